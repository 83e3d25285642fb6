"""The binomial vector-summation randomizer and analyzer (app/privacy/shuffle.py), checked
against hand-computed totals, unbiasedness and the closed-form variance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.privacy import shuffle
from app.privacy.shuffle import ShuffleCode, auto_levels, debias, encode_counts, estimate_variance, rounded_levels


def test_rows_on_the_level_grid_round_exactly() -> None:
    """x = -R + j * 2R/g is level j exactly: floor(j + U) = j for U in [0, 1)."""
    code = ShuffleCode(bound=1.0, levels=4, p=0.25)
    rows = np.array([[-1.0, -0.5, 0.0, 0.5, 1.0], [1.0, 1.0, -1.0, 0.0, 0.5]])
    counts = rounded_levels(rows, code, np.random.default_rng(0))
    assert counts.tolist() == [0 + 4, 1 + 4, 2 + 0, 3 + 2, 4 + 3]
    # no noise trials: the analyzer gives back the exact sum of the rows
    np.testing.assert_allclose(debias(counts, records=2, trials=0, code=code), rows.sum(axis=0), atol=1e-12)


def test_counts_lie_in_the_protocol_range() -> None:
    rng = np.random.default_rng(1)
    code = ShuffleCode(bound=2.0, levels=7, p=0.25)
    rows = rng.uniform(-2, 2, size=(13, 50))
    counts = encode_counts(rows, code, trials_per_record=5, rng=rng)
    assert counts.dtype == np.int64 and counts.shape == (50,)
    assert counts.min() >= 0 and counts.max() <= 13 * (7 + 5)


def test_analyzer_is_unbiased_and_its_variance_is_the_closed_form() -> None:
    """Over T independent encodings the mean of o = debias(T_j) is within 5 standard errors of
    sum_i x_ij, and the sample variance within 15% of (2R/g)^2 (sum f(1-f) + m p (1-p))."""
    rng = np.random.default_rng(7)
    code = ShuffleCode(bound=1.0, levels=10, p=0.25)
    rows = rng.uniform(-1, 1, size=(20, 8)) / math.sqrt(8)
    b, trials_t = 30, 3000
    m = rows.shape[0] * b
    outs = np.stack([debias(encode_counts(rows, code, b, rng), rows.shape[0], m, code) for _ in range(trials_t)])
    var = estimate_variance(rows, code, m)
    err = np.abs(outs.mean(axis=0) - rows.sum(axis=0))
    assert np.all(err <= 5 * np.sqrt(var / trials_t)), (err, np.sqrt(var / trials_t))
    # sample variance of T draws: relative sd ~ sqrt(2 / T) = 2.6%; 15% is > 5 sd
    np.testing.assert_allclose(outs.var(axis=0, ddof=1), var, rtol=0.15)


def test_rounding_variance_alone_matches_the_bernoulli_variance() -> None:
    """With no noise trials the only randomness is randomized rounding: Var = (2R/g)^2 f(1-f)."""
    rng = np.random.default_rng(3)
    code = ShuffleCode(bound=1.0, levels=4, p=0.5)
    rows = np.array([[-0.8, 0.3, 0.55]])  # a = 0.4, 2.6, 3.1: f = 0.4, 0.6, 0.1
    outs = np.stack([debias(encode_counts(rows, code, 0, rng), 1, 0, code) for _ in range(4000)])
    expected = 0.25 * np.array([0.4 * 0.6, 0.6 * 0.4, 0.1 * 0.9])
    np.testing.assert_allclose(outs.var(axis=0, ddof=1), expected, rtol=0.1)
    np.testing.assert_allclose(estimate_variance(rows, code, 0), expected, rtol=1e-9)


def test_chunked_rounding_equals_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounding in row chunks (bounded memory for large models) draws the same stream."""
    rows = np.random.default_rng(5).uniform(-1, 1, size=(9, 31))
    code = ShuffleCode(bound=1.0, levels=16, p=0.25)
    whole = rounded_levels(rows, code, np.random.default_rng(11))
    monkeypatch.setattr(shuffle, "CHUNK_ELEMENTS", 40)  # one row per chunk
    np.testing.assert_array_equal(rounded_levels(rows, code, np.random.default_rng(11)), whole)


def test_bad_parameters_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="levels"):
        ShuffleCode(1.0, 0, 0.25)
    with pytest.raises(ValueError, match="probability"):
        ShuffleCode(1.0, 4, 1.0)
    with pytest.raises(ValueError, match="bound"):
        ShuffleCode(math.inf, 4, 0.25)
    with pytest.raises(ValueError, match="records"):
        debias(np.zeros(3, dtype=np.int64), 0, 0, ShuffleCode(1.0, 4, 0.25))


def test_auto_levels() -> None:
    assert auto_levels(1) == 16 and auto_levels(10_000) == 400 and auto_levels(11_000_000) == shuffle.AUTO_LEVELS_MAX


def test_trial_scale_calibration_spends_the_budget_and_no_less() -> None:
    """A plan of two kinds with a budget split (anchor trials = 4 x the differences'): the
    calibrated scale m meets epsilon, and 1% fewer trials would not."""
    from app.privacy.accounting import PlannedRelease, binomial_releases, calibrate_trial_scale, epsilon_spent

    plan = [PlannedRelease("anchor", 170, 170, 3, 2.0), PlannedRelease("diff", 170, 64, 9)]
    kw = {"p": 0.25, "levels": 16, "dim": 20}
    m = calibrate_trial_scale(plan, 2.0, 1e-5, **kw)
    releases = binomial_releases(plan, m, **kw)
    assert [r.trials for r in releases] == [4 * m, m]
    assert epsilon_spent(releases, 1e-5) <= 2.0
    assert epsilon_spent(binomial_releases(plan, int(m * 0.99), **kw), 1e-5) > 2.0


def test_a_ledger_mixing_gaussian_and_binomial_releases_costs_more_than_either() -> None:
    """Composition in RDP: adding a Gaussian release to binomial ones (a node-scope ledger that
    served both modes) never lowers epsilon, and the binomial part alone matches the module."""
    from app.privacy import binomial
    from app.privacy.accounting import Release, epsilon_spent

    b = Release("grad", 100, 100, 0.0, 5, False, "binomial", 200_000, 16, 0.25, 20)
    g = Release("grad", 100, 100, 3.0, 5)
    alone = epsilon_spent([b], 1e-5)
    assert math.isclose(alone, binomial.binomial_epsilon(200_000, 0.25, 16, 20, 5, 1e-5), rel_tol=1e-12)
    assert epsilon_spent([b, g], 1e-5) > max(alone, epsilon_spent([g], 1e-5))
