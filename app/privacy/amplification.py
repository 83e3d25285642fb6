"""Record-level amplification by sampling for binomial (shuffle DP) releases.

The silo draws each release's batch of K of its n records uniformly WITHOUT replacement
(``app.data.split.fixed_size_batch``, from secret randomness in a deployment); neighbouring
datasets X, X' differ by REPLACING one record i. gamma = K / n.

What is bounded. app/privacy/binomial/ accounts for one binomial release on a fixed batch by
a curve rho(alpha) >= D_alpha(I(Y) || R(Y')) for every pair of neighbouring batches Y, Y', where
R is the real mechanism (sum of the batch's rounded levels + Bin(m, p) on each of d coordinates)
and I the *ideal* one (every noise coordinate conditioned on the window W, tail mass q each;
TV(I(Y), R(Y)) <= d q). The subsampled mechanisms are p = E_J I(X_J) (ideal, on X) and
q = E_J R(X'_J) (real, on X'), J the uniform K-subset; TV(E_J I(X_J), E_J R(X_J)) <= d q still
(same J, same noise), so the tail is charged to delta once per release exactly as before, and
what amplification must bound is D_alpha(p || q).

The bound (integer alpha >= 2), :func:`wor_subsampled_rdp`:

    eps'(alpha) = min{ rho(alpha),  (alpha/(alpha-1)) L + L
                       + 1/(alpha-1) log(1 + sum_{j=2}^{alpha} C(alpha, j) gamma^j B_j) }

    B_2 = (1 - gamma)^-1 min{ 4 (e^{rho(2)} - 1), 2 e^{rho(2)} }
    B_j = 2 (1 - gamma)^{1-j} e^{(j-1) rho(j)}                        (j >= 3)

with L = -d log(1 - q) (I <= e^L R pointwise, and R >= e^{-L} I). This is the form of Wang,
Balle & Kasiviswanathan (2019, "Subsampled Renyi DP and analytical moments accountant"),
Theorem 9, with eps(inf) = inf (the binomial mechanism's supports differ, so its min{2, (e^eps(inf)
- 1)^j} is 2), and with two changes our proof needs because the pair is ideal-vs-real rather
than one mechanism against itself: the factors (1 - gamma)^{1-j} and the constants L.

Proof. Split J by whether it contains i: p = (1 - gamma) a_I + gamma b, q = (1 - gamma) a' + gamma b',
a_I / a' the ideal / real mixtures over J not containing i (X_J = X'_J there), b = E I(X_J),
b' = E R(X'_J) over J containing i. With b'_I = E I(X'_J): a_I <= e^L a' and b' >= e^{-L} b'_I, so
p <= e^L p^ and q >= e^{-L} q^ for the distributions p^ = (1-gamma) a' + gamma b and
q^ = (1-gamma) a' + gamma b'_I, and sum p^a q^(1-a) <= e^{aL + (a-1)L} sum p^^a q^^(1-a).
p^ - q^ = gamma (b - b'_I), so by the binomial theorem (the first-order term sums to 0)
sum p^^a q^^(1-a) = 1 + sum_{j>=2} C(a, j) gamma^j E_q^[((b - b'_I)/q^)^j]. Couple J (containing
i) with J' = J - {i} + {k}, k uniform outside J: J' is uniform among the K-subsets without i,
and X_J, X_J' and X'_J, X_J' are neighbouring batches. For j >= 3, |b - b'_I|^j <= b^j + b'_I^j,
and by joint convexity of (x, y) -> x^j y^(1-j) and q^ >= (1-gamma) E R(X_J'),
sum b^j q^^(1-j) <= (1-gamma)^(1-j) E sum I(X_J)^j R(X_J')^(1-j) <= (1-gamma)^(1-j) e^{(j-1) rho(j)};
the same for b'_I. For j = 2 also sum (b - b'_I)^2 / q^ <= (1-gamma)^-1 sum ((b - a') - (b'_I - a'))^2
/ a' <= 2 (1-gamma)^-1 (chi2(b||a') + chi2(b'_I||a')) <= 4 (1-gamma)^-1 (e^{rho(2)} - 1). The
unamplified rho(alpha) holds too (joint convexity over the same J). QED.

Orders. rho is known at binomial.ORDERS only; rho is non-decreasing in alpha (a Renyi
divergence is), so rho(j) for an integer j between two orders is bounded by rho at the next
order up (:func:`step_up`). At a non-integer order the bound interpolates the cumulant
(alpha - 1) eps' linearly between the neighbouring integers (it is convex in alpha), and below 2
uses eps'(2) (D_alpha is non-decreasing in alpha).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

#: shuffle.amplification: none, or by the batch's sampling without replacement (K < n)
AMPLIFICATIONS: tuple[str, ...] = ("none", "sampling")
#: bound values for sampling rates at or above this are not amplified (gamma = 1: K = n)
FULL = 1.0
#: relative slack added to every amplified value (floating-point rounding of the sums)
REL_SLACK = 1e-9


def _logsumexp1(logs: Sequence[float]) -> float:
    """log(1 + sum_i exp(logs_i)), accurate when the sum is tiny (log1p) or huge (shifted)."""
    finite = [v for v in logs if v != -math.inf]
    if not finite:
        return 0.0
    if any(math.isnan(v) or v == math.inf for v in finite):
        return math.inf
    top = max(finite)
    if top < 0:
        return math.log1p(math.fsum(math.exp(v) for v in finite))
    return top + math.log(math.exp(-top) + math.fsum(math.exp(v - top) for v in finite))


def wor_subsampled_rdp(rho: Callable[[int], float], alpha: int, gamma: float, log_c: float = 0.0) -> float:
    """eps'(alpha) of the module docstring at an integer alpha >= 2: the Renyi bound of an
    ideal-vs-real pair sampled without replacement at rate ``gamma`` = K/n (replace-one), from
    ``rho(j)`` >= D_j(ideal(Y) || real(Y')) for neighbouring batches (j = 2..alpha) and
    ``log_c`` = L = -d log(1 - q)."""
    if not (isinstance(alpha, int) and alpha >= 2):
        raise ValueError(f"alpha must be an integer >= 2, got {alpha!r}")
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    plain = rho(alpha)
    if gamma >= FULL:
        return plain
    return min(plain, wor_subsampled_term(rho, alpha, gamma, log_c))


def wor_subsampled_term(rho: Callable[[int], float], alpha: int, gamma: float, log_c: float = 0.0) -> float:
    """The second term of eps'(alpha)'s min (inf where a rho(j) it reads is inf), for gamma < 1:
    non-decreasing in every rho(j), so rho(j) from below bound it from below."""
    lg, l1g = math.log(gamma), math.log1p(-gamma)
    log_comb = lambda j: math.lgamma(alpha + 1) - math.lgamma(j + 1) - math.lgamma(alpha - j + 1)  # noqa: E731
    r2 = rho(2)
    if math.isinf(r2):
        return math.inf
    b2 = min(math.log(4.0) + math.log(math.expm1(r2)) if r2 > 0 else -math.inf, math.log(2.0) + r2) - l1g
    terms = [log_comb(2) + 2 * lg + b2]
    for j in range(3, alpha + 1):
        rj = rho(j)
        if math.isinf(rj):
            return math.inf
        terms.append(log_comb(j) + j * lg + math.log(2.0) + (1 - j) * l1g + (j - 1) * rj)
    return (_logsumexp1(terms) / (alpha - 1) + log_c * alpha / (alpha - 1) + log_c) * (1.0 + REL_SLACK)


def step_up(orders: Sequence[float], values: Sequence[float]) -> Callable[[int], float]:
    """rho(j) at an integer j from a non-decreasing curve known at ``orders``: the value at the
    smallest order >= j (inf above the largest order)."""
    pairs = sorted(zip(orders, values))

    def rho(j: int) -> float:
        for a, v in pairs:
            if a >= j:
                return float(v)
        return math.inf
    return rho


def amplified_curve(orders: Sequence[float], rho_values: Sequence[float], gamma: float, log_c: float = 0.0,
                    rho_at: Callable[[int], float] | None = None, cache: dict[int, float] | None = None) -> list[float]:
    """The amplified bound at every order of ``orders`` (any orders > 1) from the curve
    ``rho_values`` at those orders: integers by :func:`wor_subsampled_rdp` with rho stepped up
    (:func:`step_up`, or ``rho_at`` if given), non-integers above 2 by linear interpolation of
    (alpha - 1) eps' between the neighbouring integers, orders below 2 by eps'(2); each is the
    smaller of that and the unamplified value. ``cache``: the integer orders' bounds already
    computed with the same rho, gamma and log_c (filled in; shared by calls for other orders)."""
    rho = rho_at or step_up(orders, rho_values)
    cache = {} if cache is None else cache

    def at(a: int) -> float:
        if a not in cache:
            cache[a] = wor_subsampled_rdp(rho, a, gamma, log_c)
        return cache[a]

    out = []
    for alpha, plain in zip(orders, rho_values):
        if gamma >= FULL:
            out.append(float(plain))
        elif alpha <= 2:
            out.append(min(float(plain), at(2)))
        elif float(alpha).is_integer():
            out.append(min(float(plain), at(int(alpha))))
        else:
            lo, hi = math.floor(alpha), math.ceil(alpha)
            t = alpha - lo
            cgf = (1 - t) * (lo - 1) * at(lo) + t * (hi - 1) * at(hi)
            out.append(min(float(plain), cgf / (alpha - 1) * (1.0 + REL_SLACK)))
    return out
