"""The distributed Skellam mechanism (app/privacy/skellam/) against independent facts:

* the rotation: exact inverse, norm-preserving, scipy.linalg.hadamard's matrix up to the signs;
* conditional rounding: every row within the enforced bound, the mean within the proven bias
  bound plus a statistical margin, unconditional acceptance >= 1 - beta (Hoeffding's claim);
* Skellam noise: mean 0 and variance mu (statistical bounds), sums of Skellams are Skellam (pmf
  convolution and a DKW test against scipy.stats.skellam);
* encode/decode: many silos' sums decode to the true mean within the predicted noise; no wrap at
  the chosen gamma, the empirical wrap frequency below the Chernoff bound where it is large;
* the accountant: <= the exact Renyi divergence summed from scipy's pmf in 1 to 3 dimensions, the
  sampled curve >= the exact divergence of the subsampled mixtures (n = 4, K = 2), the Gaussian
  mechanism's epsilon (dp-accounting) approached from above as mu grows, and an empirical
  likelihood-ratio audit below the claimed epsilon.
Fixed seeds throughout."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.linalg import hadamard
from scipy.special import gammaln, logsumexp
from scipy.stats import beta as beta_dist
from scipy.stats import skellam

from app.privacy.accounting import PlannedRelease
from app.privacy.skellam.calibration import calibrate
from app.privacy.skellam import (BETA, ORDERS, SkellamCode, choose_gamma, conditional_round, decode_sum,
                                 encode, epsilon, modular_sum, padded_dim, rotate, rounded_row_bound,
                                 rounding_bias_bound, row_sq_bound, sensitivity, skellam_curve, skellam_noise,
                                 skellam_rdp, unrotate, wbk_theorem9, wrap_probability)

# ---------------------------------------------------------------------------- helpers


def _sk_logpmf(k: np.ndarray, mu: float) -> np.ndarray:
    """log pmf of Sk(mu) (variance mu) from its series, P(k) = e^-mu sum_n lam^(2n+|k|) / (n! (n+|k|)!),
    lam = mu/2, summed in log space (scipy's skellam.logpmf underflows to -inf in the far tails
    that large orders weigh; test_series_matches_scipy checks the two agree where scipy is finite)."""
    k = np.abs(np.asarray(k, dtype=np.int64))
    lam = mu / 2
    n = np.arange(int(lam + 40 * math.sqrt(lam) + 60), dtype=np.float64)
    uniq, inv = np.unique(k, return_inverse=True)
    u = uniq[:, None].astype(np.float64)
    terms = (2 * n + u) * math.log(lam) - gammaln(n + 1) - gammaln(n + u + 1) - mu
    return logsumexp(terms, axis=1)[inv].reshape(k.shape)


def _window(mu: float, shift: int, alpha: float) -> np.ndarray:
    return np.arange(-int(mu + 30 * math.sqrt(mu) + 4 * alpha * abs(shift) + 60),
                     int(mu + 30 * math.sqrt(mu) + 4 * alpha * abs(shift) + 60) + 1)


def _renyi(logp: np.ndarray, logq: np.ndarray, alpha: float) -> float:
    """D_alpha(P || Q) = log sum p^a q^(1-a) / (a - 1) over a window; asserts the window's edges
    carry a negligible share of the sum (the truncation cannot hide mass)."""
    t = alpha * logp + (1 - alpha) * logq
    assert np.all(np.isfinite(t)), "pmf underflow inside the window"
    total = logsumexp(t)
    assert max(t[0], t[-1]) - total < -30, "window too narrow"
    return float(total / (alpha - 1))


def _exact_1d(alpha: float, shift: int, mu: float) -> float:
    """D_alpha(Sk(mu) + shift || Sk(mu)), summed from scipy's pmf."""
    k = _window(mu, shift, alpha)
    return _renyi(_sk_logpmf(k - shift, mu), _sk_logpmf(k, mu), alpha)


def test_series_matches_scipy() -> None:
    k = np.arange(-60, 61)
    for mu in (0.5, 3.0, 40.0):
        np.testing.assert_allclose(_sk_logpmf(k, mu), skellam.logpmf(k, mu / 2, mu / 2), rtol=1e-9)
    assert abs(logsumexp(_sk_logpmf(np.arange(-3000, 3001), 400.0))) < 1e-12


# ---------------------------------------------------------------------------- rotation


def test_padded_dim() -> None:
    assert [padded_dim(d) for d in (1, 2, 3, 4, 5, 1000, 1024, 1025)] == [1, 2, 4, 4, 8, 1024, 1024, 2048]


@pytest.mark.parametrize("seed", [b"round-7", 12345])
def test_rotation_is_an_exact_norm_preserving_inverse(seed: bytes | int) -> None:
    x = np.random.default_rng(0).normal(size=(6, 100))
    y = rotate(x, seed)
    assert y.shape == (6, 128)
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-13)
    np.testing.assert_allclose(unrotate(y, seed, 100), x, atol=1e-13)
    np.testing.assert_array_equal(rotate(x, seed), y)  # public seed: every party gets the same R
    assert not np.allclose(rotate(x, b"another"), y)


@pytest.mark.parametrize("d", [8, 5, 16])
def test_rotation_is_scipy_hadamard_times_signs(d: int) -> None:
    """R e_k = s_k H[:, k] / sqrt(D): row k of rotate(I) * sqrt(D) is +-H's column k (H symmetric)."""
    D = padded_dim(d)
    H = hadamard(D)
    M = rotate(np.eye(d), b"seed") * math.sqrt(D)
    for k in range(d):
        sign = M[k, 0] / H[k, 0]
        assert sign in (-1.0, 1.0)
        np.testing.assert_allclose(M[k], sign * H[k], atol=1e-12)
    y = np.random.default_rng(1).normal(size=D)
    np.testing.assert_allclose(rotate(np.eye(d), 3) @ y, unrotate(y, 3, d), atol=1e-12)  # R^T = R^-1


# ---------------------------------------------------------------------------- conditional rounding


def _worst_row(D: int) -> np.ndarray:
    """A row whose every fractional part is 1/2 (largest rounding variance), norm sqrt(D)/2 * 3."""
    return np.full(D, 1.5) * np.where(np.arange(D) % 2 == 0, 1.0, -1.0)


@pytest.mark.parametrize("beta", [BETA, 0.1, 0.0])
def test_conditional_rounding_bound_bias_and_acceptance(beta: float) -> None:
    D, K = 64, 4000
    x = _worst_row(D)
    c = float(np.linalg.norm(x))
    bound = rounded_row_bound(c, D, beta)
    rng = np.random.default_rng(2)
    out = conditional_round(np.tile(x, (K, 1)), bound, rng)
    assert out.dtype == np.int64
    assert np.all(np.einsum("ij,ij->i", out, out) <= math.floor(bound * bound))
    # bias: ||E[r | A] - x|| <= sqrt(beta) / (2 (1 - beta)) (rounding_bias_bound at gamma 1) + 5 sd of the mean
    err = float(np.linalg.norm(out.mean(axis=0) - x))
    assert err <= rounding_bias_bound(1.0, beta) + 5 * math.sqrt(D * 0.25 / K)
    # acceptance of UNconditional rounding >= 1 - beta (Hoeffding), independent draws
    n = 20000
    raw = np.floor(x) + (np.random.default_rng(3).random((n, D)) < (x - np.floor(x)))
    accepted = float(np.mean(np.einsum("ij,ij->i", raw, raw) <= row_sq_bound(bound)))
    assert accepted >= 1 - beta - 5 * math.sqrt(0.25 / n)


def test_conditional_rounding_is_unbiased_per_coordinate_on_generic_rows() -> None:
    D, K = 32, 20000
    x = np.random.default_rng(4).uniform(-3, 3, size=D)
    out = conditional_round(np.tile(x, (K, 1)), rounded_row_bound(float(np.linalg.norm(x)), D, BETA),
                            np.random.default_rng(5))
    # the per-row bias bound is on the L2 norm; add 5 sd of the empirical mean
    assert np.linalg.norm(out.mean(axis=0) - x) <= rounding_bias_bound(1.0, BETA) + 5 * math.sqrt(D * 0.25 / K)


def test_conditional_rounding_raises_when_rows_exceed_their_bound() -> None:
    with pytest.raises(RuntimeError):
        conditional_round(np.full((2, 16), 10.3), rounded_row_bound(1.0, 16, BETA), np.random.default_rng(0),
                          max_tries=5)


def test_sensitivity_from_the_enforced_integer_bound() -> None:
    l1, l2 = sensitivity(3.0, 1.0, 1, BETA)  # c = 3, D = 1: B = min(4, sqrt(9 + 1/4 + sqrt(1)(3 + 1/2)))
    s = math.floor(9 + 0.25 + 3.5)
    assert l2 == pytest.approx(2 * math.sqrt(s)) and l1 == pytest.approx(2 * min(s, math.sqrt(s)))
    l1, l2 = sensitivity(100.0, 1.0, 1000, 0.0)  # beta = 0: B = c + sqrt(D)
    assert l2 == pytest.approx(2 * math.sqrt(math.floor((100 + 32) ** 2)))
    assert l1 == pytest.approx(2 * 32 * math.sqrt(math.floor((100 + 32) ** 2)))


# ---------------------------------------------------------------------------- noise


def test_skellam_noise_mean_and_variance() -> None:
    mu, n = 7.3, 400_000
    z = skellam_noise(mu, n, np.random.default_rng(6))
    assert z.dtype == np.int64
    assert abs(z.mean()) <= 5 * math.sqrt(mu / n)
    assert abs(z.var() - mu) <= 5 * math.sqrt((mu + 2 * mu * mu) / n)  # Var(s^2) ~ (mu4 - mu^2)/n, mu4 = mu + 3 mu^2
    assert not skellam_noise(0.0, 5, np.random.default_rng(0)).any()


def test_sum_of_skellams_is_skellam() -> None:
    k = np.arange(-80, 81)
    conv = np.convolve(np.convolve(np.exp(_sk_logpmf(k, 1.5)), np.exp(_sk_logpmf(k, 2.5))), np.exp(_sk_logpmf(k, 4.0)))
    kk = np.arange(-240, 241)
    np.testing.assert_allclose(conv, np.exp(_sk_logpmf(kk, 8.0)), atol=1e-15)
    # five silos' shares of the real sampler, summed: DKW test against Sk(5 * 3) at confidence 1 - 1e-6
    n, rng = 200_000, np.random.default_rng(7)
    total = sum(skellam_noise(3.0, n, rng) for _ in range(5))
    grid = np.arange(total.min(), total.max() + 1)
    ecdf = np.searchsorted(np.sort(total), grid, side="right") / n
    assert np.max(np.abs(ecdf - skellam.cdf(grid, 7.5, 7.5))) <= math.sqrt(math.log(2 / 1e-6) / (2 * n))


# ---------------------------------------------------------------------------- encode / decode


def _federation(code: SkellamCode, rows: list[np.ndarray], mu_add: float, rng: np.random.Generator) -> np.ndarray:
    return modular_sum([encode(r, code, mu_add, rng) for r in rows], code.bits)


def test_encode_decode_round_trip_within_the_predicted_noise() -> None:
    silos, K, d, bits, clip = 5, 20, 100, 16, 1.0
    n_rec = silos * K
    noise_std = 2 * clip * 0.5  # z = 0.5 on the sum
    g = choose_gamma(bits, clip, d, n_rec, noise_std)
    mu_total = (g.gamma * noise_std) ** 2
    rng = np.random.default_rng(8)
    sq = []
    for trial in range(20):
        rows = [rng.normal(size=(K, d)) * rng.uniform(0.02, 0.2) for _ in range(silos)]  # some above the clip
        clipped = [r * np.minimum(1, clip / np.linalg.norm(r, axis=1))[:, None] for r in rows]
        code = SkellamCode(bits, g.gamma, d, trial.to_bytes(2, "big"), clip)
        out = decode_sum(_federation(code, rows, mu_total / silos, rng), code, n_rec)
        sq.append(float(np.sum((out - np.concatenate(clipped).mean(axis=0)) ** 2)))
    D = padded_dim(d)
    noise_part = d * mu_total / (g.gamma * n_rec) ** 2  # Sk noise: variance mu per coordinate, rotated back
    rounding_part = n_rec * D / 4 / (g.gamma * n_rec) ** 2  # at most D/4 per row, before truncation to d
    mse = float(np.mean(sq))
    assert 0.8 * noise_part <= mse <= 1.2 * (noise_part + rounding_part) + g.rounding_bias ** 2 * 2


def test_no_wrap_at_the_chosen_gamma_and_the_bound_holds_where_large() -> None:
    silos, K, d, bits, clip = 5, 20, 60, 12, 1.0
    n_rec, D = silos * K, padded_dim(d)
    noise_std = 2 * clip * 0.3
    g = choose_gamma(bits, clip, d, n_rec, noise_std, wrap_target=1e-6)
    assert g.wrap_probability <= 1e-6 and g.vector_wrap_probability <= D * 1e-6
    u = np.random.default_rng(9).normal(size=d)
    rows = [np.tile(clip * u / np.linalg.norm(u), (K, 1))] * silos  # all aligned: ||sum|| = n_rec C, the worst case
    rng = np.random.default_rng(10)

    def wrapped(gamma: float, trial: int) -> np.ndarray:
        code = SkellamCode(bits, gamma, d, trial, clip)
        mod = _federation(code, rows, (gamma * noise_std) ** 2 / silos, rng).astype(np.int64)
        centred = np.where(mod >= code.modulus // 2, mod - code.modulus, mod)
        clean = gamma * rotate(np.concatenate(rows).sum(axis=0), trial)
        return np.abs(centred - clean) > code.modulus // 4  # noise + rounding << 2**(bits-2): only a wrap gets there

    trials = 300
    assert not any(wrapped(g.gamma, t).any() for t in range(trials))  # bound: <= 300 * 6.4e-5 expected wraps
    big = g.gamma * 3.0
    p = wrap_probability(big, bits=bits, clip=clip, dim=d, records_total=n_rec, noise_std=noise_std)
    freq = float(np.mean([wrapped(big, t).mean() for t in range(trials)]))
    assert freq > 0  # the detector sees wraps where they happen
    assert freq <= p + 5 * math.sqrt(p / (trials * D))  # the Chernoff bound holds (coordinates ~ independent)


# ---------------------------------------------------------------------------- the accountant

RDP_GRID = [(mu, s, a) for mu in (2.0, 10.0, 50.0, 400.0) for s in (1, 3, 6) for a in (1.5, 2.0, 3.0, 8.0, 20.0)]


def test_skellam_rdp_is_above_the_exact_divergence_in_one_dimension() -> None:
    ratios = {}
    for mu, s, a in RDP_GRID:
        exact, bound = _exact_1d(a, s, mu), skellam_rdp(a, s, s, mu)
        assert exact <= bound * (1 + 1e-9), (mu, s, a, exact, bound)
        ratios[(mu, s, a)] = exact / bound
    # and close where the noise is not tiny against the shift (the Gaussian regime of SGD's noise)
    assert min(r for (mu, s, a), r in ratios.items() if mu >= 50 and a * s * s / mu <= 1.5) > 0.93
    assert min(r for (mu, _, _), r in ratios.items() if mu >= 400) > 0.97


def test_skellam_rdp_is_above_the_exact_divergence_in_two_and_three_dimensions() -> None:
    """Sk(mu)^D is a product, so D_alpha of a shift vector is the sum of its coordinates' 1-D
    divergences; every integer shift with ||s||_2 <= 3 in 2 and 3 dimensions."""
    for mu, a in ((3.0, 2.0), (3.0, 6.0), (20.0, 3.0), (20.0, 12.0)):
        one = {abs(t): _exact_1d(a, abs(t), mu) if t else 0.0 for t in range(-3, 4)}
        for dim in (2, 3):
            for s in itertools.product(range(-3, 4), repeat=dim):
                l2 = math.sqrt(sum(t * t for t in s))
                if not 0 < l2 <= 3:
                    continue
                exact = sum(one[abs(t)] for t in s)
                assert exact <= skellam_rdp(a, sum(abs(t) for t in s), l2, mu) * (1 + 1e-9), (mu, a, s)


def _mixture_logpmf(records: tuple[int, ...], k: int, mu: float, grid: np.ndarray) -> np.ndarray:
    subsets = list(itertools.combinations(range(len(records)), k))
    logs = np.stack([_sk_logpmf(grid - sum(records[i] for i in sub), mu) for sub in subsets])
    return logsumexp(logs, axis=0) - math.log(len(subsets))


SAMPLED_CASES = [(4, 1, 4.0), (4, 1, 8.0), (4, 1, 20.0), (6, 2, 4.0), (6, 2, 8.0)]
SAMPLED_ORDERS = [2, 3, 4, 6, 8, 12]


def sampled_brute_force(n: int, k: int, mu: float, amplification: str = "wbk9"
                        ) -> tuple[list[float], list[float], list[float]]:
    """(exact worst D_alpha over neighbouring datasets, the sampled curve, the unsampled curve) at
    SAMPLED_ORDERS: n records in {-1, 0, 1} (1-D rounded rows: a replacement shifts the sum by <= 2
    = Delta_1 = Delta_2), K drawn without replacement, Sk(mu); every neighbouring pair, both ways."""
    grid = np.arange(-int(mu + 40 * math.sqrt(mu) + 60), int(mu + 40 * math.sqrt(mu) + 61))
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def law(recs: tuple[int, ...]) -> np.ndarray:
        key = tuple(sorted(recs))
        if key not in cache:
            cache[key] = _mixture_logpmf(key, k, mu, grid)
        return cache[key]

    worst = [0.0] * len(SAMPLED_ORDERS)
    for base in itertools.combinations_with_replacement((-1, 0, 1), n):
        for i, v in itertools.product(range(n), (-1, 0, 1)):
            if v != base[i]:
                p, q = law(base), law(base[:i] + (v,) + base[i + 1:])
                for j, a in enumerate(SAMPLED_ORDERS):
                    worst[j] = max(worst[j], _renyi(p, q, a))
    return (worst, skellam_curve(SAMPLED_ORDERS, 2.0, 2.0, mu, k / n, amplification),
            [skellam_rdp(a, 2.0, 2.0, mu) for a in SAMPLED_ORDERS])


@pytest.mark.parametrize("n,k,mu", SAMPLED_CASES)
def test_sampled_curve_is_above_the_exact_subsampled_divergence(n: int, k: int, mu: float) -> None:
    """The cases are ones where the amplification bound is below the unsampled one (it is used);
    WBK's Theorem 9 as published (the default) and the repo's variant, which is never below it."""
    worst, curve, plain = sampled_brute_force(n, k, mu)
    repo = skellam_curve(SAMPLED_ORDERS, 2.0, 2.0, mu, k / n, "repo")
    assert any(c < p for c, p in zip(curve, plain))
    for a, w, c, r in zip(SAMPLED_ORDERS, worst, curve, repo):
        assert w <= c <= r * (1 + 1e-9), (n, k, mu, a, w, c, r)


def test_theorem9_is_never_below_the_gaussian_specific_bound() -> None:
    """For the Gaussian mechanism (rho(j) = j / (2 sigma^2)) the general Theorem 9 must not beat
    WBK's Gaussian-specific Theorem 27, which dp-accounting computes."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    orders = [2, 3, 5, 8, 16, 32, 64]
    for sigma, n, k in ((0.8, 100, 10), (2.0, 500, 50), (5.0, 1000, 10)):
        table = [math.inf, math.inf] + [j / (2 * sigma ** 2) for j in range(2, max(orders) + 1)]
        acc = RdpAccountant(orders, dpa.NeighboringRelation.REPLACE_ONE)
        acc.compose(dpa.SampledWithoutReplacementDpEvent(n, k, dpa.GaussianDpEvent(sigma)))
        for a, ref in zip(orders, acc._rdp):
            assert wbk_theorem9(table, a, k / n) >= ref * (1 - 1e-9), (sigma, n, k, a)


def test_epsilon_approaches_the_gaussian_mechanism_from_above() -> None:
    """sigma = sqrt(mu) / l2 fixed, the sensitivities growing (gamma growing): Skellam's epsilon >=
    the Gaussian mechanism's at every step (dp-accounting, the same orders and conversion) and the
    gap shrinks to nothing."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    sigma, count, delta, D = 1.5, 50, 1e-5, 1024
    acc = RdpAccountant(list(ORDERS), dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.GaussianDpEvent(sigma), count)
    gauss = acc.get_epsilon(delta)
    gaps = []
    for b in (3.0, 30.0, 300.0, 3000.0):
        l2, l1 = 2 * b, 2 * min(b * b, math.sqrt(D) * b)
        eps = epsilon([(skellam_curve(ORDERS, l1, l2, (sigma * l2) ** 2, 1.0), count)], delta)
        assert eps >= gauss
        gaps.append(eps / gauss - 1)
    assert all(g2 < g1 for g1, g2 in zip(gaps, gaps[1:])) and gaps[-1] < 1e-3, gaps


def _cp(k: int, n: int, alpha: float) -> tuple[float, float]:
    lo = 0.0 if k == 0 else float(beta_dist.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta_dist.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _eps_lower(tp: int, fp: int, n: int, delta: float, alpha: float = 0.05) -> float:
    tpr_lo, _ = _cp(tp, n, alpha)
    _, fpr_hi = _cp(fp, n, alpha)
    cands = [0.0]
    if tpr_lo - delta > 0 and fpr_hi > 0:
        cands.append(math.log((tpr_lo - delta) / fpr_hi))
    if 1 - fpr_hi - delta > 0 and tpr_lo < 1:
        cands.append(math.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    return max(cands)


def test_empirical_audit_stays_below_the_claimed_epsilon() -> None:
    """One 1-D release: the real code's rotation and rounding of x = +C vs x' = -C (the worst pair),
    the real Skellam sampler, the modular reduction and the server's decoding; a threshold test
    (the likelihood-ratio test: Sk is log-concave) chosen on a calibration split, Clopper-Pearson
    bounds on the held-out split (95%): the empirical epsilon lower bound <= the accountant's."""
    delta, mu, n, calib = 1e-5, 40.0, 300_000, 60_000
    code = SkellamCode(20, 3.0, 1, b"audit", 1.0)
    l1, l2 = code.sensitivity
    claimed = epsilon([(skellam_curve(ORDERS, l1, l2, mu, 1.0), 1)], delta)
    rng = np.random.default_rng(11)
    outs = []
    for x in (1.0, -1.0):
        base = encode(np.array([[x]]), code, 0.0, rng).astype(np.int64)  # rounding of +-3: exact
        noisy = np.mod(base + skellam_noise(mu, (n, 1), rng), code.modulus).astype(np.uint64)
        outs.append(decode_sum(noisy, code, 1)[:, 0])
    d_out, p_out = outs
    sign = 1.0 if d_out[:calib].mean() > p_out[:calib].mean() else -1.0
    d_out, p_out = sign * d_out, sign * p_out
    best, thr = -1.0, 0.0
    for t in np.unique(np.concatenate([d_out[:calib], p_out[:calib]])):
        e = _eps_lower(int((d_out[:calib] > t).sum()), int((p_out[:calib] > t).sum()), calib, delta)
        if e > best:
            best, thr = e, float(t)
    held = n - calib
    lower = _eps_lower(int((d_out[calib:] > thr).sum()), int((p_out[calib:] > thr).sum()), held, delta)
    assert 0.2 < lower <= claimed, (lower, claimed)


# ---------------------------------------------------------------------------- calibration


def test_calibrate_fits_the_budget_and_is_tight() -> None:
    plan = [PlannedRelease("grad", 500, 50, 100)]
    cal = calibrate(plan, 3.0, 1e-5, bits=16, clip=1.0, dim=1000, count_on=10, records_total=500, headroom=0.2)
    assert cal.epsilon <= 3.0
    assert cal.wrap_probability <= 1e-6
    assert cal.mu_add * cal.count_on == pytest.approx(cal.mu_total * 1.2)
    assert cal.mu_total == pytest.approx((2 * cal.gamma * cal.z) ** 2)
    # recomputed from the summary's numbers alone
    s = cal.summary()
    assert epsilon([(skellam_curve(ORDERS, s["l1"], s["l2"], s["mu_total"], 50 / 500), 100)], 1e-5) == \
        pytest.approx(cal.epsilon)
    assert (s["l1"], s["l2"]) == sensitivity(s["gamma"], 1.0, 1000, s["beta"])
    # a little less noise (same gamma, so the same sensitivities) breaks the budget
    less = (2 * cal.gamma * cal.z * (1 - 3e-3)) ** 2
    assert epsilon([(skellam_curve(ORDERS, cal.l1, cal.l2, less, 0.1), 100)], 1e-5) > 3.0
    code = cal.code(b"seed")
    assert code.gamma == cal.gamma and code.sensitivity == (cal.l1, cal.l2)


def test_calibrate_refuses_too_few_bits() -> None:
    with pytest.raises(ValueError):
        calibrate([PlannedRelease("grad", 500, 50, 100)], 3.0, 1e-5, bits=6, clip=1.0, dim=1000, count_on=10,
                  records_total=500)


def test_the_accountant_audit_script_finds_every_bound_above_its_independent_computation(capsys) -> None:
    """scripts/audit/skellam_accountant.py (the closing note's table) asserts each row; it runs clean."""
    from scripts.audit import skellam_accountant

    assert skellam_accountant.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("| 4 | 1 |") == 1 and "excess over the Gaussian" in out
