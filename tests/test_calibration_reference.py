"""Shuffle DP's fast calibration (app/privacy/binomial/search.py, accounting.calibrate_trial_scale)
against a slow, independent reference on a grid of plans: the same integer trials.

The reference knows nothing of the fast path (lazy columns, lower bounds, decisions, hints): it
evaluates the ledger's own accountant, epsilon_spent over whole Renyi curves (every order, every
shift), and searches the integers plainly:

* one kind of release: the smallest m with epsilon(m) <= epsilon, by doubling then bisection
  (the definition of calibrate_trials' answer);
* several kinds: the search calibrate_trial_scale has always used (start from the one-kind answer
  of the equivalent count, widen by 1.25x, bisect until hi - lo <= hi // 1000), written out here.
"""

from __future__ import annotations

import math

import pytest

from app.privacy import binomial as B
from app.privacy.binomial import search
from app.privacy.binomial.amplified import cached_amplified_curve
from app.privacy.binomial.divergence import cached_release_curve, divergence_table, prelude
from app.privacy.accounting import PlannedRelease as P
from app.privacy.accounting import binomial_releases, calibrate_trial_scale, epsilon_spent


def _clear() -> None:
    for fn in (cached_release_curve, cached_amplified_curve, divergence_table, prelude, B.lazy_curve):
        fn.cache_clear()
    from app.privacy import accounting

    search.DECIDED.clear()
    accounting._calibrate_trial_scale.cache_clear()


def _ref_eps(plan, scale, delta, p, g, d, amp) -> float:
    return epsilon_spent(binomial_releases(plan, scale, p=p, levels=g, dim=d, amplification=amp), delta)


def _smallest(fits) -> int:
    """The smallest m >= 1 with fits(m) (fits monotone), by doubling then bisection."""
    if fits(1):
        return 1
    lo, hi = 1, 2
    while not fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def _ref_scale(plan, eps, delta, p, g, d, amp) -> int:
    fits = lambda s: _ref_eps(plan, s, delta, p, g, d, amp) <= eps  # noqa: E731
    if len(plan) == 1:
        return _smallest(fits)
    equivalent = sum((min(r.count, 1) if r.disjoint else r.count) / (r.weight * r.weight) for r in plan if r.count)
    gamma = max(r.gamma for r in binomial_releases(plan, 1, p=p, levels=g, dim=d, amplification=amp) if r.count)
    one = [(m, p, g, d, max(1, math.ceil(equivalent)), gamma) for m in (0,)]
    c = one[0][4]
    guess = _smallest(lambda m: B.epsilon_from_curves(
        [((B.amplified_release_curve(m, p, g, d, gamma) if gamma < 1 else B.release_curve(m, p, g, d)), c)],
        delta) <= eps)
    if fits(guess) and (guess <= 1 or not fits(guess - 1)):
        return guess
    lo, hi = 0, max(1, guess)
    while not fits(hi):
        lo, hi = hi, math.ceil(hi * 1.25)
    if lo == 0:
        lo = hi
        while lo > 1 and fits(lo):
            hi, lo = lo, lo * 4 // 5
        if fits(lo):
            return lo
    while hi - lo > max(1, hi // 1000):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


#: (plan, epsilon, delta, p, g, d, amplification)
GRID = [
    ([P("grad", 500, 50, 25)], 1.0, 1e-5, 0.25, 8, 4, "none"),
    ([P("grad", 500, 50, 25)], 1.0, 1e-5, 0.25, 8, 4, "sampling"),
    ([P("grad", 200, 200, 10)], 3.0, 1 / 200 ** 2, 0.25, 16, 30, "sampling"),  # K = n: nothing to amplify
    ([P("grad", 300, 16, 40)], 0.75, 1e-5, 0.25, 6, 10, "sampling"),
    ([P("grad", 300, 16, 40)], 6.0, 1e-5, 0.5, 6, 10, "none"),
    ([P("grad", 1000, 10, 5)], 0.5, 1e-6, 0.25, 3, 2, "sampling"),
    ([P("anchor", 300, 300, 5, 2.0), P("diff", 300, 30, 20, 1.0)], 3.0, 1e-5, 0.25, 10, 20, "none"),
    ([P("anchor", 300, 300, 5, 2.0), P("diff", 300, 30, 20, 1.0)], 3.0, 1e-5, 0.25, 10, 20, "sampling"),
    ([P("disjoint", 400, 40, 10, 1.0, True)], 1.5, 1e-5, 0.25, 12, 30, "none"),
]


@pytest.mark.parametrize("row", GRID, ids=[f"{i}-{r[-1]}" for i, r in enumerate(GRID)])
def test_fast_calibration_gives_the_references_trials(row) -> None:
    plan, eps, delta, p, g, d, amp = row
    _clear()
    expected = _ref_scale(plan, eps, delta, p, g, d, amp)
    _clear()
    got = calibrate_trial_scale(plan, eps, delta, p=p, levels=g, dim=d, amplification=amp)
    assert got == expected
    # the accountant's claim at the answer meets the budget (and one-kind: one trial fewer does not)
    assert _ref_eps(plan, got, delta, p, g, d, amp) <= eps
    if len(plan) == 1 and got > 1:
        assert _ref_eps(plan, got - 1, delta, p, g, d, amp) > eps


@pytest.mark.parametrize("g", [2, 4, 6, 16])
def test_lower_bound_rows_are_a_lower_bound(g) -> None:
    """The few-rows bound reads the rows it names. Before the fix, at g in {2, 4, 6} the rows
    {g-1, g-2, g-g/2, 0, g+1, g+2, g+g/2, 2g} span exactly as many rows as they are, so _columns
    took the contiguous rows g-1 .. 2g instead: a "lower bound" above the exact value, which made
    the search prune the deciding order and calibrate more trials than the accountant needs."""
    _clear()
    curve = B.lazy_curve(200_000, 0.25, g)
    for o in range(len(B.ORDERS)):
        assert curve.ratio_lower(o) <= curve.ratio(o)


def test_fast_epsilon_of_a_small_g_amplified_plan_is_the_accountants_number() -> None:
    _clear()
    m, gamma = 549_094, 16 / 300
    whole = B.epsilon_from_curves([(B.amplified_release_curve(m, 0.25, 6, 10, gamma), 40)], 1e-5)
    _clear()
    assert B.fast_epsilon([(m, 0.25, 6, 10, 40, gamma)], 1e-5) == whole
