"""The server's node order (strategies/node_order.py): on Flower's simulation engine the nodes are
listed by partition id, so two runs with the same seeds sample the same partitions and sum in the
same order whatever random node ids the engine drew; elsewhere (a deployment, the in-process grid)
nobody is asked and node-id order stands. An answer only ever moves a node in the list."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.app import Message, RecordDict

from app import wire
from strategies.node_order import NodeOrder, by_position, on_simulation_engine, stable_ranks
from strategies.nodes import SiloNodes
from strategies.replies import NodeRoster
from strategies.server_mechanism import DirectReplies
from tests.helpers import without_wall

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def server_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity Flower gives the ServerApp's messages (as run_simulation sets it)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_task_id", 1), ("_run_id", 7), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


class IdentityGrid:
    """Nodes with the given ids answering the identity query with the given content (a partition
    id, or a RecordDict: a refusal or anything else); every message sent is kept in ``sent``."""

    def __init__(self, answers: dict[int, int | RecordDict]) -> None:
        self.answers = answers
        self.sent: list[Message] = []

    def get_node_ids(self) -> list[int]:
        return list(self.answers)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        out = []
        for msg in messages:
            self.sent.append(msg)
            answer = self.answers[msg.metadata.dst_node_id]
            content = answer if isinstance(answer, RecordDict) else wire.identity_reply(answer)
            out.append(Message(content, reply_to=msg))
        random.Random(len(self.sent)).shuffle(out)  # arrival order is no order
        return out


def engine_ids(n: int, seed: int) -> list[int]:
    """Random 63-bit node ids, one per partition 0..n-1, as Flower's engine draws them."""
    rng = random.Random(seed)
    return [rng.getrandbits(63) for _ in range(n)]


def silo_nodes(seed: int = 5, per_round: int = 3) -> SiloNodes:
    return SiloNodes(num_silos=6, min_silos=1, silos_per_round=per_round, seed=seed, node_wait_s=0.0,
                     fail_on_client_error=False, mechanism=DirectReplies(), roster=NodeRoster(), query_timeout=1.0)


def test_the_order_follows_the_partition_ids_that_exactly_one_node_claims() -> None:
    refusal = wire.Refusal(wire.REFUSED_CONFIG, "no partition id", 0.0).encode()
    grid = IdentityGrid({50: 2, 40: 0, 30: 1, 20: refusal, 10: 9, 60: 3, 70: 3, 5: RecordDict()})
    order = NodeOrder()
    order.learn(grid, grid.get_node_ids(), num_partitions=6, timeout=1.0)
    assert order.ranks == {40: 0, 30: 1, 50: 2}
    # refused (20), out of range (10), claimed twice (60, 70), malformed (5): after, by node id
    assert order.sort(grid.get_node_ids()) == [40, 30, 50, 5, 10, 20, 60, 70]
    assert {m.metadata.message_type for m in grid.sent} == {wire.IDENTITY_QUERY}


def test_without_ranks_the_order_is_node_id_order() -> None:
    assert NodeOrder().sort([7, 3, 5]) == [3, 5, 7]
    assert stable_ranks({1: 0, 2: 0, 3: 1}) == {3: 1}


def test_replies_are_taken_in_the_order_they_were_asked_in() -> None:
    asked = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in (30, 10, 20)]
    replies = [Message(RecordDict(), reply_to=m) for m in asked]
    stray = Message(RecordDict(), dst_node_id=5, message_type="train")
    replies.append(Message(RecordDict(), reply_to=stray))
    key = by_position([30, 10, 20])
    assert [m.metadata.src_node_id for m in sorted(replies[::-1], key=key)] == [30, 10, 20, 5]


def test_on_the_engine_two_runs_with_other_node_ids_sample_the_same_partitions(monkeypatch) -> None:
    """What the engine fix is for: node ids drawn afresh, the same partitions each round."""
    import strategies.nodes as nodes_module

    def partitions_sampled(engine: bool) -> list[list[list[int]]]:
        monkeypatch.setattr(nodes_module, "on_simulation_engine", lambda grid: engine)
        sampled = []
        for run in range(2):
            partition = {node: i for i, node in enumerate(engine_ids(6, seed=run))}
            grid = IdentityGrid(partition)
            nodes = silo_nodes()
            nodes.wait_for_nodes(grid, at_start=True)
            sampled.append([[partition[n] for n in nodes.sample_nodes(grid, rnd)] for rnd in range(1, 6)])
        return sampled

    first, second = partitions_sampled(engine=True)
    assert first == second
    first, second = partitions_sampled(engine=False)  # node-id order: it depends on the ids drawn
    assert first != second


def test_off_the_engine_nobody_is_asked_and_node_id_order_stands() -> None:
    """A deployed SuperLink's (or the in-process) grid: no identity query is sent, so no node can
    choose its place (a node knowing the run seed could otherwise choose its rounds)."""
    grid = IdentityGrid({30: 0, 10: 2, 20: 1})
    nodes = silo_nodes(per_round=3)
    nodes.wait_for_nodes(grid, at_start=True)
    assert grid.sent == [] and nodes.order.ranks == {}
    assert nodes.silo_nodes(grid) == [10, 20, 30]
    assert nodes.sample_nodes(grid, 1) == [10, 20, 30]


def test_an_answer_moves_a_node_in_the_list_but_not_its_slot_or_its_chance(monkeypatch) -> None:
    """Ranks change only where a node stands: its roster slot (every per-silo weight and state) is
    still the server's own, and every silo is sampled in the same share of rounds whatever it
    claims (M_r is uniform over positions)."""
    import strategies.nodes as nodes_module

    monkeypatch.setattr(nodes_module, "on_simulation_engine", lambda grid: True)
    rounds, share = 3000, {}
    for claims in ({10: 0, 20: 1, 30: 2, 40: 3, 50: 4, 60: 5}, {10: 5, 20: 4, 30: 3, 40: 2, 50: 1, 60: 0}):
        grid = IdentityGrid(claims)
        nodes = silo_nodes(seed=11, per_round=2)
        nodes.wait_for_nodes(grid, at_start=True)
        assert nodes.roster.slots == {10: 0, 20: 1, 30: 2, 40: 3, 50: 4, 60: 5}
        counts = dict.fromkeys(claims, 0)
        for rnd in range(1, rounds + 1):
            for n in nodes.sample_nodes(grid, rnd):
                counts[n] += 1
        share[tuple(claims.values())] = {n: c / rounds for n, c in counts.items()}
    for frequencies in share.values():  # M/N = 1/3 each: 3000 draws, 5 standard deviations ~ 0.043
        assert all(abs(f - 1 / 3) < 0.043 for f in frequencies.values()), frequencies


def test_only_flowers_simulation_grid_counts_as_the_engine() -> None:
    from flwr.superlink.grid import InMemoryGrid

    from app.federation import EngineWatchGrid
    from strategies.messaging import ExchangeGrid

    engine = object.__new__(InMemoryGrid)  # no link state needed: only its type is looked at
    assert on_simulation_engine(engine)
    assert on_simulation_engine(ExchangeGrid(EngineWatchGrid(engine, 0, None)))
    assert not on_simulation_engine(ExchangeGrid(IdentityGrid({1: 0})))
    assert not on_simulation_engine(IdentityGrid({1: 0}))


@pytest.mark.slow
def test_two_engine_runs_with_fixed_seeds_write_the_same_rounds(tmp_path: Path) -> None:
    """Two federations on Flower's simulation engine (fresh random node ids each), 6 iid silos, 3
    sampled per round, the same seeds: the same rounds.jsonl but for wall_s, and the same as the
    in-process grid's one-silo-at-a-time path (node ids 1000 + i). Before the node order, the
    engine sampled other partitions each run (other eps_max, test_error)."""
    code = f"""
import json
from app.launch import merged_run_config
from app.federation import run_federation, run_in_process
base = merged_run_config([]) | {{"num-silos": 6, "partition": "iid", "silos-per-round": 3, "num-rounds": 3,
                                 "seed": 7, "outputs-dir": {str(tmp_path)!r}}}
out = [run_federation(base | {{"run-name": "engine" + str(i)}}, warm=True)["rounds_rows"] for i in range(2)]
out.append(run_in_process(base | {{"run-name": "local"}}, batched=False)["rounds_rows"])
print("RESULT " + json.dumps(out))
"""
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    first, second, local = (without_wall(rows) for rows in json.loads(proc.stdout.split("RESULT ", 1)[1]))
    assert len(first) == 3
    assert first == second
    assert first == local
