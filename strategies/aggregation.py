"""Aggregation rules for a stack of client updates: plain FedAvg and Byzantine-robust rules.

Every rule is a pure numpy function of ``updates`` [m, d] (one row per client update) and returns
an :class:`Aggregate`: the aggregated ``vector`` [d] and ``weights`` [m], the share each client got
in the result. What ``weights`` means exactly differs by rule and is stated in each docstring:

=====================  ==========================================================================
rule                   ``weights``
=====================  ==========================================================================
mean                   1/m each; ``vector == weights @ updates``
fltrust                normalised trust scores s_i / sum_j s_j (all zeros when the guard fires)
krum                   one-hot on the selected client; ``vector == weights @ updates``
multi-krum             1/m_select on each selected client; ``vector == weights @ updates``
trimmed-mean           per client, the fraction of the d * (m - 2f) kept values that are its own
coordinate-median      per client, the fraction of the d median "votes" it supplied
geometric-median       the final Weiszfeld beta_i / sum_j beta_j; ``vector == weights @ updates``
centered-clipping      exact coefficient a_i of u_i in ``vector = a_0 * center + sum_i a_i u_i``;
                       they sum to 1 - a_0 (a_0, the share left on the center, is not reported)
smea                   1/(m - f) on each client of the selected subset; ``vector == weights @ updates``
=====================  ==========================================================================

Honest-majority rules take the number ``f`` of Byzantine clients and raise
:class:`HonestMajorityRequired` when f >= m/2; Krum and Multi-Krum need more, Blanchard et al.'s
n > 2f + 2 (at n = 2f + 1 or 2f + 2 the f colluding identical rows that IPM and ALIE send are
each other's n - f - 2 nearest neighbours, score 0, and Krum picks one of them every time).
:func:`min_clients` gives the smallest n each rule accepts for a given f, which the config check
(and so a results table's "n/a") enforces.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class HonestMajorityRequired(ValueError):
    """The rule's guarantee (and our use of it) needs f < n/2 Byzantine clients."""


@dataclass(frozen=True)
class Aggregate:
    """Result of one aggregation: ``vector`` [d] and the per-client share ``weights`` [m]."""

    vector: np.ndarray
    weights: np.ndarray


# ---------------------------------------------------------------------------------------------
# validation helpers
# ---------------------------------------------------------------------------------------------

def check_updates(updates: np.ndarray) -> np.ndarray:
    """``updates`` as a float64 [m, d] array; 2-D, m >= 1, d >= 1, all finite."""
    u = np.asarray(updates)
    if u.ndim != 2:
        raise ValueError(f"updates must be a 2-D array [m, d], got ndim = {u.ndim} (shape {u.shape})")
    if u.shape[0] < 1 or u.shape[1] < 1:
        raise ValueError(f"updates must have m >= 1 rows and d >= 1 columns, got shape {u.shape}")
    if not (np.issubdtype(u.dtype, np.floating) or np.issubdtype(u.dtype, np.integer)):
        raise ValueError(f"updates must be numeric (float), got dtype {u.dtype}")
    u = u.astype(np.float64, copy=False)
    if not np.all(np.isfinite(u)):
        bad = np.argwhere(~np.isfinite(u))[0]
        raise ValueError(f"updates must be finite, got {u[tuple(bad)]} at row {bad[0]}, column {bad[1]}")
    return u


def _check_vector(name: str, v: np.ndarray, d: int) -> np.ndarray:
    """A finite float64 vector of shape [d]."""
    a = np.asarray(v, dtype=np.float64)
    if a.shape != (d,):
        raise ValueError(f"{name} must have shape ({d},) to match updates [m, {d}], got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got non-finite entries at {np.flatnonzero(~np.isfinite(a)).tolist()}")
    return a


def check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """``value`` as an int in [lo, hi] (hi = None: no upper bound)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if v < lo or (hi is not None and v > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ValueError(f"{name} must be {allowed}, got {v}")
    return v


def _check_honest_majority(rule: str, f: object, n: int) -> int:
    """f as an int; raises HonestMajorityRequired when f >= n/2 (i.e. 2f >= n)."""
    fi = check_int("f", f, 0)
    if 2 * fi >= n:
        raise HonestMajorityRequired(
            f"{rule} needs an honest majority: f = {fi} Byzantine of n = {n} clients (f < n/2 required)")
    return fi


# ---------------------------------------------------------------------------------------------
# rules
# ---------------------------------------------------------------------------------------------

def mean(updates: np.ndarray) -> Aggregate:
    """FedAvg (McMahan et al. 2017) with equal weights: (1/m) sum_i u_i. ``weights`` = 1/m each."""
    u = check_updates(updates)
    m = u.shape[0]
    return Aggregate(u.mean(axis=0), np.full(m, 1.0 / m))


def fltrust(updates: np.ndarray, trust_update: np.ndarray) -> Aggregate:
    """FLTrust (Cao et al., NDSS 2021, Alg. 1) with server root update g0 = ``trust_update``.

    s_i = ReLU(cos(u_i, g0)); every u_i is rescaled to ||g0||;
    aggregate = sum_i s_i (||g0|| / ||u_i||) u_i / sum_i s_i.
    A zero-norm u_i gets s_i = 0. Guard: when ||g0|| = 0 or every s_i = 0 the result is the zero
    vector with all-zero ``weights`` (the model stays unchanged).
    ``weights`` = s_i / sum_j s_j (the normalised trust scores; note the coefficient of the raw
    u_i in ``vector`` is weights_i * ||g0|| / ||u_i||, not weights_i).
    """
    u = check_updates(updates)
    m, d = u.shape
    g0 = _check_vector("trust_update", trust_update, d)
    g0_norm = float(np.linalg.norm(g0))
    zero = Aggregate(np.zeros(d), np.zeros(m))
    if g0_norm == 0.0:
        return zero
    norms = np.linalg.norm(u, axis=1)
    scores = np.zeros(m)
    ok = norms > 0
    scores[ok] = np.maximum(0.0, (u[ok] @ g0) / (norms[ok] * g0_norm))
    total = float(scores.sum())
    if total == 0.0:
        return zero
    coef = np.zeros(m)
    coef[ok] = scores[ok] * g0_norm / norms[ok]
    return Aggregate(coef @ u / total, scores / total)


def _squared_distances(u: np.ndarray) -> np.ndarray:
    """[m, m] pairwise squared Euclidean distances (exact differences, no Gram-matrix shortcut)."""
    diff = u[:, None, :] - u[None, :, :]
    return np.einsum("ijk,ijk->ij", diff, diff)


def krum_scores(updates: np.ndarray, f: int) -> np.ndarray:
    """Krum scores (Blanchard et al., NeurIPS 2017): score_i = sum of the squared distances from u_i
    to its n - f - 2 nearest other updates (u_i itself excluded). Needs f < n/2 and n - f - 2 >= 1."""
    return _krum_scores(check_updates(updates), f, "krum")


def _krum_scores(u: np.ndarray, f: object, rule: str) -> np.ndarray:
    n = u.shape[0]
    fi = _check_honest_majority(rule, f, n)
    if n <= 2 * fi + 2:
        raise HonestMajorityRequired(f"{rule} needs n > 2f + 2 (Blanchard et al. 2017): f = {fi} Byzantine of "
                                     f"n = {n} clients; with n <= 2f + 2 colluding identical updates always win")
    k = n - fi - 2
    if k < 1:
        raise ValueError(f"{rule} needs n - f - 2 >= 1 neighbours: n = {n}, f = {fi} gives n - f - 2 = {k}")
    dist = _squared_distances(u)
    np.fill_diagonal(dist, np.inf)  # exclude u_i itself
    return np.sort(dist, axis=1)[:, :k].sum(axis=1)


def krum(updates: np.ndarray, f: int) -> Aggregate:
    """Krum (Blanchard et al. 2017): the update with the lowest :func:`krum_scores` (ties: lowest
    index). ``weights`` is one-hot on the selected client."""
    u = check_updates(updates)
    scores = _krum_scores(u, f, "krum")
    i = int(np.argmin(scores))
    w = np.zeros(u.shape[0])
    w[i] = 1.0
    return Aggregate(u[i].copy(), w)


def multi_krum(updates: np.ndarray, f: int, m_select: int | None = None) -> Aggregate:
    """Multi-Krum (Blanchard et al. 2017): the mean of the ``m_select`` updates with the lowest
    :func:`krum_scores` (default m_select = n - f; ties: lowest index first).
    ``weights`` = 1/m_select on each selected client, 0 elsewhere."""
    u = check_updates(updates)
    n = u.shape[0]
    scores = _krum_scores(u, f, "multi_krum")  # validates f
    fi = operator.index(f)
    sel = n - fi if m_select is None else check_int("m_select", m_select, 1, n)
    chosen = np.argsort(scores, kind="stable")[:sel]
    w = np.zeros(n)
    w[chosen] = 1.0 / sel
    return Aggregate(u[chosen].mean(axis=0), w)


def trimmed_mean(updates: np.ndarray, f: int) -> Aggregate:
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018): per coordinate, drop the f largest and
    the f smallest values and average the remaining n - 2f (needs f < n/2, i.e. n > 2f).
    ``weights``_i = (number of coordinates where u_i's value was kept) / (d * (n - 2f)); they sum
    to 1. Equal values are ordered by client index (stable sort), which decides whose value counts
    as kept in ``weights`` but never changes ``vector``."""
    u = check_updates(updates)
    n, d = u.shape
    fi = _check_honest_majority("trimmed_mean", f, n)
    order = np.argsort(u, axis=0, kind="stable")
    kept = order[fi:n - fi]  # [n - 2f, d] client indices kept per coordinate
    vector = np.take_along_axis(u, kept, axis=0).mean(axis=0)
    counts = np.bincount(kept.ravel(), minlength=n).astype(np.float64)
    return Aggregate(vector, counts / (d * (n - 2 * fi)))


def coordinate_median(updates: np.ndarray, *, f: int = 0) -> Aggregate:
    """Coordinate-wise median (Yin et al. 2018); for even n the mean of the two middle values.
    ``f`` is only checked (f < n/2). ``weights``: each coordinate gives one vote, to the client
    holding the middle value (odd n) or half to each of the two middle clients (even n);
    ``weights``_i = votes_i / d, summing to 1 (equal values ordered by client index)."""
    u = check_updates(updates)
    n, d = u.shape
    _check_honest_majority("coordinate_median", f, n)
    order = np.argsort(u, axis=0, kind="stable")
    votes = np.zeros(n)
    if n % 2 == 1:
        mid = order[n // 2]
        vector = u[mid, np.arange(d)]
        np.add.at(votes, mid, 1.0)
    else:
        lo, hi = order[n // 2 - 1], order[n // 2]
        vector = 0.5 * (u[lo, np.arange(d)] + u[hi, np.arange(d)])
        np.add.at(votes, lo, 0.5)
        np.add.at(votes, hi, 0.5)
    return Aggregate(vector, votes / d)


def geometric_median(updates: np.ndarray, eps: float = 1e-8, max_iter: int = 10_000, tol: float = 1e-6, *,
                     f: int = 0) -> Aggregate:
    """Geometric median argmin_z sum_i ||z - u_i|| by smoothed Weiszfeld (Pillutla et al., IEEE TSP
    2022, "RFA"): z <- sum_i beta_i u_i / sum_i beta_i with beta_i = 1 / max(eps, ||z - u_i||)
    (eps = the smoothing nu: no division by zero at a data point), starting at the mean; stops
    when a step moves z by at most tol * max(1, ||z||) (relative change), or after ``max_iter``
    steps, a cap set high because far outliers make the start far: each step from there only
    multiplies the distance by about f/(n - f) (100 steps left z 770 away on digits with 4 of 10
    rows at 2^64; honest rows alone converge in a handful of steps).
    ``f`` is only checked (f < n/2).
    ``weights`` = beta_i / sum_j beta_j at the last step, so ``vector == weights @ updates`` (a far
    row's weight is tiny, but weight times row is not: the f far rows pull with up to f unit
    vectors' worth of force)."""
    u = check_updates(updates)
    n = u.shape[0]
    _check_honest_majority("geometric_median", f, n)
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got {eps}")
    if not (math.isfinite(tol) and tol >= 0):
        raise ValueError(f"tol must be a finite number >= 0, got {tol}")
    iters = check_int("max_iter", max_iter, 1)
    z = u.mean(axis=0)
    w = np.full(n, 1.0 / n)
    for _ in range(iters):
        beta = 1.0 / np.maximum(eps, np.linalg.norm(u - z, axis=1))
        w = beta / beta.sum()
        z_new = w @ u
        step = float(np.linalg.norm(z_new - z))
        done = step <= tol * max(1.0, float(np.linalg.norm(z)))
        z = z_new
        if done:
            break
    return Aggregate(z, w)


def centered_clipping(updates: np.ndarray, center: np.ndarray, tau: float, iters: int = 1, *,
                      f: int = 0) -> Aggregate:
    """Centered clipping (Karimireddy, He & Jaggi, ICML 2021):
    v <- v + (1/n) sum_i (u_i - v) * min(1, tau / ||u_i - v||), from v = ``center`` (the previous
    aggregate), ``iters`` times (u_i = v counts as factor 1). tau in (0, inf]; tau = inf gives
    the mean. ``f`` is only checked (f < n/2).
    ``weights``: the result is exactly v = a_0 * center + sum_i a_i u_i with a_0 + sum_i a_i = 1
    (each step maps a <- (1 - mean(c)) a + c/n, c_i the clip factors); ``weights`` = (a_1..a_n),
    which sum to 1 - a_0 (a_0 -> 1 as tau -> 0: the result stays at the center)."""
    u = check_updates(updates)
    n, d = u.shape
    _check_honest_majority("centered_clipping", f, n)
    v = _check_vector("center", center, d).copy()
    if not (tau > 0) or math.isnan(tau):
        raise ValueError(f"tau must be in (0, inf], got {tau}")
    k = check_int("iters", iters, 1)
    a = np.zeros(n)  # coefficients of u_i; the center keeps 1 - sum(a)
    for _ in range(k):
        diff = u - v
        dist = np.linalg.norm(diff, axis=1)
        with np.errstate(divide="ignore"):
            c = np.minimum(1.0, tau / dist)  # dist = 0 -> tau/0 = inf -> factor 1
        v = v + (c[:, None] * diff).mean(axis=0)
        cbar = float(c.mean())
        a = (1.0 - cbar) * a + c / n
    return Aggregate(v, a)


#: SMEA's largest number of candidate subsets C(n, f), one (n - f) x (n - f) eigenvalue problem
#: each: beyond it the rule refuses (one line) instead of running for hours (n = 20 with f = 9 is
#: 167,960 subsets; n = 10 with f = 4 is 210)
SMEA_MAX_SUBSETS = 100_000

#: SMEA's tie tolerance: subsets whose lambda_max is within this relative distance of the smallest
#: count as tied (an exact tie computed in floating point), and the first in
#: itertools.combinations order wins, as ByzFL's strict "<" picks it
SMEA_TIE_RTOL = 1e-9


def check_smea_size(n: int, f: int) -> int:
    """C(n, f), the number of subsets SMEA compares; ValueError (one line) above SMEA_MAX_SUBSETS."""
    count = math.comb(n, f)
    if count > SMEA_MAX_SUBSETS:
        raise ValueError(f"smea compares every subset of n - f = {n - f} of the n = {n} updates: C({n}, {f}) = "
                         f"{count:,} subsets, more than its limit of {SMEA_MAX_SUBSETS:,} (one eigenvalue problem "
                         "each); use fewer silos per round, a smaller f, or another rule")
    return count


def smea_max_eigenvalues(updates: np.ndarray, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Every subset S of n - f of the n updates, in ``itertools.combinations(range(n), n - f)``
    order ([C(n, f), n - f] indices), and lambda_max(Sigma_S) of each, Sigma_S the empirical
    covariance (1/|S|) sum_{i in S} (u_i - mu_S)(u_i - mu_S)^T (normalised by |S|, as ByzFL's and
    Allouah et al.'s).

    No d x d matrix: Sigma_S = (1/|S|) D^T D with D = C U_S (C the |S| x |S| centring matrix),
    whose nonzero eigenvalues are those of (1/|S|) D D^T = (1/|S|) C G_SS C, the centred Gram
    matrix, here from the exact pairwise squared distances (C G C = -1/2 C D2 C, classical MDS),
    so no precision is lost to a large common component of the rows. Cost: n^2 d once, then
    C(n, f) symmetric eigenvalue problems of size n - f (np.linalg.eigvalsh, batched)."""
    u = check_updates(updates)
    n = u.shape[0]
    fi = check_int("f", f, 0, n - 1)
    check_smea_size(n, fi)
    m = n - fi
    sq = np.empty((n, n))
    for i in range(n):  # row by row: n x d memory, not n x n x d
        diff = u - u[i]
        sq[i] = np.einsum("ij,ij->i", diff, diff)
    subsets = np.array(list(itertools.combinations(range(n), m)), dtype=np.intp).reshape(-1, m)
    lam = np.empty(len(subsets))
    chunk = max(1, 2 ** 22 // (m * m))  # at most 32 MiB of m x m blocks at a time
    for start in range(0, len(subsets), chunk):
        sub = subsets[start:start + chunk]
        d2 = sq[sub[:, :, None], sub[:, None, :]]
        gram = -0.5 * (d2 - d2.mean(axis=2, keepdims=True) - d2.mean(axis=1, keepdims=True)
                       + d2.mean(axis=(1, 2), keepdims=True))
        lam[start:start + chunk] = np.linalg.eigvalsh(gram)[:, -1] / m
    return subsets, np.maximum(lam, 0.0)


def smea(updates: np.ndarray, f: int) -> Aggregate:
    """SMEA, Smallest Maximum Eigenvalue Averaging (Allouah et al., "On the Privacy-Robustness-
    Utility Trilemma in Distributed Learning", ICML 2023; ByzFL's ``SMEA``): over all subsets S of
    n - f updates, S* = argmin_S lambda_max(Sigma_S) (:func:`smea_max_eigenvalues`), and the result
    is the mean of S*. Needs f < n/2; f = 0 is the mean. Ties (within a relative SMEA_TIE_RTOL): the
    first subset in itertools.combinations order. ByzFL estimates lambda_max by one power-method
    step from a random vector; this computes it exactly, so the two agree wherever ByzFL's estimate
    ranks the subsets as the exact values do (tests/test_byzfl_parity.py). Refused (ValueError)
    when C(n, f) > SMEA_MAX_SUBSETS.
    ``weights`` = 1/(n - f) on each client of S*, 0 elsewhere."""
    u = check_updates(updates)
    n = u.shape[0]
    fi = _check_honest_majority("smea", f, n)
    if fi == 0:
        return Aggregate(u.mean(axis=0), np.full(n, 1.0 / n))
    subsets, lam = smea_max_eigenvalues(u, fi)
    best = int(np.flatnonzero(lam <= lam.min() * (1.0 + SMEA_TIE_RTOL))[0])
    chosen = subsets[best]
    w = np.zeros(n)
    w[chosen] = 1.0 / (n - fi)
    return Aggregate(u[chosen].mean(axis=0), w)


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """A registered aggregation rule: its function, whether it needs f < n/2, its extra inputs
    (``"f"``, ``"trust_update"``, ``"center"``, ``"tau"``) besides ``updates``, and what the config
    derives from them: ``needs_f`` (its result depends on f, so it cannot run without f stated),
    ``krum_bound`` (n > 2f + 2, Blanchard et al. 2017, not only n > 2f)."""

    fn: Callable[..., Aggregate]
    honest_majority: bool
    inputs: tuple[str, ...]
    summary: str
    needs_f: bool = False
    krum_bound: bool = False

    @property
    def trust(self) -> bool:
        """Whether it scores updates against the server's trust set (``trust.size`` >= 1)."""
        return "trust_update" in self.inputs


RULES: dict[str, Rule] = {
    "mean": Rule(mean, False, (), "FedAvg: uniform mean"),
    "fltrust": Rule(fltrust, False, ("trust_update",), "FLTrust: ReLU-cosine trust vs a server root update"),
    "krum": Rule(krum, True, ("f",), "Krum: the update closest to its n-f-2 neighbours", needs_f=True,
                 krum_bound=True),
    "multi-krum": Rule(multi_krum, True, ("f",), "Multi-Krum: mean of the n-f lowest Krum scores", needs_f=True,
                       krum_bound=True),
    "trimmed-mean": Rule(trimmed_mean, True, ("f",), "coordinate-wise mean without the f largest/smallest",
                         needs_f=True),
    "median": Rule(coordinate_median, True, ("f",), "coordinate-wise median"),
    "geometric-median": Rule(geometric_median, True, ("f",), "geometric median (smoothed Weiszfeld, RFA)"),
    "centered-clipping": Rule(centered_clipping, True, ("center", "tau", "f"),
                              "centered clipping around the previous aggregate"),
    "smea": Rule(smea, True, ("f",), "SMEA: mean of the n-f updates whose covariance has the smallest top eigenvalue",
                 needs_f=True),
}


#: rules whose guarantee needs n > 2f + 2 (Blanchard et al. 2017), not only n > 2f
KRUM_RULES = tuple(name for name, rule in RULES.items() if rule.krum_bound)

#: rules whose result depends on f, so they cannot run without it being stated (with f = 0 the
#: trimmed mean, Multi-Krum and SMEA are the plain mean); the other honest-majority rules only check it
F_RULES = tuple(name for name, rule in RULES.items() if rule.needs_f)


def min_clients(name: str, f: int) -> int:
    """The smallest number of clients n for which rule ``name`` accepts f Byzantine ones:
    2f + 3 for Krum and Multi-Krum, 2f + 1 for the other honest-majority rules, 1 otherwise."""
    if name not in RULES:
        raise ValueError(f"unknown aggregation rule {name!r}; known: {sorted(RULES)}")
    if name in KRUM_RULES:
        return 2 * f + 3
    return 2 * f + 1 if RULES[name].honest_majority else 1


__all__ = ["F_RULES", "RULES", "SMEA_MAX_SUBSETS", "Aggregate", "HonestMajorityRequired", "Rule", "centered_clipping",
           "check_smea_size", "coordinate_median", "fltrust", "geometric_median", "krum", "krum_scores", "mean",
           "min_clients", "multi_krum", "smea", "smea_max_eigenvalues", "trimmed_mean"]
