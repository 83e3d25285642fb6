"""Renyi accounting and calibration of the distributed Skellam mechanism (encoding.py).

One release of a silo: the secure-aggregation sum over the silos carries Sk(mu) noise in each of D
coordinates (mu = the total over the silos' shares, variance convention of encoding.py), and
replacing one record of this silo moves its integer sum by a vector of L1 norm <= Delta_1 and L2
norm <= Delta_2 (encoding.sensitivity). The other silos' contributions do not depend on this
silo's records, and the modular reduction and decoding are post-processing, so the release is
bounded by the multi-dimensional Skellam mechanism with these sensitivities.

Per-release bound (Agarwal, Kairouz & Liu 2021, the multi-dimensional Skellam mechanism's RDP;
google-research/federated distributed_dp/accounting_utils.py ``_skellam_rdp``), in the integer
domain with Sk(mu) of variance mu:

    eps(alpha) = alpha Delta_2^2 / (2 mu) + min( ((2 alpha - 1) Delta_2^2 + 6 Delta_1) / (4 mu^2),
                                                 3 Delta_1 / (2 mu) )

(the paper writes Sk(mu', mu') of variance 2 mu'; google-research's code takes the central
variance ``central_var`` and sensitivities in signal units with ``scale`` s; with mu = s^2 var,
Delta = s l its terms are the ones above). tests/test_skellam.py checks it against the exact
divergence D_alpha(Sk(mu) + s || Sk(mu)) summed over the pmf, in 1 to 3 dimensions (ratio exact /
bound >= 0.97 at mu = 400, alpha up to 20). It exceeds the Gaussian mechanism's
alpha Delta_2^2 / (2 mu) by the min term, which vanishes as mu grows.

Sampling: the batch is K of the silo's n records without replacement, replace-one, at rate
gamma = K/n. The Skellam mechanism is one mechanism against itself (no truncated "ideal" twin), so
Wang, Balle & Kasiviswanathan 2019 ("Subsampled Renyi differential privacy and analytical moments
accountant"), Theorem 9, applies as published (:func:`wbk_theorem9`, the default); its
eps(infinity) is infinite here (the Skellam likelihood ratio is unbounded), so min{2, (e^eps(inf) -
1)^j} = 2. ``amplification="repo"`` uses app.privacy.amplification.amplified_curve instead: the
same theorem with the extra (1 - gamma)^(1-j) factors the binomial mechanism's ideal-vs-real proof
needs (valid here too, looser: z 9.18 instead of 6.05 for 100 releases at K/n = 0.1, eps 3).
Theorem 9 is general, not tight: for the Gaussian mechanism dp-accounting's Theorem 27 (which
needs the Gaussian's exact moments; the Skellam bound is only an upper bound, so its forward
differences cannot be used) gives z = 3.19 on that plan. Its j >= 3 terms tend to 2 gamma^j C(alpha, j)
as the noise grows, a floor per release that weighs on long runs at large K/n.
Disjoint releases (one permutation's blocks) cost one unsampled release (parallel composition,
app.privacy.accounting.parallel_view). Releases compose by adding curves; dp-accounting's
``compute_epsilon`` (Canonne, Kamath & Steinke 2020's conversion, the one app/privacy/binomial
uses) converts to (epsilon, delta).

Noise multiplier. z is the continuous-equivalent multiplier: the total noise's standard deviation
in signal units (the sum of rows, before gamma) is z * 2C, i.e. z * 2C/K on one silo's mean of K
rows, as app/privacy/accounting.py's z = sigma / (2L/K). In integer units mu_total = (2 gamma C z)^2.
As gamma grows the rounding vanishes (Delta_2 -> 2 gamma C) and the bound tends to the Gaussian
mechanism's with the same z.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.privacy.rdp_orders import RDP_ORDERS
from app.privacy.amplification import amplified_curve

#: Renyi orders (integers: WBK19's bound is stated there), those of app/privacy/accounting.py
ORDERS: tuple[float, ...] = RDP_ORDERS


def skellam_rdp(alpha: float, l1: float, l2: float, mu: float) -> float:
    """The module docstring's eps(alpha) of ONE release of Sk(mu)^D noise with sensitivities l1, l2
    (integer units); inf at mu = 0 with a positive sensitivity."""
    if not alpha > 1:
        raise ValueError(f"alpha must be > 1, got {alpha!r}")
    if not (l1 >= 0 and l2 >= 0):
        raise ValueError(f"sensitivities must be >= 0, got l1={l1!r}, l2={l2!r}")
    if not mu >= 0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    if l1 == 0 and l2 == 0:
        return 0.0
    if mu == 0:
        return math.inf
    a = float(alpha)
    return a * l2 * l2 / (2.0 * mu) + min(((2.0 * a - 1.0) * l2 * l2 + 6.0 * l1) / (4.0 * mu * mu), 3.0 * l1 / (2.0 * mu))


#: how a sampled release is amplified: Theorem 9 of WBK19 as published, or the repo's variant
AMPLIFICATIONS: tuple[str, ...] = ("wbk9", "repo")
#: relative slack on every amplified value (floating-point rounding of the sums)
REL_SLACK = 1e-9


def wbk_theorem9(rho: Sequence[float], alpha: int, gamma: float) -> float:
    """Wang, Balle & Kasiviswanathan 2019, Theorem 9, at an integer alpha >= 2 with eps(inf) = inf:

        eps'(alpha) = 1/(alpha - 1) log(1 + gamma^2 C(alpha, 2) min{4 (e^rho(2) - 1), 2 e^rho(2)}
                                        + sum_{j=3}^{alpha} 2 gamma^j C(alpha, j) e^{(j-1) rho(j)})

    the RDP of a mechanism with RDP rho(j) (``rho[j]``, j = 2..alpha) on a batch of K of n records
    drawn without replacement, gamma = K/n, replace-one neighbours; min'd with rho(alpha)."""
    if not (isinstance(alpha, (int, np.integer)) and alpha >= 2):
        raise ValueError(f"alpha must be an integer >= 2, got {alpha!r}")
    if not 0 < gamma < 1:
        raise ValueError(f"gamma must be in (0, 1), got {gamma!r}")
    r = np.asarray(rho, dtype=np.float64)
    if not np.all(np.isfinite(r[2:alpha + 1])):
        return float(r[alpha])
    j = np.arange(2, alpha + 1, dtype=np.float64)
    log_comb = math.lgamma(alpha + 1) - np.array([math.lgamma(x + 1) + math.lgamma(alpha - x + 1) for x in j])
    terms = log_comb + j * math.log(gamma) + math.log(2.0) + (j - 1) * r[2:alpha + 1]
    r2 = float(r[2])
    second = math.log(2.0) + r2
    if r2 > 0:
        second = min(second, math.log(4.0) + math.log(math.expm1(r2)))
    terms[0] = log_comb[0] + 2 * math.log(gamma) + second
    top = float(np.max(terms))
    if top < 0:
        total = math.log1p(float(np.sum(np.exp(terms))))
    else:
        total = top + math.log(math.exp(-top) + float(np.sum(np.exp(terms - top))))
    return min(float(r[alpha]), total / (alpha - 1) * (1.0 + REL_SLACK))


def skellam_curve(orders: Sequence[float], l1: float, l2: float, mu: float, gamma_sampling: float,
                  amplification: str = "wbk9") -> list[float]:
    """The RDP curve of one release at ``orders``, amplified by sampling without replacement at rate
    ``gamma_sampling`` = K/n (integer orders then; 1: no amplification) by :func:`wbk_theorem9`
    (``amplification="wbk9"``) or app.privacy.amplification.amplified_curve (``"repo"``); rho is
    evaluated exactly at every integer either reads."""
    if not 0 < gamma_sampling <= 1:
        raise ValueError(f"sampling rate must be in (0, 1], got {gamma_sampling!r}")
    if amplification not in AMPLIFICATIONS:
        raise ValueError(f"amplification must be one of {AMPLIFICATIONS}, got {amplification!r}")

    def rho(j: float) -> float:
        return skellam_rdp(j, l1, l2, mu)

    plain = [rho(a) for a in orders]
    if gamma_sampling >= 1:
        return plain
    if amplification == "repo":
        return amplified_curve(orders, plain, gamma_sampling, 0.0, rho_at=rho)
    if not all(float(a).is_integer() and a >= 2 for a in orders):
        raise ValueError(f"amplified curves are computed at integer orders >= 2, got {list(orders)}")
    top = int(max(orders))
    table = [math.inf, math.inf] + [rho(j) for j in range(2, top + 1)]
    return [wbk_theorem9(table, int(a), gamma_sampling) for a in orders]


def epsilon(curves_with_counts: Sequence[tuple[Sequence[float], int]], delta: float,
            orders: Sequence[float] = ORDERS) -> float:
    """epsilon at ``delta`` of ``count`` releases of each curve (at ``orders``): the curves add
    (RDP composition), then dp-accounting's ``compute_epsilon``."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon  # loaded when an epsilon is computed

    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    rdp = np.zeros(len(orders))
    for curve, count in curves_with_counts:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count!r}")
        if count:
            rdp = rdp + count * np.asarray(curve, dtype=np.float64)
    if not np.any(rdp > 0):
        return 0.0
    if np.all(np.isinf(rdp)):
        return math.inf
    eps, _ = compute_epsilon(list(orders), rdp.tolist(), float(delta))
    return float(eps)


__all__ = ["AMPLIFICATIONS", "ORDERS", "epsilon", "skellam_curve", "skellam_rdp", "wbk_theorem9"]
