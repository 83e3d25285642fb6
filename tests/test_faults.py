"""Faults as the paper assumes them (Assumption 6: M_r of the N silos available in round r).

The real ServerApp against an in-process grid that speaks the push/pull half of Flower's Grid
API (as a deployed SuperLink does), so the server's own exchange loop (strategies/messaging.py)
is what runs. Flower's reply for a node that is gone is built with Flower's own function: an
error whose source is the SuperLink, not the node."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

import app.server_app as server_app
from app.launch import merged_run_config
from app.local_grid import InProcessGrid
from app.results import load_rounds
from strategies.nodes import TooFewSilos


class PushPullGrid(InProcessGrid):
    """InProcessGrid behind Flower's push_messages / pull_messages: replies come back by the
    instruction's message id; ``visible`` limits the nodes get_node_ids reports."""

    def __init__(self, *args: Any, visible: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.visible = visible
        self.pending: dict[str, Message] = {}

    def get_node_ids(self) -> list[int]:
        return self.node_ids[: self.visible] if self.visible is not None else list(self.node_ids)

    def push_messages(self, messages: list[Message]) -> list[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg.object_id
            (reply,) = super().send_and_receive([msg])
            reply.metadata.__dict__["_reply_to_message_id"] = msg.metadata.message_id
            self.pending[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: set[str]) -> list[Message]:
        return [self.pending.pop(i) for i in list(message_ids) if i in self.pending]


def _run(tmp_path: Path, overrides: dict[str, Any], hook=None, visible: int | None = None) -> tuple[dict, list]:
    cfg = merged_run_config([]) | {"outputs-dir": str(tmp_path / "out"), "run-name": "f", "eval-every": 0} | overrides
    grid = PushPullGrid(cfg, 2, str(tmp_path / "state"), run_id=1, hook=hook, visible=visible)
    try:
        server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    finally:
        out = tmp_path / "out" / "f"
    return json.loads((out / "summary.json").read_text()), load_rounds(out / "rounds.jsonl")


def test_a_gone_node_is_a_dropped_silo_credited_to_it_not_a_client_error(tmp_path: Path, caplog) -> None:
    """Round 2: Flower answers for node 1001 with its node-unavailable error (source: the
    SuperLink). The round goes on with M_r = 1, the row counts it missing, the log names node
    1001, and the run is not failed (before: a ClientApp failure of node 1, the run failed)."""

    def gone(node: int, msg: Message, reply: Message) -> Message:
        if node == 1001 and msg.metadata.message_type == "train" and int(msg.content["config"]["round"]) == 2:
            err = create_message_error_unavailable_res_message(msg.metadata, "node_unavail")
            assert err.metadata.src_node_id == SUPERLINK_NODE_ID
            return err
        return reply

    with caplog.at_level(logging.WARNING):
        summary, rows = _run(tmp_path, {"num-rounds": 3}, hook=gone)
    assert summary["status"] == "completed" and summary["client_errors"] == []
    assert summary["unavailable_replies"] == 1
    assert [(r["answered"], r["missing"], r["failed"]) for r in rows] == [(2, 0, 0), (1, 1, 0), (2, 0, 0)]
    assert any("node 1001 (train)" in rec.getMessage() and "unavailable" in rec.getMessage()
               for rec in caplog.records)


def test_a_run_goes_on_with_the_silos_present_down_to_min_silos(tmp_path: Path) -> None:
    """One of two silo nodes never connects: after node-wait the run goes on with M_r = 1."""
    summary, rows = _run(tmp_path, {"num-rounds": 2, "node-wait": 0.3}, visible=1)
    assert summary["status"] == "completed"
    assert [(r["sampled"], r["answered"]) for r in rows] == [(1, 1), (1, 1)]


def test_below_min_silos_the_run_fails_with_its_reason_and_outputs(tmp_path: Path) -> None:
    with pytest.raises(TooFewSilos, match="min-silos = 2"):
        _run(tmp_path, {"num-rounds": 2, "node-wait": 0.3, "min-silos": 2}, visible=1)
    summary = json.loads((tmp_path / "out" / "f" / "summary.json").read_text())
    assert summary["status"] == "failed" and "only 1 silo node(s) connected" in summary["status_reason"]
    assert summary["rounds_done"] == 0


def test_the_server_app_validates_the_run_config_before_round_one(tmp_path: Path) -> None:
    """A direct `flwr run` skips the launcher's pre-flight; the ServerApp's own check gives the
    same one-line error before anything is sent."""
    from app.config import ConfigError

    cfg = merged_run_config([]) | {"outputs-dir": str(tmp_path / "out"), "batch-size": 100000}
    grid = PushPullGrid(cfg, 2, str(tmp_path / "state"))
    with pytest.raises(ConfigError, match="batch-size = 100000 is out of range"):
        server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    assert grid.sent == []
