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
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

import dp_accounting as dpa
from dp_accounting.gaussian_mechanism import get_epsilon_gaussian
from dp_accounting.rdp import RdpAccountant

#: Renyi orders used for sampled releases: dense where the optimum usually lies, integers only
#: (the without-replacement bound of WBK19 is exact at integer orders).
RDP_ORDERS: tuple[float, ...] = tuple(range(2, 65)) + (80, 96, 128, 192, 256)


@dataclass(frozen=True)
class Release:
    """One kind of noisy release, ``count`` times.

    kind: a label ("grad", "local-step", "anchor", ...); n: the silo's record count;
    batch: K records sampled without replacement; noise_multiplier: z = sigma / (2L/K).
    """

    kind: str
    n: int
    batch: int
    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.batch <= self.n:
            raise ValueError(f"release batch K={self.batch} must be in [1, n={self.n}]")
        if self.count < 0:
            raise ValueError(f"release count must be >= 0, got {self.count}")
        if not self.noise_multiplier >= 0:
            raise ValueError(f"noise multiplier must be >= 0, got {self.noise_multiplier}")

    @property
    def sampled(self) -> bool:
        return self.batch < self.n


def group_releases(releases: Sequence[Release]) -> list[Release]:
    """Merge releases that differ only in ``count`` (composition of identical events)."""
    counts: Counter[tuple[str, int, int, float]] = Counter()
    for r in releases:
        counts[(r.kind, r.n, r.batch, r.noise_multiplier)] += r.count
    return [Release(k, n, b, z, c) for (k, n, b, z), c in counts.items() if c > 0]


def dp_event(releases: Sequence[Release]) -> dpa.DpEvent:
    """The dp-accounting event of a sequence of releases (for RDP under REPLACE_ONE)."""
    events: list[dpa.DpEvent] = []
    for r in group_releases(releases):
        base: dpa.DpEvent = dpa.GaussianDpEvent(r.noise_multiplier)
        if r.sampled:
            base = dpa.SampledWithoutReplacementDpEvent(r.n, r.batch, base)
        events.append(dpa.SelfComposedDpEvent(base, r.count))
    return dpa.ComposedDpEvent(events)


def epsilon_spent(releases: Sequence[Release], delta: float) -> float:
    """Smallest epsilon the accountant certifies at ``delta`` for all ``releases``."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    live = tuple(sorted((r for r in group_releases(releases) if r.count > 0),
                        key=lambda r: (r.kind, r.n, r.batch, r.noise_multiplier)))
    return _epsilon(live, float(delta))


@functools.lru_cache(maxsize=1024)
def _epsilon(live: tuple[Release, ...], delta: float) -> float:
    """Cached: a silo asks for the same ledger state several times per round (check, record,
    report), and Renyi accounting of sampled releases takes a fraction of a second."""
    if not live:
        return 0.0
    if any(r.noise_multiplier == 0 for r in live):
        return math.inf
    if not any(r.sampled for r in live):
        mu_sq = sum(r.count / r.noise_multiplier**2 for r in live)
        return float(get_epsilon_gaussian(1.0 / math.sqrt(mu_sq), delta))
    accountant = RdpAccountant(RDP_ORDERS, dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_event(live))
    return float(accountant.get_epsilon(delta))


def calibrate_noise_multiplier(
    plan: Sequence[Release], epsilon: float, delta: float, *, rtol: float = 1e-3
) -> float:
    """Find the smallest scale s (to relative tolerance ``rtol``, rounded up so the result
    is always within budget) such that the planned releases, each with noise multiplier
    ``s * r.noise_multiplier`` (the plan's multipliers are relative weights, 1.0 for a single
    kind), spend at most ``epsilon`` at ``delta``. Returns s."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if math.isinf(epsilon):
        return 0.0
    if not plan or all(r.count == 0 for r in plan):
        raise ValueError("cannot calibrate an empty release plan")

    def eps_at(scale: float) -> float:
        return epsilon_spent([replace(r, noise_multiplier=scale * r.noise_multiplier) for r in plan], delta)

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

