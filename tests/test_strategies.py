"""Each optimiser's server step fed hand-made replies (no silos, no Flower): the step's maths
checked against the paper's update rules computed here by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from app import wire
from app.algorithms import Phase
from app.config import parse_settings
from strategies import STRATEGIES
from strategies.replies import Updates, flatten

LAYOUT = {"w": (3,)}
W0 = {"w": np.array([1.0, -2.0, 0.5], dtype=np.float32)}


class FakeSilos:
    """Answers each ask with the next hand-made list of updates; records what was asked."""

    def __init__(self, *answers: list[np.ndarray]) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[Phase, dict, dict | None]] = []

    def __call__(self, phase: Phase, at: dict, prev: dict | None = None) -> Updates:
        self.asked.append((phase, {k: v.copy() for k, v in at.items()}, prev))
        vectors = self.answers.pop(0)
        updates = [{"w": np.asarray(v, dtype=np.float32)} for v in vectors]
        nodes = [1000 + i for i in range(len(updates))]
        return Updates(nodes=nodes, updates=updates, metrics=[wire.TrainReply(u, 0.0) for u in updates],
                       messages={n: flatten(u) for n, u in zip(nodes, updates)},
                       lift=lambda m: wire.unflatten(m, LAYOUT))


def optimiser(algorithm: str, **extra: Any):
    s = parse_settings({"algorithm": algorithm, "lr": 0.5, "privacy.mode": "off"} | extra)
    return STRATEGIES[s.algorithm](s, LAYOUT)


@pytest.mark.parametrize("algorithm,phase", [("mbsgd", Phase.GRAD), ("proxsgd", Phase.DISJOINT)])
def test_prox_gradient_step(algorithm: str, phase: Phase) -> None:
    opt = optimiser(algorithm)
    silos = FakeSilos([[1.0, 0.0, 0.0], [0.0, 2.0, 4.0]])
    out = opt.step(1, W0, silos).model
    np.testing.assert_allclose(out["w"], [1.0 - 0.5 * 0.5, -2.0 - 0.5 * 1.0, 0.5 - 0.5 * 2.0])
    assert silos.asked[0][0] == phase and silos.asked[0][2] is None


def test_prox_gradient_step_with_an_l2_ball_projects() -> None:
    opt = optimiser("mbsgd", **{"prox.kind": "l2-ball", "prox.strength": 1.0})
    out = opt.step(1, W0, FakeSilos([[0.0, 0.0, 0.0]])).model
    np.testing.assert_allclose(out["w"], W0["w"] / np.linalg.norm(W0["w"]), rtol=1e-6)  # projected onto ||w|| <= 1


def test_no_valid_reply_leaves_the_model_to_the_loop() -> None:
    for algorithm in ("mbsgd", "localsgd", "spider", "svrg", "robust"):
        assert optimiser(algorithm, **{"aggregator": "mean"}).step(1, W0, FakeSilos([])).model is None


def test_local_sgd_averages_the_model_changes() -> None:
    opt = optimiser("localsgd", **{"local-steps": 3})
    silos = FakeSilos([[1.0, 1.0, 1.0], [3.0, -1.0, 0.0]])
    np.testing.assert_allclose(opt.step(1, W0, silos).model["w"], W0["w"] + np.array([2.0, 0.0, 0.5]))
    assert silos.asked[0][0] == Phase.LOCAL


def test_spider_anchor_then_difference_accumulates_the_estimate() -> None:
    opt = optimiser("spider", **{"spider.q": 3})
    silos = FakeSilos([[2.0, 0.0, 0.0]], [[0.0, 2.0, 0.0]], [[0.0, 0.0, 2.0]])
    w1 = opt.step(1, W0, silos).model  # anchor: h = (2, 0, 0)
    np.testing.assert_allclose(w1["w"], W0["w"] - 0.5 * np.array([2.0, 0.0, 0.0]))
    w2 = opt.step(2, w1, silos).model  # diff against w_1's point: h = (2, 2, 0)
    np.testing.assert_allclose(w2["w"], w1["w"] - 0.5 * np.array([2.0, 2.0, 0.0]))
    w3 = opt.step(3, w2, silos).model  # h = (2, 2, 2)
    np.testing.assert_allclose(w3["w"], w2["w"] - 0.5 * np.array([2.0, 2.0, 2.0]))
    phases = [a[0] for a in silos.asked]
    assert phases == [Phase.ANCHOR, Phase.DIFF, Phase.DIFF]
    np.testing.assert_array_equal(silos.asked[1][2]["w"], W0["w"])  # H(w_2) - H(w_1)'s second point
    np.testing.assert_array_equal(silos.asked[2][2]["w"], w1["w"])


def test_svrg_differences_are_against_the_snapshot() -> None:
    opt = optimiser("svrg", **{"svrg.inner-steps": 2})
    silos = FakeSilos([[2.0, 0.0, 0.0]], [[0.0, 2.0, 0.0]], [[0.0, 0.0, 2.0]])
    w1 = opt.step(1, W0, silos).model  # snapshot g~ = (2, 0, 0) at w_bar = W0
    w2 = opt.step(2, w1, silos).model  # v = g~ + (0, 2, 0)
    np.testing.assert_allclose(w2["w"], w1["w"] - 0.5 * np.array([2.0, 2.0, 0.0]))
    w3 = opt.step(3, w2, silos).model  # v = g~ + (0, 0, 2): not accumulated
    np.testing.assert_allclose(w3["w"], w2["w"] - 0.5 * np.array([2.0, 0.0, 2.0]))
    assert all(np.array_equal(a[2]["w"], W0["w"]) for a in silos.asked[1:])


def test_spider_alt_two_uploads_per_round() -> None:
    opt = optimiser("spider-alt")
    silos = FakeSilos([[2.0, 0.0, 0.0]], [[0.0, 2.0, 0.0]], [[0.0, 0.0, 4.0]])
    assert opt.step(1, W0, silos).model is None  # round 1: a fresh gradient only
    out = opt.step(2, W0, silos).model
    g, d = np.array([2.0, 0.0, 0.0]), np.array([0.0, 2.0, 0.0])
    w1 = W0["w"] - 0.5 * g
    np.testing.assert_allclose(out["w"], w1 - 0.5 * (g + d))
    assert [a[0] for a in silos.asked] == [Phase.GRAD, Phase.DIFF, Phase.GRAD]
    np.testing.assert_allclose(silos.asked[1][1]["w"], w1)  # the difference is at (w^1, w^0)
    np.testing.assert_array_equal(silos.asked[1][2]["w"], W0["w"])
    np.testing.assert_allclose(silos.asked[2][1]["w"], out["w"])  # the fresh gradient at w^2
    np.testing.assert_allclose(opt.g["w"], [0.0, 0.0, 4.0])


def test_robust_line_with_the_mean_rule_and_its_weights() -> None:
    opt = optimiser("robust", aggregator="mean")
    result = opt.step(1, W0, FakeSilos([[1.0, 0.0, 0.0], [0.0, 3.0, 0.0]]))
    np.testing.assert_allclose(result.model["w"], W0["w"] - 0.5 * np.array([0.5, 1.5, 0.0]))
    assert result.row["silo_weights"] == {0: 0.5, 1: 0.5} and result.row["byzantine_weight"] == 0.0
