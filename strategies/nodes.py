"""The silo nodes of a run: waiting for them, sampling each round's M_r, telling a node that is
gone (a dropped silo, the paper's Assumption 6) from a ClientApp failure. Held by
:class:`~strategies.loop.FederatedOptimizer` (``self.nodes``); which nodes are silos is the
privacy mechanism's to say (strategies/server_mechanism.py: all, or all but the shuffler)."""

from __future__ import annotations

import time
from logging import WARNING
from typing import TYPE_CHECKING

from flwr.app import Message
from flwr.common import log
from flwr.serverapp import Grid

from app import wire
from app.seeding import np_rng
from strategies.messaging import is_unavailable
from strategies.node_order import NodeOrder, on_simulation_engine

if TYPE_CHECKING:
    from strategies.replies import NodeRoster
    from strategies.server_mechanism import ServerMechanism


class TooFewSilos(RuntimeError):
    """Fewer than min-silos silo nodes are connected, after waiting node-wait seconds."""


class ClientAppsFailed(RuntimeError):
    """With fail-on-client-error, a round in which a ClientApp failed ends the run: the run is
    failed anyway, and the failure (a node without the device asked for, data it cannot read)
    would repeat every round while the other silos spend their privacy budgets."""


class SiloNodes:
    """The run's silo nodes: N = ``num_silos`` expected, at least ``min_silos`` needed, M =
    ``silos_per_round`` sampled each round from (``seed``, round), waiting at most ``node_wait_s``;
    ``mechanism`` says which nodes are silos, ``roster`` gives each silo its slot, ``order`` lists
    the nodes (strategies/node_order.py: on Flower's simulation engine by partition id, learned
    with one identity query of ``query_timeout`` seconds when the nodes first connect; elsewhere
    by node id). It keeps the ClientApp failures (``client_errors``) and the replies of nodes
    that were gone (``unavailable``)."""

    def __init__(self, *, num_silos: int, min_silos: int, silos_per_round: int, seed: int, node_wait_s: float,
                 fail_on_client_error: bool, mechanism: ServerMechanism, roster: NodeRoster,
                 query_timeout: float = 600.0) -> None:
        self.num_silos, self.min_silos, self.silos_per_round = num_silos, min_silos, silos_per_round
        self.seed, self.node_wait_s, self.fail_on_client_error = seed, node_wait_s, fail_on_client_error
        self.mechanism, self.roster, self.query_timeout = mechanism, roster, query_timeout
        self.order = NodeOrder()
        self.client_errors: list[str] = []
        #: replies Flower gave for nodes that were gone (dropped silos, not ClientApp failures)
        self.unavailable = 0

    def stop_on_new_failures(self, rnd: int, failures_before: int) -> None:
        """ClientAppsFailed when fail-on-client-error is set and round ``rnd`` added ClientApp
        failures to ``client_errors`` (which held ``failures_before`` when the round began)."""
        new = self.client_errors[failures_before:]
        if self.fail_on_client_error and new:
            raise ClientAppsFailed(f"round {rnd}: {len(new)} ClientApp failure(s), the run is stopped "
                                   f"(fail-on-client-error = true); first: {new[0]}")

    def silo_nodes(self, grid: Grid) -> list[int]:
        """The connected nodes that are silos (all but the shuffler in shuffle mode), in ``order``."""
        return self.mechanism.silo_nodes(self.order.sort(grid.get_node_ids()))

    def sample_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """M_r = min(M, connected) of the connected silo nodes, uniformly without replacement,
        from (seed, round): the paper's Assumption 3 over the silos available (Assumption 6). The
        draw picks positions in ``order``, so the node order decides which silo a position is, never
        how likely a silo is to be picked; the chosen ones are returned in ``order``."""
        nodes = self.mechanism.silo_nodes(self.order.sort(self.wait_for_nodes(grid)))
        m = min(self.silos_per_round, len(nodes))
        if m < self.silos_per_round:
            log(WARNING, "round %d: %d silo node(s) connected; asking %d instead of silos-per-round = %d",
                server_round, len(nodes), m, self.silos_per_round)
        rng = np_rng(self.seed, "server-sampling", server_round)
        chosen = rng.choice(len(nodes), size=m, replace=False)
        return [nodes[i] for i in sorted(chosen)]

    def connected(self, grid: Grid) -> tuple[list[int], int]:
        """(the connected nodes, how many of them are silos)."""
        nodes = list(grid.get_node_ids())
        return nodes, self.mechanism.silo_count(nodes)

    def wait_for_nodes(self, grid: Grid, at_start: bool = False) -> list[int]:
        """The connected nodes (added to the roster). At the start: wait up to node-wait seconds
        for all num-silos silo nodes (and the shuffler in shuffle mode), then go on with those
        present if they are at least min-silos. In a round: wait only while fewer than
        min-silos are connected. :class:`TooFewSilos` when min-silos are not there in time. At the
        start on Flower's simulation engine, the nodes' order is learned (:meth:`NodeOrder.learn`)."""
        deadline = time.monotonic() + self.node_wait_s
        want = self.num_silos if at_start else self.min_silos
        shuffler = self.mechanism.helper_nodes  # shuffle DP: and the shuffler
        while True:
            nodes, silos = self.connected(grid)
            if silos >= want and len(nodes) >= silos + shuffler:
                break
            if time.monotonic() > deadline:
                if silos >= self.min_silos and len(nodes) >= silos + shuffler:
                    log(WARNING, "%d of %d silo nodes connected after %.0f s; going on with them (min-silos = %d)",
                        silos, self.num_silos, self.node_wait_s, self.min_silos)
                    break
                raise TooFewSilos(
                    f"only {silos} silo node(s){' and no shuffler' if shuffler and len(nodes) <= silos else ''} "
                    f"connected after waiting {self.node_wait_s:.0f} s (node-wait); the run needs at least "
                    f"min-silos = {self.min_silos} of num-silos = {self.num_silos}")
            time.sleep(0.2)
        if at_start and on_simulation_engine(grid):
            self.order.learn(grid, nodes, self.num_silos, self.query_timeout, helpers=shuffler)
        self.roster.add(self.mechanism.silo_nodes(nodes))
        return nodes

    def client_error(self, msg: Message, what: str) -> str:
        """Record an error reply: a node that is gone is a dropped silo (logged), anything
        else a ClientApp failure (``client_errors``; fails the run with fail-on-client-error)."""
        if msg.has_error():
            reason = (msg.error.reason or "").strip().splitlines()
        else:  # a silo-error refusal (app/refusal.py): the silo failed and said only that
            found = wire.refusal_of(msg.content)
            reason = [f"{found[0]}: {found[1]}"] if found else []
        short = reason[-1] if reason else f"error code {msg.error.code}"
        text = f"node {msg.metadata.src_node_id} ({what}): {short}"
        if is_unavailable(msg):
            self.unavailable += 1
            log(WARNING, "node unavailable, counted as a dropped silo: %s", text)
            return text
        self.client_errors.append(text)
        log(WARNING, "ClientApp failure: %s", text)
        return text
