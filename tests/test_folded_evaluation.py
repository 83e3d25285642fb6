"""The evaluation of round r's result rides on round r+1's training exchange (strategies/loop.py).

The reference is the same run with an evaluation exchange of its own after every round
(``FederatedOptimizer.fold_evaluation = False``, the loop before folding): every row of
rounds.jsonl (but its wall time), the summary's numbers and every silo's ledger must be the same,
with one exchange per round instead of two. Hostile evaluation parts are dropped without
touching the training update they travel with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, MetricRecord, RecordDict

from app import wire
from strategies.loop import FederatedOptimizer
from tests.helpers import run, without_wall

def _ledgers(summary: dict[str, Any]) -> list[Any]:
    return [(s.get("eps_spent"), s.get("releases")) for s in summary["silos"]]


def _both(tmp_path: Path, overrides: dict[str, Any], node_config: dict | None = None,
          monkeypatch: pytest.MonkeyPatch | None = None):
    folded = run(tmp_path / "folded", overrides, node_config=node_config)
    assert monkeypatch is not None
    monkeypatch.setattr(FederatedOptimizer, "fold_evaluation", False)
    separate = run(tmp_path / "separate", overrides, node_config=node_config)
    monkeypatch.setattr(FederatedOptimizer, "fold_evaluation", True)
    return folded, separate


CASES = {
    # the default: WBCD, 2 silos, both sampled every round, ISRL-DP MB-SGD
    "default": {"num-rounds": 4},
    # M < N: the silos not sampled get the evaluation request alone, in the same send
    "partial-participation": {"num-rounds": 4, "num-silos": 4, "silos-per-round": 2, "partition": "iid"},
    "eval-every-2": {"num-rounds": 5, "eval-every": 2},
    # SPIDER-alt asks at another point than w_r in some rounds: w_r's evaluation goes first
    "spider-alt": {"num-rounds": 5, "algorithm": "spider-alt"},
    "localsgd-off": {"num-rounds": 3, "algorithm": "localsgd", "privacy.mode": "off"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_folding_keeps_every_number_and_halves_the_exchanges(tmp_path: Path, case: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (s1, rows1, grid1), (s2, rows2, grid2) = _both(tmp_path, CASES[case], monkeypatch=monkeypatch)
    assert without_wall(rows1) == without_wall(rows2)
    assert s1["test_error"] == s2["test_error"] and s1["status"] == s2["status"] == "completed"
    assert _ledgers(s1) == _ledgers(s2)
    assert all("test_error" in r for r in rows1 if r["round"] % CASES[case].get("eval-every", 1) == 0)
    evals1 = [m for m in grid1.sent if m.metadata.message_type == "evaluate"]
    evals2 = [m for m in grid2.sent if m.metadata.message_type == "evaluate"]
    folded = [m for m in grid1.sent if wire.EVALUATE_ROUND in m.content.config_records.get(wire.CONFIG, {})]
    if case == "spider-alt":  # rounds 2.. open at w_r - eta g (w_r only as prev): nothing to fold
        assert len(evals1) == len(evals2) and not folded  # every evaluation has its own exchange
        return
    assert len(evals2) > len(evals1)  # fewer evaluation-only messages ...
    assert folded  # ... because training instructions carry them


def test_private_evaluation_is_charged_exactly_as_a_separate_one(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluation = private: the folded evaluation is one Gaussian release in the ledger, recorded
    before the round's training release (the same sequence numbers, so the same noise)."""
    node = {"evaluation": "private"}
    (s1, rows1, _), (s2, rows2, _) = _both(tmp_path, {"num-rounds": 4}, node_config=node, monkeypatch=monkeypatch)
    assert without_wall(rows1) == without_wall(rows2)
    assert _ledgers(s1) == _ledgers(s2)
    kinds = [r["kind"] for r in s1["silos"][0]["releases"]]
    assert "eval" in kinds


def test_the_default_round_is_one_exchange(tmp_path: Path) -> None:
    """R rounds of the default cost R training sends plus one evaluation send (the last round's)."""
    rounds = 4
    _, rows, grid = run(tmp_path, {"num-rounds": rounds})
    types = [m.metadata.message_type for m in grid.sent]
    silos = 2
    assert types.count("train") == rounds * silos
    assert types.count("evaluate") == silos  # only the last round's result has its own exchange
    assert [r["round"] for r in rows] == list(range(1, rounds + 1))
    assert all("test_error" in r for r in rows)


@pytest.mark.parametrize("hostile", ["malformed", "impossible", "nan"])
def test_a_hostile_folded_evaluation_is_dropped_and_the_update_kept(tmp_path: Path, hostile: str) -> None:
    """A silo's evaluation part that is malformed (no metrics), impossible (more errors than
    records) or not finite is dropped with a warning; its training update still counts, and the
    honest silo's evaluation is the round's."""
    bad: dict[str, RecordDict] = {
        "malformed": RecordDict({"metrics": MetricRecord({"nothing": 1.0})}),
        "impossible": wire.EvaluateReply(test_errors=50.0, test_count=10.0, train_loss_sum=1.0,
                                         train_count=10.0).encode(),
        "nan": wire.EvaluateReply(test_errors=1.0, test_count=10.0, train_loss_sum=float("nan"),
                                  train_count=10.0).encode(),
    }

    def hook(node: int, msg: Message, reply: Message) -> Message:
        if node != 1000 or wire.evaluation_of(reply.content) is None:
            return reply
        content = RecordDict({k: v for k, v in reply.content.items() if not k.startswith(wire.EVALUATION_PREFIX)})
        reply.content = wire.with_evaluation(content, bad[hostile])
        return reply

    _, rows, _ = run(tmp_path / "h", {"num-rounds": 3}, hook=hook)
    _, clean, _ = run(tmp_path / "c", {"num-rounds": 3})
    assert all(r["answered"] == 2 for r in rows)  # the update travelled on
    # rounds 1-2 were evaluated on the honest silo alone (its own numbers), round 3 by both
    assert rows[0]["test_error"] != clean[0]["test_error"] or rows[0]["train_loss"] != clean[0]["train_loss"]
    assert all(np.isfinite(r["test_error"]) and 0 <= r["test_error"] <= 1 for r in rows)
    assert rows[-1]["test_error"] == clean[-1]["test_error"]


def test_an_evaluation_part_nobody_asked_for_is_ignored(tmp_path: Path) -> None:
    """A silo that attaches an evaluation to a reply of the last round (whose result has an
    exchange of its own) changes nothing."""
    fake = wire.EvaluateReply(test_errors=0.0, test_count=1e6, train_loss_sum=0.0, train_count=1e6).encode()

    def hook(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "train" and wire.evaluation_of(reply.content) is None:
            reply.content = wire.with_evaluation(reply.content, fake)
        return reply

    _, rows, _ = run(tmp_path / "h", {"num-rounds": 3}, hook=hook)
    _, clean, _ = run(tmp_path / "c", {"num-rounds": 3})
    assert without_wall(rows) == without_wall(clean)
