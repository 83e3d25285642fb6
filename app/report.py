"""Tables and plots of a sweep, from its results.csv (never from memory).

    python -m app.report outputs/sweeps/<name>

Writes next to the CSV: ``results.md`` (mean ± std of the final test error over seeds for each
algorithm / sketch / epsilon, with the number of seeds), ``error_vs_epsilon.png`` (test error vs
epsilon, one line per algorithm and sketch, mean ± std over seeds; the non-private runs as
dashed horizontal lines) and, when the sweep has compressed runs, ``accuracy_vs_uploads.png``
(test accuracy vs the cumulative uploads G(t), from each job's rounds.jsonl).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from app.results import load_rounds


def load_rows(sweep_dir: Path) -> list[dict[str, str]]:
    path = sweep_dir / "results.csv"
    if not path.exists():
        raise SystemExit(f"no results.csv in {sweep_dir}")
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def epsilon_of(row: dict[str, str]) -> float:
    """The budget a run certified: inf for non-private runs."""
    if row.get("privacy.mode") == "off":
        return math.inf
    return float(row["privacy.epsilon"])


def series(rows: list[dict[str, str]]) -> dict[tuple[str, str], dict[float, list[float]]]:
    """(algorithm, sketch) -> epsilon -> final test errors of the completed jobs (one per seed)."""
    out: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["status"] != "completed" or r["test_error"] in ("", None):
            continue
        out[(r["algorithm"], r.get("sketch.kind", "none"))][epsilon_of(r)].append(float(r["test_error"]))
    return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def markdown(rows: list[dict[str, str]]) -> str:
    data = series(rows)
    eps_all = sorted({e for by_eps in data.values() for e in by_eps})
    head = ["algorithm", "sketch"] + ["ε=∞" if math.isinf(e) else f"ε={e:g}" for e in eps_all]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (algo, sketch), by_eps in sorted(data.items()):
        cells = []
        for e in eps_all:
            vals = by_eps.get(e)
            if not vals:
                cells.append("n/a")
                continue
            m, s = _mean_std(vals)
            cells.append(f"{m:.2%} ± {s:.2%} (n={len(vals)})")
        lines.append(f"| {algo} | {sketch} | " + " | ".join(cells) + " |")
    failed = [r for r in rows if r["status"] == "failed"]
    lines += ["", f"Jobs: {len(rows)} ({len(failed)} failed). Final test error, mean ± std over seeds."]
    for r in failed[:10]:
        lines.append(f"- failed job {r['job']} ({r['algorithm']}, ε={r.get('privacy.epsilon')}): {r['error']}")
    overheads = [float(r["overhead_s"]) for r in rows if r.get("overhead_s") not in ("", None)]
    if overheads:
        lines.append(f"\nEngine overhead per job (wall time minus time inside rounds): median "
                     f"{statistics.median(overheads):.1f} s over {len(overheads)} jobs.")
    return "\n".join(lines)


def plot_error_vs_epsilon(rows: list[dict[str, str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, ((algo, sketch), by_eps) in enumerate(sorted(series(rows).items())):
        label = algo if sketch == "none" else f"{algo} + {sketch}"
        finite = sorted(e for e in by_eps if not math.isinf(e))
        color = f"C{i % 10}"
        if finite:
            means = [_mean_std(by_eps[e])[0] for e in finite]
            stds = [_mean_std(by_eps[e])[1] for e in finite]
            ax.errorbar(finite, means, yerr=stds, marker="o", capsize=3, label=label, color=color)
        if math.inf in by_eps:
            ax.axhline(_mean_std(by_eps[math.inf])[0], ls="--", color=color, alpha=0.7,
                       label=f"{label} (non-private)")
    ax.set_xscale("log")
    _save(fig, ax, "ε (each silo, certified)", "test error", path)


def plot_accuracy_vs_uploads(rows: list[dict[str, str]], path: Path) -> bool:
    """Accuracy vs G(t) for every completed job with its rounds.jsonl; False if none has a sketch."""
    curves: dict[str, list[tuple[list[float], list[float]]]] = defaultdict(list)
    for r in rows:
        run_dir = Path(r.get("run_dir") or "")
        if r["status"] != "completed" or not (run_dir / "rounds.jsonl").exists():
            continue
        pts = load_rounds(run_dir / "rounds.jsonl")
        pts = [p for p in pts if p.get("test_error") is not None]
        curves[r.get("sketch.kind", "none")].append(([p["uploads_G"] for p in pts], [1 - p["test_error"] for p in pts]))
    if set(curves) <= {"none"}:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (kind, runs) in enumerate(sorted(curves.items())):
        for j, (g, acc) in enumerate(runs):
            ax.plot(g, acc, color=f"C{i % 10}", alpha=0.8, label=kind if j == 0 else None)
    _save(fig, ax, "cumulative uploads G(t) (full-gradient equivalents)", "test accuracy", path)
    return True


def _save(fig: Any, ax: Any, xlabel: str, ylabel: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    args = ap.parse_args(argv)
    rows = load_rows(args.sweep_dir)
    md = markdown(rows)
    (args.sweep_dir / "results.md").write_text(md + "\n")
    plot_error_vs_epsilon(rows, args.sweep_dir / "error_vs_epsilon.png")
    made = ["results.md", "error_vs_epsilon.png"]
    if plot_accuracy_vs_uploads(rows, args.sweep_dir / "accuracy_vs_uploads.png"):
        made.append("accuracy_vs_uploads.png")
    print(md)
    print(f"[report] wrote {', '.join(made)} in {args.sweep_dir}")


if __name__ == "__main__":
    main()
