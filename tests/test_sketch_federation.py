"""Sketched updates in the federation: the silo compresses its noised update with the broadcast
seed, the server lifts it with the same S."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, Message

from app import wire
from app.sketch_settings import SKETCH_KINDS

D = 30 * 5 + 5 + 5 * 2 + 2  # MLP 30-5-2


@pytest.mark.parametrize("private", [False, True])
def test_srht_half_learns(federation, private: bool) -> None:
    cfg = {"sketch.kind": "srht", "sketch.ratio": 0.5} | ({} if private else {"privacy.mode": "off"})
    summary, rows, _ = federation(cfg)
    assert summary["status"] == "completed" and summary["dropped"]["malformed"] == 0
    assert summary["test_error"] < 0.15
    # layer-wise k = 84 of n = 167 floats per silo per round; G(t) counts k/n per upload
    assert all(r["uplink_floats"] == 2 * 84 for r in rows)
    assert rows[-1]["uploads_G"] == pytest.approx(25 * 2 * 84 / D)


@pytest.mark.parametrize("kind", [k for k in SKETCH_KINDS if k != "none"])
def test_every_kind_round_trips_through_the_federation(federation, kind: str) -> None:
    summary, rows, _ = federation({"sketch.kind": kind, "num-rounds": 2, "eval-every": 0, "privacy.mode": "off"})
    assert [r["answered"] for r in rows] == [2, 2] and rows[0]["uplink_floats"] < 2 * D + 1


@pytest.mark.parametrize("bad", ["short", "nan"])
def test_bad_sketch_payload_is_dropped(federation, bad: str) -> None:
    def corrupt(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "train" and node == 1000:
            payload = reply.content[wire.UPDATE][wire.SKETCH].numpy().copy()
            if bad == "short":
                payload = payload[:-1]
            else:
                payload[3] = np.inf
            reply.content[wire.UPDATE][wire.SKETCH] = Array(payload)
        return reply

    summary, rows, _ = federation({"sketch.kind": "srht", "num-rounds": 2, "eval-every": 0}, hook=corrupt)
    assert [r["malformed"] for r in rows] == [1, 1] and [r["answered"] for r in rows] == [1, 1]


def test_powersgd_learns_with_per_silo_state(federation) -> None:
    """PowerSGD at k/n = 0.5 (rank 2 for the 5x30 layer): each silo keeps its warm start and error
    buffer across rounds; the server only multiplies P Q^T back."""
    summary, rows, _ = federation({"sketch.kind": "powersgd", "sketch.ratio": 0.5, "privacy.mode": "off"})
    assert summary["status"] == "completed" and summary["dropped"]["malformed"] == 0
    assert summary["test_error"] < 0.15
    # rank 2 for the 5x30 layer (P, Q: (5 + 30) * 2), rank 1 for the 2x5 one ((2 + 5) * 1), biases as is
    assert rows[0]["uplink_floats"] == 2 * ((5 + 30) * 2 + 5 + (2 + 5) * 1 + 2)
    from app.client_app import _SILOS

    states = [s.mechanism.powersgd_state for s in _SILOS.values() if s.mechanism.powersgd_state is not None]
    assert states and all(st.q and st.error for st in states)  # warm start and error feedback kept
