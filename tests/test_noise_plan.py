"""The pre-flight's noise plan (app/noise_plan.py, issue 35): each silo's planned sigma against
its signal, computed as the silo calibrates, checked against a hand computation (one Gaussian
release: the exact analytic Gaussian mechanism of Balle & Wang), the cannot-learn criterion at
its boundary, and the launcher printing it before anything starts."""

from __future__ import annotations

import math

import pytest
from scipy.optimize import brentq

from app import launch
from app.config import parse_settings
from app.launch import merged_run_config
from app.noise_plan import cannot_learn, preflight_lines, silo_noise
from tests.helpers import analytic_gaussian_delta


def settings(**over):
    """What the noise plan reads of the run config ``over`` (app.launch.noise_run)."""
    return launch.noise_run(parse_settings(merged_run_config([]) | over))


ONE_RELEASE = {"algorithm": "mbsgd", "num-rounds": 1, "eval-every": 0, "batch-size": 0, "privacy.mode": "isrl",
               "privacy.epsilon": 1.0, "privacy.delta": 1e-5, "privacy.clip": 1.0}


def test_sigma_and_the_ratios_match_a_hand_computation() -> None:
    """n = 30, one full-batch release (K = 30): sensitivity 2 clip / K = 1/15; the exact Gaussian
    mechanism's sigma at (1, 1e-5) solves delta(sigma) = 1e-5 (Balle & Wang, Theorem 8)."""
    s = settings(**ONE_RELEASE)
    (p,) = silo_noise(s, 30, 100)
    sens = 2.0 / 30
    sigma = brentq(lambda x: analytic_gaussian_delta(x, sens, 1.0) - 1e-5, 0.01 * sens, 100 * sens)
    assert p.phase == "grad" and p.batch == 30 and p.count == 1
    assert p.sigma == pytest.approx(sigma, rel=2e-2)  # the accountant's sigma: a tight bound on the exact one
    assert p.contribution == pytest.approx(1 / 30)
    assert p.ratio == pytest.approx(sigma * 30, rel=2e-2)
    assert p.noise_to_signal == pytest.approx(sigma * 10, rel=2e-2)  # sqrt(d) = 10, clip = 1


def test_the_cannot_learn_criterion_at_its_boundary() -> None:
    """The rule weighs noise (per-message rules): rho = sigma sqrt(d) / clip > 1 for the least
    noisy silo. Cannot learn: sqrt(sum sigma_i^2) / M * sqrt(d R) / (R clip) > 1, M = 3 for the
    mean of 3 silos, M = 1 for any other rule (one release: R = 1)."""
    s = settings(**ONE_RELEASE)
    sigma = silo_noise(s, 30, 1)[0].sigma
    d_one = (1 / sigma) ** 2  # rho = 1 at this d
    below, above = math.floor(d_one * 0.98), math.ceil(d_one * 1.02)
    robust = settings(**ONE_RELEASE | {"algorithm": "robust", "num-silos": 3, "silos-per-round": 3})
    assert cannot_learn(robust, [silo_noise(robust, 30, below)] * 3) == ([], [])
    learn, (weighs,) = cannot_learn(robust, [silo_noise(robust, 30, above)] * 3)
    assert "aggregator=gradbant weighs noise" in weighs and "paper's score gives 0" in weighs
    assert len(learn) == 1 and "aggregator=gradbant (no averaging assumed) adds up noise" in learn[0]  # R = 1
    # the mean of M = 3 silos: the threshold is at d = 3 / sigma^2 (one release); no per-message verdict
    mean = settings(**ONE_RELEASE | {"num-silos": 3, "silos-per-round": 3})
    assert cannot_learn(mean, [silo_noise(mean, 30, above)] * 3) == ([], [])  # the mean averages the noise down
    assert cannot_learn(mean, [silo_noise(mean, 30, math.floor(3 * d_one * 0.98))] * 3) == ([], [])
    (why,), _ = cannot_learn(mean, [silo_noise(mean, 30, math.ceil(3 * d_one * 1.02))] * 3)
    assert "the mean of 3 silos adds up noise" in why
    # R releases: the accumulated signal grows as R, the noise as sqrt(R): the threshold moves to d = R / sigma_R^2
    ten = settings(**ONE_RELEASE | {"num-rounds": 10, "num-silos": 3, "silos-per-round": 3})
    sigma10 = silo_noise(ten, 30, 1)[0].sigma
    d10 = 3 * 10 / sigma10**2
    assert cannot_learn(ten, [silo_noise(ten, 30, math.floor(d10 * 0.98))] * 3) == ([], [])
    assert cannot_learn(ten, [silo_noise(ten, 30, math.ceil(d10 * 1.02))] * 3)[0]


def test_the_printout_says_what_it_assumes_and_warns() -> None:
    s = settings(**ONE_RELEASE | {"algorithm": "robust", "num-silos": 3, "silos-per-round": 3})
    lines = preflight_lines(s, [39, 34, 26], 42, "from the run's partition")
    assert "assumes no private evaluations" in lines[0] and "n from the run's partition" in lines[0]
    assert lines[1].startswith("[silofl] pre-flight:   silo 0 n=39: grad x1 K=39: sigma ")
    assert any("WARNING grad: every silo's message carries noise" in line for line in lines)
    unknown = preflight_lines(s, None, 42, "unknown")
    assert any("n=30:" in line for line in unknown) and "not known to the server" in unknown[-1]
    assert not any("WARNING" in line for line in unknown)
    assert preflight_lines(settings(**{"privacy.mode": "off"}), [10], 42, "x") == []


def test_the_launcher_prints_the_noise_plan_before_anything_starts(no_flower, capsys) -> None:
    cfg = merged_run_config([]) | {"privacy.mode": "isrl", "privacy.epsilon": 3.0}
    launch.preflight(cfg)
    out = capsys.readouterr().out
    assert "[silofl] pre-flight: planned noise per silo" in out and "silo 0 n=" in out
