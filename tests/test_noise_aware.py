"""Noise-aware Grad-BANT (docs/byzantine.md#noise-aware-grad-bant): the expected noise energy
against Monte Carlo, the published properties on hand-made inputs, an ISRL-DP federation, and
the run that never moved its model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.config import ConfigError, parse_settings
from app.sketch.base import make_sketch
from app.sketch.noise import lift_noise_factor, srht_chunk_factor
from strategies.gradbant import gradbant_step

PRIVATE = {"algorithm": "robust", "dataset": "digits", "num-silos": 10, "silos-per-round": 10, "partition": "iid",
           "model": "logistic", "privacy.mode": "isrl", "privacy.epsilon": 8.0, "privacy.clip": 1.0, "lr": 0.5,
           "num-rounds": 12, "batch-size": 32, "trust.size": 60,
           # the pre-processing the measured errors below were taken with (outside epsilon; the
           # default inside it is tested in tests/test_private_preprocessing.py)
           "standardize": "pooled"}


@pytest.mark.parametrize("kind,layerwise", [("none", False), ("gaussian", False), ("rademacher", True),
                                            ("srht", False), ("srht", True), ("countsketch", True),
                                            ("randk", False)])
def test_expected_noise_energy_matches_monte_carlo(kind: str, layerwise: bool) -> None:
    """E||S^T S xi||^2 = sigma^2 * factor, over fresh sketches (one per round) and fresh noise:
    the Monte Carlo mean is within 5 standard errors of the exact value."""
    layout = [(37,), (12, 5)]  # 37 = 32 + 5 and 60 = 32 + 28: SRHT pads the smaller chunk
    n, sigma, trials = 97, 0.3, 3000
    rng = np.random.default_rng(0)
    sketches = [None if kind == "none" else make_sketch(kind, layout, seed=7, round=r, layerwise=layerwise, ratio=0.4)
                for r in range(1, trials + 1)]
    factor = lift_noise_factor(sketches[0], n)
    samples = []
    for sk in sketches:
        xi = torch.as_tensor(rng.normal(0, sigma, size=n))
        u = xi if sk is None else sk.decompress(sk.compress(xi))
        samples.append(float((u * u).sum()))
    mean, se = np.mean(samples), np.std(samples, ddof=1) / np.sqrt(trials)
    assert abs(mean - sigma**2 * factor) < 5 * se, (mean, sigma**2 * factor, se)
    if kind != "none":
        assert factor > n  # a sketch amplifies isotropic noise (about n^2 / k for SRHT)


def test_srht_factor_is_n_squared_over_k_without_padding() -> None:
    assert srht_chunk_factor(64, 64, 16) == pytest.approx(64 * 64 / 16)
    assert srht_chunk_factor(64, 64, 64) == pytest.approx(64)  # k = m: an orthogonal map, S^T S = I


def test_unsupported_sketch_kind_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="noise-aware"):
        parse_settings(PRIVATE | {"gradbant.noise-aware": True, "sketch.kind": "srft"})
    with pytest.raises(ConfigError, match="noise-aware"):
        parse_settings(PRIVATE | {"gradbant.noise-aware": True, "aggregator": "fltrust"})


def _noisy(rng, g, sigma, m):
    return [g + rng.normal(0, sigma, size=g.size) for _ in range(m)]


def test_noise_aware_score_keeps_the_published_properties() -> None:
    """c = the honest noise energy d sigma^2; honest noisy messages score > 0 where the paper's
    score gives them 0; the -100x silo and a sign-flipping majority get 0; the all-zero round
    keeps the model."""
    rng = np.random.default_rng(3)
    d, sigma, gamma, L = 400, 0.5, 0.5, 1.0
    g0 = rng.normal(0, 0.1, size=d)  # ||g0||^2 ~ 4, noise energy d sigma^2 = 100
    c = d * sigma**2
    honest = _noisy(rng, g0, sigma, 3)
    updates = np.stack(honest + [-100 * honest[0]])
    _, _, a_paper, theta_paper = gradbant_step(g0, updates, np.full(4, 0.25), np.arange(4), 0.5, L, gamma)
    assert not theta_paper.any()  # the paper's score: every honest noisy message scores 0
    _, _, a, theta = gradbant_step(g0, updates, np.full(4, 0.25), np.arange(4), 0.5, L, gamma, c)
    assert all(theta[:3] > 0) and theta[3] == 0 and a[3] == 0

    flippers = [-h for h in _noisy(rng, g0, sigma, 6)]  # 6 of 9 Byzantine: sign flip of noisy messages
    updates = np.stack(_noisy(rng, g0, sigma, 3) + flippers)
    direction, _, a, theta = gradbant_step(g0, updates, np.full(9, 1 / 9), np.arange(9), 0.5, L, gamma, c)
    assert direction is not None and (theta[:3] > 0).sum() >= 2 and not theta[3:].any() and not a[3:].any()

    zero = np.zeros((3, d))
    direction, p, a, theta = gradbant_step(g0, zero, np.full(3, 1 / 3), np.arange(3), 0.5, L, gamma, c)
    assert direction is None and not theta.any()  # <g0, 0> = 0: the model is kept


def test_noise_aware_score_never_exceeds_the_alignment() -> None:
    rng = np.random.default_rng(4)
    g0, u = rng.normal(size=50), rng.normal(size=(20, 50)) * rng.uniform(0, 5, size=(20, 1))
    _, _, _, theta = gradbant_step(g0, u, np.full(20, 0.05), np.arange(20), 0.5, 1.0, 0.5, 1e6)
    np.testing.assert_array_less(theta, np.maximum(u @ g0, 0) + 1e-12)
    np.testing.assert_allclose(theta, np.maximum(u @ g0, 0))  # c above every energy: theta = [<g0, u>]_+


def test_isrl_dp_federation_paper_score_is_stuck_noise_aware_learns(federation) -> None:
    """Digits, 10 IID silos, ISRL-DP eps = 8, batch 32: the paper's score gives every silo 0 in
    every round (the model never moves: ~90% error, and the summary says no-progress and points
    at gradbant.noise-aware), the noise-aware
    score keeps most silos positive and learns (measured: 27% test error, 4-9 silos positive per
    round; 7% without privacy)."""
    paper, paper_rows, _ = federation(PRIVATE, sub="paper")
    aware, aware_rows, _ = federation(PRIVATE | {"gradbant.noise-aware": True}, sub="aware")
    assert all(not any(r["silo_weights"].values()) for r in paper_rows)
    # run health stops it after stop-unchanged = 4 rounds of 12 that spent budget on nothing
    assert paper["test_error"] > 0.85 and paper["rounds_all_rejected"] == 4 and paper["status"] == "no-progress"
    assert paper["stopped_after_round"] == 4
    assert paper["health"]["blame"]["setting"] == "gradbant.noise-aware"  # app/run_health.py's hint
    positive = [sum(a > 0 for a in r["silo_weights"].values()) for r in aware_rows]
    assert np.mean(positive) >= 6 and min(positive) >= 1
    assert aware["status"] == "completed" and aware["test_error"] < 0.45
    assert aware["rounds_all_rejected"] == 0


def test_fail_on_no_progress_fails_a_run_that_never_moved(federation) -> None:
    summary, _, _ = federation(PRIVATE | {"fail-on-no-progress": True})
    assert summary["status"] == "failed" and summary["rounds_all_rejected"] == 4  # stopped after 4 (run health)
    assert "no progress" in summary["status_reason"] and "fail-on-no-progress" in summary["status_reason"]


def test_noise_aware_with_srht_local_steps_and_a_sign_flipping_majority(federation) -> None:
    """SRHT k/n = 0.5, Q = 3 local steps, eps = 8, 60% sign flippers: the paper's score never moves
    (measured: 90% error); the noise-aware score learns (measured 31%; 23% without the attack) and
    gives the flippers little weight (a flipped noisy message can align with g0 through its noise)."""
    cfg = PRIVATE | {"lr": 0.2, "sketch.kind": "srht", "sketch.ratio": 0.5, "local-steps": 3,
                     "gradbant.noise-aware": True, "attack.kind": "sign-flip", "attack.fraction": 0.6}
    summary, rows, _ = federation(cfg)
    assert summary["status"] == "completed" and summary["test_error"] < 0.45
    assert np.mean([r["byzantine_weight"] for r in rows]) < 0.1 and all(r["byzantine_answered"] == 6 for r in rows)


# ------------------------------------------------- gradient messages (Q = 1): sampling noise, auto L

@pytest.mark.parametrize("kind,layerwise", [("none", False), ("gaussian", False), ("rademacher", True),
                                            ("srht", False), ("srht", True), ("countsketch", True), ("randk", True)])
def test_lift_weights_sum_to_the_isotropic_factor(kind: str, layerwise: bool) -> None:
    from app.sketch.noise import lift_noise_weights

    layout = [(37,), (12, 5)]
    sk = None if kind == "none" else make_sketch(kind, layout, seed=3, round=1, layerwise=layerwise, ratio=0.4)
    kappa = lift_noise_weights(sk, 97)
    assert kappa.shape == (97,) and np.all(kappa >= 1.0)
    assert kappa.sum() == pytest.approx(lift_noise_factor(sk, 97), rel=1e-12)


@pytest.mark.parametrize("kind,layerwise", [("none", False), ("gaussian", False), ("srht", True),
                                            ("countsketch", False)])
def test_minibatch_noise_energy_matches_monte_carlo(kind: str, layerwise: bool) -> None:
    """A silo's n per-record gradients with unequal, correlated coordinates; its message is the
    mean of K of them drawn without replacement, sketched and lifted with a fresh sketch each
    round. E||S^T S (mean_B - mean)||^2 over batches and sketches matches
    (1 - K/n)/K * kappa . s^2 (Cochran's formula, lifted) within 5 standard errors."""
    from app.sketch.noise import lift_noise_weights
    from strategies.phase_noise import minibatch_noise_energy

    layout = [(37,), (12, 5)]
    rng = np.random.default_rng(1)
    n, k, trials = 80, 12, 3000
    mix = rng.normal(size=(97, 97)) * rng.uniform(0.1, 3.0, size=97)  # correlated, unequal variances
    records = rng.normal(size=(n, 97)) @ mix.T + 5.0  # a common mean (the gradient) cancels
    sketches = [None if kind == "none" else make_sketch(kind, layout, seed=11, round=r, layerwise=layerwise, ratio=0.4)
                for r in range(1, trials + 1)]
    kappa = lift_noise_weights(sketches[0], 97)
    exact = minibatch_noise_energy(records, k, n, kappa)
    mean_all = records.mean(axis=0)
    samples = []
    for sk in sketches:
        zeta = torch.as_tensor(records[rng.choice(n, size=k, replace=False)].mean(axis=0) - mean_all)
        u = zeta if sk is None else sk.decompress(sk.compress(zeta))
        samples.append(float((u * u).sum()))
    mean, se = np.mean(samples), np.std(samples, ddof=1) / np.sqrt(trials)
    assert abs(mean - exact) < 5 * se, (mean, exact, se)
    assert minibatch_noise_energy(records, n, n, kappa) == 0.0  # the full batch has no sampling noise


def test_secant_smoothness_is_the_curvature_along_the_step() -> None:
    """f(x) = x^T A x / 2 has grad f = A x: along an eigenvector of A the estimate is its
    eigenvalue, for any x and step; along any g0 it is ||A g0|| / ||g0|| <= ||A||."""
    from strategies.gradbant import secant_smoothness

    rng = np.random.default_rng(2)
    q, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    eig = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 7.0])
    a = q @ np.diag(eig) @ q.T
    layout = {"w": (2, 3)}
    grad = lambda p: a @ np.asarray(p["w"], dtype=np.float64).reshape(-1)  # noqa: E731
    w = {"w": rng.normal(size=(2, 3)).astype(np.float32)}
    for i in range(6):
        assert secant_smoothness(grad, w, q[:, i] * 2.0, 0.3, layout) == pytest.approx(eig[i], rel=1e-5)
    g0 = rng.normal(size=6)
    assert secant_smoothness(grad, w, g0, 0.3, layout) == pytest.approx(np.linalg.norm(a @ g0) / np.linalg.norm(g0), rel=1e-5)
    assert secant_smoothness(grad, w, np.zeros(6), 0.3, layout) == 0.0


def test_smoothness_auto_and_silo_records_are_checked() -> None:
    s = parse_settings(PRIVATE | {"gradbant.smoothness": "auto"})
    assert s.robust.gradbant_smoothness == "auto"
    with pytest.raises(ConfigError, match="auto"):
        parse_settings(PRIVATE | {"gradbant.smoothness": "automatic"})
    assert parse_settings(PRIVATE | {"gradbant.silo-records": "100,200"}).robust.gradbant_silo_records == (100, 200)
    for bad in ("200,100", "100", "100,200,300", "0,10"):
        with pytest.raises(ConfigError, match="gradbant.silo-records"):
            parse_settings(PRIVATE | {"gradbant.silo-records": bad})


def test_a_server_that_cannot_read_the_partition_needs_public_record_bounds(monkeypatch) -> None:
    """A deployment's server has no partition: noise-aware Grad-BANT then needs the operators'
    public bounds (gradbant.silo-records) and says so, instead of guessing a noise level."""
    import app.data.federated as federated
    from app.data.sources import DataUnavailableError
    from strategies.gradbant import public_noise

    def unreadable(*_args):
        raise DataUnavailableError("the data lives on the silos")

    monkeypatch.setattr(federated, "silo_splits", unreadable)
    s = parse_settings(PRIVATE | {"gradbant.noise-aware": True})
    with pytest.raises(ConfigError, match="gradbant.silo-records"):
        public_noise(s)
    bounded = parse_settings(PRIVATE | {"gradbant.noise-aware": True, "gradbant.silo-records": "150,180"})
    assert public_noise(bounded).records == (150, 180)
    monkeypatch.undo()
    n_max = public_noise(s).records[1]
    assert public_noise(parse_settings(PRIVATE | {"gradbant.silo-records": f"1,{n_max}"})).variance() == \
        pytest.approx(public_noise(s).variance())  # sigma comes from the largest silo


GRADIENTS = {"algorithm": "robust", "dataset": "digits", "num-silos": 10, "silos-per-round": 10, "partition": "iid",
             "model": "logistic", "lr": 0.5, "num-rounds": 12, "batch-size": 32, "trust.size": 60,
             "sketch.kind": "srht", "sketch.ratio": 0.5, "standardize": "pooled"}


def test_gradient_messages_without_privacy_sampling_noise_aware_learns(federation) -> None:
    """Q = 1 (minibatch-gradient messages, batch 32), no privacy, SRHT k/n = 0.5, digits: the
    batch's sampling noise (and the lift's amplification of it) makes every honest message's
    energy exceed the alignment, so the paper's score rejects every silo in every round (90%
    error, the initial model's). Noise-aware, the server estimates that noise on its trust set
    each round and learns (measured 54%, 46%, 57% error for seeds 0-2 in 12 rounds; the
    non-robust mean 40%)."""
    paper, _, _ = federation(GRADIENTS, sub="paper")
    assert paper["rounds_all_rejected"] == 4 and paper["test_error"] > 0.85  # run health stops it after 4 of 12
    assert paper["stopped_after_round"] == 4
    aware, rows, _ = federation(GRADIENTS | {"gradbant.noise-aware": True}, sub="aware")
    positive = [sum(a > 0 for a in r["silo_weights"].values()) for r in rows]
    assert aware["rounds_all_rejected"] == 0 and np.mean(positive) >= 3
    assert aware["test_error"] < 0.7
    c = [r["gradbant_noise_energy"] for r in rows]
    assert all(ci > 0 and np.isfinite(ci) for ci in c)  # the per-round sampling estimate (no DP noise)


@pytest.mark.slow
@pytest.mark.needs_data("fashion-mnist")
def test_fashion_mnist_gradient_messages_paper_stuck_auto_smoothness_and_noise_aware_learn(federation) -> None:
    """The issue's row: Fashion-MNIST, 10 IID silos, PCA 50 + MLP 64, trust set 500, SRHT k/n =
    0.5, Q = 1, lr 0.5, batch 64, no privacy. Paper's score with L = 1: (almost) every silo 0
    (measured 87.7% error after 10 rounds); L = auto (measured L-hat 0.21-0.25) or noise-aware
    each learn (measured 32.6% and 32.5%; unsketched, paper's score: 33.8%)."""
    cfg = {"algorithm": "robust", "dataset": "fashion-mnist", "partition": "iid", "num-silos": 10,
           "silos-per-round": 10, "model": "mlp", "pca": 50, "mlp-hidden": "64", "trust.size": 500,
           "local-steps": 1, "lr": 0.5, "batch-size": 64, "privacy.mode": "off", "num-rounds": 6,
           "sketch.kind": "srht", "sketch.ratio": 0.5}
    # the paper's score stays stuck for all 6 rounds (run health would stop it after 4: off here)
    paper, paper_rows, _ = federation(cfg | {"stop-unchanged": 0, "stop-patience": 0}, sub="paper")
    auto, auto_rows, _ = federation(cfg | {"gradbant.smoothness": "auto"}, sub="auto")
    aware, _, _ = federation(cfg | {"gradbant.noise-aware": True}, sub="aware")
    assert paper["test_error"] > 0.8 and paper["rounds_all_rejected"] >= 5
    estimates = [r["gradbant_smoothness"] for r in auto_rows]
    assert all(0 < e < 2 / cfg["lr"] for e in estimates)  # L-hat gamma < 2: honest messages can score > 0
    assert auto["test_error"] < 0.5 and aware["test_error"] < 0.5
