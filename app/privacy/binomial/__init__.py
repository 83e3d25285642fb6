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

Modules (each one job): :mod:`.truncation` (orders and constants, argument checks, step 1's
window and the MAX_WINDOW fallback), :mod:`.divergence` (steps 3 and "Numerics": the divergence
table and :func:`release_curve`), :mod:`.amplified` (:func:`amplified_release_curve`),
:mod:`.compose` (step 4: composition and conversion), :mod:`.lazy` (curves computed per order for
the searches), :mod:`.search` (calibration of the number of trials), :mod:`.closed_form` (the
paper's parameter choice against this accountant). This module is the public API:
``from app.privacy import binomial`` and ``binomial.X``; the modules' other public names (the
cached cores on checked arguments, the divergence table's pieces) are imported from where they live.
"""

from __future__ import annotations

from app.privacy.binomial.amplified import amplified_release_curve
from app.privacy.binomial.closed_form import calibration_table, closed_form
from app.privacy.binomial.compose import binomial_epsilon, epsilon_from_curves, gaussian_rdp
from app.privacy.binomial.divergence import release_curve, shift_divergences
from app.privacy.binomial.lazy import AmplifiedView, LazyCurve, lazy_curve
from app.privacy.binomial.search import calibrate_trials, fast_epsilon, fast_fits
from app.privacy.binomial.truncation import (MAX_LEVELS, MAX_WINDOW, ORDERS, REL_SLACK, TAIL, BinomialCurve,
                                             sensitivity, window)

__all__ = [
    "MAX_LEVELS", "MAX_WINDOW", "ORDERS", "REL_SLACK", "TAIL", "AmplifiedView", "BinomialCurve", "LazyCurve",
    "amplified_release_curve", "binomial_epsilon", "calibrate_trials", "calibration_table", "closed_form",
    "epsilon_from_curves", "fast_epsilon", "fast_fits", "gaussian_rdp", "lazy_curve", "release_curve",
    "sensitivity", "shift_divergences", "window",
]
