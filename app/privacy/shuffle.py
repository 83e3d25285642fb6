"""The binomial vector-summation protocol of shuffle DP (the paper's Appendix D, Algorithms 4 P_1D
and 5 P_vec, after Cheu, Joseph, Mao and Peng 2021), vectorised.

Randomizer (silo side), for K records x_i in R^d with |x_ij| <= R (rows clipped to L2 norm R):

    a_ij = g (x_ij + R) / (2R)           in [0, g]      (shift into [0, 2R], g levels)
    r_ij = floor(a_ij + U_ij)            U_ij ~ U[0, 1): randomized rounding, E r_ij = a_ij
    c_j  = sum_i r_ij + Bin(K b, p)                      (each record's b noise bits, summed)

In the paper each record's coordinate becomes g + b bits, of which r_ij + Bin(b, p) are 1, and
the shuffler permutes all bits; the shuffled multiset reveals exactly the per-coordinate number
of ones, so a silo sends c_j (an integer in [0, K(g + b)]) instead of the bits and the shuffler
sums: T_j = sum over contributions of c_j. Cost: O(K d) for the rounding plus d binomial draws.

Analyzer (server side, from the shuffler's totals, the number of records N and of noise trials
m = sum of the contributions' K b):

    sum_i x_ij  ~=  o_j = (2R / g) (T_j - p m) - N R,         mean = o / N.

o is unbiased: E[T_j] = sum_i a_ij + p m and sum_i a_ij = (g / 2R) (sum_i x_ij + N R). Its
variance per coordinate is (2R / g)^2 (sum_i f_ij (1 - f_ij) + m p (1 - p)), f_ij the fractional
part of a_ij (:func:`estimate_variance`). Replacing one record changes the integer vector
sum_i r_i by Delta with |Delta_j| <= g and ||Delta||_2 <= g + sqrt(d) (coupled rounding; see
app/privacy/binomial/, which accounts for it exactly).

Bounds every honest release obeys (:func:`count_slack`, :func:`honest_mean_limit`): sum_i r_ij lies
in [0, N g], and by Hoeffding's inequality |Bin(m, p) - p m| < t = sqrt(m ln(2d / alpha) / 2) on
all d coordinates except with probability alpha (union bound over 2d tails). Hence
|o_j / N| <= R + (2R / g) t / N: the server never applies a debiased mean outside it (a silo
that claims noise it did not add could otherwise move the mean by p m (2R / g) / N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: rows x coordinates rounded per chunk (bounds memory for large models: 2^24 float64 = 128 MiB)
CHUNK_ELEMENTS = 1 << 24


@dataclass(frozen=True)
class ShuffleCode:
    """The public parameters every party of one exchange shares: the coordinate bound R (rows
    are clipped to L2 norm R, so |x_j| <= R), the g levels and the noise bits' probability p."""

    bound: float
    levels: int
    p: float

    def __post_init__(self) -> None:
        if not (0 < self.bound < float("inf")):
            raise ValueError(f"shuffle bound R must be finite and > 0, got {self.bound}")
        if not (isinstance(self.levels, int) and self.levels >= 1):
            raise ValueError(f"shuffle levels g must be an integer >= 1, got {self.levels}")
        if not 0 < self.p < 1:
            raise ValueError(f"shuffle bit probability p must be in (0, 1), got {self.p}")

    @property
    def step(self) -> float:
        """The value of one level: 2R / g."""
        return 2.0 * self.bound / self.levels


def rounded_levels(rows: np.ndarray, code: ShuffleCode, rng: np.random.Generator) -> np.ndarray:
    """sum_i floor(a_ij + U_ij) over the rows [K, d] (int64 [d]), a_ij = g (x_ij + R) / (2R),
    with values clamped into [-R, R] first (a clipped row already is; the clamp only guards
    float rounding). Chunked over rows so that memory stays O(CHUNK_ELEMENTS)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2:
        raise ValueError(f"rows must be [K, d], got shape {rows.shape}")
    k, d = rows.shape
    total = np.zeros(d, dtype=np.int64)
    per_chunk = max(1, CHUNK_ELEMENTS // max(d, 1))
    for start in range(0, k, per_chunk):
        block = np.clip(rows[start:start + per_chunk], -code.bound, code.bound)
        a = (block + code.bound) * (code.levels / (2.0 * code.bound))
        r = np.floor(a + rng.random(a.shape))
        total += np.clip(r, 0, code.levels).astype(np.int64).sum(axis=0)
    return total


def encode_counts(rows: np.ndarray, code: ShuffleCode, trials_per_record: int,
                  rng: np.random.Generator) -> np.ndarray:
    """The silo's message for K clipped rows: c_j = sum_i r_ij + Bin(K b, p) (int64 [d]);
    b = ``trials_per_record``. Every c_j lies in [0, K (g + b)]."""
    if trials_per_record < 0:
        raise ValueError(f"trials per record b must be >= 0, got {trials_per_record}")
    counts = rounded_levels(rows, code, rng)
    trials = int(np.asarray(rows).shape[0]) * int(trials_per_record)
    if trials:
        counts += rng.binomial(trials, code.p, size=counts.shape).astype(np.int64)
    return counts


def debias(totals: np.ndarray, records: int, trials: int, code: ShuffleCode) -> np.ndarray:
    """The analyzer: the estimate o = (2R / g)(T - p m) - N R of sum_i x_i (float64 [d]) from the
    shuffler's totals T, N = ``records`` and m = ``trials``."""
    if records < 1:
        raise ValueError(f"records N must be >= 1, got {records}")
    t = np.asarray(totals, dtype=np.float64)
    return code.step * (t - code.p * trials) - records * code.bound


def estimate_variance(rows: np.ndarray, code: ShuffleCode, trials: int) -> np.ndarray:
    """Var(o_j) = (2R / g)^2 (sum_i f_ij (1 - f_ij) + m p (1 - p)), the closed form of the
    rounding plus binomial noise, for the records ``rows`` and ``trials`` m in total."""
    rows = np.clip(np.asarray(rows, dtype=np.float64), -code.bound, code.bound)
    a = (rows + code.bound) * (code.levels / (2.0 * code.bound))
    frac = a - np.floor(a)
    return code.step ** 2 * ((frac * (1 - frac)).sum(axis=0) + trials * code.p * (1 - code.p))


#: the largest g chosen automatically (the exact accountant's cost grows with g)
AUTO_LEVELS_MAX = 1024


def auto_levels(dim: int) -> int:
    """g for a model of d parameters when ``shuffle.levels`` = 0: ceil(4 sqrt(d)) within
    [16, AUTO_LEVELS_MAX]. Replacing a record moves the rounded sum by ||Delta||_2 <= g + sqrt(d),
    so g = 4 sqrt(d) keeps the rounding's share of the sensitivity at 1/5."""
    return int(min(AUTO_LEVELS_MAX, max(16, math.ceil(4 * math.sqrt(dim)))))


def row_bound(difference: bool, clip: float, diff_clip: float) -> float:
    """R, the L2 bound on one record's row (hence on each coordinate): L for a gradient; for a
    difference of two gradients clipped to L, 2L, or C = ``diff-clip`` when that is > 0."""
    if difference:
        return float(diff_clip) if diff_clip > 0 else 2.0 * float(clip)
    return float(clip)


def trials_per_record(required_trials: int, count_on: int, records: int, headroom: float = 0.0) -> int:
    """b, a silo's noise trials per record: its K records carry (1 + headroom) m / count_on of
    the m trials the exchange needs, so ``count_on`` silos whose calibrations differ by less
    than the headroom (e.g. delta = 1/n^2 with different n) meet each other's requirement."""
    return max(1, math.ceil(required_trials * (1.0 + headroom) / (count_on * records)))


#: The probability with which an honest release may fail the bounds below (a false drop).
HONEST_ALPHA = 1e-12

#: The largest shuffle.headroom a run may set: an honest silo claims at most (1 + MAX_HEADROOM)
#: times the trials its calibration requires, plus K for the rounding up (clients/shuffler.py).
MAX_HEADROOM = 10


def count_slack(trials: int, dim: int, alpha: float = HONEST_ALPHA) -> float:
    """t = sqrt(m ln(2 d / alpha) / 2) for m = ``trials``: by Hoeffding,
    P(|Bin(m, p) - p m| >= t) <= 2 exp(-2 t^2 / m) for any p, so d independent such draws all lie
    within t of p m with probability >= 1 - alpha (union bound over the 2d tails)."""
    return math.sqrt(max(int(trials), 0) * math.log(2.0 * max(int(dim), 1) / alpha) / 2.0)


def honest_mean_limit(code: ShuffleCode, records: int, trials: int, dim: int, alpha: float = HONEST_ALPHA) -> float:
    """The bound R + (2R / g) t / N on every coordinate of an honest debiased mean o / N, with
    t = :func:`count_slack` (trials, dim): exceeded with probability at most alpha."""
    if records < 1:
        raise ValueError(f"records N must be >= 1, got {records}")
    return code.bound + code.step * count_slack(trials, dim, alpha) / records
