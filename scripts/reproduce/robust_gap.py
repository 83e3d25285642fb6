"""The private + robust gap (issue 28): the one-run row against its references, from a sweep.

Reads ``outputs/sweeps/robust-gap/results.csv`` (``conf/experiment/robust-gap.yaml``: the row,
noise-aware Grad-BANT with ISRL-DP epsilon = 8, 60% label flippers and SRHT k/n = 0.5, and the
references at the same batch size and step size: the plain run, the private mean without attack,
the private mean over 4 silos a round) and prints one markdown row per setting (final test
accuracy, mean ± std over seeds, the largest epsilon spent, the per-step noise sigma of a silo)
and the gap of the row to each reference; ``--plot`` draws them as bars (``docs/img``).

    python -m app.sweep -m experiment=robust-gap          # and the reference commands of the file
    python -m scripts.reproduce.robust_gap [--sweep outputs/sweeps/robust-gap] [--plot docs/img/robust-gap.png]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import pandas as pd

#: the issue's plain run (mean, no attack, no sketch, privacy off; batch 64, lr 0.2): 82.20%
ISSUE_PLAIN = 82.20


def label(r: pd.Series) -> str:
    """A row's setting in words (aggregator, attack, privacy, sketch, silos a round)."""
    rule = "Grad-BANT noise-aware" if r["aggregator"] == "gradbant" else r["aggregator"]
    attack = "no attack" if r["attack.kind"] == "none" else f"{r['attack.kind']} {float(r['attack.fraction']):.0%}"
    privacy = "privacy off" if r["privacy.mode"] == "off" else f"ε = {float(r['privacy.epsilon']):g}"
    sketch = "no sketch" if r["sketch.kind"] == "none" else f"{r['sketch.kind']} k/n = {float(r['sketch.ratio']):g}"
    silos = f", {int(r['silos-per-round'])} silos a round" if int(r["silos-per-round"]) != int(r["num-silos"]) else ""
    return f"{rule}, {attack}, {privacy}, {sketch}{silos}"


def sigma_of(run_dir: str) -> float:
    """A silo's per-step Gaussian noise sigma from the run's summary.json (0 without privacy)."""
    try:
        silo = json.loads((Path(run_dir) / "summary.json").read_text())["silos"][0]
        return float(silo["planned"][0]["sigma"])
    except (OSError, KeyError, IndexError, ValueError):
        return math.nan


def summarise(results: Path) -> pd.DataFrame:
    """One row per setting: accuracies (%), their mean and std, epsilon spent, sigma, seeds."""
    df = pd.read_csv(results, dtype=str, keep_default_na=False)
    df = df[df["status"] == "completed"]
    keys = ["aggregator", "attack.kind", "attack.fraction", "privacy.mode", "privacy.epsilon", "sketch.kind",
            "sketch.ratio", "silos-per-round", "num-silos", "batch-size", "lr"]
    out = []
    for _, g in df.groupby(keys, sort=False):
        acc = [100 * (1 - float(e)) for e in g["test_error"]]
        first = g.iloc[0]
        out.append({"setting": label(first), "batch": first["batch-size"], "lr": first["lr"], "seeds": len(acc),
                    "mean": statistics.mean(acc), "std": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                    "accs": acc, "eps": max(float(e) for e in g["eps_max_spent"]), "sigma": sigma_of(first["run_dir"])})
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    lines = ["| setting | batch, lr | test accuracy (seeds) | ε spent (max) | σ a step |", "|---|---|---|---|---|"]
    for _, r in table.iterrows():
        eps = "∞" if math.isinf(r["eps"]) else f"{r['eps']:.4f}"
        accs = ", ".join(f"{a:.2f}" for a in r["accs"])
        lines.append(f"| {r['setting']} | {r['batch']}, {r['lr']} | {r['mean']:.2f}% ± {r['std']:.2f}% ({accs}) | "
                     f"{eps} | {r['sigma']:.4g} |")
    row = table[table["setting"].str.startswith("Grad-BANT")]
    if len(row):
        m = float(row.iloc[0]["mean"])
        lines += ["", f"Gap of the Grad-BANT row ({m:.2f}%): {ISSUE_PLAIN - m:+.2f} points to the issue's plain "
                  f"run ({ISSUE_PLAIN:.2f}%)"]
        for _, r in table.iterrows():
            if not r["setting"].startswith("Grad-BANT"):
                lines.append(f"- {r['mean'] - m:+.2f} points to: {r['setting']}")
    return "\n".join(lines)


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 0.55 * len(table) + 1.2))
    ys = range(len(table))
    colours = ["C1" if s.startswith("Grad-BANT") else "C0" for s in table["setting"]]
    ax.barh(list(ys), table["mean"], xerr=table["std"], color=colours, capsize=3)
    for y, m, sd in zip(ys, table["mean"], table["std"]):
        ax.text(m + sd + 0.25, y, f"{m:.2f}%", va="center", fontsize=8)
    ax.axvline(ISSUE_PLAIN, color="0.3", ls="--", lw=1, label=f"the issue's plain run, {ISSUE_PLAIN:.2f}%")
    ax.axvline(ISSUE_PLAIN - 3, color="C3", ls=":", lw=1.2, label=f"the goal: within 3 points, {ISSUE_PLAIN - 3:.2f}%")
    ax.legend(loc="upper right", fontsize=8, framealpha=0.95)
    ax.set_yticks(list(ys), table["setting"], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(70, 90)
    ax.set_xlabel("final test accuracy (%), Fashion-MNIST, 10 silos, 20 rounds; mean ± std over seeds")
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=Path, default=Path("outputs/sweeps/robust-gap"))
    ap.add_argument("--plot", type=Path, default=None, help="write the bars to this PNG")
    args = ap.parse_args(argv)
    results = args.sweep / "results.csv"
    if not results.exists():
        raise SystemExit(f"{results} not found: run `python -m app.sweep -m experiment=robust-gap` (and its "
                         "reference commands, conf/experiment/robust-gap.yaml) first")
    table = summarise(results)
    print(markdown(table))
    if args.plot:
        plot(table, args.plot)
        print(f"[robust-gap] wrote {args.plot}")


if __name__ == "__main__":
    main()
