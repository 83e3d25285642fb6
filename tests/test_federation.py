"""The real strategy and silo code driven in-process (no Flower runtime): learning, dropped
replies, refusals, failures. The same code runs under `flwr run` in test_e2e.py.

Each test runs its federations through the ``federation`` fixture (tests/conftest.py), i.e.
``tests.helpers.run``; ``run`` stays importable from here for the modules that import it so."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, RecordDict

import app.server_app as server_app
from app import wire
from tests.helpers import analytic_gaussian_delta
from tests.helpers import run as run  # re-exported: tests/test_threats.py and tests/test_golden.py import it from here

__all__ = ["run"]


def test_isrl_mbsgd_learns_and_reports_budget(federation) -> None:
    summary, rows, _ = federation({"num-rounds": 8})
    assert summary["status"] == "completed" and len(rows) == 8
    # the default pre-processing (standardize = auto -> server) carves the server's public sample out
    # first: 569 // 10 = 56 records, stratified (21 malignant, 35 benign); the silos split the rest:
    # 191 malignant -> 38 test, 153 train; 322 benign -> 64 test, 258 train
    majority = 102 - 64  # WBCD test split: 64 benign of 102 -> predicting "benign" errs on 38
    assert summary["test_error"] < 0.5 * majority / 102
    for silo in summary["silos"]:
        assert silo["eps_spent"] <= silo["eps_budget"] == 3.0
        assert silo["releases"][0]["count"] == 8 and silo["delta"] == pytest.approx(1 / silo["n"] ** 2)
    assert {s["n"] for s in summary["silos"]} == {153, 258}


def test_summary_alone_recomputes_each_silos_epsilon(federation) -> None:
    """From summary.json only: R full-batch Gaussian releases with multiplier z are one Gaussian
    mechanism with shift/std = sqrt(R)/z, whose exact delta(eps) (Balle & Wang 2018) must equal
    the silo's delta at the reported eps_spent."""
    summary, _, _ = federation({"num-rounds": 6, "privacy.epsilon": 1.5})
    for silo in summary["silos"]:
        (rel,) = silo["releases"]
        assert rel["sampling"] == "none (full batch)" and rel["batch"] == silo["n"]
        effective_sigma = rel["noise_multiplier"] / math.sqrt(rel["count"])
        delta = analytic_gaussian_delta(effective_sigma, 1.0, silo["eps_spent"])
        assert delta == pytest.approx(silo["delta"], rel=1e-3)
        assert silo["eps_spent"] <= 1.5


@pytest.mark.slow
def test_sampled_batches_use_without_replacement_accounting(federation) -> None:
    summary, rows, _ = federation({"num-rounds": 4, "batch-size": 32, "lr": 0.3})
    assert summary["status"] == "completed" and all(r["answered"] == 2 for r in rows)
    for silo in summary["silos"]:
        (rel,) = silo["releases"]
        assert rel["sampling"] == "fixed-size without replacement" and rel["batch"] == 32
        assert 2.9 < silo["eps_spent"] <= 3.0
        assert silo["sigma"] == pytest.approx(rel["noise_multiplier"] * 2 * 1.0 / 32)


def test_privacy_off_is_the_same_code_without_noise(federation) -> None:
    summary, rows, _ = federation({"num-rounds": 5, "privacy.mode": "off"})
    assert all(s["sigma"] == 0 and s["eps_spent"] == "inf" for s in summary["silos"])
    assert not math.isnan(rows[-1]["train_loss_private_batch"])


def test_localsgd_runs_q_steps_per_round(federation) -> None:
    summary, _, _ = federation({"algorithm": "localsgd", "num-rounds": 4, "local-steps": 3, "lr": 0.3})
    assert summary["status"] == "completed"
    assert all(s["releases"][0]["count"] == 12 and s["releases"][0]["kind"] == "local" for s in summary["silos"])
    assert summary["test_error"] < 0.3


def _corrupt(kind: str):
    def hook(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type != "train" or node != 1000:
            return reply
        upd = reply.content[wire.UPDATE]
        if kind == "nan":
            key = next(iter(upd))
            arr = upd[key].numpy().copy()
            arr[0] = np.nan
            upd[key] = Array(arr)
        elif kind == "shape":
            upd[next(iter(upd))] = Array(np.zeros((3, 3), np.float32))
        elif kind == "missing":
            return Message(RecordDict({"foo": ArrayRecord()}), reply_to=msg)
        elif kind == "dtype":
            upd[next(iter(upd))] = Array(np.zeros(upd[next(iter(upd))].shape, np.int64))
        return reply
    return hook


@pytest.mark.parametrize("kind", ["nan", "shape", "missing", "dtype"])
def test_malformed_reply_is_dropped_and_round_goes_on(federation, kind: str) -> None:
    summary, rows, _ = federation({"num-rounds": 3}, hook=_corrupt(kind))
    assert summary["status"] == "completed"
    assert [r["malformed"] for r in rows] == [1, 1, 1] and all(r["answered"] == 1 for r in rows)
    assert summary["dropped"]["malformed"] == 3 and summary["test_error"] is not None


def test_over_budget_silo_refuses_and_the_model_is_left_unchanged(federation) -> None:
    seen: list[dict] = []

    def spy(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "train":
            seen.append(wire.record_to_params(msg.content[wire.ARRAYS]))
        return reply

    summary, rows, _ = federation({"num-rounds": 4, "privacy.planned-rounds": 2}, hook=spy)
    # half of the rounds left the model unchanged: no progress, with the budget's cause (app/run_health.py)
    assert summary["status"] == "no-progress" and summary["health"]["blame"]["setting"] == "privacy.planned-rounds"
    assert [r["answered"] for r in rows] == [2, 2, 0, 0] and [r["refused"] for r in rows] == [0, 0, 2, 2]
    # rounds 3 and 4 had no valid answer: both sent the same w
    for k in seen[4]:
        np.testing.assert_array_equal(seen[4][k], seen[6][k])
    assert all(s["eps_spent"] <= 3.0 and s["releases"][0]["count"] == 2 for s in summary["silos"])


def test_a_crashing_clientapp_fails_the_run_after_writing_outputs(federation, tmp_path: Path) -> None:
    def crash(node: int, msg: Message, reply: Message) -> Message:
        if node == 1001 and msg.metadata.message_type == "train":
            from flwr.app import Error
            return Message(Error(code=0, reason="Traceback ...\nRuntimeError: disk on fire"), reply_to=msg)
        return reply

    with pytest.raises(server_app.ClientAppFailure):
        federation({"num-rounds": 2}, hook=crash)
    summary = json.loads((tmp_path / "out" / "t" / "summary.json").read_text())
    assert summary["status"] == "failed" and "disk on fire" in summary["client_errors"][0]
    summary2, rows, _ = federation({"num-rounds": 2, "fail-on-client-error": False}, hook=crash, sub="b")
    assert summary2["status"] == "completed" and [r["failed"] for r in rows] == [1, 1]


def test_silo_sampling_draws_m_of_n(federation) -> None:
    summary, rows, grid = federation({"num-rounds": 6, "num-silos": 4, "silos-per-round": 2, "partition": "iid",
                                      "eval-every": 0})
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    per_round = [train[i:i + 2] for i in range(0, len(train), 2)]
    assert all(len({m.metadata.dst_node_id for m in r}) == 2 for r in per_round)
    assert len({tuple(sorted(m.metadata.dst_node_id for m in r)) for r in per_round}) > 1


def test_silo_policy_caps_what_the_run_config_asks(federation) -> None:
    """Whoever submits the run writes the run config; a silo's own caps win over it."""
    summary, rows, _ = federation({"num-rounds": 2, "privacy.epsilon": 8.0}, node_config={"epsilon-cap": 3.0})
    assert [r["refused"] for r in rows] == [2, 2] and summary["status"] == "failed"
    assert "nothing trained" in summary["status_reason"] and "caps epsilon at 3" in summary["status_reason"]
    assert all(s["releases"] == [] for s in summary["silos"])
    _, rows, _ = federation({"num-rounds": 1, "privacy.mode": "off"}, node_config={"epsilon-cap": 3.0}, sub="off")
    assert rows[0]["refused"] == 2
    _, rows, _ = federation({"num-rounds": 1, "privacy.epsilon": 2.0}, node_config={"epsilon-cap": 3.0}, sub="ok")
    assert rows[0]["answered"] == 2


def test_node_noise_seed_overrides_the_run(federation) -> None:
    """With the node's noise-seed=os, two runs with the same run seed (and the same calibrated
    sigma) send different noisy gradients."""
    sigmas, updates = [], []
    for i in range(2):
        seen: list[dict] = []

        def spy(node: int, msg: Message, reply: Message, seen=seen) -> Message:
            if msg.metadata.message_type == "train" and node == 1000:
                seen.append(wire.record_to_params(reply.content[wire.UPDATE]))
            return reply

        summary, _, _ = federation({"num-rounds": 1, "eval-every": 0}, hook=spy,
                                   node_config={"noise-seed": "os"}, sub=str(i))
        sigmas.append(summary["silos"][0]["sigma"])
        updates.append(seen[0])
    assert sigmas[0] == sigmas[1] > 0
    assert any(not np.array_equal(updates[0][k], updates[1][k]) for k in updates[0])


def test_node_scope_ledger_spans_runs_under_the_silos_lifetime_cap(federation) -> None:
    """ledger-scope=node: each run calibrates for its own epsilon, the ledger holds the lifetime
    cap across runs, and the run that would cross it is refused."""
    node = {"ledger-scope": "node", "epsilon-cap": 4.0, "delta-cap": 1e-5}
    cfg = {"num-rounds": 2, "privacy.epsilon": 3.0, "privacy.delta": 1e-5, "eval-every": 0}
    first, rows1, _ = federation(cfg, node_config=node, run_id=11, name="a")  # both runs share one state dir
    assert [r["answered"] for r in rows1] == [2, 2] and 2.9 < first["silos"][0]["eps_spent"] <= 3.0
    # another seed: run b asks other questions (an identical request would be answered with the
    # release already made, at no cost: tests/test_threats.py)
    second, rows2, _ = federation(cfg | {"seed": 1}, node_config=node, run_id=12, name="b")
    # Gaussian releases compose sub-additively: 2+1 releases at z give 3.78 <= 4, 2+2 give 4.46 > 4
    assert rows2[0]["answered"] == 2 and rows2[1]["refused"] == 2
    assert all(s["eps_spent"] <= 4.0 and s["eps_budget"] == 4.0 for s in second["silos"])


def test_prox_l2_ball_keeps_every_server_iterate_in_the_ball(federation) -> None:
    sent: list[dict] = []

    def spy(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "train" and node == 1000:
            sent.append(wire.record_to_params(msg.content[wire.ARRAYS]))
        return reply

    summary, _, _ = federation({"num-rounds": 6, "prox.kind": "l2-ball", "prox.strength": 0.5, "lr": 2.0}, hook=spy)
    norms = [math.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in w.values())) for w in sent[1:]]
    assert len(norms) == 5 and max(norms) <= 0.5 * (1 + 1e-5)
    assert summary["config"]["prox"]["kind"] == "l2-ball"


def test_prox_l1_gives_a_sparse_model(federation) -> None:
    def final_weights(name: str, extra: dict) -> np.ndarray:
        seen: list[dict] = []

        def spy(node: int, msg: Message, reply: Message) -> Message:
            if msg.metadata.message_type == "evaluate" and node == 1000:
                seen.append(wire.record_to_params(msg.content[wire.ARRAYS]))
            return reply

        federation({"num-rounds": 15, "model": "logistic", "privacy.mode": "off"} | extra, hook=spy, sub=name)
        return seen[-1]["linear.weight"]

    sparse = final_weights("l1", {"prox.kind": "l1", "prox.strength": 0.05})
    dense = final_weights("none", {})
    assert (sparse == 0).mean() > 0.3  # soft-thresholding sets many of the 60 weights exactly to zero
    assert (dense == 0).mean() == 0.0


def test_gradient_mapping_without_prox_is_the_full_gradient_norm(federation) -> None:
    """Non-private full-batch MB-SGD: round r+1's mean update is grad F0 at the model evaluated
    after round r, so ||G_eta|| (prox = identity) must equal its norm."""
    updates: list[dict] = []

    def spy(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "train":
            updates.append(wire.record_to_params(reply.content[wire.UPDATE]))
        return reply

    _, rows, _ = federation({"num-rounds": 3, "privacy.mode": "off"}, hook=spy)
    for r in (0, 1):
        mean = {k: (updates[2 * (r + 1)][k] + updates[2 * (r + 1) + 1][k]) / 2 for k in updates[0]}
        norm = math.sqrt(sum(float((v.astype(np.float64) ** 2).sum()) for v in mean.values()))
        assert rows[r]["grad_mapping_norm_eval"] == pytest.approx(norm, rel=1e-4)


def test_bad_validation_counts_are_ignored(federation) -> None:
    """A silo reporting NaN or more validation errors than records cannot skew model selection."""
    from flwr.app import MetricRecord

    def lie(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "evaluate" and node == 1000:
            metrics = dict(reply.content.metric_records[wire.METRICS])
            metrics |= {"val-errors": float("nan") if msg.content[wire.CONFIG]["round"] % 2 else 1e6}
            reply.content.metric_records[wire.METRICS] = MetricRecord(metrics)
        return reply

    summary, rows, _ = federation({"num-rounds": 2, "validation-fraction": 0.2}, hook=lie)
    assert all(0 <= r["val_error"] <= 1 for r in rows)
