"""Exact numerical Renyi accountant for the binomial vector-summation mechanism of shuffle DP.

The mechanism (Cheu, Joseph, Mao & Peng 2021; the paper's Appendix D). One release shows the
analyst, for each coordinate j of [d],

    T_j = S_j + Z_j,    Z_j ~ Bin(m, p) iid over coordinates,

where m is the total number of noise trials of the exchange and S_j is an integer: the sum of
the records' randomly rounded levels in {0..g}. Replacing ONE record changes the vector S by an
integer vector Delta with |Delta_j| <= g for every j and ||Delta||_2 <= B, where

    B = min(g + sqrt(d), g * sqrt(d))

(g + sqrt(d): the level scale plus what coupled randomized rounding can add; g * sqrt(d) follows
from |Delta_j| <= g alone and is the smaller one when d = 1 or g = 1). This module bounds the
privacy of R such releases (composed, adaptively) as (epsilon, delta).

Method (rigorous up to floating-point error, see "Numerics").

1. Truncation. Let W = [lo, hi] with lo = max(g, lo_tau), hi = min(m - g, hi_tau), where
   lo_tau is the largest integer with P(Z < lo_tau) <= TAIL and hi_tau the smallest with
   P(Z > hi_tau) <= TAIL (TAIL = 1e-40): the narrowest window whose tails are each <= TAIL,
   cut to [g, m - g] so that W -+ k stays inside the support {0..m} of Z for every shift
   k <= g. The tail mass q = P(Z < lo) + P(Z > hi) is computed exactly with
   scipy.stats.binom.logcdf / logsf (never as 1 - a sum). If W is empty (m < 2 g, or the
   tails are too heavy), the release is charged epsilon = inf.

2. The ideal mechanism. Let Z~ = Z conditioned on W, and let the *ideal* mechanism draw every
   noise coordinate of every release from Z~ instead of Z. The real mechanism on a dataset D
   and the ideal one on D are coupled so that they differ only when some noise coordinate falls
   outside W: their total-variation distance is at most R * d * q (union bound over
   coordinates and releases; adaptivity does not matter, each coordinate's noise is
   independent of everything before it).

3. Renyi divergence of the ideal mechanism on D against the real one on a neighbour D'. Per
   coordinate and shift k in {1..g},

       f_alpha(k) = max over s in {+1, -1} of D_alpha(Z~ || Z + s k),

   finite because W + s k lies inside {0..m}; f_alpha(0) = D_alpha(Z~ || Z) = -log(1 - q) =: c0.
   The coordinates of one release are independent given the release's input, so the
   divergence of one release is sum_j f_alpha(|Delta_j|). Randomized rounding: the released
   sum is a mixture, over the rounding uniforms U, of (S(U) + noise); coupling both
   neighbours' roundings with the same U and using joint quasi-convexity of the Renyi
   divergence (D_alpha(mix P_U || mix Q_U) <= sup_U D_alpha(P_U || Q_U)) leaves the worst
   integer Delta satisfying the bounds above. The knapsack (LP) relaxation of
   max sum_j f_alpha(|Delta_j|) subject to sum_j Delta_j^2 <= B^2 gives the per-release curve

       rho(alpha) = B^2 * max_{1<=k<=g} f_alpha(k) / k^2  +  d * c0

   (the d * c0 covers the coordinates with Delta_j = 0; it is ~1e-37). Both orders of a
   neighbouring pair are covered because the max runs over s = +-1 (the neighbour relation is
   symmetric). Adaptive composition of Renyi DP over releases adds the curves.

4. Conversion. RDP of (ideal on D || real on D') at order alpha gives, by the conversion of
   Canonne, Kamath & Steinke 2020 (dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon),
   P_ideal(D)[E] <= e^eps P_real(D')[E] + delta' for every event E; with step 2,
   P_real(D)[E] <= e^eps P_real(D')[E] + delta' + R d q. So the composition is
   (eps, delta' + total tail)-DP: the delta handed to the conversion is delta - total tail,
   and epsilon is inf if the tails alone use up delta.

More trials than m can only help: Bin(m + m', p) = Bin(m, p) + Bin(m', p) independent, and
adding independent noise is post-processing. The module uses this only in one place: when the
window of m trials would be longer than MAX_WINDOW entries (m of order 1e11 at p = 1/4), the
curve of the largest m' <= m whose window fits is returned instead (a valid, slightly looser,
bound for m).

Numerics. log P(t) is tabulated once over [lo - g, hi + g] as a cumulative sum, in extended
precision, of the exact successive ratios log P(t)/P(t-1) = log((m - t + 1) p / (t (1 - p)));
the differences log P(t) - log P(t - s k) are then accurate to ~1e-17 absolute (a plain
float64 log-PMF of a binomial with m = 1e7 is accurate only to ~1e-9, more than the divergence
for k = 1 when m is large). D_alpha is evaluated as log1p(sum_t w_t expm1((alpha-1) x_t)) /
(alpha - 1) (relative error ~1e-12) and in log-sum-exp form where (alpha - 1) x_t is large. A
relative slack of REL_SLACK = 1e-9 is added to every rho for the remaining rounding.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from scipy.stats import binom

from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from app.privacy import amplification

#: Renyi orders of every curve in this module (compute_epsilon accepts non-integer orders > 1.01).
ORDERS: tuple[float, ...] = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0,
                             20.0, 24.0, 32.0, 48.0, 64.0, 128.0, 256.0)
#: Each tail of the truncation window has probability at most TAIL (unless cut at g or m - g).
TAIL: float = 1e-40
#: Largest level scale g accepted: the accounting costs O(g * sqrt(m * p * (1 - p)) * len(ORDERS)).
MAX_LEVELS: int = 4096
#: Longest log-PMF table (window plus 2 g); longer ones fall back to fewer trials (see the docstring).
MAX_WINDOW: int = 1 << 22
#: Relative slack added to every rho for floating-point rounding.
REL_SLACK: float = 1e-9

_CHUNK_ELEMENTS = 1 << 17  # rows * window per block of the vectorised divergence computation
_LOG_TAIL = math.log(TAIL)
_EXP_SAFE = 600.0  # expm1 form when (alpha - 1) * max x < this, log-sum-exp form above


@dataclass(frozen=True)
class BinomialCurve:
    """The privacy of ONE binomial release: its Renyi curve at ORDERS and the delta charged for
    its truncated noise tails (d * q)."""

    rdp: tuple[float, ...]
    tail: float


# ----------------------------------------------------------------------------------- validation

def _int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (Integral, Real)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, Real) and not isinstance(value, Integral):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    v = int(value)
    if v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value!r}")
    return v


def _prob(p) -> float:
    if isinstance(p, bool) or not isinstance(p, Real) or not (0.0 < float(p) < 1.0):
        raise ValueError(f"p must be a number in (0, 1), got {p!r}")
    return float(p)


def _delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, Real) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def _epsilon(epsilon) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or not (0.0 < float(epsilon) < math.inf):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    return float(epsilon)


def _extra(extra_rdp: Sequence[float] | None) -> np.ndarray:
    if extra_rdp is None:
        return np.zeros(len(ORDERS))
    extra = np.asarray(extra_rdp, dtype=float)
    if extra.shape != (len(ORDERS),):
        raise ValueError(f"extra_rdp must have one value per order ({len(ORDERS)}), got shape {extra.shape}")
    if np.any(np.isnan(extra)) or np.any(extra < 0):
        raise ValueError("extra_rdp must be non-negative")
    return extra


def sensitivity(levels: int, dim: int) -> float:
    """B: the L2 bound on the change of the integer sum vector when one record is replaced."""
    return min(levels + math.sqrt(dim), levels * math.sqrt(dim))


# ------------------------------------------------------------------------------ the window

def _largest(pred, lo: int, hi: int) -> int:
    """Largest integer u in [lo, hi] with pred(u), given pred(lo) and not pred(hi), pred monotone."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _window(m: int, p: float, g: int) -> tuple[int, int, float] | None:
    """(lo, hi, q) of the truncation window, or None if it is empty."""
    below = lambda u: binom.logcdf(u, m, p) <= _LOG_TAIL  # noqa: E731  P(Z <= u) <= TAIL
    above = lambda t: binom.logsf(t, m, p) <= _LOG_TAIL  # noqa: E731  P(Z > t) <= TAIL
    lo_tau = _largest(below, -1, m) + 1  # below(-1) holds, below(m) does not (cdf(m) = 1)
    hi_tau = _largest(lambda t: not above(t), -1, m) + 1  # smallest t with above(t); above(m) holds
    lo, hi = max(g, lo_tau), min(m - g, hi_tau)
    if lo > hi:
        return None
    q = math.exp(binom.logcdf(lo - 1, m, p)) + math.exp(binom.logsf(hi, m, p))
    return lo, hi, q


def _effective_trials(m: int, p: float, g: int) -> int:
    """m, or the largest m' <= m whose log-PMF table fits MAX_WINDOW (post-processing)."""
    def fits(n: int) -> bool:
        w = _window(n, p, g)
        return w is None or (w[1] - w[0] + 1 + 2 * g) <= MAX_WINDOW
    if fits(m):
        return m
    sd_max = (MAX_WINDOW - 2 * g) / 30.0  # a window is < 30 standard deviations long
    lo = max(1, min(m - 1, int(sd_max * sd_max / (p * (1 - p)))))
    while not fits(lo):
        lo //= 2
    return _largest(fits, lo, m)


# ------------------------------------------------------------------------- divergences

@dataclass(frozen=True)
class _Prelude:
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


@functools.lru_cache(maxsize=8)
@np.errstate(divide="ignore", invalid="ignore")
def _prelude(m: int, p: float, g: int) -> _Prelude | None:
    """The shared part of :func:`_divergence_table` (None if the window is empty)."""
    window = _window(m, p, g)
    if window is None:
        return None
    lo, hi, q = window
    a = lo - g  # table over t = a .. hi + g
    n_w = hi - lo + 1
    t = np.arange(a + 1, hi + g + 1, dtype=np.longdouble)
    ld = np.longdouble
    step = np.log(ld(m) - t + 1) - np.log(t) + (np.log(ld(p)) - np.log1p(-ld(p)))
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
    return _Prelude(g, n_w, q, c0, w, logw, log_sw, hi64, lo64)


@np.errstate(divide="ignore", invalid="ignore")
def _columns(pre: _Prelude, cols: Sequence[int], rows: np.ndarray | None = None) -> np.ndarray:
    """D_alpha(Z~ || Z + s k) + c0 at ORDERS[cols] for the sliding-view rows j = g - k (s = +1)
    and g + k (s = -1), k = 1..g (``rows``: a subset of them, default all 2 g, in the order
    0..g-1, g+1..2g): shape (len(rows), len(cols)). Every entry is computed by the same
    operations whatever ``cols`` is (a column never depends on another), so a subset of columns
    is bit-identical to the same columns of the whole table."""
    g, n_w, w, logw, log_sw = pre.g, pre.n_w, pre.w, pre.logw, pre.log_sw
    # rows j = 0..2g of the sliding view are log P(t - (g - j)), t in W; j = g - k (s = +1), g + k (s = -1)
    view_hi = np.lib.stride_tricks.sliding_window_view(pre.hi64, n_w)
    view_lo = np.lib.stride_tricks.sliding_window_view(pre.lo64, n_w)
    base_hi, base_lo = pre.hi64[g:g + n_w], pre.lo64[g:g + n_w]
    if rows is None:
        rows = np.concatenate((np.arange(0, g), np.arange(g + 1, 2 * g + 1)))
    out = np.empty((len(rows), len(cols)))
    chunk = max(1, _CHUNK_ELEMENTS // n_w)
    buf = np.empty((chunk, n_w))
    for start in range(0, len(rows), chunk):
        sel = rows[start:start + chunk]
        r = len(sel)
        j0, j1 = sel[0], sel[-1] + 1
        if j1 - j0 == r:
            x = (base_hi - view_hi[j0:j1]) + (base_lo - view_lo[j0:j1])
        else:
            x = (base_hi - view_hi[sel]) + (base_lo - view_lo[sel])
        xmax = x.max(axis=1)
        for c, o in enumerate(cols):
            a1 = ORDERS[o] - 1.0
            small = a1 * xmax < _EXP_SAFE
            vals = np.empty(r)
            if small.all():
                b = buf[:r]
                np.multiply(x, a1, out=b)
                np.expm1(b, out=b)
                vals[:] = np.log1p((b @ w) / math.exp(log_sw)) / a1
            else:
                if small.any():
                    b = np.expm1(a1 * x[small])
                    vals[small] = np.log1p((b @ w) / math.exp(log_sw)) / a1
                big = ~small
                y = logw + a1 * x[big]
                ymax = y.max(axis=1)
                vals[big] = (ymax + np.log(np.exp(y - ymax[:, None]).sum(axis=1)) - log_sw) / a1
            out[start:start + r, c] = vals
    # A Renyi divergence is >= 0 (Hoelder: sum_W P~^a Q^(1-a) >= 1 when Q(W) <= 1); a rounding
    # artefact below 0 (log1p(-1) = -inf when every term underflows) is raised to 0: sound.
    out = np.where(np.isnan(out), np.inf, np.maximum(out, 0.0))
    out += pre.c0
    return out


@functools.lru_cache(maxsize=256)
def _divergence_table(m: int, p: float, g: int) -> tuple[np.ndarray, float] | None:
    """f_alpha(k) for k = 1..g (rows) at ORDERS (columns), and q; None if the window is empty."""
    pre = _prelude(m, p, g)
    if pre is None:
        return None
    out = _columns(pre, range(len(ORDERS)))
    f = np.maximum(out[:g][::-1], out[g:])  # row k - 1: max(s = +1 at j = g - k, s = -1 at j = g + k)
    f.setflags(write=False)
    return f, pre.q


def shift_divergences(trials: int, p: float, levels: int) -> np.ndarray:
    """f_alpha(k) = max_{s=+-1} D_alpha(Z~ || Z + s k), Z ~ Bin(trials, p), Z~ = Z given the window:
    an array of shape (levels, len(ORDERS)), row k - 1 for shift k. Raises ValueError if the
    window is empty. (Exactly at ``trials``: no MAX_WINDOW fallback.)"""
    m, p, g = _int("trials", trials, 1), _prob(p), _int("levels", levels, 1, MAX_LEVELS)
    res = _divergence_table(m, p, g)
    if res is None:
        raise ValueError(f"empty truncation window for trials={m}, p={p}, levels={g}")
    return np.array(res[0])


def window(trials: int, p: float, levels: int) -> tuple[int, int, float] | None:
    """(lo, hi, q): the truncation window [lo, hi] and its exact tail mass q, or None if empty."""
    return _window(_int("trials", trials, 1), _prob(p), _int("levels", levels, 1, MAX_LEVELS))


@functools.lru_cache(maxsize=4096)
def _curve(m: int, p: float, g: int, d: int) -> BinomialCurve:
    res = _divergence_table(_effective_trials(m, p, g), p, g)
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
    return _curve(_int("trials", trials, 1), _prob(p), _int("levels", levels, 1, MAX_LEVELS),
                  _int("dim", dim, 1))


@functools.lru_cache(maxsize=4096)
def _amplified(m: int, p: float, g: int, d: int, gamma: float) -> BinomialCurve:
    plain = _curve(m, p, g, d)
    if gamma >= 1.0:
        return plain
    res = _divergence_table(_effective_trials(m, p, g), p, g)
    if res is None:
        return plain
    log_c = d * (-math.log1p(-res[1]))
    rdp = amplification.amplified_curve(ORDERS, plain.rdp, gamma, log_c)
    return BinomialCurve(rdp=tuple(float(v) for v in rdp), tail=plain.tail)


def amplified_release_curve(trials: int, p: float, levels: int, dim: int, gamma: float) -> BinomialCurve:
    """:func:`release_curve` of a release whose batch of K records is drawn without replacement
    from the silo's n, gamma = K / n: the same tail (charged once per release), the Renyi curve
    amplified by sampling (app/privacy/amplification.py; gamma = 1: the plain curve). Cached."""
    gamma = float(gamma)
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    return _amplified(_int("trials", trials, 1), _prob(p), _int("levels", levels, 1, MAX_LEVELS), _int("dim", dim, 1),
                      gamma)


# ------------------------------------------------------------- lazy curves (for calibration)

#: relative margin taken off a lower bound computed from a few rows (a matrix-vector product
#: over fewer rows may round differently in the last bits)
_LB_MARGIN = 1e-6


class LazyCurve:
    """:func:`release_curve` of (trials, p, levels) computed one order at a time, for searches
    that need only a few orders: ``ratio(o)`` is max_k f_alpha(k) / k^2 at ORDERS[o], bit-identical
    to the whole table's column (:func:`_columns`); ``ratio_lower(o)`` is a cheap lower bound of it
    from the shifts k in {1, 2, g/2, g} only (max over fewer k; minus a relative margin)."""

    def __init__(self, m: int, p: float, g: int) -> None:
        self.m, self.p, self.g = m, p, g
        self.pre = _prelude(_effective_trials(m, p, g), p, g)
        self._exact: dict[int, float] = {}
        self._lower: np.ndarray | None = None

    @property
    def empty(self) -> bool:
        return self.pre is None

    def _ratio_of(self, out: np.ndarray, ks: np.ndarray) -> np.ndarray:
        n = len(ks)
        f = np.maximum(out[:n], out[n:])  # s = +1 rows, then s = -1 rows, same k order
        return (f / (ks.astype(float) ** 2)[:, None]).max(axis=0)

    def ratio(self, o: int) -> float:
        if o not in self._exact:
            g = self.g
            out = _columns(self.pre, (o,))
            f = np.maximum(out[:g][::-1], out[g:])
            k2 = np.arange(1, g + 1, dtype=float) ** 2
            self._exact[o] = float((f / k2[:, None]).max(axis=0)[0])
        return self._exact[o]

    def ratio_lower(self, o: int) -> float:
        if self._lower is None:
            g = self.g
            ks = np.array(sorted({k for k in (1, 2, g // 2, g) if 1 <= k <= g}))
            rows = np.concatenate((g - ks, g + ks))
            self._lower = self._ratio_of(_columns(self.pre, range(len(ORDERS)), rows), ks)
        return float(self._lower[o]) * (1.0 - _LB_MARGIN)

    def ratio_guess(self, o: int) -> float:
        """ratio_lower without the margin (the search's cheap stand-in: no bound is claimed)."""
        self.ratio_lower(o)
        return float(self._lower[o])

    def rho(self, o: int, dim: int, lower: bool | str = False) -> float:
        """rho(alpha) of :func:`release_curve` at ORDERS[o] (``lower``: a lower bound of it;
        "guess": the same from the few rows without the margin)."""
        b = sensitivity(self.g, dim)
        ratio = (self.ratio_guess(o) if lower == "guess" else self.ratio_lower(o) if lower else self.ratio(o))
        return float((b * b * np.float64(ratio) + dim * (-math.log1p(-self.pre.q))) * (1.0 + REL_SLACK))

    def tail(self, dim: int) -> float:
        return 1.0 if self.pre is None else float(dim * self.pre.q)


@functools.lru_cache(maxsize=64)
def lazy_curve(trials: int, p: float, levels: int) -> LazyCurve:
    """The cached :class:`LazyCurve` of Bin(trials, p) noise on ``levels`` levels."""
    return LazyCurve(_int("trials", trials, 1), _prob(p), _int("levels", levels, 1, MAX_LEVELS))


def _next_order(j: int) -> int:
    """Index of the smallest order in ORDERS >= j (len(ORDERS) if none)."""
    for i, a in enumerate(ORDERS):
        if a >= j:
            return i
    return len(ORDERS)


def _amplified_rho(curve: LazyCurve, o: int, dim: int, lower: bool | str, gamma: float) -> float:
    """ORDERS[o]'s value of :func:`amplified_release_curve`, from the lazy curve's columns (the
    same numbers when ``lower`` is False; a lower bound when True: the bound is non-decreasing in
    every rho(j))."""
    plain = curve.rho(o, dim, lower)
    if gamma >= 1.0:
        return plain

    def rho_at(j: int, low: bool | str = lower) -> float:
        i = _next_order(j)
        return math.inf if i == len(ORDERS) else curve.rho(i, dim, low)

    log_c = dim * (-math.log1p(-curve.pre.q))
    if lower is False:
        # the amplified value from the lower-bound columns bounds it from below: when that is
        # already >= the plain value, the answer is the plain value (no other exact column needed)
        floor = amplification.amplified_curve([ORDERS[o]], [plain], gamma, log_c,
                                              rho_at=lambda j: rho_at(j, True))[0]
        if floor >= plain:
            return plain
    return amplification.amplified_curve([ORDERS[o]], [plain], gamma, log_c, rho_at=rho_at)[0]


def _order_epsilon(alpha: float, r: float, delta: float) -> float:
    """dp_accounting's compute_epsilon at one order (the same cases and operations)."""
    if r < 0:
        return 0.0
    if delta ** 2 + math.expm1(-r) > 0:
        return 0.0
    if alpha > 1.01:
        return r + math.log1p(-1 / alpha) - math.log(delta * alpha) / (alpha - 1)
    return math.inf


def fast_epsilon(parts: Sequence[tuple], delta: float, extra_rdp: Sequence[float] | None = None,
                 guess: bool = False) -> float:
    """The number :func:`epsilon_from_curves` gives for ``count`` releases of each
    (trials, p, levels, dim, count[, gamma]) in ``parts`` (curves of :func:`release_curve`, or of
    :func:`amplified_release_curve` when a sampling rate gamma < 1 is given), bit for bit,
    computing as few orders as it can: branch and bound over the orders, each order's epsilon
    bounded from below by the lower-bound rows of :class:`LazyCurve` (the conversion is
    non-decreasing in the Renyi value), the exact column computed only for orders whose lower
    bound beats the best exact epsilon so far (an amplified value is non-decreasing in every
    column it reads, so lower columns bound it from below too).
    ``guess``: the epsilon of the few rows alone at every order (cheap; for a search's first
    steps only, no bound claimed)."""
    delta = _delta(delta)
    extra = _extra(extra_rdp)
    items = []
    tail = 0.0
    for part in parts:
        trials, p, levels, dim, count = part[:5]
        gamma = float(part[5]) if len(part) > 5 else 1.0
        count = _int("count", count, 0)
        if count == 0:
            continue
        curve = lazy_curve(trials, p, levels)
        items.append((curve, _int("dim", dim, 1), count, gamma))
        tail += count * curve.tail(dim)
    if tail >= delta:
        return math.inf
    if any(c.empty for c, _, _, _ in items):
        return math.inf  # an empty window: rho = inf and tail 1 >= delta (caught above); kept for safety

    def rdp_at(o: int, lower: bool | str) -> float:
        r = extra[o]
        for c, d, count, gamma in items:
            r = r + count * np.float64(_amplified_rho(c, o, d, lower, gamma))
        return float(r)

    if not items:
        return epsilon_from_curves([], delta, extra_rdp=extra)
    if guess:
        approx = [rdp_at(o, "guess") for o in range(len(ORDERS))]
        return float(compute_epsilon(ORDERS, approx, delta - tail)[0]) if any(v > 0 for v in approx) else 0.0
    lower = [rdp_at(o, True) for o in range(len(ORDERS))]
    if not any(v > 0 for v in lower):
        exact = [rdp_at(o, False) for o in range(len(ORDERS))]
        if not any(v > 0 for v in exact):
            return 0.0
        return float(compute_epsilon(ORDERS, exact, delta - tail)[0])
    d_conv = delta - tail
    bounds = sorted((_order_epsilon(ORDERS[o], lower[o], d_conv), o) for o in range(len(ORDERS)))
    best = math.inf
    for lb, o in bounds:
        if lb >= best:
            break
        best = min(best, _order_epsilon(ORDERS[o], rdp_at(o, False), d_conv))
    return float(max(0, best))


# ---------------------------------------------------------------------------- composition

def epsilon_from_curves(parts: Sequence[tuple[BinomialCurve, int]], delta: float,
                        extra_rdp: Sequence[float] | None = None) -> float:
    """epsilon at ``delta`` of the composition of ``count`` releases of each curve in ``parts``
    (plus ``extra_rdp``, e.g. Gaussian releases' RDP at ORDERS): RDP curves add, tails add and are
    subtracted from delta before the RDP conversion; inf if the tails use up delta."""
    delta = _delta(delta)
    rdp = _extra(extra_rdp).copy()
    tail = 0.0
    for curve, count in parts:
        count = _int("count", count, 0)
        if count == 0:
            continue
        rdp += count * np.asarray(curve.rdp, dtype=float)
        tail += count * curve.tail
    if tail >= delta:
        return math.inf
    if not np.any(rdp > 0):
        return 0.0
    eps, _ = compute_epsilon(ORDERS, rdp.tolist(), delta - tail)
    return float(eps)


def binomial_epsilon(trials: int, p: float, levels: int, dim: int, count: int, delta: float) -> float:
    """epsilon at ``delta`` of ``count`` identical binomial releases."""
    count = _int("count", count, 0)
    return epsilon_from_curves([(release_curve(trials, p, levels, dim), count)], delta)


def gaussian_rdp(noise_multiplier: float) -> tuple[float, ...]:
    """RDP of one unsampled Gaussian release with multiplier z (std / L2 sensitivity) at ORDERS:
    alpha / (2 z^2)."""
    z = float(noise_multiplier)
    if not z > 0:
        raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier!r}")
    return tuple(a / (2 * z * z) for a in ORDERS)


# ---------------------------------------------------------------------------- calibration

def _gaussian_guess(epsilon: float, delta: float, p: float, levels: int, dim: int, count: int,
                    extra: np.ndarray) -> int:
    """Trials at which the Gaussian approximation of the release (std sqrt(m p (1-p)), shift B)
    meets epsilon: a starting point for the exact search."""
    b = sensitivity(levels, dim)

    def eps_at(z: float) -> float:
        rdp = extra + count * np.asarray(gaussian_rdp(z))
        return float(compute_epsilon(ORDERS, rdp.tolist(), delta)[0])

    lo, hi = 1e-3, 1.0
    while eps_at(hi) > epsilon and hi < 1e12:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps_at(mid) <= epsilon else (mid, hi)
    sd = hi * b
    return max(1, int(math.ceil(sd * sd / (p * (1 - p)))))


def calibrate_trials(epsilon: float, delta: float, p: float, levels: int, dim: int, count: int,
                     extra_rdp: Sequence[float] | None = None, gamma: float = 1.0) -> int:
    """The smallest number of trials m with binomial_epsilon(m, p, levels, dim, count, delta) <= epsilon
    (composed with ``extra_rdp`` if given): an integer m with eps(m) <= epsilon < eps(m - 1) (m = 1
    if eps(1) already meets it), found by bracketing from the Gaussian approximation (geometric
    steps out) and safeguarded interpolation / bisection over the integers. ValueError if no m
    reaches epsilon (e.g. extra_rdp alone exceeds it). ``gamma`` < 1: every release's batch is
    sampled without replacement at rate gamma (:func:`amplified_release_curve`)."""
    epsilon, delta, p = _epsilon(epsilon), _delta(delta), _prob(p)
    g, d, count = _int("levels", levels, 1, MAX_LEVELS), _int("dim", dim, 1), _int("count", count, 0)
    extra = _extra(extra_rdp)

    def eps(m: int) -> float:  # epsilon_from_curves([(release_curve(m, p, g, d), count)], ...), bit for bit
        return fast_epsilon([(m, p, g, d, count, gamma)], delta, extra_rdp=extra)

    if eps(1) <= epsilon:
        return 1
    floor = float(compute_epsilon(ORDERS, extra.tolist(), delta)[0]) if np.any(extra > 0) else 0.0
    if count == 0 or floor >= epsilon:
        raise ValueError(f"epsilon {epsilon} not reachable: extra_rdp alone gives epsilon {floor}")
    m0 = max(2, _gaussian_guess(epsilon, delta, p, g, d, count, extra))
    # the crossing of the cheap stand-in (the few shifts that decide rho), then the exact one near it
    near = _crossing(lambda m: fast_epsilon([(m, p, g, d, count, gamma)], delta, extra_rdp=extra, guess=True),
                     epsilon, m0, p, g)
    return _settle(eps, epsilon, near)


def _crossing(eps, epsilon: float, m0: int, p: float, g: int) -> int:
    """An m with eps(m) <= epsilon < eps(m - 1), by bracketing from m0 (geometric steps out) and
    safeguarded interpolation of log eps in log m / bisection over the integers (eps(1) > epsilon)."""
    e0 = eps(m0)
    # bracket: lo fails (eps > epsilon), hi passes
    factor = 1.02
    if e0 <= epsilon:
        hi, e_hi = m0, e0
        lo = max(1, int(hi / factor))
        while (e_lo := eps(lo)) <= epsilon:
            hi, e_hi = lo, e_lo
            factor *= factor
            lo = max(1, int(hi / factor))
    else:
        lo, e_lo = m0, e0
        hi = int(math.ceil(lo * factor)) + 1
        while (e_hi := eps(hi)) > epsilon:
            if _effective_trials(hi, p, g) < hi:  # eps is flat from here on
                raise ValueError(f"epsilon {epsilon} not reachable: the window limit MAX_WINDOW "
                                 f"caps the accounted trials near {_effective_trials(hi, p, g)}")
            lo, e_lo = hi, e_hi
            factor *= factor
            hi = int(math.ceil(lo * factor)) + 1
    bisect_next = False
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if not bisect_next and math.isfinite(e_lo) and e_lo > 0 and e_hi > 0 and e_lo != e_hi:
            # log eps roughly linear in log m
            frac = (math.log(e_lo) - math.log(epsilon)) / (math.log(e_lo) - math.log(e_hi))
            guess = math.exp(math.log(lo) + frac * (math.log(hi) - math.log(lo)))
            mid = min(hi - 1, max(lo + 1, int(round(guess))))
        width = hi - lo
        e_mid = eps(mid)
        if e_mid <= epsilon:
            hi, e_hi = mid, e_mid
        else:
            lo, e_lo = mid, e_mid
        bisect_next = (hi - lo) * 2 > width and not bisect_next
    return hi


def _settle(eps, epsilon: float, near: int) -> int:
    """An m with eps(m) <= epsilon < eps(m - 1) (eps(1) > epsilon), searched from ``near`` (the
    crossing of a close stand-in): galloping steps down or up, then bisection. Two evaluations
    of eps when ``near`` is the crossing."""
    if eps(near) <= epsilon:
        hi, step = near, 1
        lo = max(1, hi - step)
        while lo > 1 and eps(lo) <= epsilon:
            hi, step = lo, step * 2
            lo = max(1, hi - step)
    else:
        lo, step = near, 1
        hi = lo + step
        while eps(hi) > epsilon:
            if step > 1 << 40:
                raise ValueError(f"epsilon {epsilon} not reachable near {near} trials")
            lo, step = hi, step * 2
            hi = lo + step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if eps(mid) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------------------- closed form

def closed_form(epsilon: float, delta: float, messages: int, dim: int) -> tuple[int, int, float]:
    """The paper's parameter choice for the binomial protocol, *the closed form as we read it*
    (Cheu, Joseph, Mao & Peng 2021; Lowy et al., Appendix D): with N = ``messages``,

        g = ceil(max(2 sqrt(N), d, 4)),   p = 1/4,
        b = ceil(24e4 * g^2 * ln(4 (d^2 + 1) / delta)^2 / (epsilon^2 * N))

    noise trials PER MESSAGE, so the exchange carries N * b trials in total. Returns (g, b, p)."""
    epsilon, delta = _epsilon(epsilon), _delta(delta)
    n, d = _int("messages", messages, 1), _int("dim", dim, 1)
    two_sqrt_n = math.isqrt(4 * n - 1) + 1 if n > 0 else 0  # ceil(2 sqrt(N)) exactly
    g = max(two_sqrt_n, d, 4)
    b = math.ceil(24e4 * g * g * math.log(4 * (d * d + 1) / delta) ** 2 / (epsilon * epsilon * n))
    return g, int(b), 0.25


def calibration_table(epsilons: Sequence[float] = (1.0, 3.0), dims: Sequence[int] = (10, 100, 1000),
                      messages: Sequence[int] = (100, 1000), delta: float = 1e-5, count: int = 1,
                      max_levels: int | None = None) -> list[dict]:
    """Closed form against the exact accountant: for each (epsilon, d, N), the closed form's
    (g, b, N b) and the exact accountant's minimal total trials at the SAME g and p = 1/4 for
    ``count`` releases, with the ratio N b / m. Rows with g > ``max_levels`` get exact_trials None
    (the exact search costs ~g sqrt(m) per evaluation)."""
    rows = []
    for eps in epsilons:
        for d in dims:
            for n in messages:
                g, b, p = closed_form(eps, delta, n, d)
                row = {"epsilon": eps, "dim": d, "messages": n, "levels": g, "p": p,
                       "per_message": b, "closed_total": n * b, "exact_trials": None, "ratio": None}
                if max_levels is None or g <= max_levels:
                    m = calibrate_trials(eps, delta, p, g, d, count)
                    row["exact_trials"] = m
                    row["ratio"] = n * b / m
                rows.append(row)
    return rows
