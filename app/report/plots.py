"""The figures of a sweep report (PNG and PDF): the metric vs x, one curve per series, error bars
from seeds only; test accuracy vs uploads G(t). matplotlib is imported only when one is drawn."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol

from app.report.cells import (LOG_KEYS, MARKERS, Layout, combo_label, context_line, groups, label, mean_curve, number,
                              value_order, value_text)


class PlottedReport(Protocol):
    """What the figures read from a report (app/report/grid.py's GridReport draws itself with them):
    its results, axes, metric and cells, and the curves and target accuracy of the G(t) plot."""

    df: Any
    lay: Layout
    metric: str
    cells: Any
    target: float | None
    data: dict[tuple[Any, ...], Any]

    @property
    def pct(self) -> bool: ...


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
    nums = {v: number(v) for v in values}
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


def plot_metric(rep: PlottedReport, stem: Path) -> list[str]:
    """The metric vs x, one panel per facet value, one curve per series (its own colour and
    marker), error bars ±1 std over seeds where n ≥ 2 (none for one seed); ticks at the swept x
    values."""
    plt = _pyplot()
    lay, cells = rep.lay, rep.cells
    facets = groups(cells, lay.facets)
    ncols = min(3, len(facets))
    nrows = math.ceil(len(facets) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.4 * ncols, 3.9 * nrows + 0.6), squeeze=False, sharey=True)
    xs = sorted(cells[lay.x].unique(), key=value_order) if lay.x else [""]
    pos, log = x_positions(list(xs), lay.x)
    series_all = [s for s, _ in groups(cells, lay.series)]
    for ax, (fvals, sub) in zip(axes.flat, facets):
        for i, (svals, srows) in enumerate(groups(sub, lay.series)):
            k = series_all.index(svals)
            srows = srows.sort_values(lay.x, key=lambda c: c.map(value_order)) if lay.x else srows
            # a small sideways shift per series so that error bars do not overlap
            shift = (k - (len(series_all) - 1) / 2) * 0.025
            px = [pos[v] * (1 + shift) if log else pos[v] + shift * (max(pos.values()) - min(pos.values()) or 1)
                  for v in (srows[lay.x] if lay.x else [""] * len(srows))]
            style = dict(color=f"C{k % 10}", marker=MARKERS[k % len(MARKERS)], ms=6)
            ax.plot(px, srows["mean"], label=combo_label(lay.series, svals) or label(rep.metric), **style)
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
            ax.set_title(combo_label(lay.facets, fvals), fontsize=10)
        ax.legend(fontsize=8, title=None)
    return _finish(fig, axes, len(facets), f"{label(rep.metric)} vs {label(lay.x) if lay.x else 'jobs'} — "
                   f"{context_line(rep.df, cells)}\nmean over seeds; bars ±1 std where n ≥ 2", stem)


def plot_traffic(rep: PlottedReport, stem: Path) -> list[str]:
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
        ax.set_title(combo_label(panel_keys, pvals) or "all jobs", fontsize=10)
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
