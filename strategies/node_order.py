"""The order in which the server lists its nodes: the order M_r is sampled from, instructions are
sent in and replies are summed in.

By default, Flower's node ids ascending. A deployed SuperLink gives each SuperNode its id; a node
cannot choose where it stands. Flower's simulation engine, though, draws a fresh random id for each
virtual SuperNode in every run, so node-id order, and with it which data partitions a seeded
sample picks and the order of the aggregate's float sums, changed from run to run. On the engine
(:func:`on_simulation_engine`: the ServerApp's grid is Flower's ``InMemoryGrid``, whose nodes are
virtual SuperNodes of this app with the partition-id the engine gives them) the server asks each
node once for its partition-id (``wire.IDENTITY_QUERY``, the attack harness's question) and lists
the nodes by it, so a simulation with fixed seeds is reproducible there as on the in-process grid.

What an answer can change: only a node's place in the list. Never its weight (weights come from
the server's own roster, strategies/replies.py) and never its chance of being sampled (M_r is a
uniformly random subset of the positions, so every listed silo is sampled with probability M/N
in every order). A node that refuses, answers a malformed or out-of-range id, or claims the id
another node claims too, is listed after the ones that answered, by node id. On any other grid (a
deployment, the in-process grid whose node ids 1000 + i already follow the partitions) nobody is
asked: there a node that could choose its place, knowing the run seed, could choose the rounds it
is sampled in (and a coalition, to be sampled together), which it cannot do with ids it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

from flwr.app import Message, RecordDict
from flwr.common import log


def on_simulation_engine(grid: Any) -> bool:
    """Whether ``grid`` is, or wraps (through ``_grid`` attributes, as silofl's grid wrappers
    do), Flower's simulation engine's ``InMemoryGrid``."""
    from flwr.superlink.grid import InMemoryGrid

    seen: set[int] = set()
    while grid is not None and id(grid) not in seen:
        if isinstance(grid, InMemoryGrid):
            return True
        seen.add(id(grid))
        grid = vars(grid).get("_grid") if hasattr(grid, "__dict__") else None
    return False


def stable_ranks(claims: Mapping[int, int]) -> dict[int, int]:
    """node -> its claimed partition id, keeping only the ids exactly one node claims."""
    counts: dict[int, int] = {}
    for part in claims.values():
        counts[part] = counts.get(part, 0) + 1
    return {node: part for node, part in claims.items() if counts[part] == 1}


class NodeOrder:
    """The server's order of nodes: those with a rank (a unique partition id learned on the
    simulation engine) by rank, then the others by node id. Without ranks: node-id order."""

    def __init__(self) -> None:
        #: node id -> rank (its partition id); empty: node-id order
        self.ranks: dict[int, int] = {}

    def key(self, node: int) -> tuple[int, int]:
        """The sort key of ``node``: (0, rank) when it has one, else (1, node id)."""
        rank = self.ranks.get(int(node))
        return (0, rank) if rank is not None else (1, int(node))

    def sort(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` in this order."""
        return sorted(nodes, key=self.key)

    def learn(self, grid: Any, nodes: Iterable[int], num_partitions: int, timeout: float, helpers: int = 0) -> None:
        """Ask ``nodes`` for their partition ids (one identity query each) and rank them by the
        valid, unique answers (:func:`stable_ranks`); nodes that refuse or fail keep node-id order.
        ``helpers``: nodes expected to have no partition (the shuffler); more unranked ones are
        logged as a warning (the run is then not reproducible on the engine)."""
        from app import wire  # (here: the wire loads torch, which ordering alone does not need)

        asked = sorted(int(n) for n in nodes)
        msgs = [Message(RecordDict(), dst_node_id=n, message_type=wire.IDENTITY_QUERY) for n in asked]
        claims: dict[int, int] = {}
        for reply in grid.send_and_receive(msgs, timeout=timeout):
            node = reply.metadata.src_node_id
            if node not in asked or node in claims or reply.has_error():
                continue
            try:
                claims[node] = wire.read_identity(reply.content, num_partitions)
            except wire.ReplyError:  # a refusal (e.g. the shuffler's) or a malformed answer
                continue
        self.ranks = stable_ranks(claims)
        unranked = len(asked) - len(self.ranks)
        log(INFO if unranked <= helpers else WARNING,
            "node order: %d of %d node(s) listed by partition id, %d by node id", len(self.ranks), len(asked),
            unranked)


def by_position(order: Iterable[int]) -> Any:
    """A sort key for replies: their source's position in ``order`` (the nodes as they were asked,
    which is :class:`NodeOrder`'s order), then node id for a source not in it."""
    rank = {int(n): i for i, n in enumerate(order)}
    last = len(rank)
    return lambda msg: (rank.get(int(msg.metadata.src_node_id), last), int(msg.metadata.src_node_id))
