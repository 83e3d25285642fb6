"""The binomial accountant's constants, input checks and truncation window (the method in
app/privacy/binomial/__init__.py, step 1 and the MAX_WINDOW fallback)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from scipy.stats import binom

#: Renyi orders of every curve (compute_epsilon accepts non-integer orders > 1.01).
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

_LOG_TAIL = math.log(TAIL)


@dataclass(frozen=True)
class BinomialCurve:
    """The privacy of ONE binomial release: its Renyi curve at ORDERS and the delta charged for
    its truncated noise tails (d * q)."""

    rdp: tuple[float, ...]
    tail: float


# ----------------------------------------------------------------------------------- validation

def check_int(name: str, value, minimum: int, maximum: int | None = None) -> int:
    """``value`` as an int in [minimum, maximum] (an integral float is accepted); ValueError otherwise."""
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


def check_prob(p) -> float:
    """The success probability p of a trial, in (0, 1)."""
    if isinstance(p, bool) or not isinstance(p, Real) or not (0.0 < float(p) < 1.0):
        raise ValueError(f"p must be a number in (0, 1), got {p!r}")
    return float(p)


def check_delta(delta) -> float:
    """delta in (0, 1)."""
    if isinstance(delta, bool) or not isinstance(delta, Real) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    return float(delta)


def check_epsilon(epsilon) -> float:
    """A positive finite epsilon."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or not (0.0 < float(epsilon) < math.inf):
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
    return float(epsilon)


def check_extra_rdp(extra_rdp: Sequence[float] | None) -> np.ndarray:
    """Extra Renyi values, one non-negative value per order of ORDERS (None: zeros)."""
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

def largest_true(pred, lo: int, hi: int) -> int:
    """Largest integer u in [lo, hi] with pred(u), given pred(lo) and not pred(hi), pred monotone."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _bracket(pred, lo: int, hi: int, near_lo: float, near_hi: float) -> tuple[int, int]:
    """[a, b] inside [lo, hi] with pred(a) and not pred(b) around the guesses (the full range if
    they do not bracket): :func:`largest_true` then returns the same integer with fewer steps."""
    a, b = max(lo, math.floor(near_lo)), min(hi, math.ceil(near_hi))
    if a < b and (a == lo or pred(a)) and (b == hi or not pred(b)):
        return a, b
    return lo, hi


@functools.lru_cache(maxsize=256)
def cached_window(m: int, p: float, g: int) -> tuple[int, int, float] | None:
    """(lo, hi, q) of the truncation window, or None if it is empty. The searches start from a
    bracket of 9 to 18 standard deviations around the mean (a tail of 1e-40 is ~13 of a normal)."""
    below = lambda u: binom.logcdf(u, m, p) <= _LOG_TAIL  # noqa: E731  P(Z <= u) <= TAIL
    above = lambda t: binom.logsf(t, m, p) <= _LOG_TAIL  # noqa: E731  P(Z > t) <= TAIL
    mu, sd = m * p, math.sqrt(m * p * (1 - p))
    # below(-1) holds, below(m) does not (cdf(m) = 1)
    lo_tau = largest_true(below, *_bracket(below, -1, m, mu - 18 * sd, mu - 9 * sd)) + 1
    not_above = lambda t: not above(t)  # noqa: E731
    # smallest t with above(t); above(m) holds
    hi_tau = largest_true(not_above, *_bracket(not_above, -1, m, mu + 9 * sd, mu + 18 * sd)) + 1
    lo, hi = max(g, lo_tau), min(m - g, hi_tau)
    if lo > hi:
        return None
    q = math.exp(binom.logcdf(lo - 1, m, p)) + math.exp(binom.logsf(hi, m, p))
    return lo, hi, q


def effective_trials(m: int, p: float, g: int) -> int:
    """m, or the largest m' <= m whose log-PMF table fits MAX_WINDOW (post-processing)."""
    def fits(n: int) -> bool:
        w = cached_window(n, p, g)
        return w is None or (w[1] - w[0] + 1 + 2 * g) <= MAX_WINDOW
    if fits(m):
        return m
    sd_max = (MAX_WINDOW - 2 * g) / 30.0  # a window is < 30 standard deviations long
    lo = max(1, min(m - 1, int(sd_max * sd_max / (p * (1 - p)))))
    while not fits(lo):
        lo //= 2
    return largest_true(fits, lo, m)


def window(trials: int, p: float, levels: int) -> tuple[int, int, float] | None:
    """(lo, hi, q): the truncation window [lo, hi] and its exact tail mass q, or None if empty."""
    return cached_window(check_int("trials", trials, 1), check_prob(p), check_int("levels", levels, 1, MAX_LEVELS))
