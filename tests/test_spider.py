"""ISRL-DP FedProx-SPIDER (Algorithm 3) against independent facts."""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant
from flwr.app import Error, Message
from scipy.optimize import minimize

from app import wire
from app.config import parse_settings
from app.launch import merged_run_config
from tests.helpers import logistic_objective


def final_weights(federation, cfg: dict, hook=None, sub: str = "") -> tuple[dict, dict[str, np.ndarray], list[Message]]:
    """The run's summary, the last model sent to silo 1000 for evaluation, every train message."""
    seen: list[dict] = []
    sent: list[Message] = []

    def spy(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "evaluate" and node == 1000:
            seen.append(wire.record_to_params(msg.content[wire.ARRAYS]))
        if msg.metadata.message_type == "train":
            sent.append(msg)
        return hook(node, msg, reply) if hook else reply

    summary, _, _ = federation(cfg, hook=spy, sub=sub)
    return summary, seen[-1], sent


@pytest.mark.slow
def test_q1_is_minibatch_sgd(federation) -> None:
    """With q = 1 every round is an anchor round: the same seeds give MB-SGD's iterates."""
    common = {"num-rounds": 4, "privacy.epsilon": 3.0}
    _, w_spider, _ = final_weights(federation, common | {"algorithm": "spider", "spider.q": 1,
                                                         "spider.anchor-batch": 64}, sub="s")
    _, w_mbsgd, _ = final_weights(federation, common | {"algorithm": "mbsgd", "batch-size": 64}, sub="m")
    for k in w_mbsgd:
        np.testing.assert_array_equal(w_spider[k], w_mbsgd[k])


@pytest.mark.slow
def test_non_private_spider_reaches_the_l2_regularised_optimum(federation) -> None:
    lam = 0.05
    cfg = {"algorithm": "spider", "model": "logistic", "privacy.mode": "off", "prox.kind": "l2",
           "prox.strength": lam, "spider.q": 5, "batch-size": 64, "num-rounds": 200, "lr": 1.0, "eval-every": 50}
    summary, w, _ = final_weights(federation, cfg)
    f = logistic_objective(parse_settings(merged_run_config([]) | {k: v for k, v in cfg.items()}), lam)
    best = minimize(f, np.zeros(62), jac=True, method="L-BFGS-B", options={"gtol": 1e-10, "maxiter": 5000})
    theta = np.concatenate([w["linear.weight"].ravel(), w["linear.bias"]]).astype(np.float64)
    gap = f(theta)[0] - best.fun
    assert -1e-6 < gap < 1e-4, gap  # stated tolerance: 1e-4 suboptimality in the regularised objective
    assert summary["test_error"] < 0.1
    assert summary["grad_mapping_norm_eval"] < 1e-3  # the prox-gradient mapping vanishes at the optimum


def test_silo_dropout_does_not_break_spider(federation) -> None:
    """Both silos miss round 1 (no anchor yet: round 2 asks for an anchor again) and silo 1001
    misses every third round; the run completes and learns."""
    def drop(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type != "train":
            return reply
        rnd = int(msg.content[wire.CONFIG]["round"])
        if rnd == 1 or (node == 1001 and rnd % 3 == 0):
            return Message(Error(code=0, reason="silo offline"), reply_to=msg)
        return reply

    cfg = {"algorithm": "spider", "spider.q": 4, "batch-size": 64, "num-rounds": 12, "fail-on-client-error": False,
           "privacy.mode": "off", "partition": "iid"}  # the mechanics under dropout, without noise
    summary, _, sent = final_weights(federation, cfg, hook=drop)
    phases = {}
    for m in sent:
        c = m.content[wire.CONFIG]
        phases[int(c["round"])] = (c["phase"], wire.PREV_ARRAYS in m.content)
    assert phases[1] == ("anchor", False) and phases[2] == ("anchor", False)  # no anchor received yet
    assert phases[3] == ("diff", True) and phases[5] == ("anchor", False)
    assert summary["status"] == "completed" and summary["test_error"] < 0.15


@pytest.mark.slow
def test_spider_privacy_counts_anchor_and_difference_releases(federation) -> None:
    # the paper's bound (diff-clip 0), not WBCD's private preset (diff-clip 0.2, sensitivity 2C/K2)
    cfg = {"algorithm": "spider", "spider.q": 3, "batch-size": 64, "num-rounds": 7, "privacy.epsilon": 2.0,
           "diff-clip": 0.0}
    summary, _, _ = final_weights(federation, cfg)
    for silo in summary["silos"]:
        kinds = {r["kind"]: r for r in silo["releases"]}
        assert kinds["anchor"]["count"] == 3 and kinds["diff"]["count"] == 4  # rounds 1, 4, 7 are anchors
        planned = {p["phase"]: p for p in silo["planned"]}
        assert planned["diff"]["sensitivity"] == pytest.approx(4 * 1.0 / 64)  # 4L/K2
        assert planned["anchor"]["sensitivity"] == pytest.approx(2 * 1.0 / silo["n"])  # 2L/K1, K1 = n
        # independent recomputation with dp-accounting's RDP accountant from the summary alone
        acc = RdpAccountant(list(range(2, 65)) + [80, 96, 128, 192, 256], dpa.NeighboringRelation.REPLACE_ONE)
        for r in silo["releases"]:
            ev = dpa.GaussianDpEvent(r["noise_multiplier"])
            if r["batch"] < r["n"]:
                ev = dpa.SampledWithoutReplacementDpEvent(r["n"], r["batch"], ev)
            acc.compose(ev, r["count"])
        assert acc.get_epsilon(silo["delta"]) == pytest.approx(silo["eps_spent"], rel=1e-6)
        assert silo["eps_spent"] <= 2.0
