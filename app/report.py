"""Tables and plots of a sweep, from its results.csv (never from memory).

    python -m app.report outputs/sweeps/<name>

Writes next to the CSV: ``results.md`` (mean ± std of the final test error over seeds for each
algorithm / sketch / epsilon, with the number of seeds), ``error_vs_epsilon.png`` (test error vs
epsilon, one line per algorithm and sketch, mean ± std over seeds; the non-private runs as
dashed horizontal lines) and, when the sweep has compressed runs, ``accuracy_vs_uploads.png``
(test accuracy vs the cumulative uploads G(t), from each job's rounds.jsonl).

Jobs that ran to their end count in every table and plot, healthy (``completed``) or not
(``diverged``, ``no-progress``: app/run_health.py): a rule that let an attack drive the model off
is a result. The unhealthy ones are counted under each table and listed with their hint; a
robust table's cell says how many of its seeds they are.

A Byzantine-robust sweep (``algorithm = robust`` rows, e.g. ``experiment=private-robust``) gets
instead, in ``results.md``, one table per epsilon of the final test accuracy (mean ± std over
seeds) with rows = rule × sketch and columns = attack; a job the config check refused for want of
an honest majority (trimmed mean with 60% attackers) shows as "refused: honest majority required".
``accuracy_vs_epsilon.png`` has one panel per attack, one line per rule, SRHT (any sketch) dashed.
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
from app.run_health import FINISHED, UNHEALTHY


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
    """(algorithm, sketch) -> epsilon -> final test errors of the finished jobs (one per seed)."""
    out: dict[tuple[str, str], dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["status"] not in FINISHED or r["test_error"] in ("", None):
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
    lines += ["", f"Jobs: {len(rows)} ({len(failed)} failed{_unhealthy_count(rows)}). "
              "Final test error, mean ± std over seeds."]
    for r in failed[:10]:
        lines.append(f"- failed job {r['job']} ({r['algorithm']}, ε={r.get('privacy.epsilon')}): {r['error']}")
    lines += _unhealthy_lines(rows, lambda r: f"{r['algorithm']}, ε={r.get('privacy.epsilon')}")
    overheads = [float(r["overhead_s"]) for r in rows if r.get("overhead_s") not in ("", None)]
    if overheads:
        lines.append(f"\nEngine overhead per job (wall time minus time inside rounds): median "
                     f"{statistics.median(overheads):.1f} s over {len(overheads)} jobs.")
    return "\n".join(lines)


def _unhealthy_count(rows: list[dict[str, str]]) -> str:
    """", 2 diverged, 1 no progress" (nothing when every finished job was healthy)."""
    counts = {st: sum(r["status"] == st for r in rows) for st in UNHEALTHY}
    return "".join(f", {k} {st.replace('-', ' ')}" for st, k in counts.items() if k)


def _unhealthy_lines(rows: list[dict[str, str]], what: Any) -> list[str]:
    """One line per diverged / no-progress job (at most 10): its hint (the sweep's ``error``)."""
    bad = [r for r in rows if r["status"] in UNHEALTHY]
    return [f"- {r['status']} job {r['job']} ({what(r)}): {r.get('error') or ''}" for r in bad[:10]]


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
    """Accuracy vs G(t) for every finished job with its rounds.jsonl; False if none has a sketch."""
    curves: dict[str, list[tuple[list[float], list[float]]]] = defaultdict(list)
    for r in rows:
        run_dir = Path(r.get("run_dir") or "")
        if r["status"] not in FINISHED or not (run_dir / "rounds.jsonl").exists():
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


# -- Byzantine-robust sweeps (experiment=private-robust) -------------------------------------
#: the table's name of each rule: (aggregator, gradbant.noise-aware) -> label
RULE_LABELS = {("gradbant", True): "Grad-BANT noise-aware", ("gradbant", False): "Grad-BANT (paper)",
               ("fltrust", False): "FLTrust", ("mean", False): "mean", ("trimmed-mean", False): "trimmed mean"}
REFUSED = "refused: honest majority required"


def _true(text: str | None) -> bool:
    return str(text).strip().lower() in ("true", "1", "yes")


def rule_of(row: dict[str, str]) -> str:
    agg = row.get("aggregator", "")
    return RULE_LABELS.get((agg, _true(row.get("gradbant.noise-aware")) and agg == "gradbant"), agg)


def attack_of(row: dict[str, str]) -> str:
    kind = row.get("attack.kind") or "none"
    return "none" if kind == "none" else f"{kind} {float(row.get('attack.fraction') or 0):.0%}"


def latest_per_job(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """One row per job (a resumed sweep appends a failed job's rerun): its last finished row,
    else its last row; in the order the jobs first appear."""
    keep: dict[str, dict[str, str]] = {}
    for i, r in enumerate(rows):
        key = r.get("job") or f"row{i}"
        if key not in keep or r["status"] in FINISHED or keep[key]["status"] not in FINISHED:
            keep[key] = r
    return list(keep.values())


def robust_cells(rows: list[dict[str, str]]) -> dict[tuple[float, str, str, str], dict[str, Any]]:
    """(epsilon, rule, sketch, attack) -> {"acc": final test accuracies of the finished jobs,
    "diverged" / "no-progress": how many of those were, "refused": jobs refused for an honest
    majority, "failed": other failed jobs}."""
    out: dict[tuple[float, str, str, str], dict[str, Any]] = defaultdict(
        lambda: {"acc": [], "refused": 0, "failed": 0} | {st: 0 for st in UNHEALTHY})
    for r in latest_per_job(rows):
        cell = out[(epsilon_of(r), rule_of(r), r.get("sketch.kind") or "none", attack_of(r))]
        if r["status"] in FINISHED and r.get("test_accuracy") not in ("", None):
            cell["acc"].append(float(r["test_accuracy"]))
            if r["status"] in UNHEALTHY:
                cell[r["status"]] += 1
        elif r["status"] == "failed" and "honest majority" in (r.get("error") or ""):
            cell["refused"] += 1
        elif r["status"] != "skipped":
            cell["failed"] += 1
    return out


#: the issue's order of the attack columns (others after them, by name)
ATTACK_KINDS = ("none", "label-flip", "sign-flip", "alie")


def _attack_order(a: str) -> tuple[int, str]:
    kind = a.split(" ")[0]
    return (ATTACK_KINDS.index(kind) if kind in ATTACK_KINDS else len(ATTACK_KINDS), a)


def _rule_order(rule: str) -> tuple[int, str]:
    order = list(RULE_LABELS.values())
    return (order.index(rule) if rule in order else len(order), rule)


def _cell_text(cell: dict[str, Any]) -> str:
    acc = cell["acc"]
    if acc:
        m, s = _mean_std(acc)
        unhealthy = "".join(f", {cell[st]} {st.replace('-', ' ')}" for st in UNHEALTHY if cell.get(st))
        text = f"{m:.2%} ± {s:.2%} (n={len(acc)}{unhealthy})"
    elif cell["refused"]:
        return REFUSED
    else:
        text = "n/a"
    extra = [f"{cell[k]} {k}" for k in ("refused", "failed") if cell[k]]
    return text + (f" (+{', '.join(extra)})" if extra else "")


def robust_markdown(rows: list[dict[str, str]]) -> str:
    cells = robust_cells(rows)
    eps_all = sorted({k[0] for k in cells})
    attacks = sorted({k[3] for k in cells}, key=_attack_order)
    lines: list[str] = []
    for eps in eps_all:
        title = "ε = ∞ (privacy off)" if math.isinf(eps) else f"ε = {eps:g} (ISRL-DP, each silo)"
        lines += [f"### {title}", "", "| rule | sketch | " + " | ".join(attacks) + " |",
                  "|" + "---|" * (len(attacks) + 2)]
        pairs = sorted({(k[1], k[2]) for k in cells if k[0] == eps}, key=lambda p: (_rule_order(p[0]), p[1] != "none", p[1]))
        for rule, sketch in pairs:
            row_cells = [_cell_text(cells[(eps, rule, sketch, a)]) if (eps, rule, sketch, a) in cells else "n/a"
                         for a in attacks]
            lines.append(f"| {rule} | {sketch} | " + " | ".join(row_cells) + " |")
        lines.append("")
    jobs = latest_per_job(rows)
    refused = sum(c["refused"] for c in cells.values())
    failed = [r for r in jobs if r["status"] == "failed" and "honest majority" not in (r.get("error") or "")]
    lines.append(f"Jobs: {len(jobs)} ({refused} refused for an honest majority, {len(failed)} failed otherwise"
                 f"{_unhealthy_count(jobs)}). Final test accuracy, mean ± std over seeds.")
    for r in failed[:10]:
        lines.append(f"- failed job {r['job']} ({rule_of(r)}, {attack_of(r)}, ε={epsilon_of(r):g}): {r['error']}")
    lines += _unhealthy_lines(jobs, lambda r: f"{rule_of(r)}, {attack_of(r)}, ε={epsilon_of(r):g}")
    return "\n".join(lines)


def plot_accuracy_vs_epsilon(rows: list[dict[str, str]], path: Path) -> None:
    """One panel per attack; x = epsilon (categorical, ∞ last), one line per rule (mean ± std over
    seeds), solid without a sketch and dashed with one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = robust_cells(rows)
    eps_all = sorted({k[0] for k in cells})
    attacks = sorted({k[3] for k in cells}, key=_attack_order)
    rules = sorted({k[1] for k in cells}, key=_rule_order)
    ncols = min(2, len(attacks))
    nrows = math.ceil(len(attacks) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False, sharey=True)
    for ax, attack in zip(axes.flat, attacks):
        for i, rule in enumerate(rules):
            for sketch in sorted({k[2] for k in cells if k[1] == rule}, key=lambda s: (s != "none", s)):
                xs, ms, ss = [], [], []
                for j, eps in enumerate(eps_all):
                    acc = cells.get((eps, rule, sketch, attack), {"acc": []})["acc"]
                    if acc:
                        m, s = _mean_std(acc)
                        xs.append(j), ms.append(m), ss.append(s)
                if xs:
                    ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=3, color=f"C{i % 10}",
                                ls="-" if sketch == "none" else "--",
                                label=rule if sketch == "none" else f"{rule} + {sketch}")
        ax.set_xticks(range(len(eps_all)), ["∞" if math.isinf(e) else f"{e:g}" for e in eps_all])
        ax.set_title(f"attack: {attack}", fontsize=10)
        ax.set_xlabel("ε (each silo, certified)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(attacks):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(4, len(labels)))
    fig.tight_layout(rect=(0, 0.16 / nrows if handles else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def is_robust_sweep(rows: list[dict[str, str]]) -> bool:
    return any(r.get("algorithm") == "robust" for r in rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    args = ap.parse_args(argv)
    rows = load_rows(args.sweep_dir)
    if is_robust_sweep(rows):
        md = robust_markdown(rows)
        (args.sweep_dir / "results.md").write_text(md + "\n")
        plot_accuracy_vs_epsilon(rows, args.sweep_dir / "accuracy_vs_epsilon.png")
        print(md)
        print(f"[report] wrote results.md, accuracy_vs_epsilon.png in {args.sweep_dir}")
        return
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
