"""The engine's message index (app.runtime.engine_patches.index_engine_messages) against Flower
1.42's own ``vce_api.add_messages_to_queue`` on the same link state: the same instructions handed
to the workers' queue in the same order, the same ones marked delivered, the same expired ones
deleted; and skipped with a RuntimeWarning when Flower's code is not the code it was checked on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path
from queue import Queue
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, MessageType, RecordDict  # noqa: E402
from flwr.common.constant import SUPERLINK_NODE_ID  # noqa: E402
from flwr.proto.task_pb2 import Task  # noqa: E402
from flwr.server.superlink.fleet.vce import vce_api  # noqa: E402
from flwr.server.superlink.linkstate import LinkStateFactory, in_memory_linkstate  # noqa: E402
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState, RunRecord  # noqa: E402
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID  # noqa: E402
from flwr.supercore.object_store import ObjectStoreFactory  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from flwr.superlink.federation import NoOpFederationManager  # noqa: E402

from app.runtime import engine_patches  # noqa: E402
from tests.helpers import without_wall  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

class Clock:
    """The link state's clock (``in_memory_linkstate.now``), moved by the test from ``t0`` (the
    real time when it was made: Flower checks a new message's TTL against the real clock)."""

    def __init__(self) -> None:
        self.t0 = self.t = datetime.now(timezone.utc)

    def __call__(self) -> datetime:
        return self.t


class Sweeps:
    """A stop event that lets ``add_messages_to_queue`` run ``n`` sweeps (its wait ends one)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def is_set(self) -> bool:
        return self.left <= 0

    def wait(self, timeout: float) -> bool:
        self.left -= 1
        return self.is_set()


RUN_ID = 7


@pytest.fixture()
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The link state's clock, and the ServerApp's identity new messages take (as run_simulation sets it)."""
    for name, value in (("_task_id", 1), ("_run_id", RUN_ID), ("_node_id", SUPERLINK_NODE_ID)):
        monkeypatch.setattr(TaskIdentity, name, value)
    c = Clock()
    monkeypatch.setattr(in_memory_linkstate, "now", c)
    return c


@pytest.fixture()
def loops(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(Flower's add_messages_to_queue, the indexed one); this process's engine loop is restored after."""
    for key, value in engine_patches._ENGINE_LOOP.items():
        monkeypatch.setitem(engine_patches._ENGINE_LOOP, key, value)
    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)
    flower = engine_patches._flower_loop(vce_api)
    assert engine_patches._source_sha256(flower) == engine_patches.INDEX_SOURCE_SHA256["add_messages_to_queue"]
    engine_patches.fast_poll(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # applied on this Flower, without a warning
        assert engine_patches.index_engine_messages(True)
    indexed = vce_api.add_messages_to_queue
    assert indexed is not flower and indexed._silofl_index
    return flower, indexed


class Federation:
    """A simulation's link state (as flwr.simulation.run_simulation builds it) with ``nodes``
    virtual SuperNodes; instructions are named by ``(partition, tag)``."""

    def __init__(self, nodes: int) -> None:
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
        self.state: InMemoryLinkState = factory.state()  # type: ignore[assignment]
        assert type(self.state) is InMemoryLinkState
        self.run = Run.create_empty(run_id=RUN_ID)
        self.run.primary_task_id, self.run.federation_id = 11, NOOP_FEDERATION_ID
        self.state.run_ids[self.run.run_id] = RunRecord(run=self.run)
        self.state.task_store[11] = Task(task_id=11, run_id=self.run.run_id)
        self.mapping = vce_api._register_nodes(nodes, factory)  # node id -> partition, in partition order
        self.node_of = {p: n for n, p in self.mapping.items()}
        self.partition_of = dict(self.mapping)

    def push(self, partition: int, tag: int, created: datetime, ttl: float) -> None:
        msg = Message(RecordDict({"config": ConfigRecord({"tag": tag})}), dst_node_id=self.node_of[partition],
                      message_type=MessageType.TRAIN, ttl=ttl)
        msg.metadata.__dict__["_message_id"] = f"m{tag}"
        msg.metadata.created_at = created.timestamp()
        assert self.state.store_message_ins(msg) == f"m{tag}"

    def name(self, msg: Message) -> tuple[int, int]:
        return self.partition_of[msg.metadata.dst_node_id], int(msg.content.config_records["config"]["tag"])

    def stored(self) -> list[tuple[tuple[int, int], str]]:
        """Every stored instruction in store order, with its delivered-at."""
        return [(self.name(m), m.metadata.delivered_at) for m in self.state.message_ins_store.values()]

    def sweep(self, loop: Any, mapping: dict[int, int], n: int = 1) -> list[tuple[int, int]]:
        queue: Queue[Message] = Queue()
        loop(self.state, queue, mapping, Sweeps(n))
        return [self.name(queue.get_nowait()) for _ in range(queue.qsize())]


def scenario(seed: int, nodes: int, clock: Clock) -> list[tuple[Federation, dict[int, int]]]:
    """Two identical federations (one per loop) with a random mix of instructions: several per
    node, to nodes outside the engine's mapping, some already delivered, some whose TTL runs out."""
    rng = np.random.default_rng(seed)
    plan = []
    for tag in range(int(rng.integers(nodes, 4 * nodes))):
        partition = int(rng.integers(0, nodes))
        created = clock.t0 - timedelta(seconds=float(rng.uniform(0.0, 3.0)))
        ttl = float(rng.choice([5.0, 9.0, 3600.0]))  # 5 s and 9 s: expire during the sweeps below
        plan.append((partition, tag, created, ttl))
    served = sorted(int(p) for p in rng.choice(nodes, size=max(1, nodes * 3 // 4), replace=False))
    early = [int(p) for p in rng.choice(nodes, size=nodes // 3, replace=False)]
    out = []
    for _ in range(2):
        clock.t = clock.t0
        fed = Federation(nodes)
        for partition, tag, created, ttl in plan:
            fed.push(partition, tag, created, ttl)
        for p in early:  # delivered before the engine's sweeps (the ServerApp's own pull path)
            fed.state.get_message_ins(node_id=fed.node_of[p], limit=1)
        order = list(rng.permutation(served)) if not out else out[0][2]
        out.append((fed, {fed.node_of[p]: p for p in order}, order))
    return [(fed, mapping) for fed, mapping, _ in out]


@pytest.mark.parametrize("seed", range(8))
def test_the_index_hands_out_what_flowers_loop_does(seed: int, clock: Clock, loops: tuple[Any, Any]) -> None:
    flower, indexed = loops
    (a, map_a), (b, map_b) = scenario(seed, nodes=12 + 5 * seed, clock=clock)
    assert [a.partition_of[n] for n in map_a] == [b.partition_of[n] for n in map_b]
    assert a.stored() == b.stored()
    before = len(a.stored())
    for step in range(6):  # the clock moves: messages expire between sweeps
        clock.t = clock.t0 + timedelta(seconds=3.0 * step)
        got_a, got_b = a.sweep(flower, map_a), b.sweep(indexed, map_b)
        assert got_a == got_b, f"sweep {step}"
        assert a.stored() == b.stored(), f"store after sweep {step}"
    assert any(d for _, d in a.stored()) and len(a.stored()) < before  # some delivered, some expired


def test_every_node_served_leaves_later_expired_messages_where_flower_does(clock: Clock, loops: tuple[Any, Any]) -> None:
    """Flower's per-node scans stop at each node's first instruction; messages past the last one
    are not checked in that sweep (expired or not), and the index stops at the same place."""
    flower, indexed = loops
    feds = []
    for _ in range(2):
        clock.t = clock.t0
        fed = Federation(5)
        for p in range(5):
            fed.push(p, p, clock.t0, 3600.0)
        fed.push(2, 10, clock.t0, 5.0)  # expired at the sweeps, behind every node's instruction
        fed.push(0, 11, clock.t0, 3600.0)
        feds.append(fed)
    a, b = feds
    clock.t = clock.t0 + timedelta(seconds=10)
    assert a.sweep(flower, a.mapping) == b.sweep(indexed, b.mapping) == [(p, p) for p in range(5)]
    assert a.stored() == b.stored() and (2, 10) in [name for name, _ in a.stored()]
    assert a.sweep(flower, a.mapping) == b.sweep(indexed, b.mapping) == [(0, 11)]
    assert a.stored() == b.stored() and (2, 10) not in [name for name, _ in a.stored()]  # now scanned: gone


def test_several_sweeps_in_a_row_and_node_order(clock: Clock, loops: tuple[Any, Any]) -> None:
    """One instruction per node per sweep, in the engine's node order (not the store's)."""
    flower, indexed = loops
    feds = []
    for _ in range(2):
        fed = Federation(4)
        for tag, p in enumerate([3, 3, 1, 0, 3, 2, 1]):
            fed.push(p, tag, clock.t0, 3600.0)
        feds.append(fed)
    a, b = feds
    reverse_a = {a.node_of[p]: p for p in (3, 2, 1, 0)}
    reverse_b = {b.node_of[p]: p for p in (3, 2, 1, 0)}
    got = a.sweep(flower, reverse_a, n=3)
    assert got == b.sweep(indexed, reverse_b, n=3)
    assert got == [(3, 0), (2, 5), (1, 2), (0, 3), (3, 1), (1, 6), (3, 4)]
    assert a.stored() == b.stored()


def test_a_state_other_than_flowers_in_memory_one_gets_flowers_calls(clock: Clock, loops: tuple[Any, Any]) -> None:
    _, indexed = loops
    fed = Federation(3)
    calls = []

    class Counting(InMemoryLinkState):
        def get_message_ins(self, node_id: int, limit: int | None, *, run_id: int | None = None) -> list[Message]:
            calls.append(node_id)
            return super().get_message_ins(node_id, limit, run_id=run_id)

    fed.state.__class__ = Counting
    for p in range(3):
        fed.push(p, p, clock.t0, 3600.0)
    assert fed.sweep(indexed, fed.mapping) == [(0, 0), (1, 1), (2, 2)]
    assert calls == list(fed.mapping)


def test_skipped_with_a_warning_when_flowers_code_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in engine_patches._ENGINE_LOOP.items():
        monkeypatch.setitem(engine_patches._ENGINE_LOOP, key, value)
    engine_patches.fast_poll(0)
    engine_patches.index_engine_messages(False)
    flower = vce_api.add_messages_to_queue

    def add_messages_to_queue(state: Any, queue: Any, nodes_mapping: Any, f_stop: Any) -> None:
        """A later Flower's loop (not the code the index was checked on)."""

    monkeypatch.setattr(vce_api, "add_messages_to_queue", add_messages_to_queue)
    with pytest.warns(RuntimeWarning, match="add_messages_to_queue is not the code"):
        assert not engine_patches.index_engine_messages(True)
    assert vce_api.add_messages_to_queue is add_messages_to_queue
    monkeypatch.setattr(vce_api, "add_messages_to_queue", flower)
    monkeypatch.setitem(engine_patches.INDEX_SOURCE_SHA256, "InMemoryLinkState.get_message_ins", "0" * 16)
    with pytest.warns(RuntimeWarning, match="get_message_ins is not the code"):
        assert not engine_patches.index_engine_messages(True)
    assert vce_api.add_messages_to_queue is flower


def test_on_by_default_and_off_with_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in engine_patches._ENGINE_LOOP.items():
        monkeypatch.setitem(engine_patches._ENGINE_LOOP, key, value)
    monkeypatch.setattr(vce_api, "add_messages_to_queue", vce_api.add_messages_to_queue)
    engine_patches.fast_poll(0)
    engine_patches.index_engine_messages(False)  # on if the ClientApp was imported in this process
    flower = vce_api.add_messages_to_queue
    assert flower is engine_patches._flower_loop(vce_api)
    monkeypatch.delenv(engine_patches.ENGINE_INDEX_ENV, raising=False)
    assert engine_patches.index_engine_messages()
    assert vce_api.add_messages_to_queue._silofl_index and vce_api.add_messages_to_queue._silofl_poll_s == 0.1
    assert engine_patches.fast_poll(0.005)  # both: one loop
    assert vce_api.add_messages_to_queue._silofl_index and vce_api.add_messages_to_queue._silofl_poll_s == 0.005
    monkeypatch.setenv(engine_patches.ENGINE_INDEX_ENV, "0")
    assert not engine_patches.index_engine_messages()
    assert not vce_api.add_messages_to_queue._silofl_index
    engine_patches.fast_poll(0)
    assert vce_api.add_messages_to_queue is flower  # Flower's own function back


@pytest.mark.slow
def test_a_federation_computes_the_same_with_and_without_the_index(tmp_path: Path) -> None:
    """Two federations of silofl's apps on one warm engine, Flower's loop then the index (on by
    default in run_federation): rounds.jsonl is the same but for wall_s."""
    code = f"""
import json, os
from app.launch import merged_run_config
from app.federation import run_federation
from flwr.server.superlink.fleet.vce import vce_api
out = {{}}
for index in ("0", "1"):
    os.environ["SILOFL_ENGINE_INDEX"] = index
    cfg = merged_run_config([]) | {{"num-rounds": 3, "outputs-dir": {str(tmp_path)!r},
                                   "run-name": "index" + index}}
    out[index] = [run_federation(cfg, warm=True)["rounds_rows"],
                  getattr(vce_api.add_messages_to_queue, "_silofl_index", False)]
print("RESULT " + json.dumps(out))
"""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(proc.stdout.split("RESULT ", 1)[1])
    (flower, off), (indexed, on) = rows["0"], rows["1"]
    assert not off and on
    assert without_wall(flower) == without_wall(indexed) and len(indexed) == 3
