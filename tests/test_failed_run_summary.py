"""A run that fails still writes its summary.json, with ``status`` "failed" and the reason in
``status_reason``: every reply an error, every reply missing (what a round timeout leaves), and
the rounds raising an error the ServerApp does not expect (the run still fails with that error).
The launcher reads this summary to say why the run failed (app/launch.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, Error, Message, RecordDict

import app.server_app as server_app
from app.launch import merged_run_config
from app.local_grid import InProcessGrid, run_local, simulation_nodes


def _config(tmp_path: Path, **over: Any) -> dict[str, Any]:
    return merged_run_config([]) | {"outputs-dir": str(tmp_path / "out"), "run-name": "f", "num-rounds": 2} | over


def _summary(tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "out" / "f" / "summary.json"
    assert path.is_file(), "the failed run left no summary.json"
    return json.loads(path.read_text())


def _error(node: int, msg: Message, reply: Message) -> Message:
    return Message(Error(code=0, reason="ClientApp exception: disk on fire"), reply_to=msg)


def test_every_reply_an_error_fails_the_run_with_a_summary(tmp_path: Path) -> None:
    with pytest.raises(server_app.ClientAppFailure):
        run_local(_config(tmp_path), str(tmp_path / "state"), hook=_error)
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and "disk on fire" in summary["status_reason"]


def test_every_reply_an_error_without_fail_on_client_error_is_nothing_trained(tmp_path: Path) -> None:
    with pytest.raises(server_app.NothingTrained):
        run_local(_config(tmp_path, **{"fail-on-client-error": False}), str(tmp_path / "state"), hook=_error)
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and "nothing trained" in summary["status_reason"]
    assert summary["rounds_done"] == 2


class _TimedOutGrid(InProcessGrid):
    """Every exchange ends at its timeout with no reply (the silos' actors never ran)."""

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        self.sent.extend(messages)
        return []


def test_rounds_that_time_out_fail_the_run_with_a_summary(tmp_path: Path) -> None:
    cfg = _config(tmp_path, **{"round-timeout": 1.0, "node-wait": 1.0})
    grid = _TimedOutGrid(cfg, simulation_nodes(cfg), str(tmp_path / "state"), run_id=5)
    with pytest.raises(server_app.NothingTrained):
        server_app.main(grid, Context(run_id=5, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    summary = _summary(tmp_path)
    assert summary["status"] == "failed" and "nothing trained" in summary["status_reason"]
    assert summary["dropped"]["missing"] > 0


def test_an_unexpected_error_in_the_rounds_still_writes_the_summary(tmp_path: Path) -> None:
    def broken(node: int, msg: Message, reply: Message) -> Message:
        raise OSError("the grid's socket is gone")

    with pytest.raises(OSError, match="socket is gone"):  # the run fails with the error itself
        run_local(_config(tmp_path), str(tmp_path / "state"), hook=broken)
    summary = _summary(tmp_path)
    assert summary["status"] == "failed"
    assert summary["status_reason"].startswith("OSError: the grid's socket is gone")
    assert summary["rounds_done"] == 0 and summary["silos"] == []
