"""Privacy accounting and noise calibration with ``dp-accounting``.

Every release a silo makes is one Gaussian mechanism applied to the mean of K per-record
gradients clipped to L, where the K records are drawn uniformly **without replacement**
from the silo's n records (fixed size), and neighbouring datasets differ by **replacing**
one record (the paper's Definition 2). A release is described by its noise multiplier

    z = sigma / Delta,   Delta = 2 L / K   (replace-one L2 sensitivity of the mean),

so z is the ratio of the noise's standard deviation to the largest possible shift of the
released vector when one record is replaced.

Accounting rules (all numbers come from dp-accounting):

* All releases unsampled (K = n): a composition of Gaussian mechanisms with shifts/std
  1/z_i is exactly one Gaussian mechanism with 1/z_eff^2 = sum_i 1/z_i^2 (Gaussian DP,
  Dong, Roth & Su 2019), whose exact (epsilon, delta) curve is the analytic Gaussian
  mechanism (Balle & Wang 2018): ``dp_accounting.gaussian_mechanism.get_epsilon_gaussian``.
* Any release sampled (K < n): Renyi DP with ``SampledWithoutReplacementDpEvent`` under
  ``NeighboringRelation.REPLACE_ONE`` (Wang, Balle & Kasiviswanathan 2019, Theorem 27),
  whose Gaussian noise multiplier is defined relative to the replace-one shift, as z above.
* Disjoint releases (noisy Prox-SGD, the paper's Algorithm 6): the batches of the ``count``
  releases are disjoint blocks of one secret permutation of the silo's records, so each record
  is in at most one of them. By parallel composition their privacy is that of ONE Gaussian
  mechanism with multiplier z, unsampled (no amplification is claimed: the record's block is
  released with certainty). The kind label names the permutation, so disjoint releases over
  different permutations (e.g. several runs on a node-scope ledger) compose as usual.
* Binomial releases (shuffle DP, ``mechanism = "binomial"``): the per-coordinate totals of the
  shuffler carry Bin(trials, p) noise on g levels in d coordinates; their Renyi curves and the
  delta of their truncated tails come from the exact numerical accountant in
  app/privacy/binomial/. A ledger holding any binomial release composes everything in RDP at
  that module's orders (Gaussian releases by their exact RDP curves). A sampled binomial
  release (K < n) claims amplification by its batch's sampling without replacement only when it
  says so (``amplification = "sampling"``, app/privacy/amplification.py); otherwise it is
  accounted as if its record were included.

Calibration (:func:`calibrate_noise_multiplier`) is a bisection over the noise scale. A sampled
release's Renyi curve comes from :func:`wor_gaussian_rdp`, a vectorised copy of dp-accounting's
without-replacement formula that reproduces its numbers bit for bit (milliseconds per curve
instead of a third of a second, tests/test_accounting.py). The calibration's search uses it
unchecked, along the same path as :func:`calibrate_reference` (dp-accounting at every order and
step), so it returns the same multiplier; every epsilon that is *reported* or *certified*
(:func:`epsilon_spent`: the ledger, the calibration's final check) is checked against
dp-accounting's own accountant at the order that attains the minimum, so it is dp-accounting's
number at that order, never below dp-accounting's epsilon; on any mismatch dp-accounting's
curves are used at every order (and the calibration falls back to the reference search).
"""

from __future__ import annotations

import functools
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from app.privacy.amplification import AMPLIFICATIONS
from app.privacy.rdp_orders import RDP_ORDERS
from app.privacy.wor_gaussian import wor_gaussian_rdp

if TYPE_CHECKING:
    import dp_accounting as dpa

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class Release:
    """One kind of noisy release, ``count`` times.

    kind: a label ("grad", "local-step", "anchor", ...); n: the silo's record count;
    batch: K records sampled without replacement; noise_multiplier: z = sigma / (2L/K);
    disjoint: the releases of this kind use disjoint blocks of records (parallel composition).
    """

    kind: str
    n: int
    batch: int
    noise_multiplier: float
    count: int = 1
    disjoint: bool = False
    #: "gaussian" (noise_multiplier z), or "binomial" (shuffle DP: ``trials`` noise trials of
    #: probability ``p`` on ``levels`` levels in ``dim`` coordinates; noise_multiplier unused)
    mechanism: str = "gaussian"
    trials: int = 0
    levels: int = 0
    p: float = 0.0
    dim: int = 0
    #: binomial releases: "sampling" claims amplification by the batch's sampling without
    #: replacement (app/privacy/amplification.py) when K < n; "none" accounts as if included
    amplification: str = "none"
    #: binomial releases: q = M / N when the shuffler keeps a random M of the N silos and this
    #: silo's node trusts it to (app/privacy/silo_sampling.py); 1: no silo sampling claimed
    silo_sampling: float = 1.0
    #: "skellam" releases (secure aggregation): the replace-one L1 and L2 sensitivities of the
    #: release's integer vector; its Skellam noise has variance mu = (noise_multiplier * l2)^2 per
    #: coordinate (app/privacy/skellam/accounting.py)
    l1: float = 0.0
    l2: float = 0.0

    def __post_init__(self) -> None:
        if not (0 < self.silo_sampling <= 1 and (self.silo_sampling == 1 or self.mechanism == "binomial")):
            raise ValueError(f"silo sampling q must be in (0, 1] (below 1 for binomial releases only), got "
                             f"{self.silo_sampling!r}")
        if self.amplification not in AMPLIFICATIONS:
            raise ValueError(f"release amplification must be one of {AMPLIFICATIONS}, got {self.amplification!r}")
        if self.mechanism not in ("gaussian", "binomial", "skellam"):
            raise ValueError(f"release mechanism must be gaussian, binomial or skellam, got {self.mechanism!r}")
        if self.mechanism == "skellam" and not (self.l2 > 0 and 0 < self.l1 and self.dim >= 1):
            raise ValueError(f"a skellam release needs l1, l2 > 0 and dim >= 1; got {self}")
        if self.mechanism == "binomial" and not (self.trials >= 1 and self.levels >= 1 and 0 < self.p < 1
                                                 and self.dim >= 1):
            raise ValueError(f"a binomial release needs trials, levels, dim >= 1 and p in (0, 1); got {self}")
        if not 1 <= self.batch <= self.n:
            raise ValueError(f"release batch K={self.batch} must be in [1, n={self.n}]")
        if self.count < 0:
            raise ValueError(f"release count must be >= 0, got {self.count}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise multiplier must be >= 0, got {self.noise_multiplier}")

    @property
    def sampled(self) -> bool:
        return self.batch < self.n and not self.disjoint

    @property
    def binomial(self) -> bool:
        return self.mechanism == "binomial"

    @property
    def skellam(self) -> bool:
        return self.mechanism == "skellam"

    @property
    def gamma(self) -> float:
        """The sampling rate amplification is claimed at: K / n for a sampled binomial or skellam
        release with amplification "sampling", else 1 (none claimed)."""
        return self.batch / self.n if ((self.binomial or self.skellam) and self.sampled
                                       and self.amplification == "sampling") else 1.0

    @property
    def blocks(self) -> int:
        """How many disjoint batches of K records the silo's n records hold."""
        return self.n // self.batch


def parallel_view(r: Release) -> Release:
    """What ``count`` disjoint releases cost: one unsampled Gaussian mechanism (each record is
    in one block only). More releases than blocks would reuse records: refused here."""
    if not r.disjoint:
        return r
    if r.count > r.blocks:
        raise ValueError(f"{r.count} disjoint releases of K={r.batch} records exceed the {r.blocks} disjoint "
                         f"blocks of n={r.n} records (kind {r.kind!r})")
    return replace(r, batch=r.n, count=min(r.count, 1), disjoint=False)


def group_releases(releases: Sequence[Release]) -> list[Release]:
    """Merge releases that differ only in ``count`` (composition of identical events)."""
    counts: Counter[Release] = Counter()
    for r in releases:
        counts[replace(r, count=1)] += r.count
    return [replace(r, count=c) for r, c in counts.items() if c > 0]


def dp_event(releases: Sequence[Release]) -> dpa.DpEvent:
    """The dp-accounting event of a sequence of releases (for RDP under REPLACE_ONE)."""
    import dp_accounting as dpa  # dp-accounting (and scipy): loaded when an epsilon is computed
    events: list[dpa.DpEvent] = []
    for r in map(parallel_view, group_releases(releases)):
        base: dpa.DpEvent = dpa.GaussianDpEvent(r.noise_multiplier)
        if r.sampled:
            base = dpa.SampledWithoutReplacementDpEvent(r.n, r.batch, base)
        events.append(dpa.SelfComposedDpEvent(base, r.count))
    return dpa.ComposedDpEvent(events)


def epsilon_spent(releases: Sequence[Release], delta: float) -> float:
    """Smallest epsilon the accountant certifies at ``delta`` for all ``releases``."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    live = _live(releases)
    if any(r.binomial for r in live):
        if any(r.skellam for r in live):
            raise ValueError("a ledger holds binomial (shuffle) and skellam (secagg) releases: not composed here")
        return _epsilon_rdp_binomial(live, float(delta))
    if any(r.skellam for r in live):
        return _epsilon_rdp_skellam(live, float(delta))
    return _epsilon(live, float(delta))


@functools.lru_cache(maxsize=1024)
def _epsilon_rdp_skellam(live: tuple[Release, ...], delta: float) -> float:
    """A ledger with Skellam releases (secure aggregation): each release's Renyi curve at
    :data:`RDP_ORDERS` (app/privacy/skellam/accounting.py; amplified by the batch's sampling
    where claimed), Gaussian releases by their curves, composed and converted by dp-accounting."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rdp = np.zeros(len(RDP_ORDERS))
    for r in live:
        if r.noise_multiplier == 0:
            return math.inf
        if r.skellam:
            rdp += r.count * _skellam_curve(r.l1, r.l2, (r.noise_multiplier * r.l2) ** 2, r.gamma)
        else:
            rdp += r.count * _rdp_one(r.n, r.batch, r.noise_multiplier, r.sampled)
    return float(compute_epsilon(RDP_ORDERS, rdp, delta)[0])


@functools.lru_cache(maxsize=4096)
def _skellam_curve(l1: float, l2: float, mu: float, gamma: float) -> np.ndarray:
    """One Skellam release's Renyi curve at :data:`RDP_ORDERS` (cached: a ledger grows by count)."""
    from app.privacy.skellam.accounting import skellam_curve

    return np.asarray(skellam_curve(RDP_ORDERS, l1, l2, mu, gamma), dtype=np.float64)


def epsilon_spent_reference(releases: Sequence[Release], delta: float) -> float:
    """:func:`epsilon_spent` with dp-accounting's accountant for every curve at every order
    (the reference of the calibration's fallback and of the tests; Gaussian releases only)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon  # loaded when an epsilon is computed
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    live = _live(releases)
    if not live:
        return 0.0
    if any(r.binomial for r in live):
        raise ValueError("epsilon_spent_reference covers Gaussian releases only")
    if any(r.noise_multiplier == 0 for r in live):
        return math.inf
    if not any(r.sampled for r in live):
        return _epsilon(live, float(delta))  # the analytic Gaussian mechanism: no RDP curve involved
    rdp = sum(r.count * _rdp_one_accountant(r.n, r.batch, r.noise_multiplier, r.sampled) for r in live)
    return float(compute_epsilon(RDP_ORDERS, rdp, delta)[0])


def _live(releases: Sequence[Release]) -> tuple[Release, ...]:
    """The releases that count, identical ones merged, disjoint ones as their parallel view, in
    a canonical order (the cache key, and the order the curves are summed in)."""
    return tuple(sorted((parallel_view(r) for r in group_releases(releases) if r.count > 0),
                        key=lambda r: (r.kind, r.n, r.batch, r.noise_multiplier, r.trials, r.l2, r.l1)))


@functools.lru_cache(maxsize=1024)
def _epsilon_rdp_binomial(live: tuple[Release, ...], delta: float) -> float:
    """A ledger with binomial releases: every release's Renyi curve at binomial.ORDERS (the
    binomial ones with their truncation tails), composed and converted by the binomial module."""
    import dp_accounting as dpa  # dp-accounting (and scipy): loaded when an epsilon is computed
    from dp_accounting.rdp import RdpAccountant
    from app.privacy import binomial

    from app.privacy.silo_sampling import silo_sampled_curve

    parts = [(binomial.amplified_release_curve(r.trials, r.p, r.levels, r.dim, r.gamma) if r.gamma < 1
              else binomial.release_curve(r.trials, r.p, r.levels, r.dim), r.count) for r in live if r.binomial]
    parts = [(silo_sampled_curve(binomial.ORDERS, c, r.silo_sampling) if r.silo_sampling < 1 else c, n)
             for (c, n), r in zip(parts, [r for r in live if r.binomial])]
    extra = np.zeros(len(binomial.ORDERS))
    for r in live:
        if r.binomial:
            continue
        if r.noise_multiplier == 0:
            return math.inf
        if r.sampled:
            accountant = RdpAccountant(list(binomial.ORDERS), dpa.NeighboringRelation.REPLACE_ONE)
            accountant.compose(dpa.SampledWithoutReplacementDpEvent(r.n, r.batch, dpa.GaussianDpEvent(r.noise_multiplier)),
                               r.count)
            extra += np.asarray(accountant._rdp, dtype=np.float64)  # dp-accounting keeps the curve here
        else:
            extra += r.count * np.asarray(binomial.gaussian_rdp(r.noise_multiplier))
    return float(binomial.epsilon_from_curves(parts, delta, extra_rdp=tuple(extra)))


def _epsilon_fast_binomial(releases: Sequence[Release], delta: float) -> float:
    """:func:`epsilon_spent`'s number for binomial releases only, bit for bit, computing only the
    Renyi orders that can decide it (binomial.fast_epsilon); any other mix goes to epsilon_spent."""
    from app.privacy import binomial

    live = _live(releases)
    if not live or not all(r.binomial and r.silo_sampling == 1 for r in live):
        return epsilon_spent(releases, delta)
    return binomial.fast_epsilon([(r.trials, r.p, r.levels, r.dim, r.count, r.gamma) for r in live], float(delta))


@functools.lru_cache(maxsize=1024)
def _epsilon(live: tuple[Release, ...], delta: float) -> float:
    """Cached: a silo asks for the same ledger state several times per round (check, record,
    report), and Renyi accounting of sampled releases takes a fraction of a second.

    The sampled curves are :func:`wor_gaussian_rdp`'s (dp-accounting's numbers, computed
    faster); the answer is checked against dp-accounting's own accountant at the order that
    attains the minimum: if every sampled kind's value there is dp-accounting's, the epsilon
    returned is dp-accounting's conversion of dp-accounting's RDP at one order, which can only
    be at or above dp-accounting's epsilon (the minimum over all orders). If any differs, the
    curves are recomputed with dp-accounting at every order."""
    if not live:
        return 0.0
    if any(r.noise_multiplier == 0 for r in live):
        return math.inf
    # dp-accounting (and scipy): loaded when an epsilon is computed, not for an empty ledger's 0
    from dp_accounting.gaussian_mechanism import get_epsilon_gaussian
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if not any(r.sampled for r in live):
        mu_sq = sum(r.count / r.noise_multiplier**2 for r in live)
        return float(get_epsilon_gaussian(1.0 / math.sqrt(mu_sq), delta))
    # RDP composes additively: sum count * RDP(one release) over the kinds, then convert.
    rdp = sum(r.count * _rdp_one(r.n, r.batch, r.noise_multiplier, r.sampled) for r in live)
    eps, order = compute_epsilon(RDP_ORDERS, rdp, delta)
    k = RDP_ORDERS.index(order)
    mismatched = [r for r in live if r.sampled
                  and _rdp_at_order(r.n, r.batch, r.noise_multiplier, order) != _rdp_one(r.n, r.batch, r.noise_multiplier,
                                                                                        True)[k]]
    if mismatched:
        logger.warning("the fast Renyi curve of %s differs from dp-accounting's at order %s; using dp-accounting's "
                       "curves", mismatched, order)
        rdp = sum(r.count * _rdp_one_accountant(r.n, r.batch, r.noise_multiplier, r.sampled) for r in live)
        eps, _ = compute_epsilon(RDP_ORDERS, rdp, delta)
    return float(eps)


@functools.lru_cache(maxsize=4096)
def _rdp_one(n: int, batch: int, noise_multiplier: float, sampled: bool) -> np.ndarray:
    """RDP curve (at RDP_ORDERS) of ONE release; cached, so a ledger that grows by one release
    per round costs a vector sum, not a new accountant run. A sampled release's curve comes from
    :func:`wor_gaussian_rdp` (dp-accounting's formula, vectorised; :func:`_epsilon` checks it
    against dp-accounting where it matters), an unsampled one's from dp-accounting."""
    if sampled:
        curve = wor_gaussian_rdp(batch / n, noise_multiplier, RDP_ORDERS)
        curve.setflags(write=False)
        return curve
    return _rdp_one_accountant(n, batch, noise_multiplier, sampled)


@functools.lru_cache(maxsize=4096)
def _rdp_one_accountant(n: int, batch: int, noise_multiplier: float, sampled: bool) -> np.ndarray:
    """RDP curve (at RDP_ORDERS) of ONE release, from dp-accounting's accountant."""
    import dp_accounting as dpa  # dp-accounting (and scipy): loaded when an epsilon is computed
    from dp_accounting.rdp import RdpAccountant
    accountant = RdpAccountant(RDP_ORDERS, dpa.NeighboringRelation.REPLACE_ONE)
    event: dpa.DpEvent = dpa.GaussianDpEvent(noise_multiplier)
    if sampled:
        event = dpa.SampledWithoutReplacementDpEvent(n, batch, event)
    accountant.compose(event)
    curve = np.asarray(accountant._rdp, dtype=np.float64)  # dp-accounting keeps the curve here
    curve.setflags(write=False)
    return curve


@functools.lru_cache(maxsize=16384)
def _rdp_at_order(n: int, batch: int, noise_multiplier: float, order: float) -> float:
    """dp-accounting's RDP of ONE sampled release at one order (its cost grows with order^2,
    so one order is a small fraction of the whole curve)."""
    import dp_accounting as dpa  # dp-accounting (and scipy): loaded when an epsilon is computed
    from dp_accounting.rdp import RdpAccountant
    accountant = RdpAccountant([order], dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dpa.SampledWithoutReplacementDpEvent(n, batch, dpa.GaussianDpEvent(noise_multiplier)))
    return float(accountant._rdp[0])


@dataclass(frozen=True)
class PlannedRelease:
    """``count`` releases of one kind that a silo plans, before calibration: their noise
    multiplier will be ``scale * weight`` (the budget split; 1.0 for a single kind)."""

    kind: str
    n: int
    batch: int
    count: int = 1
    weight: float = 1.0
    disjoint: bool = False

    def at(self, scale: float) -> Release:
        """The releases with noise multiplier ``scale * weight``."""
        return Release(self.kind, self.n, self.batch, scale * self.weight, self.count, self.disjoint)


def calibrate_noise_multiplier(
    plan: Sequence[PlannedRelease], epsilon: float, delta: float, *, rtol: float = 1e-3
) -> float:
    """Find the smallest scale s (to relative tolerance ``rtol``, rounded up so the result
    is always within budget) such that the planned releases, each with noise multiplier
    ``s * r.weight``, spend at most ``epsilon`` at ``delta``. Returns s."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if math.isinf(epsilon):
        return 0.0
    if not plan or all(r.count == 0 for r in plan):
        raise ValueError("cannot calibrate an empty release plan")
    return _calibrate(tuple(plan), float(epsilon), float(delta), float(rtol))


@functools.lru_cache(maxsize=256)
def _calibrate(plan: tuple[PlannedRelease, ...], epsilon: float, delta: float, rtol: float) -> float:
    """Cached: every silo of a sweep with the same (plan, epsilon, delta) gets the same answer.

    A plan with sampled Gaussian releases searches with :func:`wor_gaussian_rdp` (a vectorised
    copy of dp-accounting's formula, milliseconds per evaluation instead of a third of a second),
    along the same bisection path as :func:`calibrate_reference`, so it returns the same number;
    the answer is then certified by :func:`epsilon_spent`, the number the ledger will use, which
    checks the curves against dp-accounting's accountant at the order that decides it. Should the
    answer not fit, the reference search (dp-accounting at every order, every step) runs instead."""
    if not any(r.count > 0 and r.batch < r.n and not r.disjoint for r in plan):
        return calibrate_reference(plan, epsilon, delta, rtol)  # no RDP involved: already fast
    scale = bisect_scale(lambda s: epsilon_fast([r.at(s) for r in plan], delta), epsilon, delta, rtol)
    if epsilon_spent([r.at(scale) for r in plan], delta) <= epsilon:
        return scale
    logger.warning("fast calibration's answer z=%r is over budget by the certified accountant (epsilon=%r, "
                   "delta=%r); searching with dp-accounting at every step", scale, epsilon, delta)
    return calibrate_reference(plan, epsilon, delta, rtol)


def calibrate_reference(plan: Sequence[PlannedRelease], epsilon: float, delta: float, rtol: float = 1e-3) -> float:
    """The bisection with dp-accounting at every step (the fallback, and the tests' reference):
    the algorithm before the fast search, with the accountant's curves at every order."""
    return bisect_scale(lambda s: epsilon_spent_reference([r.at(s) for r in plan], delta), float(epsilon), float(delta),
                   float(rtol))


def bisect_scale(eps_at: Callable[[float], float], epsilon: float, delta: float, rtol: float) -> float:
    """Smallest scale with eps_at(scale) <= epsilon, to relative tolerance rtol, rounded up:
    doubling (or halving) from 1, then geometric bisection."""
    lo, hi = 0.0, 1.0
    while eps_at(hi) > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e7:
            raise ValueError(f"no noise level reaches epsilon={epsilon} at delta={delta}")
    if lo == 0.0:
        lo = hi / 2.0
        while lo > 1e-7 and eps_at(lo) <= epsilon:
            hi, lo = lo, lo / 2.0
    while (hi - lo) > rtol * hi:
        mid = math.sqrt(lo * hi)
        if eps_at(mid) > epsilon:
            lo = mid
        else:
            hi = mid
    return float(hi)


def epsilon_fast(releases: Sequence[Release], delta: float) -> float:
    """:func:`epsilon_spent` for Gaussian releases with at least one sampled kind, with the
    vectorised RDP curves (used by the calibration's search only, never for a reported number)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon  # loaded when an epsilon is computed
    live = _live(releases)
    if any(r.noise_multiplier == 0 for r in live):
        return math.inf
    orders = np.asarray(RDP_ORDERS, dtype=np.float64)
    rdp = sum(r.count * (wor_gaussian_rdp(r.batch / r.n, r.noise_multiplier, RDP_ORDERS) if r.sampled
                         else orders / (2 * r.noise_multiplier**2)) for r in live)
    eps, _ = compute_epsilon(RDP_ORDERS, rdp, delta)
    return float(eps)


def calibrate_trial_scale(plan: Sequence[PlannedRelease], epsilon: float, delta: float, *, p: float, levels: int,
                     dim: int, amplification: str = "none") -> int:
    """Shuffle DP's calibration: the smallest integer scale m (noise trials) such that the
    planned binomial releases, kind i with ``ceil(m * weight_i^2)`` trials (the noise standard
    deviation in levels is sqrt(trials p (1 - p)), so a weight scales it like a noise multiplier),
    spend at most ``epsilon`` at ``delta`` (``amplification`` = "sampling": sampled kinds claim
    amplification by sampling, :class:`Release`). A doubling search, then bisection over integers."""
    if not epsilon > 0 or math.isinf(epsilon):
        raise ValueError(f"shuffle calibration needs a finite epsilon > 0, got {epsilon}")
    if not plan or all(r.count == 0 for r in plan):
        raise ValueError("cannot calibrate an empty release plan")
    if amplification not in AMPLIFICATIONS:
        raise ValueError(f"amplification must be one of {AMPLIFICATIONS}, got {amplification!r}")
    return _calibrate_trial_scale(tuple(plan), float(epsilon), float(delta), float(p), int(levels), int(dim),
                                  amplification)


def binomial_releases(plan: Sequence[PlannedRelease], scale: int, *, p: float, levels: int, dim: int,
                      amplification: str = "none") -> list[Release]:
    """The planned releases as binomial releases at trial scale ``scale``."""
    return [Release(r.kind, r.n, r.batch, 0.0, r.count, r.disjoint, "binomial", trials_for(scale, r.weight),
                    levels, p, dim, amplification) for r in plan]


def trials_for(scale: int, weight: float) -> int:
    """A kind's noise trials at trial scale m: ceil(m * weight^2)."""
    return max(1, math.ceil(scale * weight * weight))


@functools.lru_cache(maxsize=256)
def _calibrate_trial_scale(plan: tuple[PlannedRelease, ...], epsilon: float, delta: float, p: float, levels: int,
                      dim: int, amplification: str = "none") -> int:
    from app.privacy import binomial

    def fits(scale: int) -> bool:  # _epsilon_fast_binomial(...) <= epsilon, decided with fewer exact columns
        live = _live(binomial_releases(plan, scale, p=p, levels=levels, dim=dim, amplification=amplification))
        return binomial.fast_fits([(r.trials, r.p, r.levels, r.dim, r.count, r.gamma) for r in live], delta, epsilon)

    # A start that is exact when every kind has weight 1: kinds with the same trials compose like
    # one kind released sum(count) times (a disjoint kind counts once, parallel composition).
    equivalent = sum((min(r.count, 1) if r.disjoint else r.count) / (r.weight * r.weight) for r in plan if r.count)
    # amplified: start from the least amplified kind's rate (the guess is then an upper-ish start)
    rates = [r.gamma for r in binomial_releases(plan, 1, p=p, levels=levels, dim=dim, amplification=amplification)
             if r.count]
    guess = binomial.calibrate_trials(epsilon, delta, p, levels, dim, max(1, math.ceil(equivalent)),
                                      gamma=max(rates, default=1.0))
    if fits(guess) and (guess <= 1 or not fits(guess - 1)):
        return int(guess)
    lo, hi = 0, max(1, guess)
    while not fits(hi):
        lo, hi = hi, math.ceil(hi * 1.25)
        if hi > 1 << 50:
            raise ValueError(f"no number of noise trials reaches epsilon={epsilon} at delta={delta}")
    if lo == 0:
        lo = hi
        while lo > 1 and fits(lo):
            hi, lo = lo, lo * 4 // 5
        if fits(lo):
            return int(lo)
    while hi - lo > max(1, hi // 1000):  # 0.1% in trials = 0.05% in noise std: within budget (hi fits)
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return int(hi)
