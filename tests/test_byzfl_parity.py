"""Pre-aggregators and adaptive attacks against ByzFL 0.0.11's own implementations (the dev extra
installs it; `make setup` with --no-deps). Same inputs -> same outputs to 1e-12 where the
conventions agree; where they differ the test says how and checks the formula instead.

Conventions: Bucketing's permutation (ByzFL: numpy's global legacy RNG; here an explicit
Generator) is passed explicitly, the one ByzFL draws after np.random.seed; ByzFL's line-search
attacks append the f Byzantine copies after the honest rows, as attack_effect does. ByzFL's SMEA
ranks the subsets by one power-method step from a fresh np.random.randn vector each, an estimate
of lambda_max (times |S|), where silofl computes it exactly: the two are compared with ByzFL given
each subset's exact top eigenvector (then its step returns |S| lambda_max exactly), and with its
own random vectors where far outliers leave no doubt.
"""

from __future__ import annotations

import itertools
import math
import sys
import types

import numpy as np
import pytest

from app.adaptive_attacks import adaptive_alie, adaptive_ipm, mimic
from strategies.aggregation import coordinate_median, krum, smea, trimmed_mean
from strategies.preaggregation import apply_chain, arc, bucketing, nnm


@pytest.fixture(scope="module")
def byzfl():
    """ByzFL's package; its benchmark module imports seaborn (not a dependency of its rules or
    attacks): a stand-in module is put in place, in this process only, when seaborn is absent."""
    try:
        import seaborn  # noqa: F401
    except ImportError:
        sys.modules.setdefault("seaborn", types.ModuleType("seaborn"))
    return pytest.importorskip("byzfl", reason="byzfl==0.0.11 is not installed (dev extra; `make setup` installs it)")


@pytest.fixture
def rows() -> np.ndarray:
    rng = np.random.default_rng(28)
    return rng.normal(size=(10, 13)) * rng.uniform(0.1, 5.0, size=(10, 1))


@pytest.mark.parametrize("f", range(10))
def test_nnm_matches_byzfl(byzfl, rows, f):
    np.testing.assert_allclose(nnm(rows, f).rows, byzfl.NNM(f)(rows.copy()), rtol=0, atol=1e-12)


@pytest.mark.parametrize("f", range(11))
def test_arc_matches_byzfl(byzfl, rows, f):
    np.testing.assert_allclose(arc(rows, f).rows, byzfl.ARC(f)(rows.copy()), rtol=0, atol=1e-12)


@pytest.mark.parametrize("s", [1, 2, 3, 4, 7, 10])
def test_bucketing_matches_byzfl_given_its_permutation(byzfl, rows, s):
    np.random.seed(s)
    theirs = byzfl.Bucketing(s)(rows.copy())
    np.random.seed(s)
    perm = np.random.permutation(len(rows))
    np.testing.assert_allclose(bucketing(rows, s, perm=perm).rows, theirs, rtol=0, atol=1e-12)


def test_mimic_matches_byzfl(byzfl, rows):
    np.testing.assert_array_equal(mimic(rows), byzfl.Mimic(0)(rows))


def _theirs(byzfl, name: str, pre: list[str], f: int):
    """ByzFL's aggregator and pre-aggregator objects for our rule ``name`` after ``pre``."""
    agg = {"krum": lambda: byzfl.Krum(f), "median": lambda: byzfl.Median(),
           "trimmed-mean": lambda: byzfl.TrMean(f)}[name]()
    pres = [{"nnm": lambda: byzfl.NNM(f), "arc": lambda: byzfl.ARC(f)}[p]() for p in pre]
    return agg, pres


def _ours(name: str, pre: list[str], f: int):
    rule = {"krum": lambda u: krum(u, f).vector, "median": lambda u: coordinate_median(u).vector,
            "trimmed-mean": lambda u: trimmed_mean(u, f).vector}[name]
    return lambda u: rule(apply_chain(u, pre, f, 2, None).rows)


CASES = [("alie", "krum", []), ("alie", "krum", ["nnm"]), ("alie", "median", ["nnm"]),
         ("alie", "trimmed-mean", ["arc"]), ("alie", "trimmed-mean", ["arc", "nnm"]),
         ("ipm", "krum", []), ("ipm", "krum", ["nnm"]), ("ipm", "median", ["nnm"]), ("ipm", "trimmed-mean", ["arc"])]


@pytest.mark.parametrize("kind,name,pre", CASES)
def test_optimal_attacks_match_byzfl(byzfl, rows, kind, name, pre):
    """ByzFL's Optimal_ALittleIsEnough / Optimal_InnerProductManipulation (same line search, same
    defaults: start 0, delta 10, ratio 0.8, 20 evaluations) against the same rule and chain.
    Not IPM against ARC then NNM: at tau = 0 the Byzantine rows are 0 and ARC leaves the clipped
    rows at one norm, so NNM's neighbours of 0 tie exactly; ByzFL breaks ties by np.argpartition's
    selection order, silofl by index (test_nnm_ties_break_by_index checks ours)."""
    f = 3
    honest = rows[: 10 - f]
    agg, pres = _theirs(byzfl, name, pre, f)
    cls = byzfl.Optimal_ALittleIsEnough if kind == "alie" else byzfl.Optimal_InnerProductManipulation
    theirs = cls(agg=agg, pre_agg_list=pres, f=f)(honest.copy())
    ours, _ = (adaptive_alie if kind == "alie" else adaptive_ipm)(honest, f, _ours(name, pre, f))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)


def _smea_rows(n: int, d: int, f: int, far: bool, seed: int) -> np.ndarray:
    """n rows in R^d of different scales; with ``far`` the last f are moved 10^4 away, each in its
    own random direction."""
    rng = np.random.default_rng([seed, n, d, f])
    u = rng.normal(size=(n, d)) * rng.uniform(0.1, 3.0, size=(n, 1))
    if far:
        away = rng.normal(size=(f, d))
        u[n - f:] += 1e4 * away / np.linalg.norm(away, axis=1, keepdims=True)
    return u


@pytest.mark.parametrize("n,f,d,far", [(10, 4, 4000, False), (10, 4, 3, False), (10, 3, 1, False),
                                       (7, 3, 2, False), (5, 2, 13, False), (9, 1, 5, False), (6, 2, 40, False),
                                       (10, 4, 200, True), (8, 3, 2, True), (11, 5, 30, True), (3, 1, 4, False)])
def test_smea_matches_byzfl_given_each_subsets_top_eigenvector(byzfl, monkeypatch, n, f, d, far):
    """ByzFL's np.random.randn, called once per subset in itertools.combinations order, returns
    that subset's top eigenvector (here: the first right singular vector of its centred rows, no
    code of silofl's): its one power step then gives |S| lambda_max, and its strict "<" scan picks
    the subset the exact values rank first. Same subset, same mean: equal to 1e-12."""
    u = _smea_rows(n, d, f, far, 28)
    tops = []
    for sub in itertools.combinations(range(n), n - f):
        x = u[list(sub)] - u[list(sub)].mean(axis=0)
        tops.append(np.linalg.svd(x, full_matrices=False)[2][0])
    given = iter(tops)
    monkeypatch.setattr(np.random, "randn", lambda dim: next(given).copy())
    theirs = byzfl.SMEA(f)(u.copy())
    assert next(given, None) is None and len(tops) == math.comb(n, f)  # one vector per subset, all used
    np.testing.assert_allclose(smea(u, f).vector, theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("f", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_smea_matches_byzfl_own_estimate_with_far_outliers(byzfl, f, seed):
    """ByzFL as it runs (random start vectors, np.random.seed): f rows 10^4 away, so every subset
    holding one scores far above the honest subset whatever the start vector; both return the
    honest rows' mean."""
    u = _smea_rows(10, 50, f, True, seed)
    np.random.seed(seed)
    theirs = byzfl.SMEA(f)(u.copy())
    ours = smea(u, f)
    np.testing.assert_allclose(ours.vector, theirs, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours.vector, u[: 10 - f].mean(axis=0), rtol=0, atol=1e-12)


def test_smea_f0_and_refusals_match_byzfl(byzfl, rows):
    """f = 0: the mean of all rows; f >= n/2: both refuse."""
    np.testing.assert_allclose(smea(rows, 0).vector, byzfl.SMEA(0)(rows.copy()), rtol=0, atol=1e-12)
    with pytest.raises(ValueError):
        byzfl.SMEA(5)(rows.copy())
    with pytest.raises(ValueError, match="smea needs an honest majority"):
        smea(rows, 5)
