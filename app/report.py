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
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.report_cells import (AXIS_ORDER, PERCENT_METRICS, Layout, _number, _unhealthy_count, _unhealthy_lines,
                              cell_stats, context_line, curves, default_target, effective_settings, grid_table, label,
                              layout, load_rows, reach_stats, reach_text, stats_text, tuned_keys, value_text)
from app.report_plots import plot_metric, plot_traffic
from app.report_robust import (  # noqa: F401 (REFUSED)
    REFUSED, latest_per_job, plot_accuracy_heatmap, plot_accuracy_vs_epsilon, robust_markdown)
from app.run_health import FINISHED


@dataclass
class GridReport:
    """What app.report writes for any sweep but the Byzantine-robust one."""

    df: Any
    lay: Layout
    metric: str
    cells: Any
    sweep_dir: Path
    target: float | None = None
    data: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    reach: Any = None

    @classmethod
    def build(cls, rows: list[dict[str, str]], sweep_dir: Path, x: str | None = None, series: list[str] | None = None,
              facets: list[str] | None = None, metric: str = "test_error", target: float | None = None) -> "GridReport":
        try:
            import pandas as pd
        except ImportError:
            raise SystemExit("report: needs pandas (a dependency in pyproject.toml): pip install 'pandas>=2.1'") from None

        df = effective_settings(pd.DataFrame(latest_per_job(rows)).fillna(""))
        if metric not in df.columns:
            raise SystemExit(f"report: metric {metric!r} is not a column of results.csv")
        finished = df[df["status"].isin(FINISHED)]
        lay = layout(finished if len(finished) else df, x, series, facets)
        cells = cell_stats(df, lay.axes, metric)
        rep = cls(df=df, lay=lay, metric=metric, cells=cells, sweep_dir=sweep_dir)
        rep.data = curves(df, lay, sweep_dir)
        if rep.data:
            rep.target = default_target(rep.data) if target is None else (target / 100 if target > 1 else target)
            rep.reach = reach_stats(rep.data, lay, rep.target)
        return rep

    @property
    def pct(self) -> bool:
        return self.metric in PERCENT_METRICS

    def markdown(self) -> str:
        lay, df = self.lay, self.df
        what = f"Final {label(self.metric)}" if self.metric in ("test_error", "test_accuracy") else label(self.metric)
        ctx = context_line(df, self.cells)
        lines = [f"### {what}" + (f": {ctx}" if ctx else ""), ""]
        axes = ([f"{k} (x)" for k in [lay.x] if k] + [f"{k} (rows)" for k in lay.series]
                + [f"{k} (tables)" for k in lay.facets])
        lines.append("Axes (the settings that vary): " + (", ".join(axes) or "none") + ".")
        if lay.dependent:
            lines.append("Also varying, set by the axes: " + ", ".join(lay.dependent) + ".")
        if tuned_keys(df):
            lines.append("Chosen by each job on validation data (sweep.tuning=grid), not axes: "
                         + ", ".join(tuned_keys(df)) + ".")
        fixed = [f"{label(k)} = {value_text(df[k].iloc[0])}" for k in AXIS_ORDER
                 if k in df and k not in lay.axes and k not in lay.dependent and df[k].nunique() == 1 and df[k].iloc[0] != ""
                 and not (k == "aggregator" and "robust" not in set(df.get("algorithm", [])))]
        if fixed:
            lines.append("Fixed: " + ", ".join(fixed) + ".")
        lines.append("")
        if not len(self.cells):
            return "\n".join(lines + ["No job ran to its end: nothing to tabulate.", "", self.jobs_line()])
        lines += grid_table(self.cells, lay, lambda c: stats_text(c, self.pct))
        lines.append("Cells: mean ± sample std over seeds, n = seeds; 95% t-interval when n ≥ 3; "
                     "no ± with one seed. Other settings are the same in every job.")
        dups = int(self.cells["dups"].sum()) if len(self.cells) else 0
        if dups:
            lines.append(f"{dups} job(s) repeat another's settings in everything that acted (e.g. sketch.ratio "
                         "without a sketch, ε without privacy): each seed counted once.")
        if self.reach is not None and len(self.reach):
            lines += ["", f"### Rounds R and uploads G(t) to reach {self.target:.0%} test accuracy", ""]
            lines += grid_table(self.reach, lay, reach_text)
            lines.append("G(t): cumulative uploads in full-gradient equivalents (a silo's k/n per upload); "
                         "mean ± std over the seeds that reached the target (reached/seeds).")
        lines += ["", self.jobs_line()]
        return "\n".join(lines)

    def jobs_line(self) -> str:
        df = self.df
        failed = df[df["status"] == "failed"]
        lines = [f"Jobs: {len(df)} ({len(failed)} failed{_unhealthy_count(df.to_dict('records'))})."]
        where = [k for k in self.lay.axes]
        for _, r in failed.head(10).iterrows():
            at = ", ".join(f"{label(k)}={value_text(r[k])}" for k in where)
            lines.append(f"- failed job {r['job']} ({at}): {r['error']}")
        lines += _unhealthy_lines(df.to_dict("records"),
                                  lambda r: ", ".join(f"{label(k)}={value_text(r[k])}" for k in where))
        overheads = [v for v in (_number(o) for o in df.get("overhead_s", [])) if v is not None and math.isfinite(v)]
        if overheads:
            lines.append(f"\nEngine overhead per job (wall time minus time inside rounds): median "
                         f"{statistics.median(overheads):.1f} s over {len(overheads)} jobs.")
        return "\n".join(lines)

    def write(self) -> list[str]:
        """results.md, summary.csv and the figures (PNG + PDF) next to results.csv; the names."""
        d = self.sweep_dir
        (d / "results.md").write_text(self.markdown() + "\n")
        self.cells.to_csv(d / "summary.csv", index=False)
        made = ["results.md", "summary.csv"]
        if not len(self.cells):
            return made
        name = f"{'error' if 'error' in self.metric else self.metric.replace('test_', '')}_vs_" \
               f"{(self.lay.x or 'jobs').split('.')[-1]}"
        made += plot_metric(self, d / name)
        if self.data:
            made += plot_traffic(self, d / "accuracy_vs_uploads")
        return made


def is_robust_sweep(rows: list[dict[str, str]]) -> bool:
    return any(r.get("algorithm") == "robust" for r in rows)


def _keys(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        md = robust_markdown(rows)
        (args.sweep_dir / "results.md").write_text(md + "\n")
        plot_accuracy_vs_epsilon(rows, args.sweep_dir / "accuracy_vs_epsilon.png")
        plot_accuracy_heatmap(rows, args.sweep_dir / "accuracy_heatmap.png")
        print(md)
        print(f"[report] wrote results.md, accuracy_vs_epsilon.png, accuracy_heatmap.png in {args.sweep_dir}")
        return
    rep = GridReport.build(rows, args.sweep_dir, x=args.x, series=args.series, facets=args.facet,
                           metric=args.metric, target=args.target)
    made = rep.write()
    print(rep.markdown())
    print(f"[report] wrote {', '.join(made)} in {args.sweep_dir}")


if __name__ == "__main__":
    main()
