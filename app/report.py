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
import csv
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
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


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _unhealthy_count(rows: list[dict[str, str]]) -> str:
    """", 2 diverged, 1 no progress" (nothing when every finished job was healthy)."""
    counts = {st: sum(r["status"] == st for r in rows) for st in UNHEALTHY}
    return "".join(f", {k} {st.replace('-', ' ')}" for st, k in counts.items() if k)


def _unhealthy_lines(rows: list[dict[str, str]], what: Any) -> list[str]:
    """One line per diverged / no-progress job (at most 10): its hint (the sweep's ``error``)."""
    bad = [r for r in rows if r["status"] in UNHEALTHY]
    return [f"- {r['status']} job {r['job']} ({what(r)}): {r.get('error') or ''}" for r in bad[:10]]


# -- any sweep: the axes are the settings that vary, seeds (only seeds) are aggregated --------
#: results.csv columns that are not settings (app.sweep.RESULT_FIELDS, and the job id)
RESULT_COLUMNS = frozenset({"job", "status", "error", "test_error", "test_accuracy", "best_test_error", "val_error",
                            "train_loss", "grad_mapping_norm", "eps_max_spent", "eps_per_silo", "uploads_G",
                            "rounds_done", "selected", "grid_points", "wall_s", "overhead_s", "run_dir"})
#: settings that are never an axis: the seed (aggregated) and where a run reads or writes
NOT_AXES = frozenset({"seed", "run-name", "outputs-dir", "data-dir", "ledger-run-key"})
#: the order in which varying settings become axes; a later setting that the earlier axes
#: determine (a dataset's preset lr, privacy.mode = off next to ε = ∞) is listed, not an axis
AXIS_ORDER = ("privacy.epsilon", "sketch.ratio", "privacy.mode", "sketch.kind", "algorithm", "aggregator",
              "dataset", "partition", "attack.kind", "attack.fraction", "num-silos", "silos-per-round", "model",
              "mlp-hidden", "lr", "batch-size", "local-steps", "num-rounds")
#: short names for tables and figures
LABELS = {"privacy.epsilon": "ε", "sketch.ratio": "k/n", "privacy.mode": "privacy", "sketch.kind": "sketch",
          "privacy.delta": "δ", "num-silos": "silos", "attack.kind": "attack", "attack.fraction": "attackers",
          "num-rounds": "rounds", "test_error": "test error", "test_accuracy": "test accuracy",
          "best_test_error": "best test error", "val_error": "validation error", "train_loss": "train loss"}
#: metrics shown in % (the others as numbers)
PERCENT_METRICS = frozenset({"test_error", "test_accuracy", "best_test_error", "val_error"})
#: settings drawn on a log axis when every value is positive
LOG_KEYS = frozenset({"privacy.epsilon", "sketch.ratio", "lr", "num-silos", "privacy.clip", "privacy.delta"})
#: settings that mean nothing unless another one has a value: (switch, values that turn them off, keys)
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def label(key: str) -> str:
    return LABELS.get(key, key)


def _number(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def value_text(value: Any) -> str:
    """A setting's value as a table shows it: numbers with %g, ε = inf as ∞, no value as –."""
    if value in ("", None):
        return "–"
    num = _number(value)
    if num is None or str(value).strip().lower() in ("true", "false"):
        return str(value)
    return "∞" if math.isinf(num) else f"{num:g}"


def value_order(value: Any) -> tuple[int, float, str]:
    """Sort key: numbers in order (∞ last), then words, then no value."""
    num = _number(value)
    if value in ("", None):
        return (2, 0.0, "")
    return (0, num, "") if num is not None else (1, 0.0, str(value))


def effective_settings(df: Any) -> Any:
    """The settings as they acted: ε = inf where privacy is off, and no value for the settings
    that their switch turns off (sketch.ratio without a sketch, δ without privacy, ...), so that
    they neither make an axis nor split a cell."""
    from app.config import OPTIONS

    df = df.copy()
    for key, opt in OPTIONS.items():  # each option's declared switch (app.config.inert_options)
        if opt.switch is None or key not in df or opt.switch not in df:
            continue
        switch = df[opt.switch].where(df[opt.switch] != "", str(OPTIONS[opt.switch].default)).astype(str)
        df.loc[switch.isin(opt.values) != opt.acts_in, key] = ""
    if "privacy.mode" in df and "privacy.epsilon" in df:
        df.loc[df["privacy.mode"] == "off", "privacy.epsilon"] = "inf"
    return df


def tuned_keys(df: Any) -> list[str]:
    """The settings each job chose on validation data (``sweep.tuning=grid``: results.csv's
    ``selected``): outcomes of the job, never axes."""
    keys: set[str] = set()
    for text in df.get("selected", []):
        try:
            keys |= set(json.loads(text)) if text else set()
        except (ValueError, TypeError):
            continue
    return sorted(keys)


def choose_axes(df: Any, first: list[str]) -> tuple[list[str], list[str]]:
    """(axes, dependent): the settings that vary across ``df``'s rows, ``first`` (asked for)
    first, then in :data:`AXIS_ORDER`, then by name; a varying setting that the axes before it
    determine (one value for each of their combinations) is dependent, not an axis."""
    tuned = set(tuned_keys(df)) - set(first)
    settings = [c for c in df.columns
                if c not in RESULT_COLUMNS and c not in NOT_AXES and c not in tuned and not c.startswith("_")]
    varying = {c for c in settings if df.loc[df[c] != "", c].nunique() > 1}  # "": did not act
    order = list(dict.fromkeys(first + [k for k in AXIS_ORDER if k in varying] + sorted(varying)))
    axes: list[str] = []
    dependent: list[str] = []
    for k in order:
        if k in first:
            axes.append(k)
        elif k in varying:
            determined = bool(axes) and int(df.groupby(axes, sort=False)[k].nunique(dropna=False).max()) <= 1
            (dependent if determined else axes).append(k)
    return axes, dependent


def t_quantile(n: int) -> float:
    """t_{0.975, n-1}: the 95% two-sided quantile of Student's t with n - 1 degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.975, n - 1))


def cell_stats(df: Any, axes: list[str], metric: str) -> Any:
    """One row per combination of ``axes``: n (distinct seeds), mean, std (sample, n - 1), the 95%
    t-interval (n >= 3), the seeds, and how many of them diverged / made no progress. Rows of the
    same cell and seed (the same run in everything that acted, e.g. sketch.ratio swept without a
    sketch) count once, with their mean; ``dups`` says how many were merged so."""
    import pandas as pd

    fin = df[df["status"].isin(FINISHED)].copy()
    fin["_v"] = pd.to_numeric(fin[metric], errors="coerce") if metric in fin else math.nan
    fin = fin[fin["_v"].notna()]
    fin["_seed"] = fin["seed"] if "seed" in fin else fin.index.astype(str)
    for st in UNHEALTHY:
        fin[f"_{st}"] = (fin["status"] == st).astype(int)
    keys = axes or ["_all"]
    if not axes:
        fin["_all"] = ""
    per_seed = fin.groupby(keys + ["_seed"], sort=False).agg(
        v=("_v", "mean"), rows=("_v", "size"), **{f"_{st}": (f"_{st}", "max") for st in UNHEALTHY})
    cells = per_seed.groupby(level=keys, sort=False).agg(
        n=("v", "size"), mean=("v", "mean"), std=("v", "std"), dups=("rows", lambda r: int((r - 1).sum())),
        **{st: (f"_{st}", "sum") for st in UNHEALTHY})
    seeds = per_seed.reset_index().groupby(keys, sort=False)["_seed"].agg(lambda s: ",".join(sorted(map(str, s))))
    cells["seeds"] = seeds
    half = [t_quantile(int(n)) * s / math.sqrt(n) if n >= 3 else math.nan for n, s in zip(cells["n"], cells["std"])]
    cells["ci95_low"] = cells["mean"] - half
    cells["ci95_high"] = cells["mean"] + half
    return cells.reset_index().drop(columns=["_all"], errors="ignore")


def _fmt(value: float, pct: bool) -> str:
    return f"{value:.2%}" if pct else f"{value:.4g}"


def stats_text(c: Mapping[str, Any], pct: bool) -> str:
    """"86.07% ± 1.23% (n=3; 95% CI 83.01–89.13%)"; no ± for one seed."""
    n = int(c["n"])
    text = _fmt(c["mean"], pct) + (f" ± {_fmt(c['std'], pct)}" if n >= 2 else "")
    notes = [f"n={n}"]
    if n >= 3:
        lo, hi = _fmt(c["ci95_low"], pct), _fmt(c["ci95_high"], pct)
        notes.append(f"95% CI {lo.rstrip('%') if pct else lo}–{hi}")
    notes += [f"{int(c[st])} {st.replace('-', ' ')}" for st in UNHEALTHY if c.get(st)]
    return f"{text} ({'; '.join(notes)})"


@dataclass
class Layout:
    """Which axes go where: x (table columns, the figure's x axis), series (table rows, one curve
    each), facets (one table / panel each); ``dependent``: settings the axes determine."""

    x: str | None
    series: list[str]
    facets: list[str]
    dependent: list[str] = field(default_factory=list)

    @property
    def axes(self) -> list[str]:
        return ([self.x] if self.x else []) + self.series + self.facets


def layout(df: Any, x: str | None = None, series: list[str] | None = None, facets: list[str] | None = None) -> Layout:
    """The report's layout: asked-for keys as given (each must be a column of results.csv); x
    defaults to ε when it varies, else the first axis; series to the axes left."""
    asked = ([x] if x else []) + list(series or []) + list(facets or [])
    for key in asked:
        if key not in df.columns:
            known = ", ".join(c for c in choose_axes(df, [])[0]) or "none"
            raise SystemExit(f"report: {key!r} is not a setting in results.csv (the settings that vary: {known})")
    axes, dependent = choose_axes(df, asked)
    rest = [k for k in axes if k not in asked]
    if x is None and rest:
        x = rest.pop(0)
    if series is None:
        series, rest = rest, []
    facets = list(facets or []) + rest
    return Layout(x=x, series=list(series), facets=facets, dependent=dependent)


def _combo_label(keys: list[str], values: tuple[Any, ...]) -> str:
    return ", ".join(f"{label(k)} = {value_text(v)}" for k, v in zip(keys, values))


def _groups(cells: Any, keys: list[str]) -> list[tuple[tuple[Any, ...], Any]]:
    """(values, sub-frame) for each combination of ``keys`` present in ``cells``, in value order."""
    if not keys:
        return [((), cells)]
    out = [(k if isinstance(k, tuple) else (k,), g) for k, g in cells.groupby(keys, sort=False)]
    return sorted(out, key=lambda kv: [value_order(v) for v in kv[0]])


def grid_table(cells: Any, lay: Layout, text: Any) -> list[str]:
    """Markdown: one table per facet value; rows = series, columns = x values; ``text(cell row)``
    fills a cell, "n/a" where no finished job is."""
    lines: list[str] = []
    xs = sorted(cells[lay.x].unique(), key=value_order) if lay.x else [None]
    for fvals, sub in _groups(cells, lay.facets):
        if lay.facets:
            lines += [f"#### {_combo_label(lay.facets, fvals)}", ""]
        cols = [v for v in xs if v is None or (sub[lay.x] == v).any()]  # the x values this table has
        head = [label(k) for k in lay.series] or ["jobs"]
        head += [f"{label(lay.x)} = {value_text(v)}" for v in cols] if lay.x else ["result"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for svals, row in _groups(sub, lay.series):
            first = [value_text(v) for v in svals] or ["all"]
            out = []
            for xv in cols:
                hit = row if xv is None else row[row[lay.x] == xv]
                out.append(text(hit.iloc[0]) if len(hit) else "n/a")
            lines.append("| " + " | ".join(first + out) + " |")
        lines.append("")
    return lines


def _constant(df: Any, key: str) -> str | None:
    if key not in df:
        return None
    vals = sorted({value_text(v) for v in df[key]}, key=value_order)
    return ", ".join(vals) if vals else None


def context_line(df: Any, cells: Any) -> str:
    """"digits · δ = 1/n² per silo · 5 rounds · 3 seeds": what a figure's title says."""
    parts = []
    data = _constant(df, "dataset")
    if data and data != "–":
        part = _constant(df, "partition")
        parts.append(data + (f" ({part})" if part and part not in ("preset", "–") else ""))
    delta = _constant(df[df.get("privacy.mode", "") != "off"], "privacy.delta") if "privacy.delta" in df else None
    if delta and delta != "–":
        parts.append("δ = 1/n² per silo" if delta == "auto" else f"δ = {delta}")
    rounds = _constant(df, "num-rounds")
    if rounds and rounds != "–":
        parts.append(f"{rounds} rounds")
    ns = sorted({int(n) for n in cells["n"]}) if len(cells) else []
    if ns:
        parts.append(f"{ns[0]} seed{'s' if ns[0] > 1 else ''}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]} seeds")
    return " · ".join(parts)


# -- traffic to a target accuracy (Grad-BANT's Table 11): rounds and uploads G(t) --------------
def run_rounds(row: Mapping[str, Any], sweep_dir: Path) -> list[dict[str, Any]]:
    """The job's rounds.jsonl rows with a test error (its run_dir as recorded, relative to where
    the sweep ran, else under the sweep's runs/); [] when it is not there."""
    recorded = Path(str(row.get("run_dir") or ""))
    for d in (recorded, sweep_dir / "runs" / recorded.name):
        if str(recorded) and (d / "rounds.jsonl").exists():
            return [r for r in load_rounds(d / "rounds.jsonl") if r.get("test_error") is not None]
    return []


def curves(df: Any, lay: Layout, sweep_dir: Path) -> dict[tuple[Any, ...], dict[str, list[tuple[float, float, float]]]]:
    """Axes values -> seed -> [(round, G(t), test accuracy)] of every finished job with its rounds."""
    out: dict[tuple[Any, ...], dict[str, list[tuple[float, float, float]]]] = defaultdict(dict)
    for _, r in df[df["status"].isin(FINISHED)].iterrows():
        pts = [(float(p["round"]), float(p["uploads_G"]), 1.0 - float(p["test_error"])) for p in run_rounds(r, sweep_dir)]
        if pts:
            out[tuple(r[k] for k in lay.axes)].setdefault(str(r.get("seed", len(out))), pts)
    return out


def mean_curve(by_seed: Mapping[str, list[tuple[float, float, float]]]) -> tuple[list[float], list[float], list[float]]:
    """(G, mean accuracy, std accuracy) at the rounds every seed evaluated."""
    common = sorted(set.intersection(*[{p[0] for p in pts} for pts in by_seed.values()]))
    gs, ms, ss = [], [], []
    for rnd in common:
        at = [next(p for p in pts if p[0] == rnd) for pts in by_seed.values()]
        gs.append(statistics.mean(p[1] for p in at))
        ms.append(statistics.mean(p[2] for p in at))
        ss.append(statistics.stdev(p[2] for p in at) if len(at) > 1 else math.nan)
    return gs, ms, ss


def default_target(data: Mapping[tuple[Any, ...], Mapping[str, list[tuple[float, float, float]]]]) -> float:
    """90% of the best accuracy any cell's mean curve reaches, rounded down to a whole percent
    (the cells that never get there say so)."""
    best = [max(mean_curve(by_seed)[1], default=0.0) for by_seed in data.values()]
    return math.floor(0.9 * max(best) * 100 + 1e-9) / 100 if best else 0.0


def reach_stats(data: Mapping[tuple[Any, ...], Mapping[str, list[tuple[float, float, float]]]], lay: Layout,
                target: float) -> Any:
    """One row per cell: seeds, how many reached ``target`` accuracy, and mean ± std over those of
    the first round that did and of G(t) then (cumulative uploads, full-gradient equivalents)."""
    import pandas as pd

    rows = []
    for key, by_seed in data.items():
        hits = [next(((p[0], p[1]) for p in pts if p[2] >= target - 1e-12), None) for pts in by_seed.values()]
        got = [h for h in hits if h is not None]
        rnds, gs = [h[0] for h in got], [h[1] for h in got]
        rows.append(dict(zip(lay.axes, key)) | {
            "n": len(hits), "reached": len(got),
            "rounds_mean": statistics.mean(rnds) if rnds else math.nan,
            "rounds_std": statistics.stdev(rnds) if len(rnds) > 1 else math.nan,
            "uploads_G_mean": statistics.mean(gs) if gs else math.nan,
            "uploads_G_std": statistics.stdev(gs) if len(gs) > 1 else math.nan})
    return pd.DataFrame(rows)


def reach_text(c: Mapping[str, Any]) -> str:
    """"R 4.3 ± 0.6, G 3.9 ± 0.5 (3/3)"; "not reached (0/3)"."""
    if not c["reached"]:
        return f"not reached (0/{c['n']})"

    def pm(m: float, s: float) -> str:
        return f"{m:.3g}" + ("" if math.isnan(s) else f" ± {s:.2g}")

    return (f"R {pm(c['rounds_mean'], c['rounds_std'])}, G {pm(c['uploads_G_mean'], c['uploads_G_std'])} "
            f"({c['reached']}/{c['n']})")


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


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_both(fig: Any, stem: Path) -> list[str]:
    fig.savefig(stem.with_suffix(".png"), dpi=150)
    fig.savefig(stem.with_suffix(".pdf"))
    _pyplot().close(fig)
    return [stem.with_suffix(".png").name, stem.with_suffix(".pdf").name]


def x_positions(values: list[Any], key: str | None) -> tuple[dict[Any, float], bool]:
    """Where each x value goes and whether the axis is logarithmic: numbers at themselves (on a
    log axis for :data:`LOG_KEYS` when all are positive), ∞ one step right of the largest, words
    at 0, 1, 2, ..."""
    nums = {v: _number(v) for v in values}
    if values and all(n is not None for n in nums.values()):
        finite = sorted(n for n in nums.values() if math.isfinite(n))
        log = key in LOG_KEYS and bool(finite) and finite[0] > 0
        if finite:
            step = (finite[-1] / finite[0]) ** (1 / max(len(finite) - 1, 1)) if log and len(finite) > 1 else 2.0
            gap = (finite[-1] - finite[0]) / max(len(finite) - 1, 1) or 1.0
            inf_at = finite[-1] * max(step, 1.5) if log else finite[-1] + gap
        else:
            inf_at = 1.0
        return {v: (inf_at if math.isinf(n) else n) for v, n in nums.items()}, log
    ordered = sorted(values, key=value_order)
    return {v: float(i) for i, v in enumerate(ordered)}, False


def _style(ax: Any, pct: bool) -> None:
    from matplotlib.ticker import NullLocator, PercentFormatter

    if pct:
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.grid(alpha=0.3)


def plot_metric(rep: GridReport, stem: Path) -> list[str]:
    """The metric vs x, one panel per facet value, one curve per series (its own colour and
    marker), error bars ±1 std over seeds where n ≥ 2 (none for one seed); ticks at the swept x
    values."""
    plt = _pyplot()
    lay, cells = rep.lay, rep.cells
    facets = _groups(cells, lay.facets)
    ncols = min(3, len(facets))
    nrows = math.ceil(len(facets) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 3.9 * nrows + 0.6), squeeze=False, sharey=True)
    xs = sorted(cells[lay.x].unique(), key=value_order) if lay.x else [""]
    pos, log = x_positions(list(xs), lay.x)
    series_all = [s for s, _ in _groups(cells, lay.series)]
    for ax, (fvals, sub) in zip(axes.flat, facets):
        for i, (svals, srows) in enumerate(_groups(sub, lay.series)):
            k = series_all.index(svals)
            srows = srows.sort_values(lay.x, key=lambda c: c.map(value_order)) if lay.x else srows
            # a small sideways shift per series so that error bars do not overlap
            shift = (k - (len(series_all) - 1) / 2) * 0.025
            px = [pos[v] * (1 + shift) if log else pos[v] + shift * (max(pos.values()) - min(pos.values()) or 1)
                  for v in (srows[lay.x] if lay.x else [""] * len(srows))]
            style = dict(color=f"C{k % 10}", marker=MARKERS[k % len(MARKERS)], ms=6)
            ax.plot(px, srows["mean"], label=_combo_label(lay.series, svals) or label(rep.metric), **style)
            bars = srows["n"] >= 2
            if bars.any():
                ax.errorbar([p for p, b in zip(px, bars) if b], srows["mean"][bars], yerr=srows["std"][bars],
                            fmt="none", ecolor=style["color"], capsize=3, lw=1)
        if log:
            ax.set_xscale("log")
        ax.margins(x=0.08)
        ax.set_xticks([pos[v] for v in xs], [value_text(v) for v in xs])
        _style(ax, rep.pct)
        ax.set_xlabel(label(lay.x) if lay.x else "")
        ax.set_ylabel(label(rep.metric))
        if lay.facets:
            ax.set_title(_combo_label(lay.facets, fvals), fontsize=10)
        ax.legend(fontsize=8, title=None)
    return _finish(fig, axes, len(facets), f"{label(rep.metric)} vs {label(lay.x) if lay.x else 'jobs'} — "
                   f"{context_line(rep.df, cells)}\nmean over seeds; bars ±1 std where n ≥ 2", stem)


def plot_traffic(rep: GridReport, stem: Path) -> list[str]:
    """Test accuracy vs cumulative uploads G(t): one panel per series value (per k/n), one curve
    per x value (per ε), the mean over seeds with a ±1 std band where n ≥ 2; the target accuracy
    dashed."""
    plt = _pyplot()
    lay = rep.lay
    panel_keys = lay.facets + lay.series
    panels = sorted({tuple(k[lay.axes.index(p)] for p in panel_keys) for k in rep.data},
                    key=lambda t: [value_order(v) for v in t])
    xs = sorted({k[0] for k in rep.data}, key=value_order) if lay.x else [None]
    ncols = 2 if len(panels) == 4 else min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows + 0.7), squeeze=False, sharex=True,
                             sharey=True)
    all_g = [g for by_seed in rep.data.values() for pts in by_seed.values() for _, g, _ in pts if g > 0]
    for ax, pvals in zip(axes.flat, panels):
        for k, xv in enumerate(xs):
            keys = [key for key in rep.data if (not lay.x or key[0] == xv)
                    and tuple(key[lay.axes.index(p)] for p in panel_keys) == pvals]
            for key in keys:
                gs, ms, ss = mean_curve(rep.data[key])
                color, marker = f"C{k % 10}", MARKERS[k % len(MARKERS)]
                n = len(rep.data[key])
                name = f"{label(lay.x)} = {value_text(xv)}" if lay.x else "mean"
                ax.plot(gs, ms, color=color, marker=marker, ms=4, label=f"{name} (n={n})")
                if n >= 2:
                    lo = [m - s for m, s in zip(ms, ss)]
                    hi = [m + s for m, s in zip(ms, ss)]
                    ax.fill_between(gs, lo, hi, color=color, alpha=0.15, lw=0)
        if rep.target:
            ax.axhline(rep.target, color="0.4", ls="--", lw=1, label=f"target {rep.target:.0%}")
        if all_g and max(all_g) / min(all_g) >= 20:  # one log axis for every panel: traffic compares
            ax.set_xscale("log")
        _style(ax, True)
        ax.set_xlabel("cumulative uploads G(t) (full gradients)")
        ax.set_ylabel("test accuracy")
        if ax.get_xscale() == "log":
            from matplotlib.ticker import FormatStrFormatter, LogLocator

            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.label_outer()
        ax.set_title(_combo_label(panel_keys, pvals) or "all jobs", fontsize=10)
        ax.legend(fontsize=7)
    return _finish(fig, axes, len(panels), f"test accuracy vs uploads — {context_line(rep.df, rep.cells)}\n"
                   "mean over seeds; band ±1 std where n ≥ 2", stem)


def _finish(fig, axes, used: int, title: str, stem: Path) -> list[str]:
    """Hide the panels past the first ``used``, title the figure, and save it as PNG and PDF."""
    for ax in list(axes.flat)[used:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save_both(fig, stem)


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
        print(md)
        print(f"[report] wrote results.md, accuracy_vs_epsilon.png in {args.sweep_dir}")
        return
    rep = GridReport.build(rows, args.sweep_dir, x=args.x, series=args.series, facets=args.facet,
                           metric=args.metric, target=args.target)
    made = rep.write()
    print(rep.markdown())
    print(f"[report] wrote {', '.join(made)} in {args.sweep_dir}")


if __name__ == "__main__":
    main()
