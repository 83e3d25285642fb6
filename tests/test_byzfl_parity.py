"""Pre-aggregators and adaptive attacks against ByzFL 0.0.11's own implementations (the dev extra
installs it; `make setup` with --no-deps). Same inputs -> same outputs to 1e-12 where the
conventions agree; where they differ the test says how and checks the formula instead.

Conventions: Bucketing's permutation (ByzFL: numpy's global legacy RNG; here an explicit
Generator) is passed explicitly, the one ByzFL draws after np.random.seed; ByzFL's line-search
attacks append the f Byzantine copies after the honest rows, as attack_effect does.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from app.adaptive_attacks import adaptive_alie, adaptive_ipm, mimic
from strategies.aggregation import coordinate_median, krum, trimmed_mean
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
