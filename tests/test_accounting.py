"""Privacy accounting against independent facts."""

from __future__ import annotations

import math

import pytest
from scipy.optimize import brentq

from app.privacy.accounting import PlannedRelease, Release, calibrate_noise_multiplier, epsilon_spent
from app.privacy.sensitivity import mean_sensitivity
from tests.helpers import analytic_gaussian_delta


def analytic_gaussian_sigma(eps: float, delta: float, sensitivity: float) -> float:
    return brentq(lambda s: analytic_gaussian_delta(s, sensitivity, eps) - delta, 1e-6 * sensitivity, 1e6 * sensitivity)


@pytest.mark.parametrize("eps,n", [(0.75, 170), (3.0, 286), (18.0, 170)])
def test_full_batch_single_release_matches_analytic_gaussian(eps: float, n: int) -> None:
    clip, delta = 1.0, 1.0 / n**2
    z = calibrate_noise_multiplier([PlannedRelease("grad", n, n, 1)], eps, delta)
    sigma = z * mean_sensitivity(clip, n)  # the silo's sigma with K = n
    expected = analytic_gaussian_sigma(eps, delta, 2 * clip / n)
    assert sigma == pytest.approx(expected, rel=0.02)
    assert sigma >= expected * (1 - 1e-6)  # never below the exact value: always within budget


def test_epsilon_grows_with_rounds_and_falls_with_noise() -> None:
    n, delta = 200, 1e-5
    for batch in (n, 32):
        by_rounds = [epsilon_spent([Release("g", n, batch, 2.0, r)], delta) for r in (1, 5, 25, 100)]
        assert all(a < b for a, b in zip(by_rounds, by_rounds[1:]))
        by_noise = [epsilon_spent([Release("g", n, batch, z, 25)], delta) for z in (0.8, 1.5, 3.0, 6.0)]
        assert all(a > b for a, b in zip(by_noise, by_noise[1:]))


def test_subsampling_amplifies() -> None:
    """Sampling K < n records without replacement gives a smaller epsilon than touching all n."""
    n, delta = 500, 1e-6
    full = epsilon_spent([Release("g", n, n, 3.0, 20)], delta)
    sampled = epsilon_spent([Release("g", n, 50, 3.0, 20)], delta)
    assert sampled < 0.5 * full


def test_composition_of_unsampled_gaussians_is_one_gaussian() -> None:
    """R releases with multiplier z equal one release with z / sqrt(R) (Gaussian DP)."""
    n, delta = 100, 1e-5
    assert epsilon_spent([Release("g", n, n, 4.0, 16)], delta) == pytest.approx(
        epsilon_spent([Release("g", n, n, 1.0, 1)], delta), rel=1e-9)


@pytest.mark.slow
def test_calibration_is_tight_and_safe() -> None:
    n, batch, rounds, eps, delta = 286, 64, 25, 3.0, 1 / 286**2
    z = calibrate_noise_multiplier([PlannedRelease("g", n, batch, rounds)], eps, delta)
    assert epsilon_spent([Release("g", n, batch, z, rounds)], delta) <= eps
    assert epsilon_spent([Release("g", n, batch, z * 0.99, rounds)], delta) > eps * 0.995


def test_no_noise_is_infinite_epsilon_and_infinite_budget_needs_no_noise() -> None:
    assert math.isinf(epsilon_spent([Release("g", 10, 10, 0.0, 1)], 1e-5))
    assert calibrate_noise_multiplier([PlannedRelease("g", 10, 10, 1)], math.inf, 1e-5) == 0.0
    assert epsilon_spent([], 1e-5) == 0.0


@pytest.mark.parametrize("bad", [dict(batch=0), dict(batch=11), dict(count=-1), dict(noise_multiplier=-1.0)])
def test_release_rejects_bad_values(bad: dict) -> None:
    args = dict(kind="g", n=10, batch=5, noise_multiplier=1.0, count=1) | bad
    with pytest.raises(ValueError):
        Release(**args)


def test_opacus_cross_check_bounds_the_exact_full_batch_epsilon() -> None:
    from app.privacy.opacus_check import opacus_epsilon

    n, delta = 170, 1 / 170**2
    releases = [Release("grad", n, n, 6.5, 25)]
    exact = epsilon_spent(releases, delta)
    opacus = opacus_epsilon(releases, delta)
    assert exact <= opacus <= 1.3 * exact  # RDP -> (eps, delta) conversion is a little loose
    sampled = [Release("grad", 2000, 64, 1.2, 100)]
    ratio = opacus_epsilon(sampled, 1e-6) / epsilon_spent(sampled, 1e-6)
    assert 0.25 < ratio < 4  # Poisson vs fixed-size sampling: same order of magnitude only
