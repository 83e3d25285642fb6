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

Modules (each one job; this one re-exports their public names):
binomial_window (constants, checks, the window), binomial_divergence (divergence table and
release_curve), binomial_amplified (amplified_release_curve), binomial_compose (composition),
binomial_lazy (curves computed per order for searches), binomial_search (calibration).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.privacy.binomial_amplified import _amplified, amplified_release_curve  # noqa: F401
from app.privacy.binomial_compose import (_order_epsilon, binomial_epsilon, epsilon_from_curves,  # noqa: F401
                                          gaussian_rdp)
from app.privacy.binomial_divergence import (_CHUNK_ELEMENTS, _EXP_SAFE, _columns, _curve,  # noqa: F401
                                             _divergence_table, _prelude, _Prelude, release_curve,
                                             shift_divergences)
from app.privacy.binomial_lazy import _LB_MARGIN, AmplifiedView, LazyCurve, lazy_curve  # noqa: F401
from app.privacy.binomial_search import (_crossing, _gaussian_guess, _settle, calibrate_trials,  # noqa: F401
                                         fast_epsilon, fast_fits)
from app.privacy.binomial_window import (_LOG_TAIL, MAX_LEVELS, MAX_WINDOW, ORDERS, REL_SLACK,  # noqa: F401
                                         TAIL, BinomialCurve, _delta, _effective_trials, _epsilon, _extra,
                                         _int, _largest, _prob, _window, sensitivity, window)


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
