"""strategies/aggregation.py against answers worked out by hand (in the comments), never by calling
the function under test: small stacks of 2-5 vectors in R^1..R^3. Well under a second."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from strategies.aggregation import (
    RULES,
    Aggregate,
    HonestMajorityRequired,
    centered_clipping,
    coordinate_median,
    fltrust,
    geometric_median,
    krum,
    krum_scores,
    min_clients,
    mean,
    multi_krum,
    smea,
    smea_max_eigenvalues,
    trimmed_mean,
)

A = np.array  # shorthand


# ----------------------------------------------------------------------------------------- mean

def test_mean_uniform():
    # ((1+3+5)/3, (2+0-2)/3) = (3, 0); weights 1/3 each
    r = mean(A([[1.0, 2.0], [3.0, 0.0], [5.0, -2.0]]))
    assert isinstance(r, Aggregate)
    np.testing.assert_allclose(r.vector, [3.0, 0.0])
    np.testing.assert_allclose(r.weights, [1 / 3, 1 / 3, 1 / 3])


# -------------------------------------------------------------------------------------- fltrust

def test_fltrust_only_aligned_client_counts_rescaled_to_root_norm():
    # g0 = (2, 0), ||g0|| = 2.  u0 = (1, 0): cos 1 -> score 1, rescaled to (2, 0).
    # u1 = (0, 5): cos 0 -> score 0.  u2 = (-3, 0): cos -1 -> ReLU -> 0.
    # aggregate = 1 * (2, 0) / 1 = (2, 0); weights (1, 0, 0).
    r = fltrust(A([[1.0, 0.0], [0.0, 5.0], [-3.0, 0.0]]), A([2.0, 0.0]))
    np.testing.assert_allclose(r.vector, [2.0, 0.0])
    np.testing.assert_allclose(r.weights, [1.0, 0.0, 0.0])


def test_fltrust_two_partial_scores():
    # g0 = (2, 0).  u0 = (1, 0): s0 = 1, rescaled (2, 0).
    # u1 = (3, 3): cos = 3 / (3 sqrt 2) = 1/sqrt2 = s1, rescaled 2 (1, 1)/sqrt2 = (sqrt2, sqrt2).
    # numerator = (2, 0) + (1/sqrt2)(sqrt2, sqrt2) = (3, 1); denominator 1 + 1/sqrt2.
    r = fltrust(A([[1.0, 0.0], [3.0, 3.0]]), A([2.0, 0.0]))
    den = 1 + 1 / math.sqrt(2)
    np.testing.assert_allclose(r.vector, [3 / den, 1 / den])
    np.testing.assert_allclose(r.weights, [1 / den, (1 / math.sqrt(2)) / den])


def test_fltrust_guards_return_zero_update():
    # every score 0 (orthogonal / opposite / zero-norm client) -> zero vector, zero weights
    r = fltrust(A([[0.0, 1.0], [-1.0, 0.0], [0.0, 0.0]]), A([1.0, 0.0]))
    np.testing.assert_array_equal(r.vector, [0.0, 0.0])
    np.testing.assert_array_equal(r.weights, [0.0, 0.0, 0.0])
    # ||g0|| = 0 -> zero update even though clients agree with each other
    r = fltrust(A([[1.0, 1.0], [1.0, 1.0]]), A([0.0, 0.0]))
    np.testing.assert_array_equal(r.vector, [0.0, 0.0])
    np.testing.assert_array_equal(r.weights, [0.0, 0.0])


def test_fltrust_zero_norm_client_scores_zero():
    # u1 = 0 would divide by zero when rescaling; it must get score 0, leaving u0 alone: (3, 0)
    r = fltrust(A([[5.0, 0.0], [0.0, 0.0]]), A([3.0, 0.0]))
    np.testing.assert_allclose(r.vector, [3.0, 0.0])
    np.testing.assert_allclose(r.weights, [1.0, 0.0])


def test_fltrust_shape_mismatch():
    with pytest.raises(ValueError, match="trust_update must have shape \\(2,\\)"):
        fltrust(A([[1.0, 0.0]]), A([1.0, 0.0, 0.0]))


# ----------------------------------------------------------------------------------------- krum

def test_krum_spec_example_with_tie():
    # the unit square {(0,0), (1,0), (0,1), (1,1)}, n = 4, f = 0 -> n - f - 2 = 2 nearest
    # neighbours, each at squared distance 1: every score is 2.  Tie -> lowest index 0.
    u = A([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(krum_scores(u, 0), [2.0, 2.0, 2.0, 2.0])
    r = krum(u, 0)
    np.testing.assert_array_equal(r.vector, [0.0, 0.0])
    np.testing.assert_array_equal(r.weights, [1.0, 0.0, 0.0, 0.0])


# n = 5, f = 1 -> 2 nearest neighbours. a=(0,0) b=(3,0) c=(0,4) d=(1,1) e=(10,10)
# squared distances: ab 9, ac 16, ad 2, ae 200, bc 25, bd 5, be 149, cd 10, ce 136, de 162
# scores: a 2+9 = 11, b 5+9 = 14, c 10+16 = 26, d 2+5 = 7, e 136+149 = 285
KRUM5 = A([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0], [1.0, 1.0], [10.0, 10.0]])


def test_krum_scores_and_selection_without_tie():
    np.testing.assert_allclose(krum_scores(KRUM5, 1), [11.0, 14.0, 26.0, 7.0, 285.0])
    r = krum(KRUM5, 1)
    np.testing.assert_array_equal(r.vector, [1.0, 1.0])
    np.testing.assert_array_equal(r.weights, [0.0, 0.0, 0.0, 1.0, 0.0])


def test_multi_krum():
    # default m_select = n - f = 4: d, a, b, c -> mean of (1,1),(0,0),(3,0),(0,4) = (1, 5/4)
    r = multi_krum(KRUM5, 1)
    np.testing.assert_allclose(r.vector, [1.0, 1.25])
    np.testing.assert_allclose(r.weights, [0.25, 0.25, 0.25, 0.25, 0.0])
    # m_select = 3: d, a, b -> mean of (1,1),(0,0),(3,0) = (4/3, 1/3)
    r = multi_krum(KRUM5, 1, m_select=3)
    np.testing.assert_allclose(r.vector, [4 / 3, 1 / 3])
    np.testing.assert_allclose(r.weights, [1 / 3, 1 / 3, 0.0, 1 / 3, 0.0])
    with pytest.raises(ValueError, match="m_select must be in \\[1, 5\\], got 6"):
        multi_krum(KRUM5, 1, m_select=6)


def test_krum_needs_n_above_2f_plus_2():
    # n = 3, f = 1: an honest majority (1 < 1.5) but not Blanchard et al.'s n > 2f + 2
    for rule in (krum, multi_krum):
        with pytest.raises(HonestMajorityRequired, match="needs n > 2f \\+ 2"):
            rule(A([[0.0], [1.0], [2.0]]), 1)


# -------------------------------------------------------------------------------- trimmed mean

def test_trimmed_mean_f1_five_values():
    # column 0: [1, 100, 3, 2, 4] -> drop 1 (u0) and 100 (u1) -> (3+2+4)/3 = 3, kept u2,u3,u4
    # column 1: [-50, 0, 5, 1, 2] -> drop -50 (u0) and 5 (u2) -> (0+1+2)/3 = 1, kept u1,u3,u4
    # kept counts (0, 1, 1, 2, 2) / (d (n - 2f) = 2 * 3 = 6)
    u = A([[1.0, -50.0], [100.0, 0.0], [3.0, 5.0], [2.0, 1.0], [4.0, 2.0]])
    r = trimmed_mean(u, 1)
    np.testing.assert_allclose(r.vector, [3.0, 1.0])
    np.testing.assert_allclose(r.weights, [0.0, 1 / 6, 1 / 6, 1 / 3, 1 / 3])


def test_trimmed_mean_f0_is_mean():
    r = trimmed_mean(A([[1.0], [2.0], [6.0]]), 0)
    np.testing.assert_allclose(r.vector, [3.0])
    np.testing.assert_allclose(r.weights, [1 / 3, 1 / 3, 1 / 3])


# ---------------------------------------------------------------------------------------- median

def test_median_even_count():
    # column 0: [1, 3, 2, 10] sorted 1,2,3,10 -> (2+3)/2 = 2.5 from u2, u1
    # column 1: [7, -1, 0, 4] sorted -1,0,4,7 -> (0+4)/2 = 2 from u2, u3
    # votes: u1 1/2, u2 1/2 + 1/2 = 1, u3 1/2 -> / d = 2 -> (0, 1/4, 1/2, 1/4)
    u = A([[1.0, 7.0], [3.0, -1.0], [2.0, 0.0], [10.0, 4.0]])
    r = coordinate_median(u)
    np.testing.assert_allclose(r.vector, [2.5, 2.0])
    np.testing.assert_allclose(r.weights, [0.0, 0.25, 0.5, 0.25])


def test_median_odd_count():
    # column 0: [5, -1, 2] -> 2 (u2); column 1: [0, 9, 4] -> 4 (u2); column 2: [3, 1, 8] -> 3 (u0)
    # votes: u0 1, u2 2 -> / 3
    u = A([[5.0, 0.0, 3.0], [-1.0, 9.0, 1.0], [2.0, 4.0, 8.0]])
    r = coordinate_median(u, f=1)
    np.testing.assert_allclose(r.vector, [2.0, 4.0, 3.0])
    np.testing.assert_allclose(r.weights, [1 / 3, 0.0, 2 / 3])


# ------------------------------------------------------------------------------ geometric median

def test_geometric_median_equilateral_triangle_is_centroid():
    # vertices of an equilateral triangle centred at (2, -1): the three unit vectors from the
    # centroid to the vertices are 120 degrees apart and sum to 0 -> the centroid is optimal;
    # equal distances -> equal beta -> weights 1/3 each.
    c = A([2.0, -1.0])
    s = math.sqrt(3) / 2
    u = c + A([[1.0, 0.0], [-0.5, s], [-0.5, -s]])
    r = geometric_median(u)
    np.testing.assert_allclose(r.vector, c, atol=1e-9)
    np.testing.assert_allclose(r.weights, [1 / 3, 1 / 3, 1 / 3])


def test_geometric_median_square_plus_far_outlier():
    # square corners (0,0),(1,0),(0,1),(1,1) plus an outlier at (1000,1000). By symmetry z = (t, t);
    # for 1/2 < t < 1 the unit vectors sum to: (0,0): -(1,1)/sqrt2, (1,1): +(1,1)/sqrt2,
    # (1,0)+(0,1): (1-2t)(1,1)/r with r = sqrt((1-t)^2 + t^2), outlier: +(1,1)/sqrt2.
    # Zero sum: (2t-1)/r = 1/sqrt2 -> 6t^2 - 6t + 1 = 0 -> t = 1/2 + sqrt3/6 = 0.78868
    # (the mean is at (200.4, 200.4); the median stays inside the cluster).
    u = A([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1000.0, 1000.0]])
    r = geometric_median(u, f=1)
    t = 0.5 + math.sqrt(3) / 6
    np.testing.assert_allclose(r.vector, [t, t], atol=1e-5)
    assert r.weights[4] < 1e-3
    np.testing.assert_allclose(r.weights.sum(), 1.0)
    np.testing.assert_allclose(r.weights @ u, r.vector)


def test_geometric_median_collinear_is_middle_point():
    # on a line the geometric median is the 1-D median: {0, 1, 10} -> 1
    r = geometric_median(A([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0]]))
    np.testing.assert_allclose(r.vector, [1.0, 0.0], atol=1e-6)
    assert np.argmax(r.weights) == 1


# ---------------------------------------------------------------------------- centered clipping

def test_centered_clipping_hand_case():
    # center 0, tau = 1. u0 = (3, 4): distance 5 -> factor 1/5 -> (0.6, 0.8);
    # u1 = (0.5, 0): distance 0.5 -> factor 1 -> (0.5, 0).  v = ((0.6,0.8) + (0.5,0)) / 2 = (0.55, 0.4)
    # coefficients: c/n = (0.1, 0.5); center keeps 1 - mean(c) = 0.4. Check 0.1(3,4) + 0.5(0.5,0) = (0.55, 0.4)
    r = centered_clipping(A([[3.0, 4.0], [0.5, 0.0]]), A([0.0, 0.0]), tau=1.0)
    np.testing.assert_allclose(r.vector, [0.55, 0.4])
    np.testing.assert_allclose(r.weights, [0.1, 0.5])


def test_centered_clipping_large_tau_is_mean():
    # every factor 1: v = center + mean(u - center) = mean(u) = (2, 1, 0), any center
    u = A([[0.0, 3.0, 1.0], [6.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    for tau in (1e9, math.inf):
        r = centered_clipping(u, A([5.0, -5.0, 7.0]), tau=tau)
        np.testing.assert_allclose(r.vector, [2.0, 1.0, 0.0])
        np.testing.assert_allclose(r.weights, [1 / 3, 1 / 3, 1 / 3])


def test_centered_clipping_tiny_tau_stays_at_center():
    # each clipped difference has norm <= tau, so v moves by at most tau per iteration
    u = A([[3.0, 4.0], [-6.0, 8.0], [100.0, 0.0]])
    center = A([1.0, 1.0])
    r = centered_clipping(u, center, tau=1e-9, iters=3)
    assert np.linalg.norm(r.vector - center) <= 3e-9
    assert r.weights.sum() < 1e-9  # nearly all the share stays on the center


def test_centered_clipping_iterations_converge_towards_mean():
    # tau = 1, center 0, two points (4, 0) and (0, 0): iteration 1: factors 1/4 and 1 (distance 0
    # counts as 1) -> v = ((1,0) + 0)/2 = (0.5, 0). iteration 2: u0 - v = (3.5, 0) -> factor 1/3.5
    # -> (1, 0); u1 - v = (-0.5, 0) -> factor 1 -> (-0.5, 0); v = (0.5, 0) + (0.5, 0)/2 = (0.75, 0)
    r = centered_clipping(A([[4.0, 0.0], [0.0, 0.0]]), A([0.0, 0.0]), tau=1.0, iters=2)
    np.testing.assert_allclose(r.vector, [0.75, 0.0])
    # coefficients: step 1 c = (1/4, 1), mean 5/8 -> a = (1/8, 1/2);
    # step 2 c = (2/7, 1), mean 9/14 -> a = (5/14)(1/8, 1/2) + (1/7, 1/2) = (21/112, 19/28) = (3/16, 19/28);
    # the center keeps (3/8)(5/14) = 15/112 and 21/112 + 76/112 + 15/112 = 1
    np.testing.assert_allclose(r.weights, [3 / 16, 19 / 28])
    assert r.weights @ A([4.0, 0.0]) == pytest.approx(0.75)


def test_centered_clipping_bad_tau_and_center():
    u = A([[1.0, 0.0]])
    for tau in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="tau must be in \\(0, inf\\]"):
            centered_clipping(u, A([0.0, 0.0]), tau=tau)
    with pytest.raises(ValueError, match="center must have shape \\(2,\\)"):
        centered_clipping(u, A([0.0]), tau=1.0)


# ------------------------------------------------------------------------------------------ SMEA

def test_smea_one_dimension_by_hand():
    # {0, 1, 3}, f = 1: subsets (0,1), (0,2), (1,2) in itertools.combinations order; lambda_max of
    # the 1/|S| covariance = the variance: 0.25, 2.25, 1.0 -> (0, 1), mean 0.5
    subsets, lam = smea_max_eigenvalues(A([[0.0], [1.0], [3.0]]), 1)
    np.testing.assert_array_equal(subsets, [[0, 1], [0, 2], [1, 2]])
    np.testing.assert_allclose(lam, [0.25, 2.25, 1.0], rtol=1e-14)
    r = smea(A([[0.0], [1.0], [3.0]]), 1)
    np.testing.assert_allclose(r.vector, [0.5])
    np.testing.assert_allclose(r.weights, [0.5, 0.5, 0.0])


def test_smea_excludes_far_outliers():
    # honest (0,0), (1,0), (0,1) at rows 0, 2, 4; two far rows 1, 3. The honest triangle's
    # covariance: deviations (-1,-1)/3, (2,-1)/3, (-1,2)/3 -> [[2/9, -1/9], [-1/9, 2/9]], eigenvalues
    # 1/3 and 1/9; it is subset 4 of combinations(range(5), 3): (0,1,2) (0,1,3) (0,1,4) (0,2,3) (0,2,4)
    u = A([[0.0, 0.0], [100.0, 0.0], [1.0, 0.0], [0.0, -100.0], [0.0, 1.0]])
    subsets, lam = smea_max_eigenvalues(u, 2)
    np.testing.assert_array_equal(subsets[4], [0, 2, 4])
    assert lam[4] == pytest.approx(1 / 3, rel=1e-12) and np.argmin(lam) == 4
    r = smea(u, 2)
    np.testing.assert_allclose(r.vector, [1 / 3, 1 / 3])
    np.testing.assert_allclose(r.weights, [1 / 3, 0.0, 1 / 3, 0.0, 1 / 3])
    np.testing.assert_allclose(r.weights @ u, r.vector)


def test_smea_ties_go_to_the_first_subset_in_combinations_order():
    # {0, 1, 2}, f = 1: (0,1) and (1,2) both have variance 1/4, (0,2) has 1 -> (0,1), mean 0.5
    np.testing.assert_allclose(smea(A([[0.0], [1.0], [2.0]]), 1).vector, [0.5])
    # regular polygons on the unit circle (rotated by 0.1 rad): exact ties that rounding breaks
    # either way (the computed values differ in the last bits); the tie tolerance gives the first
    # in combinations order. Triangle, f = 1: every pair has lambda_max 3/4 -> rows 0 and 1
    tri = A([[math.cos(0.1 + 2 * math.pi * k / 3), math.sin(0.1 + 2 * math.pi * k / 3)] for k in range(3)])
    r = smea(tri, 1)
    np.testing.assert_allclose(r.vector, tri[[0, 1]].mean(axis=0), rtol=0, atol=1e-15)
    np.testing.assert_allclose(r.weights, [0.5, 0.5, 0.0])
    # pentagon, f = 2: the five triples of adjacent vertices tie; the first is (0, 1, 2)
    pent = A([[math.cos(0.1 + 2 * math.pi * k / 5), math.sin(0.1 + 2 * math.pi * k / 5)] for k in range(5)])
    np.testing.assert_allclose(smea(pent, 2).weights, [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0])


def test_smea_f0_is_the_mean():
    u = np.random.default_rng(5).normal(size=(6, 4))
    r = smea(u, 0)
    np.testing.assert_allclose(r.vector, u.mean(axis=0), rtol=0, atol=1e-15)
    np.testing.assert_allclose(r.weights, np.full(6, 1 / 6))


@pytest.mark.parametrize("n, d", [(5, 1), (5, 2), (7, 3), (9, 2), (9, 7), (6, 20)])
@pytest.mark.parametrize("offset", [0.0, 1e6])
def test_smea_eigenvalues_equal_the_d_by_d_covariance_brute_force(n, d, offset):
    """lambda_max of (1/|S|) sum (u_i - mu_S)(u_i - mu_S)^T formed as a d x d matrix, for every
    subset and f < n/2; the rows shifted by a large common offset give the same values (the
    covariance does not move with a translation)."""
    rng = np.random.default_rng(n * 100 + d)
    u = rng.normal(size=(n, d)) * rng.uniform(0.1, 3.0, size=(n, 1))
    for f in range(1, (n + 1) // 2):
        brute = []
        for sub in itertools.combinations(range(n), n - f):
            x = u[list(sub)] - u[list(sub)].mean(axis=0)
            brute.append(np.linalg.eigvalsh(x.T @ x / (n - f))[-1])
        subsets, lam = smea_max_eigenvalues(u + offset, f)
        np.testing.assert_array_equal(subsets, list(itertools.combinations(range(n), n - f)))
        np.testing.assert_allclose(lam, brute, rtol=1e-8 if offset else 1e-11, atol=0)
        best = list(subsets[int(np.argmin(brute))])
        np.testing.assert_allclose(smea(u, f).vector, u[best].mean(axis=0), rtol=0, atol=1e-15)


def test_smea_refuses_too_many_subsets_and_a_byzantine_half():
    with pytest.raises(ValueError, match=r"^smea compares every subset of n - f = 11 of the n = 20 updates: "
                                         r"C\(20, 9\) = 167,960 subsets, more than its limit of 100,000"):
        smea(np.zeros((20, 1)), 9)
    with pytest.raises(HonestMajorityRequired, match="^smea needs an honest majority: f = 2 Byzantine of n = 4"):
        smea(np.zeros((4, 1)), 2)


# ----------------------------------------------------------------------------- honest majority

def test_honest_majority_messages():
    u10 = np.zeros((10, 2))
    with pytest.raises(HonestMajorityRequired) as e:
        krum(u10, 6)
    assert str(e.value) == "krum needs an honest majority: f = 6 Byzantine of n = 10 clients (f < n/2 required)"
    assert isinstance(e.value, ValueError)
    # f = n/2 exactly is refused too
    cases = [
        ("multi_krum", lambda: multi_krum(u10, 5)),
        ("trimmed_mean", lambda: trimmed_mean(u10, 5)),
        ("coordinate_median", lambda: coordinate_median(u10, f=5)),
        ("geometric_median", lambda: geometric_median(u10, f=5)),
        ("centered_clipping", lambda: centered_clipping(u10, np.zeros(2), 1.0, f=5)),
        ("smea", lambda: smea(u10, 5)),
    ]
    for name, call in cases:
        with pytest.raises(HonestMajorityRequired, match=f"^{name} needs an honest majority: f = 5 Byzantine "
                                                         f"of n = 10 clients"):
            call()
    # f = 4 < 5 is accepted by all of them
    trimmed_mean(u10, 4)
    coordinate_median(u10, f=4)


def _call(name: str, u: np.ndarray, f: int):
    """Rule ``name`` on ``u`` with the inputs it declares (a neutral trust update and centre)."""
    extra = {"f": f, "trust_update": u.mean(axis=0) + 1.0, "center": np.zeros(u.shape[1]), "tau": 1.0}
    return RULES[name].fn(u, **{k: extra[k] for k in RULES[name].inputs})


@pytest.mark.parametrize("name", sorted(RULES))
def test_every_rule_keeps_its_declared_needs(name: str):
    """What a rule declares (honest majority, the Krum bound, needing f) is what it does: every
    registered rule, so a new rule is covered without listing it here."""
    rule, rng = RULES[name], np.random.default_rng(0)
    assert not rule.needs_f or "f" in rule.inputs, name
    assert not rule.krum_bound or rule.honest_majority, name
    expected = 2 * 4 + 3 if rule.krum_bound else 2 * 4 + 1 if rule.honest_majority else 1
    assert min_clients(name, 4) == expected, name
    out = _call(name, rng.normal(size=(max(expected, 2), 3)), 4)  # the fewest clients it accepts f = 4 of
    assert out.vector.shape == (3,) and np.all(np.isfinite(out.vector)), name
    if expected > 1 and "f" in rule.inputs:
        with pytest.raises(ValueError):  # one client fewer: refused (HonestMajorityRequired or the Krum bound)
            _call(name, rng.normal(size=(expected - 1, 3)), 4)


def test_registry_and_min_clients():
    assert {"mean", "fltrust", "krum", "multi-krum", "trimmed-mean", "median", "geometric-median",
            "centered-clipping", "smea"} <= set(RULES)
    assert min_clients("mean", 4) == 1 and min_clients("fltrust", 4) == 1
    for name in ("trimmed-mean", "median", "geometric-median", "centered-clipping", "smea"):
        assert min_clients(name, 4) == 9, name  # f < n/2
    assert min_clients("krum", 4) == min_clients("multi-krum", 4) == 11  # n > 2f + 2
    with pytest.raises(ValueError, match="unknown aggregation rule 'foo'"):
        min_clients("foo", 0)


# ---------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("bad, msg", [
    (np.zeros(3), "updates must be a 2-D array"),
    (np.zeros((0, 3)), "m >= 1 rows"),
    (A([[1.0, math.nan]]), "updates must be finite"),
    (A([[1.0, math.inf]]), "updates must be finite"),
])
def test_updates_validation(bad, msg):
    with pytest.raises(ValueError, match=msg):
        mean(bad)


def test_f_validation():
    with pytest.raises(ValueError, match="f must be >= 0, got -1"):
        trimmed_mean(np.zeros((3, 1)), -1)
    with pytest.raises(ValueError, match="f must be an integer"):
        trimmed_mean(np.zeros((3, 1)), 0.5)
