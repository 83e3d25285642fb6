"""Tables and plots of a sweep, from its results.csv (never from memory).

    python -m app.report outputs/sweeps/<name>

    python -m app.report DIR --x privacy.epsilon --series sketch.ratio --facet privacy.mode

The axes are the settings that vary across the sweep's finished jobs (detected from results.csv;
a setting that the axes before it determine, such as a dataset's preset lr, is listed, not an
axis; a setting that did not act, such as sketch.ratio without a sketch or ε without privacy,
is no value). Seeds, and only seeds, are aggregated: each cell is the mean ± sample std over
its seeds with n, and a 95% Student-t interval when n ≥ 3 (no ± for one seed). x defaults to ε
when it varies, series to the other axes. Writes next to the CSV: ``results.md`` (one table per
facet: rows = series, columns = x; then the rounds R and uploads G(t) each cell needed to reach a
target test accuracy, as the Grad-BANT paper's Table 11), ``summary.csv`` (every cell: axes, n,
mean, std, 95% interval, seeds), ``error_vs_epsilon.png/.pdf`` (the metric vs x, one curve per
series, error bars from seeds only) and, from the jobs' rounds.jsonl, ``accuracy_vs_uploads.png/.pdf``
(test accuracy vs G(t), one panel per series value, e.g. per k/n, one curve per x value).

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
from pathlib import Path

from app.report.cells import effective_settings, load_rows
from app.report.grid import GridReport
from app.report.robust import (REFUSED, latest_per_job, plot_accuracy_heatmap, plot_accuracy_vs_epsilon,
                               robust_markdown)

__all__ = ["REFUSED", "GridReport", "effective_settings", "is_robust_sweep", "latest_per_job", "load_rows", "main",
           "plot_accuracy_heatmap", "plot_accuracy_vs_epsilon", "robust_markdown"]


def is_robust_sweep(rows: list[dict[str, str]]) -> bool:
    return any(r.get("algorithm") == "robust" for r in rows)


def _keys(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


#: what every sweep table's epsilon covers (issue 39), under each results.md
EPSILON_NOTE = ("ε here is each silo's budget for one run's training releases (summary.json `eps_covers`); picking "
                "the best of this sweep's runs by their results is not covered by it — a private selection that "
                "charges the silos for it: `python -m scripts.reproduce.isrl_private_tuning`.")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m app.report", description=__doc__.splitlines()[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--x", default=None, help="the x axis / table columns (default: privacy.epsilon when it varies)")
    ap.add_argument("--series", default=None, type=_keys, help="one curve / table row per value (comma-separated "
                    "keys; default: the other settings that vary)")
    ap.add_argument("--facet", default=None, type=_keys, help="one panel / table per value (comma-separated keys)")
    ap.add_argument("--metric", default="test_error", help="results.csv column to aggregate (test_error, "
                    "test_accuracy, best_test_error, val_error, train_loss, ...)")
    ap.add_argument("--target", default=None, type=float, help="target test accuracy for rounds / uploads to "
                    "reach it (0.8 or 80; default: the highest whole percent every cell reaches)")
    args = ap.parse_args(argv)
    rows = load_rows(args.sweep_dir)
    if is_robust_sweep(rows):
        md = robust_markdown(rows) + "\n\n" + EPSILON_NOTE
        (args.sweep_dir / "results.md").write_text(md + "\n")
        plot_accuracy_vs_epsilon(rows, args.sweep_dir / "accuracy_vs_epsilon.png")
        plot_accuracy_heatmap(rows, args.sweep_dir / "accuracy_heatmap.png")
        print(md)
        print(f"[report] wrote results.md, accuracy_vs_epsilon.png, accuracy_heatmap.png in {args.sweep_dir}")
        return
    rep = GridReport.build(rows, args.sweep_dir, x=args.x, series=args.series, facets=args.facet,
                           metric=args.metric, target=args.target)
    made = rep.write()
    with (args.sweep_dir / "results.md").open("a") as fh:
        fh.write("\n" + EPSILON_NOTE + "\n")
    print(rep.markdown() + "\n\n" + EPSILON_NOTE)
    print(f"[report] wrote {', '.join(made)} in {args.sweep_dir}")

