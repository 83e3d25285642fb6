"""The empirical privacy audit (app/privacy/audit.py): its statistics, that it catches a broken
mechanism, and that the real Gaussian and shuffle-DP releases pass it with power."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import beta, binomtest

from app.privacy.accounting import PlannedRelease, calibrate_noise_multiplier
from app.privacy.audit import (audit_gaussian, audit_shuffle, choose_threshold, clopper_pearson, epsilon_lower,
                               threshold_audit)
from app.privacy.mechanism import GaussianMechanism
from app.privacy.shuffle import encode_counts

DELTA = 1e-5
K, D = 50, 4


def z_for(eps: float) -> float:
    return calibrate_noise_multiplier([PlannedRelease("grad", K, K, 1)], eps, DELTA)


@pytest.mark.parametrize("k,n", [(0, 1), (0, 10), (1, 10), (5, 10), (10, 10), (3, 2000), (1990, 2000), (417, 1000)])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.01])
def test_clopper_pearson_matches_scipy_exact_interval(k: int, n: int, alpha: float) -> None:
    lo, hi = clopper_pearson(k, n, alpha)
    ci = binomtest(k, n).proportion_ci(confidence_level=1 - alpha, method="exact")
    assert lo == pytest.approx(ci.low, abs=1e-12) and hi == pytest.approx(ci.high, abs=1e-12)
    # and the defining property: the binomial tail at each end is alpha / 2
    from scipy.stats import binom
    if k > 0:
        assert binom.sf(k - 1, n, lo) == pytest.approx(alpha / 2, rel=1e-6)
    if k < n:
        assert binom.cdf(k, n, hi) == pytest.approx(alpha / 2, rel=1e-6)


def test_clopper_pearson_rejects_bad_input() -> None:
    for k, n in ((-1, 5), (6, 5), (0, 0)):
        with pytest.raises(ValueError):
            clopper_pearson(k, n)


@pytest.mark.parametrize("trials", [10, 200, 2000])
def test_epsilon_lower_is_zero_without_a_gap(trials: int) -> None:
    for k in sorted({0, 1, trials // 3, trials // 2, trials - 1, trials}):
        assert epsilon_lower(k, k, trials, DELTA) == 0.0
    assert epsilon_lower(trials // 3, trials // 2, trials, DELTA) == 0.0  # worse than chance: no evidence


def test_epsilon_lower_formula_and_the_perfect_test() -> None:
    tp, fp, n = 1500, 300, 2000
    tpr_lo, fpr_hi = beta.ppf(0.025, tp, n - tp + 1), beta.ppf(0.975, fp + 1, n - fp)
    want = max(math.log((tpr_lo - DELTA) / fpr_hi), math.log((1 - fpr_hi - DELTA) / (1 - tpr_lo)))
    assert epsilon_lower(tp, fp, n, DELTA) == pytest.approx(want, rel=1e-12)
    # no errors at all in T trials: the bound is only about ln(T / ln(2 / alpha))
    assert epsilon_lower(n, 0, n, 0.0) == pytest.approx(math.log(n / math.log(40)), abs=0.01)
    # more evidence, a larger bound; symmetric in the two branches
    assert epsilon_lower(1600, 300, n, DELTA) > epsilon_lower(tp, fp, n, DELTA)
    assert epsilon_lower(n - fp, n - tp, n, DELTA) == pytest.approx(epsilon_lower(tp, fp, n, DELTA))


def test_epsilon_lower_is_the_older_helper_at_twice_alpha() -> None:
    """scripts/audit/privacy_attacks.py bounds each rate one-sided at 1 - alpha."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "audit" / "privacy_attacks.py"
    try:
        spec = importlib.util.spec_from_file_location("_privacy_attacks", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except Exception as exc:  # the script imports the whole silo stack
        pytest.skip(f"privacy_attacks.py not importable here: {exc}")
    for tp, fp, n in ((1500, 300, 2000), (200, 3, 200), (50, 49, 100), (97, 12, 4000)):
        assert epsilon_lower(tp, fp, n, DELTA, alpha=0.1) == pytest.approx(mod.epsilon_lower(tp, fp, n, DELTA, 0.05))


def test_threshold_comes_from_the_calibration_split_only() -> None:
    rng = np.random.default_rng(0)
    out_d, out_p = rng.normal(1.0, 1.0, 1200), rng.normal(0.0, 1.0, 1200)
    trials, tp, fp, t, lower = threshold_audit(out_d, out_p, 200, DELTA, 0.05)
    assert trials == 1000 and t == choose_threshold(out_d[:200], out_p[:200], DELTA, 0.05)
    assert tp == int((out_d[200:] > t).sum()) and fp == int((out_p[200:] > t).sum())
    assert lower == epsilon_lower(tp, fp, 1000, DELTA)
    tampered_d, tampered_p = out_d.copy(), out_p.copy()
    tampered_d[200:], tampered_p[200:] = -5.0, 5.0  # held-out outputs do not move the threshold
    assert threshold_audit(tampered_d, tampered_p, 200, DELTA, 0.05)[3] == t


def test_audit_catches_a_gaussian_release_with_too_little_noise() -> None:
    z = z_for(2.0)
    sigma = z * 2.0 / K
    weak = audit_gaussian(z, K, D, 1.0, DELTA, 2000, seed=0, release=GaussianMechanism(sigma / 10).release)
    assert weak.eps_claimed == pytest.approx(2.0, abs=0.01)
    assert weak.eps_lower > weak.eps_claimed + 1 and not weak.sound
    silent = audit_gaussian(z, K, D, 1.0, DELTA, 2000, seed=0, release=GaussianMechanism(0.0).release)
    assert silent.tp == 2000 and silent.fp == 0 and silent.eps_lower > 6


def test_audit_catches_a_shuffle_encoder_with_too_few_trials() -> None:
    def stingy(rows, code, b, rng):  # each silo adds 1/50 of the trials the claim counts on
        return encode_counts(rows, code, max(1, b // 50), rng)

    r = audit_shuffle(2.0, K=K, d=D, count_on=4, delta=DELTA, trials=2000, seed=0, encode=stingy)
    assert r.eps_claimed == pytest.approx(2.0, abs=0.05)
    assert r.eps_lower > r.eps_claimed and not r.sound


@pytest.mark.parametrize("seed", [0, 1])
def test_gaussian_mechanism_passes_the_audit_with_power(seed: int) -> None:
    r = audit_gaussian(z_for(2.0), K, D, 1.0, DELTA, 4000, seed=seed)
    assert r.mechanism == "gaussian" and r.trials == 4000 and r.params["calibration"] == 800
    assert r.eps_claimed == pytest.approx(2.0, abs=0.01)
    assert 0.3 < r.eps_lower <= r.eps_claimed


@pytest.mark.parametrize("d,seed", [(4, 0), (1, 1)])
def test_shuffle_mechanism_passes_the_audit_with_power(d: int, seed: int) -> None:
    r = audit_shuffle(2.0, K=K, d=d, count_on=4, delta=DELTA, trials=4000, seed=seed)
    p = r.params
    assert p["m_total"] == 4 * K * p["b"] >= p["m"] and p["g"] == 16
    assert r.eps_claimed == pytest.approx(2.0, abs=0.05)
    assert 0.3 < r.eps_lower <= r.eps_claimed


def test_mechanism_audit_script_prints_the_table(tmp_path, capsys) -> None:
    path = Path(__file__).resolve().parents[1] / "scripts" / "audit" / "mechanism_audit.py"
    spec = importlib.util.spec_from_file_location("_mechanism_audit", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "rows.json"
    rows = mod.main(["--trials", "300", "--epsilon", "4", "--json", str(out)])
    text = capsys.readouterr().out
    assert "| mechanism | params | trials | TP | FP | eps_lower | eps_claimed |" in text
    assert [r.mechanism for r in rows] == ["gaussian", "shuffle"] and all(r.sound for r in rows)
    import json
    saved = json.loads(out.read_text())
    assert [s["mechanism"] for s in saved] == ["gaussian", "shuffle"] and saved[0]["trials"] == 300


def test_replay_attack_script_before_and_after(capsys) -> None:
    """scripts/audit/replay_attack.py: the shuffler of 8646705 sums run 1's context again in run 2
    (T1 - T2 is silo 0's counts, K b trials), today's refuses it in run 2 and after a restart; the
    isolated release (1/12 x 1.1 of the trials) has a larger exact epsilon than the exchange."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "audit" / "replay_attack.py"
    spec = importlib.util.spec_from_file_location("_replay_attack", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (row,) = mod.main(["--trials", "300", "--full-trials", "0", "--epsilon", "3"])["rows"]
    text = capsys.readouterr().out
    if "git show unavailable" not in text:  # a clone without that history skips the before case
        assert "T1 - T2 == silo 0's counts: True; trials 4800 - 4400 = 400" in text
    assert "serves run 2: a context of another run is never aggregated" in text
    assert 'same replay: refused: "exchange already aggregated"' in text
    assert (row["b"], row["trials_exchange"], row["trials_isolated"]) == (8, 12 * 50 * 8, 50 * 8)
    assert row["eps_claimed"] <= 3.0 < row["eps_isolated_exact"]
