"""Record-level amplification by sampling for binomial releases (app/privacy/amplification.py),
checked against independent facts:

(a) brute force: the exact Renyi divergence of the subsampled truncated-vs-real mixture, the
    quantity the bound claims, D_alpha(E_J I(X_J) || E_J R(X'_J)), at tiny d, n, K and trials,
    enumerating every K-subset J of the n records and every output, in exact rational arithmetic
    (fractions.Fraction: the binomial PMF at p = 1/4 is rational), over every pair of
    neighbouring datasets whose records sit on integer levels (the worst case of the rounding,
    which the accountant's Delta covers); the bound must be >= the largest exact value;
(b) an empirical audit: the real mechanism (randomized rounding, Bin(m, p) noise, the batch
    drawn without replacement) sampled many times on a worst-case neighbouring pair; a threshold
    test gives a Clopper-Pearson lower bound on epsilon that must not exceed the claimed one.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import beta as beta_dist

from app.privacy import amplification as A
from app.privacy import binomial as B

P = Fraction(1, 4)


def _pmf(m: int) -> list[Fraction]:
    return [Fraction(math.comb(m, t)) * P ** t * (1 - P) ** (m - t) for t in range(m + 1)]


def _mech(levels_sum: tuple[int, ...], m: int, g: int, ideal: bool, pmf: list[Fraction],
          window: tuple[int, int], out_size: int) -> dict[tuple[int, ...], Fraction]:
    """Output law of S + Z over d coordinates (Z iid Bin(m, 1/4); ``ideal``: each coordinate
    conditioned on the window)."""
    lo, hi = window
    keep = sum(pmf[lo:hi + 1])
    one = [(pmf[z] / keep if lo <= z <= hi else Fraction(0)) if ideal else pmf[z] for z in range(m + 1)]
    law: dict[tuple[int, ...], Fraction] = {}
    for zs in itertools.product(range(m + 1), repeat=len(levels_sum)):
        w = Fraction(1)
        for z in zs:
            w *= one[z]
            if not w:
                break
        if w:
            t = tuple(s + z for s, z in zip(levels_sum, zs))
            law[t] = law.get(t, Fraction(0)) + w
    return law


def _mixture(records: list[tuple[int, ...]], k: int, m: int, g: int, ideal: bool, pmf, window, cache) -> dict:
    subsets = list(itertools.combinations(range(len(records)), k))
    total: dict[tuple[int, ...], Fraction] = {}
    for sub in subsets:
        s = tuple(sum(records[i][c] for i in sub) for c in range(len(records[0])))
        key = (s, ideal)
        if key not in cache:
            cache[key] = _mech(s, m, g, ideal, pmf, window, 0)
        for t, v in cache[key].items():
            total[t] = total.get(t, Fraction(0)) + v
    n_sub = len(subsets)
    return {t: v / n_sub for t, v in total.items()}


def _renyi(pl: dict, ql: dict, alpha: float) -> float:
    """D_alpha(pl || ql): exact rationals at integer orders, mpmath (60 digits) at the others."""
    if float(alpha).is_integer():
        alpha = int(alpha)
        acc = Fraction(0)
        for t, pv in pl.items():
            qv = ql[t]  # the real mixture covers the ideal one's support (the window is inside [g, m - g])
            acc += pv ** alpha / qv ** (alpha - 1)
        return (math.log(acc.numerator) - math.log(acc.denominator)) / (alpha - 1)
    import mpmath

    with mpmath.workdps(60):
        a = mpmath.mpf(alpha)
        acc = mpmath.fsum(mpmath.mpf(pv.numerator) / pv.denominator * (mpmath.mpf(ql[t].numerator) / ql[t].denominator
                                                                      / (mpmath.mpf(pv.numerator) / pv.denominator))
                          ** (1 - a) for t, pv in pl.items())
        return float(mpmath.log(acc) / (a - 1))


def _exact_worst(n: int, k: int, d: int, g: int, m: int, alphas: tuple[int, ...],
                 values: tuple[int, ...]) -> dict[int, float]:
    """max over neighbouring (X, X') with record levels in ``values``^d (record 0 replaced) of the
    exact D_alpha(E_J I(X_J) || E_J R(X'_J))."""
    pmf = _pmf(m)
    window = (g, m - g)  # TAIL = 1e-40 never binds at these trials: the window is cut at [g, m - g]
    points = list(itertools.product(values, repeat=d))
    cache: dict = {}
    worst = {a: 0.0 for a in alphas}
    for others in itertools.combinations_with_replacement(points, n - 1):
        for x0 in points:
            for x0p in points:
                if x0p == x0:
                    continue
                pl = _mixture([x0, *others], k, m, g, True, pmf, window, cache)
                ql = _mixture([x0p, *others], k, m, g, False, pmf, window, cache)
                for a in alphas:
                    worst[a] = max(worst[a], _renyi(pl, ql, a))
    return worst


# (n, K, d, g, m, record level values, orders)
CASES = [
    (4, 1, 1, 1, 12, (0, 1), (1.5, 2, 2.5, 3, 4, 8, 16, 64)),
    (5, 1, 1, 2, 16, (0, 1, 2), (2, 3, 4, 8, 16, 64)),
    (6, 2, 1, 2, 20, (0, 1, 2), (2, 3, 4, 8, 16)),
    (5, 2, 1, 1, 24, (0, 1), (2, 3, 4, 8, 16)),
    (8, 1, 1, 1, 40, (0, 1), (1.25, 1.75, 2, 2.5, 3, 4, 8, 16, 64, 128)),
    (4, 1, 2, 1, 10, (0, 1), (2, 3, 4, 8)),
    (4, 2, 2, 1, 12, (0, 1), (2, 3, 4, 8)),
]


@pytest.mark.parametrize("case", CASES, ids=[f"n{c[0]}-K{c[1]}-d{c[2]}-g{c[3]}-m{c[4]}" for c in CASES])
def test_bound_against_brute_force(case):
    n, k, d, g, m, values, alphas = case
    assert B.window(m, 0.25, g)[:2] == (g, m - g)
    exact = _exact_worst(n, k, d, g, m, alphas, values)
    curve = B.amplified_release_curve(m, 0.25, g, d, k / n)
    plain = B.release_curve(m, 0.25, g, d)
    print(f"\n{'n':>2} {'K':>2} {'d':>2} {'g':>2} {'m':>3} {'alpha':>5} {'exact':>10} {'amplified':>10} "
          f"{'plain':>10}")
    for a in alphas:
        o = B.ORDERS.index(float(a))
        print(f"{n:>2} {k:>2} {d:>2} {g:>2} {m:>3} {a:>5g} {exact[a]:>10.5f} {curve.rdp[o]:>10.5f} "
              f"{plain.rdp[o]:>10.5f}")
        assert curve.rdp[o] >= exact[a], (a, curve.rdp[o], exact[a])
        assert curve.rdp[o] <= plain.rdp[o]


def test_formula_by_hand():
    """wor_subsampled_rdp at alpha = 2 and 3 against the formula written out (rho constant)."""
    r, gm, lc = 0.3, 0.05, 1e-6
    b2 = min(4 * math.expm1(r), 2 * math.exp(r)) / (1 - gm)
    want2 = math.log(1 + gm ** 2 * b2) + 2 * lc + lc
    b3 = 2 * math.exp(2 * r) / (1 - gm) ** 2
    want3 = math.log(1 + 3 * gm ** 2 * b2 + gm ** 3 * b3) / 2 + 1.5 * lc + lc
    assert math.isclose(A.wor_subsampled_rdp(lambda j: r, 2, gm, lc), want2 * (1 + A.REL_SLACK), rel_tol=1e-12)
    assert math.isclose(A.wor_subsampled_rdp(lambda j: r, 3, gm, lc), want3 * (1 + A.REL_SLACK), rel_tol=1e-12)
    assert A.wor_subsampled_rdp(lambda j: r, 3, 1.0, lc) == r  # K = n: nothing to amplify
    assert A.wor_subsampled_rdp(lambda j: 1e-3 * j, 64, 0.9, 0.0) == 1e-3 * 64  # never above the plain curve


# ------------------------------------------------------------------------------ empirical audit

def _sample_releases(records: np.ndarray, k: int, code, b: int, trials: int, rng: np.random.Generator) -> np.ndarray:
    """``trials`` releases of the real silo path: a batch of K of the n records drawn without
    replacement (app.data.split.fixed_size_batch), then the binomial encoding (encode_counts)."""
    from app.data.split import fixed_size_batch
    from app.privacy.shuffle import encode_counts

    out = np.empty(trials, dtype=np.int64)
    for i in range(trials):
        idx = fixed_size_batch(len(records), k, rng)
        out[i] = encode_counts(records[idx], code, b, rng)[0]
    return out


def _clopper_pearson(successes: int, trials: int, conf: float) -> tuple[float, float]:
    """One-sided lower and upper Clopper-Pearson bounds, each at level ``conf``."""
    a = 1 - conf
    lo = 0.0 if successes == 0 else float(beta_dist.ppf(a, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(beta_dist.ppf(1 - a, successes + 1, trials - successes))
    return lo, hi


@pytest.mark.slow
def test_empirical_audit_of_the_amplified_claim():
    """d = 1, n = 10 records, K = 1 (gamma = 0.1), g = 2 levels, m = 40 trials, p = 1/4: X has
    record 0 at the top level g and the others at 0, X' has every record at 0 (the largest
    shift). The threshold tau is the one that maximises the population's epsilon at delta among
    {T >= tau} (computed from the binomial law, not from the samples); 200,000 releases per side
    at a fixed seed; 99% one-sided Clopper-Pearson bounds each side."""
    from app.privacy.shuffle import ShuffleCode

    n, k, g, m, p, delta = 10, 1, 2, 40, 0.25, 1e-3
    code = ShuffleCode(bound=1.0, levels=g, p=p)
    x = np.full((n, 1), -1.0)  # level 0
    x_top = x.copy()
    x_top[0, 0] = 1.0  # level g
    gamma = k / n
    pmf = np.array([math.comb(m, t) * p ** t * (1 - p) ** (m - t) for t in range(m + 1)])
    sf = lambda tau: float(pmf[max(0, tau):].sum())  # noqa: E731  P(Z >= tau)

    def population_eps(tau: int) -> float:
        p1 = (1 - gamma) * sf(tau) + gamma * sf(tau - g)
        p0 = sf(tau)
        return math.log((p1 - delta) / p0) if p1 > delta and p0 > 0 else -math.inf

    tau = max(range(1, m + g + 1), key=population_eps)
    rng = np.random.default_rng(20261202)
    samples = 100_000
    t1 = _sample_releases(x_top, k, code, m, samples, rng)
    t0 = _sample_releases(x, k, code, m, samples, rng)
    p1_lo, _ = _clopper_pearson(int((t1 >= tau).sum()), samples, 0.99)
    _, p0_hi = _clopper_pearson(int((t0 >= tau).sum()), samples, 0.99)
    eps_lower = math.log((p1_lo - delta) / p0_hi) if p1_lo > delta else 0.0
    claimed = B.epsilon_from_curves([(B.amplified_release_curve(m, p, g, 1, gamma), 1)], delta)
    plain = B.epsilon_from_curves([(B.release_curve(m, p, g, 1), 1)], delta)
    # the exact epsilon of this pair at delta (hockey-stick divergence over all outputs, both orders)
    p1 = np.zeros(m + g + 1)
    p1[:m + 1] += (1 - gamma) * pmf
    p1[g:] += gamma * pmf
    p0 = np.zeros(m + g + 1)
    p0[:m + 1] = pmf

    def hockey(a: np.ndarray, b: np.ndarray, eps: float) -> float:
        return float(np.maximum(a - math.exp(eps) * b, 0).sum())

    lo, hi = 0.0, 20.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if max(hockey(p1, p0, mid), hockey(p0, p1, mid)) <= delta else (mid, hi)
    print(f"\naudit: tau={tau} population eps={population_eps(tau):.4f} eps_lower={eps_lower:.4f} "
          f"exact eps of the pair={hi:.4f} claimed (amplified)={claimed:.4f} plain={plain:.4f} "
          f"({samples} releases per side)")
    assert eps_lower <= hi <= claimed
    assert claimed < plain


# --------------------------------------------------------------------------- the silo's record

SHUFFLE = {"privacy.mode": "shuffle", "num-rounds": 2, "partition": "iid", "privacy.epsilon": 3.0, "num-silos": 2,
           "silos-per-round": 2, "model": "logistic", "lr": 0.5, "privacy.delta": 1e-5, "batch-size": 8}


def test_summary_names_the_bound_and_recomputes_from_the_file(federation):
    """summary.json says which bound each silo used; its epsilon is recomputed from the file
    alone; the amplified run calibrates fewer trials than the unamplified one."""
    from app.privacy.accounting import Release, epsilon_spent

    trials = {}
    for amp in ("none", "sampling"):
        # secret batches (noise-seed os): the only ones a silo claims amplification for (issue 34 section 2)
        summary, rows, _ = federation(SHUFFLE | {"shuffle.amplification": amp, "privacy.noise-seed": "os"},
                                      sub=amp, name=amp)
        assert summary["status"] == "completed" and len(rows) == 2
        for silo in summary["silos"]:
            assert silo["shuffle"]["record_amplification"].startswith(amp)
            (release,) = silo["releases"]
            assert release["batch"] == 8 < release["n"]
            assert release.get("amplification", "none") == amp
            assert ("amplified at gamma" in release["sampling"]) == (amp == "sampling")
            r = Release(release["kind"], release["n"], release["batch"], 0.0, release["count"], False, "binomial",
                        release["trials"], release["levels"], release["p"], release["dim"],
                        release.get("amplification", "none"))
            assert math.isclose(epsilon_spent([r], silo["delta"]), silo["eps_spent"], rel_tol=1e-12)
            assert silo["eps_spent"] <= 3.0
            trials.setdefault(amp, []).append(release["trials"])
    assert all(a < b for a, b in zip(trials["sampling"], trials["none"]))
