"""Private selection (app/privacy/selection.py) against independent facts: exact Renyi divergences
of best-of-K over small discrete mechanisms (brute force over the outputs), sampled means, the
theorem's K = 1 limit, Gaussian composition, and dp-accounting's own RepeatAndSelect code."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from app.privacy.selection import (calibrate_selection, revealed_rdp, sample_runs, selection_epsilon, selection_rdp,
                                   tnb_gamma_for_mean, tnb_mean)

ORDERS = [1.0] + [float(a) for a in range(2, 65)]


def renyi(p: np.ndarray, q: np.ndarray, lam: float) -> float:
    """D_lambda(p || q) of two discrete distributions (lambda = 1: KL)."""
    m = p > 0
    if lam == 1:
        return float(np.sum(p[m] * np.log(p[m] / q[m])))
    return float(np.log(np.sum(p[m] ** lam * q[m] ** (1 - lam))) / (lam - 1))


def both_ways(p: np.ndarray, q: np.ndarray, lam: float) -> float:
    return max(renyi(p, q, lam), renyi(q, p, lam))


def pmf_by_product(eta: float, gamma: float, kmax: int) -> np.ndarray:
    """P[K=k], k = 1..kmax, from the paper's definition as written (plain products)."""
    out, prod = [], 1.0
    for k in range(1, kmax + 1):
        if eta == 0:
            out.append((1 - gamma) ** k / (k * math.log(1 / gamma)))
        else:
            prod *= (k - 1 + eta) / k  # prod_{l=0}^{k-1} (l + eta) / (l + 1), one factor more per k
            out.append((1 - gamma) ** k / (gamma ** -eta - 1) * prod)
    return np.array(out)


def best_of(p: np.ndarray, weights: dict[int, float], bottom: float = 0.0) -> np.ndarray:
    """Output distribution of "K ~ weights, output the largest of K i.i.d. draws from p"
    (outputs ordered by index; K = 0 has mass ``bottom`` on an extra output), by summation over K."""
    cdf = np.cumsum(p)
    prev = np.concatenate([[0.0], cdf[:-1]])
    out = np.zeros(len(p) + 1)
    out[-1] = bottom
    for k, w in weights.items():
        out[:-1] += w * (cdf ** k - prev ** k)
    return out


# small mechanisms on two neighbouring datasets: outputs are scores, larger is better
MECHANISMS = [
    (np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.3, 0.3])),
    (np.array([0.1, 0.2, 0.3, 0.4]), np.array([0.15, 0.25, 0.3, 0.3])),
    (np.array([0.7, 0.3]), np.array([0.6, 0.4])),  # randomized response, e^eps = 7/6 * ...
]


def base_curve(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    return np.array([both_ways(p, q, lam) for lam in ORDERS])


@pytest.mark.parametrize("eta,gamma", [(0.0, 0.3), (1.0, 0.25), (0.5, 0.1), (-0.5, 0.2), (2.0, 0.5)])
@pytest.mark.parametrize("mech", range(len(MECHANISMS)))
def test_tnb_bound_covers_exact_divergence_of_best_of_k(eta: float, gamma: float, mech: int) -> None:
    p, q = MECHANISMS[mech]
    kmax = 4000
    w = pmf_by_product(eta, gamma, kmax)
    assert w.sum() == pytest.approx(1.0, abs=1e-9)
    weights = dict(enumerate(w, start=1))
    pa, qa = best_of(p, weights)[:-1], best_of(q, weights)[:-1]
    bound = selection_rdp(ORDERS, base_curve(p, q), "tnb", {"eta": eta, "gamma": gamma}, [2, 3, 5, 8, 16, 32])
    for lam, b in zip([2, 3, 5, 8, 16, 32], bound):
        assert b >= both_ways(pa, qa, lam) - 1e-12, (lam, b, both_ways(pa, qa, lam))


@pytest.mark.parametrize("mu", [1.0, 2.0, 6.0])
@pytest.mark.parametrize("mech", range(len(MECHANISMS)))
def test_poisson_bound_covers_exact_divergence_of_best_of_k(mu: float, mech: int) -> None:
    p, q = MECHANISMS[mech]
    weights = {k: math.exp(-mu + k * math.log(mu) - math.lgamma(k + 1)) for k in range(1, 200)}
    pa, qa = best_of(p, weights, math.exp(-mu)), best_of(q, weights, math.exp(-mu))
    assert pa.sum() == pytest.approx(1.0, abs=1e-12)
    lams = [2, 3, 5, 8, 16]
    bound = selection_rdp(ORDERS, base_curve(p, q), "poisson", {"mu": mu}, lams)
    for lam, b in zip(lams, bound):
        assert b >= both_ways(pa, qa, lam) - 1e-12, (lam, b, both_ways(pa, qa, lam))


def test_poisson_below_one_is_refused() -> None:
    """At mu = 0.5 the formula would sit below the exact divergence: refused (mu >= 1, as dp-accounting)."""
    p, q = MECHANISMS[0]
    mu = 0.5
    weights = {k: math.exp(-mu + k * math.log(mu) - math.lgamma(k + 1)) for k in range(1, 200)}
    pa, qa = best_of(p, weights, math.exp(-mu)), best_of(q, weights, math.exp(-mu))
    eps_hat_term = 0.0  # even with delta_hat = 0, eps(2) + log(0.5) < 0 < the exact divergence
    assert both_ways(p, q, 2) + eps_hat_term + math.log(mu) < both_ways(pa, qa, 2)
    with pytest.raises(ValueError):
        selection_rdp(ORDERS, base_curve(p, q), "poisson", {"mu": mu})


@pytest.mark.parametrize("eta,gamma", [(0.0, 0.05), (1.0, 0.2), (0.5, 0.3), (-0.5, 0.1)])
def test_tnb_mean_by_sampling(eta: float, gamma: float) -> None:
    rng = np.random.default_rng(1234)
    draws = np.array([sample_runs("tnb", {"eta": eta, "gamma": gamma}, rng) for _ in range(20000)])
    assert draws.min() >= 1
    se = draws.std() / math.sqrt(len(draws))
    assert abs(draws.mean() - tnb_mean(eta, gamma)) < 4 * se
    # the empirical frequency of K = 1 against the pmf by products
    p1 = pmf_by_product(eta, gamma, 1)[0]
    assert abs((draws == 1).mean() - p1) < 4 * math.sqrt(p1 * (1 - p1) / len(draws))
    # the mean formula against the pmf summed
    w = pmf_by_product(eta, gamma, 20000)
    assert tnb_mean(eta, gamma) == pytest.approx(float(np.sum(np.arange(1, 20001) * w)), rel=1e-6)


def test_poisson_sampling_mean() -> None:
    rng = np.random.default_rng(7)
    draws = np.array([sample_runs("poisson", {"mu": 3.5}, rng) for _ in range(20000)])
    assert abs(draws.mean() - 3.5) < 4 * math.sqrt(3.5 / len(draws))


def test_gamma_for_mean_inverts_the_mean() -> None:
    for eta in (0.0, 1.0, 0.5, -0.5):
        for mean in (1.5, 4.0, 20.0):
            g = tnb_gamma_for_mean(eta, mean)
            assert tnb_mean(eta, g) == pytest.approx(mean, rel=1e-8)
            assert tnb_mean(eta, g) >= mean
    assert tnb_gamma_for_mean(1.0, 4.0) == pytest.approx(0.25, rel=1e-9)  # geometric: E[K] = 1/gamma


def test_one_run_reduces_to_the_base_curve() -> None:
    """Theorem 2 with lambda_hat = 1 (the KL order) as gamma -> 1 (K = 1 with probability -> 1,
    eta = 1: the geometric) gives back eps(lambda); a fixed K = 1 seen whole is Q itself."""
    p, q = MECHANISMS[1]
    curve = base_curve(p, q)
    for gamma in (1 - 1e-6, 1 - 1e-9):
        bound = selection_rdp(ORDERS, curve, "tnb", {"eta": 1.0, "gamma": gamma})
        assert np.all(bound >= curve[1:] - 1e-15)
        assert np.allclose(bound, curve[1:], atol=1e-5)
    assert np.allclose(revealed_rdp(ORDERS, curve, "fixed", {"k": 1}), curve[1:], rtol=1e-12)


@pytest.mark.parametrize("k", [2, 3])
def test_revealed_runs_equal_exact_divergence_of_all_outputs(k: int) -> None:
    """K fixed and every run seen: brute force over all k-tuples of outputs."""
    p, q = MECHANISMS[0]
    tuples = list(itertools.product(range(len(p)), repeat=k))
    pk = np.array([np.prod([p[i] for i in t]) for t in tuples])
    qk = np.array([np.prod([q[i] for i in t]) for t in tuples])
    lams = [2, 4, 9]
    got = revealed_rdp(ORDERS, base_curve(p, q), "fixed", {"k": k}, lams)
    for lam, g in zip(lams, got):
        assert g == pytest.approx(both_ways(pk, qk, lam), rel=1e-9)


def test_revealed_random_k_equals_exact_divergence_with_k_seen() -> None:
    """K ~ geometric, seen with every run: the joint (K, outputs) by summation over K."""
    p, q = MECHANISMS[2]
    gamma, lam = 0.6, 3
    w = pmf_by_product(1.0, gamma, 200)
    # D = 1/(lam-1) log sum_k w_k (sum_y p^lam q^(1-lam))^k, each k-fold sum by brute force for small k
    terms = []
    for k, wk in enumerate(w, start=1):
        inner = float(np.sum(p ** lam * q ** (1 - lam))) ** k if k > 4 else float(sum(
            np.prod([p[i] for i in t]) ** lam * np.prod([q[i] for i in t]) ** (1 - lam)
            for t in itertools.product(range(len(p)), repeat=k)))
        terms.append(wk * inner)
    exact = math.log(sum(terms)) / (lam - 1)
    curve = np.array([renyi(p, q, a) for a in ORDERS])  # one direction, as the brute force
    got = revealed_rdp(ORDERS, curve, "tnb", {"eta": 1.0, "gamma": gamma}, [lam])[0]
    assert got == pytest.approx(exact, rel=1e-9)


def test_matches_dp_accounting_repeat_and_select() -> None:
    """dp-accounting implements the same two theorems (_compute_rdp_repeat_and_select)."""
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_repeat_and_select

    orders = np.array([float(a) for a in range(2, 65)])
    curve = orders / (2 * 3.0**2)  # a Gaussian mechanism, noise multiplier 3
    for eta, mean in ((0.0, 5.0), (1.0, 4.0), (0.5, 10.0)):
        gamma = tnb_gamma_for_mean(eta, mean)
        ours = selection_rdp(orders, curve, "tnb", {"eta": eta, "gamma": gamma})
        theirs = _compute_rdp_repeat_and_select(orders, curve, tnb_mean(eta, gamma), eta)
        assert np.allclose(ours, theirs, rtol=1e-6)
    ours = selection_rdp(orders, curve, "poisson", {"mu": 4.0})
    theirs = _compute_rdp_repeat_and_select(orders, curve, 4.0, np.inf)
    # dp-accounting skips the monotone step for Poisson: ours is its curve, then the least value at any higher order
    assert np.allclose(ours, [min(theirs[i:]) for i in range(len(theirs))], rtol=1e-9)
    assert np.all(ours <= theirs + 1e-12) and np.allclose(ours[5:], theirs[5:], rtol=1e-9)


def test_calibration_of_k_revealed_gaussian_runs_is_sqrt_k_times_one() -> None:
    """K Gaussian runs seen whole are one Gaussian with multiplier s / sqrt(K): the calibrated s
    for K runs is sqrt(K) times the one for a single run."""
    orders = [float(a) for a in range(2, 129)]

    def gauss(s: float) -> np.ndarray:
        return np.asarray(orders) / (2 * s * s)

    one = calibrate_selection(2.0, 1e-5, "fixed", {"k": 1}, gauss, orders, revealed=True, rtol=1e-5)
    four = calibrate_selection(2.0, 1e-5, "fixed", {"k": 4}, gauss, orders, revealed=True, rtol=1e-5)
    assert four.noise_multiplier == pytest.approx(2 * one.noise_multiplier, rel=1e-4)
    assert four.total_epsilon <= 2.0 and one.candidate_epsilon == pytest.approx(one.total_epsilon)
    assert four.candidate_epsilon < 2.0 / 1.9  # each run gets about eps / sqrt(4) (plus the log(1/delta) share)


def test_selection_calibration_fits_and_is_tight() -> None:
    orders = [1.0] + [float(a) for a in range(2, 129)]

    def gauss(s: float) -> np.ndarray:
        return np.asarray(orders) / (2 * s * s)

    params = {"eta": 0.0, "gamma": tnb_gamma_for_mean(0.0, 4.0)}
    cal = calibrate_selection(3.0, 1e-5, "tnb", params, gauss, orders, rtol=1e-4)
    assert cal.total_epsilon <= 3.0
    assert selection_epsilon(orders, gauss(cal.noise_multiplier * (1 - 3e-4)), "tnb", params, 1e-5) > 3.0
    assert cal.candidate_epsilon < cal.total_epsilon
    # the output-only bound is below the cost of the same runs seen whole (a fixed K = 4 here)
    assert selection_epsilon(orders, gauss(cal.noise_multiplier), "fixed", {"k": 4}, 1e-5, revealed=True) > 0


def test_unreachable_target_is_refused() -> None:
    orders = [float(a) for a in range(2, 65)]
    with pytest.raises(ValueError):
        calibrate_selection(0.01, 1e-5, "tnb", {"eta": 1.0, "gamma": 0.01},
                            lambda s: np.asarray(orders) / (2 * s * s), orders)


@pytest.mark.parametrize("protocol", ["compose", "ps"])
def test_driver_calibration_keeps_the_silos_within_epsilon(protocol: str) -> None:
    """The chain the driver relies on (scripts/reproduce/isrl_private_tuning.py): the run epsilon it
    asks for -> each silo's own calibration (app/privacy/accounting.py) -> K runs composed by the
    silo's accountant (compose: <= epsilon against the server), or Theorem 2 of one run (ps)."""
    from app.privacy.accounting import PlannedRelease, Release, calibrate_noise_multiplier, epsilon_spent
    from app.privacy.rdp_orders import RDP_ORDERS
    from scripts.reproduce.isrl_private_tuning import calibrate, ledger_curve

    eps, k = 1.5, 4
    silos, plans = [], []
    for n in (122, 206):  # WBCD's two silos: 25 sampled gradients, one private evaluation at ratio 0.25
        plan = [PlannedRelease("grad", n, 64, 25, 1.0), PlannedRelease("eval", n, n, 1, 0.25)]
        plans.append(plan)
        silos.append({"n": n, "delta": 1 / n**2, "planned": [
            {"batch": p.batch, "count": p.count, "noise_multiplier": 7.0 * p.weight} for p in plan]})
    params = {"k": k} if protocol == "compose" else {"eta": 0.0, "gamma": tnb_gamma_for_mean(0.0, 4.0)}
    run_eps = calibrate(silos, eps, protocol, params)
    assert 0 < run_eps < eps
    spent_all = []
    for silo, plan in zip(silos, plans):
        z = calibrate_noise_multiplier(plan, run_eps, silo["delta"])
        one = [r.at(z) for r in plan]
        if protocol == "compose":  # the node ledger's own number for K runs
            spent = epsilon_spent([Release(r.kind, r.n, r.batch, r.noise_multiplier, r.count * k) for r in one],
                                  silo["delta"])
        else:
            curve = ledger_curve([{"kind": r.kind, "n": r.n, "batch": r.batch, "noise_multiplier": r.noise_multiplier,
                                   "count": r.count} for r in one])
            spent = selection_epsilon(RDP_ORDERS, curve, "tnb", params, silo["delta"])
        spent_all.append(spent)
    assert max(spent_all) <= eps and max(spent_all) > 0.99 * eps  # the silo that sets the run epsilon is tight
