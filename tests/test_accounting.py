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


# -- the calibration's fast search (issue 14) -------------------------------------------------

import numpy as np  # noqa: E402
from dp_accounting import GaussianDpEvent, NeighboringRelation, SampledWithoutReplacementDpEvent  # noqa: E402
from dp_accounting.rdp import RdpAccountant  # noqa: E402
from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_sample_wor_gaussian  # noqa: E402

from app.privacy import accounting  # noqa: E402
from app.privacy.accounting import RDP_ORDERS, calibrate_reference, wor_gaussian_rdp  # noqa: E402

#: (n, K, z): tiny and large sampling rates, noise from far below 1 to far above (where the high
#: forward differences cancel catastrophically), the WBCD grid's silos
WOR_POINTS = [(136, 64, 22.98), (229, 64, 1.0233), (1000, 10, 0.5), (50, 49, 3.0), (10000, 1, 0.3),
              (300, 150, 20.0), (60000, 256, 1.1), (100, 99, 50.0), (7, 3, 0.8), (2, 1, 2.0)]
#: orders on both sides of dp-accounting's switch to its O(alpha) bound (256)
WOR_ORDERS = [2, 3, 4, 5, 8, 17, 33, 64, 100, 256, 257, 300]


@pytest.mark.parametrize("n,batch,z", WOR_POINTS)
def test_vectorised_wor_rdp_is_dp_accountings_bit_for_bit(n: int, batch: int, z: float) -> None:
    """The calibration's search must walk the old search's path: same numbers, not close ones."""
    ours = wor_gaussian_rdp(batch / n, z, WOR_ORDERS)
    theirs = _compute_rdp_sample_wor_gaussian(batch / n, z, WOR_ORDERS)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=0)
    assert ours.tolist() == theirs.tolist()


def test_vectorised_wor_rdp_matches_the_public_accountant_at_every_order() -> None:
    for n, batch, z in [(136, 64, 6.525347295012731), (229, 64, 4.160164640959711)]:
        acc = RdpAccountant(list(RDP_ORDERS), NeighboringRelation.REPLACE_ONE)
        acc.compose(SampledWithoutReplacementDpEvent(n, batch, GaussianDpEvent(z)))
        assert wor_gaussian_rdp(batch / n, z, RDP_ORDERS).tolist() == list(acc._rdp)


def test_vectorised_wor_rdp_edge_cases() -> None:
    orders = [2, 10, 64]
    assert wor_gaussian_rdp(0.0, 1.0, orders).tolist() == [0.0, 0.0, 0.0]  # nothing sampled
    assert wor_gaussian_rdp(1.0, 2.0, orders).tolist() == [o / 8 for o in orders]  # the Gaussian's a/(2 z^2)
    assert np.all(np.isinf(wor_gaussian_rdp(0.5, 0.0, orders)))  # no noise
    for bad in ([1, 2], [2.5], [0]):
        with pytest.raises(ValueError):
            wor_gaussian_rdp(0.5, 1.0, bad)
    with pytest.raises(ValueError):
        wor_gaussian_rdp(1.5, 1.0, orders)
    # sanity against an independent fact: subsampling never costs more than the full Gaussian
    full = np.array(RDP_ORDERS) / (2 * 1.3**2)
    assert np.all(wor_gaussian_rdp(0.3, 1.3, RDP_ORDERS) <= full)


#: the grid's 6 calibrations as the old bisection (dp-accounting at every step) returned them,
#: recorded before the fast search existed: (n, epsilon, z as float.hex); K = 64, 25 rounds, delta 1/n^2
GRID_BEFORE = [(136, 0.75, "0x1.6fb8218301b90p+4"), (229, 0.75, "0x1.d2f87080d89f1p+3"),
               (136, 3.0, "0x1.a19f4a42c7caap+2"), (229, 3.0, "0x1.0a402331b9715p+2"),
               (136, 18.0, "0x1.88247e08e1958p+0"), (229, 18.0, "0x1.05f5c74f0bec2p+0")]
#: other plans, also recorded from the old code: (plan, epsilon, delta, rtol, z as float.hex)
OTHER_BEFORE = [
    ((PlannedRelease("grad", 500, 50, 20, 1.0), PlannedRelease("anchor", 500, 500, 5, 2.0)), 2.0, 1e-5, 1e-3,
     "0x1.95a44cbc8520fp+1"),  # sampled + unsampled kinds, weighted
    ((PlannedRelease("grad", 300, 30, 10, 1.0), PlannedRelease("prox", 300, 30, 8, 1.0, True)), 1.0, 1e-5, 1e-3,
     "0x1.371a7373aa9cap+2"),  # sampled + disjoint
    ((PlannedRelease("grad", 1000, 10, 50, 1.0),), 8.0, 1e-6, 1e-3, "0x1.130b1e264a0e9p-1"),  # z < 1: halving
    ((PlannedRelease("grad", 286, 64, 25, 1.0),), 3.0, 1 / 286**2, 1e-2, "0x1.ba5b030a10649p+1"),
]


@pytest.mark.parametrize("n,eps,z_hex", GRID_BEFORE)
def test_fast_calibration_returns_the_old_bisections_numbers(n: int, eps: float, z_hex: str) -> None:
    accounting._calibrate.cache_clear()
    z = calibrate_noise_multiplier([PlannedRelease("grad", n, 64, 25)], eps, 1 / n**2)
    assert z == float.fromhex(z_hex)


@pytest.mark.parametrize("plan,eps,delta,rtol,z_hex", OTHER_BEFORE)
def test_fast_calibration_returns_the_old_numbers_for_mixed_plans(plan, eps, delta, rtol, z_hex) -> None:
    accounting._calibrate.cache_clear()
    assert calibrate_noise_multiplier(plan, eps, delta, rtol=rtol) == float.fromhex(z_hex)


@pytest.mark.parametrize("n,eps", [(136, 0.75), (229, 18.0)])
def test_fast_calibration_is_within_budget_and_tight_by_dp_accounting(n: int, eps: float) -> None:
    rtol, delta = 1e-3, 1 / n**2
    z = calibrate_noise_multiplier([PlannedRelease("grad", n, 64, 25)], eps, delta, rtol=rtol)
    # dp-accounting's own accountant (not our curves, not our cache): within budget ...
    acc = RdpAccountant(list(RDP_ORDERS), NeighboringRelation.REPLACE_ONE)
    acc.compose(SampledWithoutReplacementDpEvent(n, 64, GaussianDpEvent(z)), 25)
    assert acc.get_epsilon(delta) <= eps
    # ... and tight: rtol less noise is over it
    assert epsilon_spent([Release("g", n, 64, z * (1 - rtol), 25)], delta) > eps


def test_a_fast_path_that_under_reports_cannot_leave_the_budget(monkeypatch) -> None:
    """Attack: the search's curves claim a smaller epsilon than dp-accounting's (a bug, a
    tampered cache). The answer is certified with dp-accounting, so the silo still gets a
    multiplier within budget (the exact search's), not the under-noised one."""
    plan = (PlannedRelease("grad", 229, 64, 25),)
    eps, delta, rtol = 3.0, 1 / 229**2, 0.05
    honest = accounting.epsilon_fast
    monkeypatch.setattr(accounting, "epsilon_fast", lambda rel, d: 0.5 * honest(rel, d))
    accounting._calibrate.cache_clear()
    z = calibrate_noise_multiplier(plan, eps, delta, rtol=rtol)
    accounting._calibrate.cache_clear()
    assert epsilon_spent([r.at(z) for r in plan], delta) <= eps
    assert z == calibrate_reference(plan, eps, delta, rtol)


@pytest.mark.slow
def test_fast_calibration_equals_the_reference_bisection_run_now() -> None:
    """The old algorithm, still callable, against the new one on a plan not recorded above."""
    plan = (PlannedRelease("grad", 400, 40, 15, 1.0), PlannedRelease("anchor", 400, 400, 3, 1.5))
    accounting._calibrate.cache_clear()
    assert calibrate_noise_multiplier(plan, 1.5, 1e-5, rtol=1e-2) == calibrate_reference(plan, 1.5, 1e-5, 1e-2)


def test_a_wrong_fast_curve_is_caught_by_dp_accountings_own_number(monkeypatch, caplog) -> None:
    """Attack: the vectorised curve under-reports (a bug, a changed dp-accounting formula).
    epsilon_spent checks it against dp-accounting's accountant at the order that decides the
    answer, so what a ledger reports is dp-accounting's epsilon, not the under-report."""
    releases = [Release("grad", 229, 64, 4.160164640959711, 25)]
    delta = 1 / 229**2
    acc = RdpAccountant(list(RDP_ORDERS), NeighboringRelation.REPLACE_ONE)
    acc.compose(SampledWithoutReplacementDpEvent(229, 64, GaussianDpEvent(4.160164640959711)), 25)
    truth = acc.get_epsilon(delta)
    honest = accounting.wor_gaussian_rdp
    for fn in (accounting._epsilon, accounting._rdp_one, accounting._calibrate):
        fn.cache_clear()
    monkeypatch.setattr(accounting, "wor_gaussian_rdp", lambda q, z, orders: 0.5 * honest(q, z, orders))
    with caplog.at_level("WARNING", logger="app.privacy.accounting"):
        assert epsilon_spent(releases, delta) == pytest.approx(truth, rel=1e-12)
    assert "differs from dp-accounting" in caplog.text
    # and the calibration, searching with the wrong curves, still hands out a multiplier within budget
    z = calibrate_noise_multiplier([PlannedRelease("grad", 229, 64, 25)], 3.0, delta, rtol=0.05)
    acc = RdpAccountant(list(RDP_ORDERS), NeighboringRelation.REPLACE_ONE)
    acc.compose(SampledWithoutReplacementDpEvent(229, 64, GaussianDpEvent(z)), 25)
    assert acc.get_epsilon(delta) <= 3.0
    for fn in (accounting._epsilon, accounting._rdp_one, accounting._calibrate):
        fn.cache_clear()


def test_reported_epsilon_is_dp_accountings_for_ledger_states() -> None:
    """The ledger's epsilon after each of 25 rounds, as dp-accounting's accountant gives it."""
    n, z, delta = 136, 6.525347295012731, 1 / 136**2
    for fn in (accounting._epsilon, accounting._rdp_one):
        fn.cache_clear()
    for count in (1, 2, 7, 25):
        acc = RdpAccountant(list(RDP_ORDERS), NeighboringRelation.REPLACE_ONE)
        acc.compose(SampledWithoutReplacementDpEvent(n, 64, GaussianDpEvent(z)), count)
        assert epsilon_spent([Release("grad", n, 64, z, count)], delta) == acc.get_epsilon(delta)
