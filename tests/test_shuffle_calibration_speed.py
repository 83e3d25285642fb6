"""Shuffle DP's calibration (issue 24, "calibration <= 1 s per silo"): the search that computes
only the Renyi orders that decide each step (app/privacy/binomial/: fast_epsilon, LazyCurve)
must return the SAME trials as the search before it, and its epsilon must be the accountant's
number bit for bit.

REFERENCE holds independent facts: the trials ``calibrate_trial_scale`` returned at the base
commit 8646705 (before the change), computed there with

    calibrate_trial_scale(plan, epsilon, delta, p=p, levels=g, dim=d)

for each row (digits rows: silo sizes n = 142 and 139 of the digits preset's 10 silos, MLP
64-64-10 so d = 4810 and g = ceil(4 sqrt(d)) = 278, full batches, 15 rounds, delta = 1/n^2).
"""

from __future__ import annotations

import time

import pytest

from app.privacy import binomial as B
from app.privacy.binomial.amplified import cached_amplified_curve
from app.privacy.binomial.divergence import cached_release_curve, divergence_table, prelude
from app.privacy.accounting import PlannedRelease as P
from app.privacy.accounting import binomial_releases, calibrate_trial_scale, epsilon_spent

#: (name, plan, epsilon, delta, p, g, d, trials at 8646705)
REFERENCE = [
    ("small sampled", [P("grad", 500, 50, 25)], 1.0, 1e-5, 0.25, 16, 4, 716951),
    ("spider two kinds", [P("anchor", 300, 300, 5, 2.0), P("diff", 300, 30, 20, 1.0)], 3.0, 1e-5, 0.25, 40, 100,
     635446),
    ("proxsgd disjoint", [P("disjoint", 400, 40, 10, 1.0, True)], 1.5, 1e-5, 0.25, 24, 30, 36788),
    ("digits silo 0, eps 18", [P("grad", 142, 142, 15)], 18.0, 1 / 142 ** 2, 0.25, 278, 4810, 965157),
    ("digits silo 0, eps 3", [P("grad", 142, 142, 15)], 3.0, 1 / 142 ** 2, 0.25, 278, 4810, 18584757),
]
#: the base commit's answer for digits silo 8 at eps 0.75 (a minute there; seconds now): slow test
SLOW_REFERENCE = ("digits silo 8, eps 0.75", [P("grad", 139, 139, 15)], 0.75, 1 / 139 ** 2, 0.25, 278, 4810,
                  219609245)


def _clear() -> None:
    for fn in (cached_release_curve, divergence_table, prelude, B.lazy_curve):
        fn.cache_clear()


@pytest.mark.parametrize("row", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_same_trials_as_before(row):
    name, plan, eps, delta, p, g, d, expected = row
    _clear()
    t0 = time.perf_counter()
    m = calibrate_trial_scale(plan, eps, delta, p=p, levels=g, dim=d)
    print(f"{name}: {m} trials in {time.perf_counter() - t0:.2f} s (base commit: {expected})")
    assert m == expected


@pytest.mark.slow
def test_same_trials_as_before_large():
    name, plan, eps, delta, p, g, d, expected = SLOW_REFERENCE
    _clear()
    assert calibrate_trial_scale(plan, eps, delta, p=p, levels=g, dim=d) == expected


@pytest.mark.parametrize("m,p,g,d,count,delta", [(60, 0.25, 2, 1, 1, 1e-3), (5000, 0.25, 16, 4, 7, 1e-5),
                                                 (635446, 0.25, 40, 100, 20, 1e-5), (10 ** 7, 0.5, 3, 5, 3, 1e-6),
                                                 (40, 0.25, 30, 2, 1, 1e-5)])
def test_fast_epsilon_is_the_accountants_number(m, p, g, d, count, delta):
    """fast_epsilon computes a few orders only; its number must be epsilon_from_curves', bit for bit."""
    _clear()
    full = B.epsilon_from_curves([(B.release_curve(m, p, g, d), count)], delta)
    _clear()
    assert B.fast_epsilon([(m, p, g, d, count)], delta) == full


def test_fast_epsilon_several_kinds_and_extra():
    extra = B.gaussian_rdp(3.0)
    parts = [(20_000, 0.25, 8, 10, 3), (80_000, 0.25, 8, 10, 2)]
    full = B.epsilon_from_curves([(B.release_curve(*q[:4]), q[4]) for q in parts], 1e-5, extra_rdp=extra)
    _clear()
    assert B.fast_epsilon(parts, 1e-5, extra_rdp=extra) == full


def test_calibrated_trials_meet_the_budget_and_one_fewer_does_not():
    """One kind: the smallest m by definition (several kinds: within 0.1%, the search's contract)."""
    plan, eps, delta, p, g, d = [P("grad", 500, 50, 25)], 1.0, 1e-5, 0.25, 16, 4
    m = calibrate_trial_scale(plan, eps, delta, p=p, levels=g, dim=d)
    assert epsilon_spent(binomial_releases(plan, m, p=p, levels=g, dim=d), delta) <= eps
    assert epsilon_spent(binomial_releases(plan, m - 1, p=p, levels=g, dim=d), delta) > eps


@pytest.mark.parametrize("m,g,d,gamma,count,delta", [(60, 2, 1, 0.1, 3, 1e-3), (5000, 16, 4, 0.03, 25, 1e-5),
                                                     (716951, 16, 4, 0.1, 25, 1e-5), (40, 1, 1, 1 / 8, 1, 1e-3)])
def test_fast_epsilon_of_amplified_releases_is_the_accountants_number(m, g, d, gamma, count, delta):
    full = B.epsilon_from_curves([(B.amplified_release_curve(m, 0.25, g, d, gamma), count)], delta)
    _clear()
    cached_amplified_curve.cache_clear()
    assert B.fast_epsilon([(m, 0.25, g, d, count, gamma)], delta) == full
