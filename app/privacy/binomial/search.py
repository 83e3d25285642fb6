"""Shuffle DP's calibration search over the number of noise trials m (the method in
app/privacy/binomial/__init__.py): the smallest m whose composed epsilon meets the budget,
computing as few Renyi columns as it can.

* :func:`fast_epsilon`: the accountant's epsilon (epsilon_from_curves over the whole curves), bit
  for bit, by branch and bound over the orders on :class:`app.privacy.binomial.lazy.LazyCurve`.
* :func:`fast_fits`: ``fast_epsilon(...) <= epsilon`` decided with fewer exact columns: it stops at
  the first order whose exact epsilon meets the budget, and checks exactly only the orders whose
  lower bound meets it (the conversion is non-decreasing in the Renyi value, so an order whose
  lower bound exceeds the budget cannot meet it); before an exact column it tries the two rows
  of the shift that decided the last exact column there (LazyCurve.ratio_rows: the table's own
  numbers, so a lower bound with no margin), which refute m - 1 at the crossing.
* :func:`calibrate_trials`: a cheap stand-in's crossing, then the exact crossing next to it
  (one exact column at m, the deciding rows at m - 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from app.privacy.amplification import amplified_curve
from app.privacy.binomial.compose import epsilon_from_curves, gaussian_rdp, order_epsilon
from app.privacy.binomial.lazy import dependencies, lazy_curve
from app.privacy.binomial.truncation import (MAX_LEVELS, ORDERS, check_delta, check_epsilon, check_extra_rdp,
                                             check_int, check_prob, effective_trials, largest_true, sensitivity)


def _items(parts: Sequence[tuple]) -> tuple[list[tuple], float]:
    """(curve, dim, count, gamma) of every part with count > 0, and the total tail."""
    items, tail = [], 0.0
    for part in parts:
        trials, p, levels, dim, count = part[:5]
        gamma = float(part[5]) if len(part) > 5 else 1.0
        count = check_int("count", count, 0)
        if count == 0:
            continue
        curve = lazy_curve(trials, p, levels)
        items.append((curve, check_int("dim", dim, 1), count, gamma))
        tail += count * curve.tail(dim)
    return items, tail


def _rdp_at(items: list[tuple], extra: np.ndarray, o: int, lower: bool | str) -> float:
    r = extra[o]
    for c, d, count, gamma in items:
        r = r + count * np.float64(c.amplified(d, gamma, lower).value(o))
    return float(r)


def fast_epsilon(parts: Sequence[tuple], delta: float, extra_rdp: Sequence[float] | None = None,
                 guess: bool = False) -> float:
    """The number :func:`epsilon_from_curves` gives for ``count`` releases of each
    (trials, p, levels, dim, count[, gamma]) in ``parts`` (curves of :func:`release_curve`, or of
    :func:`amplified_release_curve` when a sampling rate gamma < 1 is given), bit for bit,
    computing as few orders as it can: branch and bound over the orders, each order's epsilon
    bounded from below by the lower-bound rows of :class:`LazyCurve` (the conversion is
    non-decreasing in the Renyi value), the exact column computed only for orders whose lower
    bound beats the best exact epsilon so far (an amplified value is non-decreasing in every
    column it reads, so lower columns bound it from below too).
    ``guess``: the epsilon of the few rows alone at every order (cheap; for a search's first
    steps only, no bound claimed)."""
    return _fast(parts, delta, extra_rdp, guess, None)


def fast_fits(parts: Sequence[tuple], delta: float, epsilon: float, extra_rdp: Sequence[float] | None = None,
              hint: int | None = None) -> bool:
    """``fast_epsilon(parts, delta, extra_rdp) <= epsilon``, exactly, with fewer exact columns
    (``hint``: an order index to try first, e.g. the stand-in's best order)."""
    extra = tuple(float(v) for v in check_extra_rdp(extra_rdp))
    key = (tuple(tuple(part) for part in parts), float(delta), float(epsilon), extra)
    if key not in DECIDED:
        if len(DECIDED) > 4096:
            DECIDED.clear()
        DECIDED[key] = bool(_fast(parts, delta, extra_rdp, False, float(epsilon), hint))
    return DECIDED[key]


#: relative guard on an order refuted by its deciding rows (an amplified bound is monotone in
#: its columns up to a few ulps)
_ROWS_GUARD = 1e-12

#: fast_fits' answers (a calibration asks the same question again: accounting.calibrate_trial_scale
#: re-checks the crossing calibrate_trials found)
DECIDED: dict[tuple, bool] = {}


def _stand_in(parts: Sequence[tuple], delta: float, extra: np.ndarray, orders: Sequence[int]) -> tuple[float, int]:
    """The search's cheap stand-in: the epsilon of the few-rows curves at ``orders`` only, and the
    index of the order that gives it (no bound claimed)."""
    delta = check_delta(delta)
    items, tail = _items(parts)
    if tail >= delta or any(c.empty for c, _, _, _ in items):
        return math.inf, orders[0]
    for c, _, _, gamma in items:  # the columns the orders read (an amplified order reads lower ones too)
        c.prefetch_lower(set().union(*(dependencies(o) for o in orders)) if gamma < 1 else orders)
    approx = [_rdp_at(items, extra, o, "guess") for o in orders]
    if not any(v > 0 for v in approx):
        return 0.0, orders[0]
    eps, alpha = compute_epsilon([ORDERS[o] for o in orders], approx, delta - tail)
    return float(eps), ORDERS.index(alpha)


def _fast(parts, delta, extra_rdp, guess: bool, target: float | None, hint: int | None = None):
    delta = check_delta(delta)
    extra = check_extra_rdp(extra_rdp)
    items, tail = _items(parts)
    exact_value = target is None
    if not exact_value and hint is not None and tail < delta and items and not any(c.empty for c, *_ in items):
        # the decision: an order whose exact epsilon meets the target settles it (it is one of the
        # orders the minimum runs over, and the result is max(0, min) <= target then)
        refuted = order_epsilon(ORDERS[hint], _rdp_at(items, extra, hint, "rows"), delta - tail) \
            > target * (1.0 + _ROWS_GUARD)
        if not refuted and order_epsilon(ORDERS[hint], _rdp_at(items, extra, hint, False), delta - tail) <= target:
            return True
    if tail >= delta:
        return math.inf if exact_value else math.inf <= target
    if any(c.empty for c, _, _, _ in items):
        # an empty window: rho = inf and tail 1 >= delta (caught above); kept for safety
        return math.inf if exact_value else math.inf <= target
    if not items:
        eps = epsilon_from_curves([], delta, extra_rdp=extra)
        return eps if exact_value else eps <= target
    if guess:
        approx = [_rdp_at(items, extra, o, "guess") for o in range(len(ORDERS))]
        return float(compute_epsilon(ORDERS, approx, delta - tail)[0]) if any(v > 0 for v in approx) else 0.0
    lower = [_rdp_at(items, extra, o, True) for o in range(len(ORDERS))]
    if not any(v > 0 for v in lower):
        exact = [_rdp_at(items, extra, o, False) for o in range(len(ORDERS))]
        eps = 0.0 if not any(v > 0 for v in exact) else float(compute_epsilon(ORDERS, exact, delta - tail)[0])
        return eps if exact_value else eps <= target
    d_conv = delta - tail
    bounds = sorted((order_epsilon(ORDERS[o], lower[o], d_conv), o) for o in range(len(ORDERS)))
    best = math.inf
    for lb, o in bounds:
        if lb >= best or (not exact_value and lb > target):
            break  # (a decision: no order left can meet the target)
        if not exact_value and order_epsilon(ORDERS[o], _rdp_at(items, extra, o, "rows"), d_conv) \
                > target * (1.0 + _ROWS_GUARD):
            continue  # (a decision: the deciding shift's exact rows already put this order above it)
        best = min(best, order_epsilon(ORDERS[o], _rdp_at(items, extra, o, False), d_conv))
        if not exact_value and max(0, best) <= target:
            return True
    return float(max(0, best)) if exact_value else max(0, best) <= target


def _gaussian_guess(epsilon: float, delta: float, p: float, levels: int, dim: int, count: int,
                    extra: np.ndarray, gamma: float = 1.0) -> tuple[int, int]:
    """(trials, index of the best order) at which the Gaussian approximation of the release (std sqrt(m p (1-p)), shift B)
    meets epsilon: a starting point for the exact search (gamma < 1: the Gaussian curve amplified
    by the same sampling bound, amplification.amplified_curve, so the search starts near the
    amplified crossing instead of walking down from the unamplified one)."""
    b = sensitivity(levels, dim)

    def eps_at(z: float, best: bool = False):
        curve = gaussian_rdp(z)
        if gamma < 1.0:
            try:
                curve = amplified_curve(ORDERS, curve, gamma)
            except OverflowError:  # a tiny z: the bound's exp overflows, the plain curve is the answer
                pass
        rdp = extra + count * np.asarray(curve)
        eps, alpha = compute_epsilon(ORDERS, rdp.tolist(), delta)
        return ORDERS.index(alpha) if best else float(eps)

    lo, hi = 1e-3, 1.0
    while eps_at(hi) > epsilon and hi < 1e12:
        lo, hi = hi, hi * 2
    for _ in range(60 if gamma >= 1.0 else 30):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps_at(mid) <= epsilon else (mid, hi)
    sd = hi * b
    return max(1, int(math.ceil(sd * sd / (p * (1 - p))))), eps_at(hi, best=True)


def calibrate_trials(epsilon: float, delta: float, p: float, levels: int, dim: int, count: int,
                     extra_rdp: Sequence[float] | None = None, gamma: float = 1.0) -> int:
    """The smallest number of trials m with binomial_epsilon(m, p, levels, dim, count, delta) <= epsilon
    (composed with ``extra_rdp`` if given): an integer m with eps(m) <= epsilon < eps(m - 1) (m = 1
    if eps(1) already meets it), found by bracketing from the Gaussian approximation (geometric
    steps out) and safeguarded interpolation / bisection over the integers. ValueError if no m
    reaches epsilon (e.g. extra_rdp alone exceeds it). ``gamma`` < 1: every release's batch is
    sampled without replacement at rate gamma (:func:`amplified_release_curve`)."""
    epsilon, delta, p = check_epsilon(epsilon), check_delta(delta), check_prob(p)
    g, d, count = check_int("levels", levels, 1, MAX_LEVELS), check_int("dim", dim, 1), check_int("count", count, 0)
    extra = check_extra_rdp(extra_rdp)

    def fits(m: int) -> bool:  # epsilon_from_curves([(release_curve(m, p, g, d), count)], ...) <= epsilon
        return fast_fits([(m, p, g, d, count, gamma)], delta, epsilon, extra_rdp=extra)

    if fits(1):
        return 1
    floor = float(compute_epsilon(ORDERS, extra.tolist(), delta)[0]) if np.any(extra > 0) else 0.0
    if count == 0 or floor >= epsilon:
        raise ValueError(f"epsilon {epsilon} not reachable: extra_rdp alone gives epsilon {floor}")
    m0, first = _gaussian_guess(epsilon, delta, p, g, d, count, extra, gamma)
    m0 = max(2, m0)
    # the crossing of the cheap stand-in (the few shifts that decide rho, at the orders next to the
    # last best one, at first next to the Gaussian's), then the exact one near it, trying the
    # stand-in's best order first
    state = {"orders": list(range(max(0, first - 2), min(len(ORDERS), first + 3))), "best": None}

    def stand_in(m: int) -> float:
        eps_m, best = _stand_in([(m, p, g, d, count, gamma)], delta, extra, state["orders"])
        state["best"] = best
        state["orders"] = list(range(max(0, best - 2), min(len(ORDERS), best + 3)))
        return eps_m

    near = _crossing(stand_in, epsilon, m0, p, g)
    hint = state["best"]
    return _settle(lambda m: fast_fits([(m, p, g, d, count, gamma)], delta, epsilon, extra_rdp=extra, hint=hint),
                   near, epsilon)


#: relative margin of the stand-in's first step past the predicted crossing
_PRED_MARGIN = 1e-5


def _crossing(eps, epsilon: float, m0: int, p: float, g: int) -> int:
    """An m with eps(m) <= epsilon < eps(m - 1), by bracketing from m0 (geometric steps out) and
    safeguarded interpolation of log eps in log m / bisection over the integers (eps(1) > epsilon)."""
    e0 = eps(m0)
    # bracket: lo fails (eps > epsilon), hi passes
    factor = 1.002  # the Gaussian start is usually within 0.1% of the crossing
    # the first step: where eps ~ m^(-1/2) puts the crossing, just past it (no further than a factor step)
    pred = m0 * (e0 / epsilon) ** 2 if 0 < e0 < math.inf else None
    if e0 <= epsilon:
        hi, e_hi = m0, e0
        lo = max(1, int(hi / factor))
        if pred is not None:
            lo = min(hi - 1, max(lo, int(pred * (1 - _PRED_MARGIN)) - 1))
        while (e_lo := eps(lo)) <= epsilon:
            hi, e_hi = lo, e_lo
            factor *= factor
            lo = max(1, int(hi / factor))
    else:
        lo, e_lo = m0, e0
        hi = int(math.ceil(lo * factor)) + 1
        if pred is not None:
            hi = max(lo + 1, min(hi, int(math.ceil(pred * (1 + _PRED_MARGIN))) + 1))
        while (e_hi := eps(hi)) > epsilon:
            if effective_trials(hi, p, g) < hi:  # eps is flat from here on
                raise ValueError(f"epsilon {epsilon} not reachable: the window limit MAX_WINDOW "
                                 f"caps the accounted trials near {effective_trials(hi, p, g)}")
            lo, e_lo = hi, e_hi
            factor *= factor
            hi = int(math.ceil(lo * factor)) + 1
    bisect_next = False
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if not bisect_next and math.isfinite(e_lo) and e_lo > 0 and e_hi > 0 and e_lo != e_hi:
            # log eps roughly linear in log m
            frac = (math.log(e_lo) - math.log(epsilon)) / (math.log(e_lo) - math.log(e_hi))
            guess = math.exp(math.log(lo) + frac * (math.log(hi) - math.log(lo)))
            mid = min(hi - 1, max(lo + 1, int(round(guess))))
        width = hi - lo
        e_mid = eps(mid)
        if e_mid <= epsilon:
            hi, e_hi = mid, e_mid
        else:
            lo, e_lo = mid, e_mid
        bisect_next = (hi - lo) * 2 > width and not bisect_next
        if bisect_next and hi - lo > 1 and (hi == mid or lo == mid):
            # the interpolation barely moved its side: before bisecting, probe the integer next to
            # it (the interpolated m is usually the crossing itself or one off)
            probe = mid - 1 if hi == mid else mid + 1
            e_probe = eps(probe)
            if e_probe <= epsilon:
                hi, e_hi = probe, e_probe
            else:
                lo, e_lo = probe, e_probe
    return hi


def _settle(fits, near: int, epsilon: float) -> int:
    """An m with fits(m) and not fits(m - 1) (fits(1) is false), searched from ``near`` (the
    crossing of a close stand-in): galloping steps down or up, then bisection. Two evaluations
    when ``near`` is the crossing."""
    if fits(near):
        hi, step = near, 1
        lo = max(1, hi - step)
        while lo > 1 and fits(lo):
            hi, step = lo, step * 2
            lo = max(1, hi - step)
    else:
        lo, step = near, 1
        hi = lo + step
        while not fits(hi):
            if step > 1 << 40:
                raise ValueError(f"epsilon {epsilon} not reachable near {near} trials")
            lo, step = hi, step * 2
            hi = lo + step
    return largest_true(lambda m: not fits(m), lo, hi) + 1  # the smallest m in (lo, hi] that fits
