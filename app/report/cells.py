"""The numbers of a sweep report: results.csv's rows, the axes (the settings that vary; seeds
are aggregated), each cell's mean ± std and 95% interval, the grid tables, and the rounds and
uploads G(t) each cell needs to reach a target accuracy (the Grad-BANT paper's Table 11).
app/report/grid.py and app/report/robust.py write them."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.results import complete_csv_rows, load_rounds
from app.run_health import FINISHED, UNHEALTHY


def load_rows(sweep_dir: Path) -> list[dict[str, str]]:
    path = sweep_dir / "results.csv"
    if not path.exists():
        raise SystemExit(f"no results.csv in {sweep_dir}")
    return complete_csv_rows(path)


def epsilon_of(row: dict[str, str]) -> float:
    """The budget a run certified: inf for non-private runs."""
    if row.get("privacy.mode") == "off":
        return math.inf
    return float(row["privacy.epsilon"])


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def unhealthy_count(rows: list[dict[str, str]]) -> str:
    """", 2 diverged, 1 no progress" (nothing when every finished job was healthy)."""
    counts = {st: sum(r["status"] == st for r in rows) for st in UNHEALTHY}
    return "".join(f", {k} {st.replace('-', ' ')}" for st, k in counts.items() if k)


def unhealthy_lines(rows: list[dict[str, str]], what: Any) -> list[str]:
    """One line per diverged / no-progress job (at most 10): its hint (the sweep's ``error``)."""
    bad = [r for r in rows if r["status"] in UNHEALTHY]
    return [f"- {r['status']} job {r['job']} ({what(r)}): {r.get('error') or ''}" for r in bad[:10]]


# -- any sweep: the axes are the settings that vary, seeds (only seeds) are aggregated --------
#: results.csv columns that are not settings (app.sweep.RESULT_FIELDS, and the job id)
RESULT_COLUMNS = frozenset({"job", "status", "error", "test_error", "test_accuracy", "best_test_error", "val_error",
                            "train_loss", "grad_mapping_norm", "eps_max_spent", "eps_per_silo", "uploads_G",
                            "rounds_done", "retries", "selected", "grid_points", "wall_s", "overhead_s", "run_dir"})
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


def number(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def value_text(value: Any) -> str:
    """A setting's value as a table shows it: numbers with %g, ε = inf as ∞, no value as –."""
    if value in ("", None):
        return "–"
    num = number(value)
    if num is None or str(value).strip().lower() in ("true", "false"):
        return str(value)
    return "∞" if math.isinf(num) else f"{num:g}"


def value_order(value: Any) -> tuple[int, float, str]:
    """Sort key: numbers in order (∞ last), then words, then no value."""
    num = number(value)
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


def combo_label(keys: list[str], values: tuple[Any, ...]) -> str:
    return ", ".join(f"{label(k)} = {value_text(v)}" for k, v in zip(keys, values))


def groups(cells: Any, keys: list[str]) -> list[tuple[tuple[Any, ...], Any]]:
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
    for fvals, sub in groups(cells, lay.facets):
        if lay.facets:
            lines += [f"#### {combo_label(lay.facets, fvals)}", ""]
        cols = [v for v in xs if v is None or (sub[lay.x] == v).any()]  # the x values this table has
        head = [label(k) for k in lay.series] or ["jobs"]
        head += [f"{label(lay.x)} = {value_text(v)}" for v in cols] if lay.x else ["result"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for svals, row in groups(sub, lay.series):
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
