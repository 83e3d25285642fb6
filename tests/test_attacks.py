"""app/attacks.py against answers worked out by hand (in the comments) and an independent
evaluation of the ALIE formula with scipy's norm.ppf. Fixed seeds; well under a second."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy.stats import norm

from app.attacks import (
    ATTACKS,
    alie,
    alie_z,
    byzantine_silos,
    flip_labels,
    gaussian_noise,
    ipm,
    random_labels,
    sign_flip,
)

A = np.array


# ---------------------------------------------------------------------------------- label attacks

def test_flip_labels_c10():
    # C = 10: y -> 9 - y
    y = A([0, 1, 5, 9, 3], dtype=np.int64)
    out = flip_labels(y, 10)
    np.testing.assert_array_equal(out, [9, 8, 4, 0, 6])
    assert out.dtype == y.dtype
    np.testing.assert_array_equal(y, [0, 1, 5, 9, 3])  # input untouched
    np.testing.assert_array_equal(flip_labels(out, 10), y)  # an involution


def test_flip_labels_binary_and_validation():
    np.testing.assert_array_equal(flip_labels(A([0, 1, 1]), 2), [1, 0, 0])
    with pytest.raises(ValueError, match="y labels must be in \\[0, 9\\], got values in \\[0, 10\\]"):
        flip_labels(A([0, 10]), 10)
    with pytest.raises(ValueError, match="num_classes must be an integer >= 2, got 1"):
        flip_labels(A([0]), 1)
    with pytest.raises(ValueError, match="integer class labels"):
        flip_labels(A([0.0, 1.0]), 2)


def test_random_labels_uniform_and_reproducible():
    y = np.zeros(20_000, dtype=np.int64)
    a = random_labels(y, 10, np.random.default_rng(3))
    b = random_labels(y, 10, np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    assert a.shape == y.shape and a.min() >= 0 and a.max() <= 9
    counts = np.bincount(a, minlength=10)
    # each count ~ Binomial(20000, 0.1): mean 2000, sd ~ 42; 6 sd band
    assert np.all(np.abs(counts - 2000) < 260), counts
    assert not np.array_equal(a, random_labels(y, 10, np.random.default_rng(4)))


# --------------------------------------------------------------------------------- update attacks

def test_sign_flip():
    np.testing.assert_array_equal(sign_flip(A([1.5, -2.0, 0.0])), [-1.5, 2.0, 0.0])


def test_ipm():
    # mean of (1, 2, 3), (3, 0, -1), (2, 4, 1) = (2, 2, 1); -0.5 * (2, 2, 1) = (-1, -1, -0.5)
    honest = A([[1.0, 2.0, 3.0], [3.0, 0.0, -1.0], [2.0, 4.0, 1.0]])
    np.testing.assert_allclose(ipm(honest, 0.5), [-1.0, -1.0, -0.5])
    np.testing.assert_allclose(ipm(honest, 100.0), [-200.0, -200.0, -100.0])
    for eps in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
            ipm(honest, eps)


def test_alie_z_n50_f24():
    # s = floor(50/2 + 1) - 24 = 26 - 24 = 2; z = Phi^-1((50 - 2)/50) = Phi^-1(0.96) ~ 1.7507
    expected = norm.ppf(48 / 50)
    assert alie_z(50, 24) == pytest.approx(expected, rel=1e-12)
    assert alie_z(50, 24) == pytest.approx(1.75069, abs=1e-5)


def test_alie_z_other_honest_majority_values():
    # n = 10, f = 1: s = 6 - 1 = 5 -> Phi^-1(0.5) = 0
    assert alie_z(10, 1) == pytest.approx(0.0, abs=1e-12)
    # n = 10, f = 4: s = 2 -> Phi^-1(0.8)
    assert alie_z(10, 4) == pytest.approx(norm.ppf(0.8), rel=1e-12)
    # n = 7, f = 3: s = floor(4.5) - 3 = 1 -> Phi^-1(6/7)
    assert alie_z(7, 3) == pytest.approx(norm.ppf(6 / 7), rel=1e-12)


def test_alie_z_refuses_byzantine_majority():
    # f = n/2: s = 1, still computable but meaningless; f = 6 of 10: s = 0 -> Phi^-1(1) = inf;
    # f = 7 of 10: s = -1 -> Phi^-1(1.1) = nan. All refused, telling the caller to pass z.
    for n, f in ((10, 5), (10, 6), (10, 7), (9, 5)):
        with pytest.raises(ValueError, match="pass z explicitly"):
            alie_z(n, f)
    # honest majority but the argument is 0: n = 2, f = 0 -> s = 2 -> (2 - 2)/2 = 0
    with pytest.raises(ValueError, match="not in \\(0, 1\\).*pass z explicitly"):
        alie_z(2, 0)
    with pytest.raises(ValueError, match="f must be in \\[0, n\\]"):
        alie_z(10, -1)


def test_alie_vector():
    # honest column 0: (1, 3) -> mu 2, sample sd (ddof 1) sqrt(2); column 1: (0, 0) -> mu 0,
    # sd 0; column 2: (2, 6) -> mu 4, sd 2 sqrt(2).  z = 1.5 -> (2 + 1.5 r2, 0, 4 + 3 r2)
    r2 = math.sqrt(2.0)
    honest = A([[1.0, 0.0, 2.0], [3.0, 0.0, 6.0]])
    np.testing.assert_allclose(alie(honest, n=10, f=8, z=1.5), [2 + 1.5 * r2, 0.0, 4 + 3 * r2])
    # the same with statistics.stdev (the sample standard deviation), an independent implementation
    np.testing.assert_allclose(alie(honest, n=10, f=8, z=1.5)[2], 4 + 1.5 * statistics.stdev([2.0, 6.0]))
    # z from the formula: n = 10, f = 4 -> z = Phi^-1(0.8)
    z = norm.ppf(0.8)
    np.testing.assert_allclose(alie(honest, n=10, f=4), [2 + z * r2, 0.0, 4 + 2 * r2 * z])
    # one honest update: no spread can be estimated, the attack sends it unchanged
    np.testing.assert_allclose(alie(honest[:1], n=10, f=8, z=1.5), honest[0])
    with pytest.raises(ValueError, match="pass z explicitly"):
        alie(honest, n=10, f=8)


def test_gaussian_noise():
    a = gaussian_noise((4, 3), 2.0, np.random.default_rng(0))
    b = gaussian_noise((4, 3), 2.0, np.random.default_rng(0))
    assert a.shape == (4, 3)
    np.testing.assert_array_equal(a, b)
    big = gaussian_noise(40_000, 2.0, np.random.default_rng(1))
    assert abs(big.mean()) < 0.05 and abs(big.std() - 2.0) < 0.05
    np.testing.assert_array_equal(gaussian_noise(5, 0.0, np.random.default_rng(0)), np.zeros(5))
    with pytest.raises(ValueError, match="sigma must be a finite number >= 0, got -1"):
        gaussian_noise(3, -1.0, np.random.default_rng(0))


def test_attack_registry():
    assert set(ATTACKS) == {"label-flip", "random-labels", "sign-flip", "ipm", "alie", "gaussian", "alie-adaptive",
                            "ipm-adaptive", "mimic", "edge-of-score"}
    assert {k for k, v in ATTACKS.items() if v.omniscient} == {"ipm", "alie", "alie-adaptive", "ipm-adaptive", "mimic",
                                                               "edge-of-score"}
    assert {k for k, v in ATTACKS.items() if v.level == "data"} == {"label-flip", "random-labels"}
    assert all(v.description for v in ATTACKS.values())


# ------------------------------------------------------------------------------ Byzantine silos

def test_byzantine_silos_counts():
    rng = np.random.default_rng(0)
    # floor(fraction * N): 0.3 * 10 = 3, 0.25 * 10 = 2.5 -> 2, 0.29 * 100 = 29 (not 28 from fp error),
    # 0.9 * 5 = 4.5 -> 4 (= N - 1), 0.9 * 1 -> 0, 0 -> 0
    for n, frac, k in ((10, 0.3, 3), (10, 0.25, 2), (100, 0.29, 29), (5, 0.9, 4), (1, 0.9, 0), (7, 0.0, 0),
                       (2, 0.5, 1)):
        out = byzantine_silos(n, frac, rng)
        assert len(out) == k, (n, frac, out)
        assert out.dtype == np.int64
        assert len(np.unique(out)) == k
        assert np.all((out >= 0) & (out < n))
        assert np.all(np.diff(out) > 0)  # sorted, no repeats


def test_byzantine_silos_reproducible_and_uniform():
    a = byzantine_silos(20, 0.4, np.random.default_rng(42))
    b = byzantine_silos(20, 0.4, np.random.default_rng(42))
    np.testing.assert_array_equal(a, b)
    # every silo is chosen with probability k/N = 3/10 over many seeds
    hits = np.zeros(10)
    for s in range(2000):
        hits[byzantine_silos(10, 0.3, np.random.default_rng(s))] += 1
    # Binomial(2000, 0.3): mean 600, sd ~ 20.5; 6 sd band
    assert np.all(np.abs(hits - 600) < 125), hits


def test_byzantine_silos_bounds():
    rng = np.random.default_rng(0)
    for frac in (-0.1, 0.91, 1.0, math.nan):
        with pytest.raises(ValueError, match="fraction must be in \\[0, 0.9\\]"):
            byzantine_silos(10, frac, rng)
    with pytest.raises(ValueError, match="num_silos must be an integer >= 1, got 0"):
        byzantine_silos(0, 0.1, rng)
