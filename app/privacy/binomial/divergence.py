"""Divergences of shifted binomial noise and the per-release Renyi curve (the method in
app/privacy/binomial/__init__.py, steps 3 and "Numerics"): the log-PMF table, the divergence
table f_alpha(k) and rho(alpha) = B^2 max_k f_alpha(k) / k^2 + d c0."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.privacy.binomial.truncation import (MAX_LEVELS, ORDERS, REL_SLACK, BinomialCurve, cached_window, check_int,
                                             check_prob, effective_trials, sensitivity)

CHUNK_ELEMENTS = 1 << 17  # rows * window per block of the vectorised divergence computation
_EXP_SAFE = 600.0  # expm1 form when (alpha - 1) * max x < this, log-sum-exp form above

@dataclass(frozen=True)
class Prelude:
    """What every column of the divergence table of Bin(m, p) at g shares: the window's weights
    and the log-PMF table (split into float64 high and low parts)."""

    g: int
    n_w: int
    q: float
    c0: float
    w: np.ndarray
    logw: np.ndarray
    log_sw: float
    hi64: np.ndarray
    lo64: np.ndarray


#: cached longdouble logs of integer ranges: (first integer, np.log of the range)
_LOGS: list[tuple[int, np.ndarray]] = []
_LOGS_KEPT = 8
_LOGS_PAD = 0.125  # a new range is computed this much wider on each side (relative to its length)


def log_ints(lo: int, hi: int) -> np.ndarray:
    """np.log(np.arange(lo, hi + 1, dtype=np.longdouble)), from a cached wider range when one
    holds it (a calibration search asks for overlapping ranges at nearby m; longdouble logs are
    computed element by element, so a slice of a wider range is the same numbers bit for bit)."""
    for start, logs in _LOGS:
        if start <= lo and hi < start + len(logs):
            return logs[lo - start:hi - start + 1]
    pad = int((hi - lo + 1) * _LOGS_PAD)
    start = max(1, lo - pad)
    logs = np.log(np.arange(start, hi + pad + 1, dtype=np.longdouble))
    logs.setflags(write=False)
    _LOGS.insert(0, (start, logs))
    del _LOGS[_LOGS_KEPT:]
    return logs[lo - start:hi - start + 1]


log_ints.cache_clear = _LOGS.clear  # type: ignore[attr-defined]  (cleared with the lru caches)


@functools.lru_cache(maxsize=8)
@np.errstate(divide="ignore", invalid="ignore")
def prelude(m: int, p: float, g: int) -> Prelude | None:
    """The shared part of :func:`divergence_table` (None if the window is empty)."""
    window = cached_window(m, p, g)
    if window is None:
        return None
    lo, hi, q = window
    a = lo - g  # table over t = a .. hi + g
    n_w = hi - lo + 1
    ld = np.longdouble
    # log(m - t + 1) and log(t), t = a + 1 .. hi + g: the same longdouble logs of the same integers
    # as np.log over the arrays (element by element), read from a cache shared by nearby m
    step = log_ints(m - hi - g + 1, m - a)[::-1] - log_ints(a + 1, hi + g) + (np.log(ld(p)) - np.log1p(-ld(p)))
    table = np.concatenate(([ld(0)], np.cumsum(step)))  # log P(a + i) - log P(a)
    hi64 = table.astype(np.float64)
    lo64 = (table - hi64.astype(np.longdouble)).astype(np.float64)
    lw_ld = table[g:g + n_w]
    lmax = lw_ld.max()
    logw_ld = lw_ld - (lmax + np.log(np.sum(np.exp(lw_ld - lmax))))
    logw = logw_ld.astype(np.float64)  # log P~(t), t in W
    w = np.exp(logw)
    log_sw = math.log(float(w.sum()))
    c0 = -math.log1p(-q)
    return Prelude(g, n_w, q, c0, w, logw, log_sw, hi64, lo64)


@np.errstate(divide="ignore", invalid="ignore")
def columns(pre: Prelude, cols: Sequence[int], rows: np.ndarray | None = None) -> np.ndarray:
    """D_alpha(Z~ || Z + s k) + c0 at ORDERS[cols] for the sliding-view rows j = g - k (s = +1)
    and g + k (s = -1), k = 1..g (``rows``: a subset of them, default all 2 g, in the order
    0..g-1, g+1..2g): shape (len(rows), len(cols)). Every entry is computed by the same
    operations whatever ``cols`` is (a column never depends on another), so a subset of columns
    is bit-identical to the same columns of the whole table; the blocks of rows depend on
    ``rows`` and CHUNK_ELEMENTS only. The differences x are formed once per block for all
    ``cols``, in preallocated buffers (the same float64 operations as a fresh array)."""
    g, n_w, w, logw, log_sw = pre.g, pre.n_w, pre.w, pre.logw, pre.log_sw
    # rows j = 0..2g of the sliding view are log P(t - (g - j)), t in W; j = g - k (s = +1), g + k (s = -1)
    view_hi = np.lib.stride_tricks.sliding_window_view(pre.hi64, n_w)
    view_lo = np.lib.stride_tricks.sliding_window_view(pre.lo64, n_w)
    base_hi, base_lo = pre.hi64[g:g + n_w], pre.lo64[g:g + n_w]
    if rows is None:
        rows = np.concatenate((np.arange(0, g), np.arange(g + 1, 2 * g + 1)))
    out = np.empty((len(rows), len(cols)))
    chunk = max(1, CHUNK_ELEMENTS // n_w)
    nrow = min(chunk, len(rows))
    buf, xbuf, ybuf = np.empty((nrow, n_w)), np.empty((nrow, n_w)), np.empty((nrow, n_w))
    sw = math.exp(log_sw)
    for start in range(0, len(rows), chunk):
        sel = rows[start:start + chunk]
        r = len(sel)
        j0, j1 = sel[0], sel[-1] + 1
        x, y = xbuf[:r], ybuf[:r]
        if j1 - j0 == r and (r == 1 or bool(np.all(np.diff(sel) == 1))):  # consecutive rows: a plain view
            np.subtract(base_hi, view_hi[j0:j1], out=x)
            np.subtract(base_lo, view_lo[j0:j1], out=y)
        else:
            np.subtract(base_hi, view_hi[sel], out=x)
            np.subtract(base_lo, view_lo[sel], out=y)
        np.add(x, y, out=x)  # (base_hi - view_hi) + (base_lo - view_lo)
        xmax = x.max(axis=1)
        for c, o in enumerate(cols):
            a1 = ORDERS[o] - 1.0
            small = a1 * xmax < _EXP_SAFE
            vals = np.empty(r)
            if small.all():
                b = buf[:r]
                np.multiply(x, a1, out=b)
                np.expm1(b, out=b)
                vals[:] = np.log1p((b @ w) / sw) / a1
            else:
                if small.any():
                    b = np.expm1(a1 * x[small])
                    vals[small] = np.log1p((b @ w) / sw) / a1
                big = ~small
                yb = logw + a1 * x[big]
                ymax = yb.max(axis=1)
                vals[big] = (ymax + np.log(np.exp(yb - ymax[:, None]).sum(axis=1)) - log_sw) / a1
            out[start:start + r, c] = vals
    # A Renyi divergence is >= 0 (Hoelder: sum_W P~^a Q^(1-a) >= 1 when Q(W) <= 1); a rounding
    # artefact below 0 (log1p(-1) = -inf when every term underflows) is raised to 0: sound.
    out = np.where(np.isnan(out), np.inf, np.maximum(out, 0.0))
    out += pre.c0
    return out


def block_of(pre: Prelude, j: int) -> np.ndarray:
    """The rows of the block of the whole table's default order (0..g-1, g+1..2g, in blocks of
    max(1, CHUNK_ELEMENTS // |W|)) that holds sliding-view row j: computed alone by
    :func:`columns`, that block goes through the very operations it goes through in the table."""
    g = pre.g
    rows = np.concatenate((np.arange(0, g), np.arange(g + 1, 2 * g + 1)))
    chunk = max(1, CHUNK_ELEMENTS // pre.n_w)
    start = ((j if j < g else j - 1) // chunk) * chunk
    return rows[start:start + chunk]


@functools.lru_cache(maxsize=256)
def divergence_table(m: int, p: float, g: int) -> tuple[np.ndarray, float] | None:
    """f_alpha(k) for k = 1..g (rows) at ORDERS (columns), and q; None if the window is empty."""
    pre = prelude(m, p, g)
    if pre is None:
        return None
    out = columns(pre, range(len(ORDERS)))
    f = np.maximum(out[:g][::-1], out[g:])  # row k - 1: max(s = +1 at j = g - k, s = -1 at j = g + k)
    f.setflags(write=False)
    return f, pre.q


def shift_divergences(trials: int, p: float, levels: int) -> np.ndarray:
    """f_alpha(k) = max_{s=+-1} D_alpha(Z~ || Z + s k), Z ~ Bin(trials, p), Z~ = Z given the window:
    an array of shape (levels, len(ORDERS)), row k - 1 for shift k. Raises ValueError if the
    window is empty. (Exactly at ``trials``: no MAX_WINDOW fallback.)"""
    m, p, g = check_int("trials", trials, 1), check_prob(p), check_int("levels", levels, 1, MAX_LEVELS)
    res = divergence_table(m, p, g)
    if res is None:
        raise ValueError(f"empty truncation window for trials={m}, p={p}, levels={g}")
    return np.array(res[0])


@functools.lru_cache(maxsize=4096)
def cached_release_curve(m: int, p: float, g: int, d: int) -> BinomialCurve:
    """:func:`release_curve` on checked arguments (its cached core): rho(alpha) = (B^2 max_k f_alpha(k) / k^2
    + d c0) (1 + REL_SLACK) at the effective trials, tail d q; an empty window is charged inf."""
    res = divergence_table(effective_trials(m, p, g), p, g)
    if res is None:
        return BinomialCurve(rdp=tuple([math.inf] * len(ORDERS)), tail=1.0)
    f, q = res
    k2 = np.arange(1, g + 1, dtype=float) ** 2
    ratio = (f / k2[:, None]).max(axis=0)
    b = sensitivity(g, d)
    rho = (b * b * ratio + d * (-math.log1p(-q))) * (1.0 + REL_SLACK)
    return BinomialCurve(rdp=tuple(float(v) for v in rho), tail=float(d * q))


def release_curve(trials: int, p: float, levels: int, dim: int) -> BinomialCurve:
    """The Renyi curve (at ORDERS) and tail delta of ONE binomial release: Bin(trials, p) noise on
    each of ``dim`` coordinates, records on ``levels`` levels. Cached."""
    return cached_release_curve(check_int("trials", trials, 1), check_prob(p),
                                check_int("levels", levels, 1, MAX_LEVELS), check_int("dim", dim, 1))

