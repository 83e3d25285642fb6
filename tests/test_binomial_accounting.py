"""The exact numerical accountant of the binomial mechanism (app/privacy/binomial/), checked
against independent facts: exact enumeration of the privacy curve of small binomial mechanisms
(d = 1 and d = 2), brute-force Renyi divergences in plain Python (math.lgamma, math.fsum), the
Gaussian limit, monotonicity, calibration by definition, and the paper's closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.privacy import binomial as B
from app.privacy.binomial import divergence, truncation


# ------------------------------------------------------------------ independent reference code

def _log_pmf(m: int, p: float) -> list[float]:
    """log P(Z = t), t = 0..m, Z ~ Bin(m, p), from math.lgamma."""
    lm = math.lgamma(m + 1)
    return [lm - math.lgamma(t + 1) - math.lgamma(m - t + 1) + t * math.log(p) + (m - t) * math.log1p(-p)
            for t in range(m + 1)]


def _pmf(m: int, p: float) -> np.ndarray:
    return np.exp(np.array(_log_pmf(m, p)))


def _hockey_1d(pmf: np.ndarray, shift: int, eps: float) -> float:
    """sum_t max(0, P(t) - e^eps P(t - shift)) over the union of both supports."""
    m = len(pmf) - 1
    total = []
    for t in range(min(0, shift), m + max(0, shift) + 1):
        a = pmf[t] if 0 <= t <= m else 0.0
        u = t - shift
        b = pmf[u] if 0 <= u <= m else 0.0
        total.append(max(0.0, a - math.exp(eps) * b))
    return math.fsum(total)


def _exact_delta_1d(pmf: np.ndarray, g: int, eps: float) -> float:
    return max(_hockey_1d(pmf, s * k, eps) for k in range(1, g + 1) for s in (1, -1))


def _exact_eps_1d(pmf: np.ndarray, g: int, delta: float) -> float:
    """The smallest eps with exact delta(eps) <= delta (bisection on the enumerated curve)."""
    lo, hi = 0.0, 1.0
    while _exact_delta_1d(pmf, g, hi) > delta:
        lo, hi = hi, 2 * hi
        assert hi < 1e3, "delta below the non-overlapping mass"
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if _exact_delta_1d(pmf, g, mid) <= delta else (mid, hi)
    return hi


# -------------------------------------------------------------------------------- soundness

@pytest.mark.parametrize("m,p,g", [(60, 0.25, 2), (200, 0.25, 3)])
def test_sound_against_exact_enumeration_1d(m, p, g):
    pmf = _pmf(m, p)
    for delta in (1e-2, 1e-3, 1e-4, 1e-5):
        exact = _exact_eps_1d(pmf, g, delta)
        ours = B.binomial_epsilon(m, p, g, 1, 1, delta)
        assert ours >= exact, (m, g, delta, ours, exact)
        assert ours <= 4 * exact, (m, g, delta, ours, exact)


def test_sound_against_exact_enumeration_2d():
    m, p, g, d = 60, 0.25, 2, 2
    pmf = _pmf(m, p)
    pad = np.zeros(m + 1 + 4 * g)
    pad[2 * g:2 * g + m + 1] = pmf  # support with room for shifts of up to 2 g either way
    joint = np.outer(pad, pad)
    bound = g + math.sqrt(d)
    shifts = [(k1, k2) for k1 in range(-g, g + 1) for k2 in range(-g, g + 1)
              if (k1, k2) != (0, 0) and k1 * k1 + k2 * k2 <= bound * bound]
    assert len(shifts) == 24

    def exact_delta(eps: float) -> float:
        worst = 0.0
        for k1, k2 in shifts:
            shifted = np.roll(np.roll(joint, k1, axis=0), k2, axis=1)  # Q(t) = P(t - k); no wrap (padding)
            worst = max(worst, float(np.maximum(0.0, joint - math.exp(eps) * shifted).sum()))
        return worst

    for eps in (0.5, 1.0, 2.0):
        delta = exact_delta(eps)
        assert 1e-5 < delta < 1
        assert B.binomial_epsilon(m, p, g, d, 1, delta) >= eps


# ------------------------------------------------------------------------- the divergences

def _brute_window(m: int, p: float, g: int) -> tuple[int, int, float]:
    pmf = [math.exp(v) for v in _log_pmf(m, p)]
    lo_tau = 0  # the largest t with P(Z < t) <= TAIL
    while math.fsum(pmf[:lo_tau + 1]) <= B.TAIL:
        lo_tau += 1
    hi_tau = m  # the smallest t with P(Z > t) <= TAIL
    while math.fsum(pmf[hi_tau:]) <= B.TAIL:
        hi_tau -= 1
    lo, hi = max(g, lo_tau), min(m - g, hi_tau)
    return lo, hi, math.fsum(pmf[:lo]) + math.fsum(pmf[hi + 1:])


def _brute_renyi(m: int, p: float, g: int, k: int, alpha: float) -> float:
    """max_s D_alpha(Z~ || Z + s k) with plain floats and math.fsum."""
    lp = _log_pmf(m, p)
    lo, hi, _ = _brute_window(m, p, g)
    log_pw = math.log(math.fsum(math.exp(lp[t]) for t in range(lo, hi + 1)))
    best = -math.inf
    for s in (1, -1):
        terms = [alpha * (lp[t] - log_pw) + (1 - alpha) * lp[t - s * k] for t in range(lo, hi + 1)]
        top = max(terms)
        best = max(best, (top + math.log(math.fsum(math.exp(v - top) for v in terms))) / (alpha - 1))
    return best


@pytest.mark.parametrize("m,p,g", [(80, 0.3, 3), (400, 0.5, 4), (3000, 0.25, 5)])
def test_divergences_against_brute_force(m, p, g):
    lo, hi, q = _brute_window(m, p, g)
    w = B.window(m, p, g)
    assert w[:2] == (lo, hi)
    assert w[2] == pytest.approx(q, rel=1e-9)
    f = B.shift_divergences(m, p, g)
    for alpha in (1.5, 2.0, 8.0, 64.0, 256.0):
        o = B.ORDERS.index(alpha)
        for k in range(1, g + 1):
            # the reference's own error: a few ulps of lgamma(m + 1) in each log-PMF
            assert f[k - 1, o] == pytest.approx(_brute_renyi(m, p, g, k, alpha), rel=1e-9, abs=1e-14 * m)


def test_divergences_do_not_depend_on_chunking(monkeypatch):
    """One shift per block (contiguous rows) and all shifts in one block give the same numbers."""
    m, p, g = 400, 0.5, 4
    whole = B.shift_divergences(m, p, g)
    divergence.divergence_table.cache_clear()
    monkeypatch.setattr(divergence, "CHUNK_ELEMENTS", 1)
    try:
        rows = B.shift_divergences(m, p, g)
    finally:
        divergence.divergence_table.cache_clear()
    np.testing.assert_allclose(rows, whole, rtol=1e-13, atol=0)
    assert rows[2, B.ORDERS.index(4.0)] == pytest.approx(_brute_renyi(m, p, g, 3, 4.0), rel=1e-9)


def test_divergence_accurate_for_large_trials():
    """Large m, shift 1: the divergence (~1e-6) is below a float64 binomial log-PMF's error (~1e-10
    absolute at m = 2e6 would be 1e-4 relative); compare with 40-digit mpmath."""
    mpmath = pytest.importorskip("mpmath")
    m, p, g = 2_000_000, 0.25, 1
    lo, hi, _ = B.window(m, p, g)
    mp = mpmath.mp
    mp.dps = 40
    lp = {t: mpmath.loggamma(m + 1) - mpmath.loggamma(t + 1) - mpmath.loggamma(m - t + 1)
          + t * mpmath.log(mpmath.mpf(p)) + (m - t) * mpmath.log(1 - mpmath.mpf(p))
          for t in range(lo - 1, hi + 2)}
    pw = mpmath.fsum(mpmath.exp(lp[t]) for t in range(lo, hi + 1))
    f = B.shift_divergences(m, p, g)
    for alpha in (2.0, 16.0):
        worst = max(mpmath.log(mpmath.fsum(mpmath.exp(alpha * (lp[t] - mpmath.log(pw)) + (1 - alpha) * lp[t - s])
                                           for t in range(lo, hi + 1))) / (alpha - 1) for s in (1, -1))
        assert f[0, B.ORDERS.index(alpha)] == pytest.approx(float(worst), rel=1e-8)


def test_gaussian_limit():
    m, p, g, d = 1_000_000, 0.25, 16, 10
    curve = B.release_curve(m, p, g, d)
    b = g + math.sqrt(d)
    for alpha in (2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0):
        gauss = alpha * b * b / (2 * m * p * (1 - p))
        assert curve.rdp[B.ORDERS.index(alpha)] == pytest.approx(gauss, rel=0.05)
    assert 0 < curve.tail <= 2 * d * B.TAIL


def test_gaussian_rdp():
    assert B.gaussian_rdp(2.0) == tuple(a / 8 for a in B.ORDERS)


# ----------------------------------------------------------------------- composition, monotone

def test_monotone_in_trials_and_count():
    p, g, d, delta = 0.25, 8, 10, 1e-5
    eps = [B.binomial_epsilon(m, p, g, d, 1, delta) for m in (3000, 10_000, 30_000, 100_000, 1_000_000)]
    assert all(math.isfinite(e) for e in eps)
    assert all(a > b for a, b in zip(eps, eps[1:]))
    by_count = [B.binomial_epsilon(30_000, p, g, d, c, delta) for c in (1, 2, 5, 10, 40)]
    assert all(a < b for a, b in zip(by_count, by_count[1:]))
    assert B.binomial_epsilon(30_000, p, g, d, 0, delta) == 0.0


def test_empty_window_and_tails():
    assert B.binomial_epsilon(5, 0.25, 3, 1, 1, 1e-5) == math.inf  # m < 2 g
    curve = B.release_curve(60, 0.25, 2, 1)  # window cut at g: the tail is P(Z < 2) + P(Z > 58)
    assert curve.tail == pytest.approx(0.75 ** 60 + 60 * 0.25 * 0.75 ** 59, rel=1e-6)
    assert B.epsilon_from_curves([(curve, 1)], curve.tail * 0.99) == math.inf
    assert B.epsilon_from_curves([(curve, 2)], 1.5 * curve.tail) == math.inf


def test_epsilon_from_curves_composes():
    c1 = B.release_curve(50_000, 0.25, 4, 20)
    c2 = B.release_curve(200_000, 0.5, 8, 20)
    extra = B.gaussian_rdp(3.0)
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
    rdp = [3 * a + b + c for a, b, c in zip(c1.rdp, c2.rdp, extra)]
    want = compute_epsilon(B.ORDERS, rdp, 1e-5 - 3 * c1.tail - c2.tail)[0]
    assert B.epsilon_from_curves([(c1, 3), (c2, 1)], 1e-5, extra_rdp=extra) == pytest.approx(want, rel=1e-12)


# ----------------------------------------------------------------------------- calibration

@pytest.mark.parametrize("eps,g,d,count", [(2.0, 8, 20, 3), (1.0, 64, 200, 25)])
def test_calibrate_trials(eps, g, d, count):
    m = B.calibrate_trials(eps, 1e-5, 0.25, g, d, count)
    assert B.binomial_epsilon(m, 0.25, g, d, count, 1e-5) <= eps
    assert B.binomial_epsilon(m - 1, 0.25, g, d, count, 1e-5) > eps


def test_calibrate_with_extra_rdp():
    extra = B.gaussian_rdp(4.0)
    m = B.calibrate_trials(2.0, 1e-5, 0.25, 8, 20, 3, extra_rdp=extra)
    eps = lambda n: B.epsilon_from_curves([(B.release_curve(n, 0.25, 8, 20), 3)], 1e-5, extra_rdp=extra)  # noqa: E731
    assert eps(m) <= 2.0 < eps(m - 1)
    assert m > B.calibrate_trials(2.0, 1e-5, 0.25, 8, 20, 3)
    with pytest.raises(ValueError):
        B.calibrate_trials(0.1, 1e-5, 0.25, 8, 20, 3, extra_rdp=B.gaussian_rdp(0.5))


# ----------------------------------------------------------------------------- closed form

def test_closed_form_numbers():
    # eps = 1, delta = 1e-5, N = 100, d = 10: g = max(2 * 10, 10, 4) = 20, p = 1/4,
    # b = ceil(24e4 * 400 * ln(4 * 101 / 1e-5)^2 / 100) = ceil(96000 * 17.51434034^2) = 294482033
    assert B.closed_form(1.0, 1e-5, 100, 10) == (20, 294482033, 0.25)
    assert B.closed_form(1.0, 1e-5, 1000, 10)[0] == 64  # ceil(2 sqrt(1000)) = ceil(63.25)
    assert B.closed_form(2.0, 1e-5, 10, 1)[0] == 7  # ceil(2 sqrt(10)) = ceil(6.32)
    assert B.closed_form(2.0, 1e-5, 1, 1)[0] == 4


def test_closed_form_is_conservative():
    eps, delta, n, d = 1.0, 1e-5, 4, 1
    g, b, p = B.closed_form(eps, delta, n, d)
    assert B.binomial_epsilon(n * b, p, g, d, 1, delta) <= eps


# ------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("args", [
    (0, 0.25, 4, 10), (10.5, 0.25, 4, 10), (100, 0.0, 4, 10), (100, 1.0, 4, 10),
    (100, 0.25, 0, 10), (100, 0.25, B.MAX_LEVELS + 1, 10), (100, 0.25, 4, 0), (True, 0.25, 4, 10),
])
def test_invalid_release(args):
    with pytest.raises(ValueError):
        B.release_curve(*args)


def test_invalid_composition():
    with pytest.raises(ValueError):
        B.binomial_epsilon(100, 0.25, 4, 10, -1, 1e-5)
    for delta in (0.0, 1.0):
        with pytest.raises(ValueError):
            B.binomial_epsilon(100, 0.25, 4, 10, 1, delta)
    with pytest.raises(ValueError):
        B.epsilon_from_curves([], 1e-5, extra_rdp=(1.0, 2.0))


def test_window_limit_falls_back_to_fewer_trials(monkeypatch):
    """Beyond MAX_WINDOW the curve of fewer trials is used (sound by post-processing)."""
    monkeypatch.setattr(truncation, "MAX_WINDOW", 2000)
    divergence.cached_release_curve.cache_clear()
    try:
        m_eff = truncation.effective_trials(10**6, 0.25, 4)
        lo, hi, _ = B.window(m_eff, 0.25, 4)
        assert m_eff < 10**6 and hi - lo + 1 + 8 <= 2000
        lo, hi, _ = B.window(m_eff + 1, 0.25, 4)
        assert hi - lo + 1 + 8 > 2000
        assert B.release_curve(10**6, 0.25, 4, 3) == B.release_curve(m_eff, 0.25, 4, 3)
    finally:
        divergence.cached_release_curve.cache_clear()
