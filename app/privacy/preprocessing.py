"""The budget of a silo's DP pre-processing release and of the training that follows it.

Split: the pre-processing release (``standardize = "dp"``: the noisy mean and second moment of
the silo's clipped records, two unsampled Gaussian mechanisms with multiplier z_pre each) gets
the noise that makes it alone spend ``preprocess-share`` * epsilon at the silo's delta; the
training releases are then calibrated so that pre-processing + training together spend at most
epsilon (the ledger composes them exactly as it composes training releases). So the run's
epsilon covers both, and the share only decides how the budget is divided.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.privacy.accounting import (PlannedRelease, Release, bisect_scale, calibrate_noise_multiplier, epsilon_fast,
                                    epsilon_spent, epsilon_spent_reference)

#: the ledger kind of the pre-processing release
PREPROCESS_KIND = "preprocess-stats"
#: the release holds two Gaussian mechanisms: the mean and the second moment
PREPROCESS_COUNT = 2


def preprocess_noise_multiplier(n: int, epsilon: float, share: float, delta: float) -> float:
    """z_pre: the smallest multiplier with which the two unsampled releases spend ``share * epsilon``
    at ``delta`` (0 for an infinite epsilon: no privacy asked)."""
    if not 0 < share < 1:
        raise ValueError(f"preprocess-share = {share} must be in (0, 1)")
    if math.isinf(epsilon):
        return 0.0
    return calibrate_noise_multiplier([PlannedRelease(PREPROCESS_KIND, n, n, PREPROCESS_COUNT)], share * epsilon, delta)


def preprocess_releases(n: int, noise_multiplier: float) -> list[Release]:
    """The ledger rows of the release (z = sigma / sensitivity for each of the two)."""
    return [Release(PREPROCESS_KIND, n, n, noise_multiplier, PREPROCESS_COUNT)]


def calibrate_after(fixed: Sequence[Release], plan: Sequence[PlannedRelease], epsilon: float, delta: float,
                    rtol: float = 1e-3) -> float:
    """The smallest training scale s (rounded up) with epsilon_spent(fixed + plan at s) <= epsilon:
    :func:`calibrate_noise_multiplier` with the already planned ``fixed`` releases composed in."""
    if math.isinf(epsilon):
        return 0.0
    fixed = list(fixed)
    sampled = any(r.batch < r.n and not r.disjoint for r in plan)

    def certified(s: float) -> float:
        return epsilon_spent(fixed + [r.at(s) for r in plan], delta)

    if sampled:
        scale = bisect_scale(lambda s: epsilon_fast(fixed + [r.at(s) for r in plan], delta), epsilon, delta, rtol)
        if certified(scale) <= epsilon:
            return scale
        return bisect_scale(lambda s: epsilon_spent_reference(fixed + [r.at(s) for r in plan], delta), epsilon, delta,
                       rtol)
    return bisect_scale(certified, epsilon, delta, rtol)


def preprocess_plan(step, n: int, private: bool, shuffle: bool, epsilon: float, delta: float,
                    key: dict) -> tuple[float, int, list[Release]]:
    """A silo's ``dp`` pre-processing plan: (z_pre, seed placeholder 0, ledger rows); adds it to the
    calibration ``key``. No step: (0, 0, []). A non-private run plans no rows (z = 0: exact
    statistics, nothing to account). Shuffle DP is refused (its calibration has no fixed release)."""
    if step is None:
        return 0.0, 0, []
    if shuffle:
        raise ValueError("standardize = 'dp' is not available with privacy.mode = 'shuffle' (its calibration has no "
                         "fixed release); use standardize = 'public', 'server' or 'none'")
    z = preprocess_noise_multiplier(n, epsilon, step.share, delta) if private else 0.0
    key["preprocess"] = [step.clip, step.share, z]
    return z, 0, preprocess_releases(n, z) if private else []
