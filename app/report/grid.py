"""The report of any sweep but the Byzantine-robust one: its cells (mean ± std over seeds per
setting), the rounds and uploads to a target accuracy, ``results.md``, ``summary.csv`` and the
figures (app/report/plots.py)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.report.cells import (AXIS_ORDER, PERCENT_METRICS, Layout, cell_stats, context_line, curves, default_target,
                              effective_settings, grid_table, label, layout, number, reach_stats, reach_text,
                              stats_text, tuned_keys, unhealthy_count, unhealthy_lines, value_text)
from app.report.plots import plot_metric, plot_traffic
from app.report.robust import latest_per_job
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
        lines = [f"Jobs: {len(df)} ({len(failed)} failed{unhealthy_count(df.to_dict('records'))})."]
        where = [k for k in self.lay.axes]
        for _, r in failed.head(10).iterrows():
            at = ", ".join(f"{label(k)}={value_text(r[k])}" for k in where)
            lines.append(f"- failed job {r['job']} ({at}): {r['error']}")
        lines += unhealthy_lines(df.to_dict("records"),
                                  lambda r: ", ".join(f"{label(k)}={value_text(r[k])}" for k in where))
        overheads = [v for v in (number(o) for o in df.get("overhead_s", [])) if v is not None and math.isfinite(v)]
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
