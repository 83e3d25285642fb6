"""The server's part in shuffle DP: find the shuffler, relay sealed contributions, debias totals.

The server never holds a plaintext encoding. Once, before round 1, it asks every node for its
role and public key (:data:`~app.wire.KEYS_QUERY`): exactly one node must be the shuffler; the
others are silos with sender keys. Each exchange it sends the sampled silos the shuffler's key
(an :class:`~app.wire.ShuffleTicket`), collects their :class:`~app.wire.SealedReply` blobs (an
invalid, refused or failed reply counts as a dropped silo), relays them to the shuffler in one
:class:`~app.wire.ShuffleRequest`, and gets back only the per-coordinate totals, the number of
records and of noise trials. The analyzer (app/privacy/shuffle.py) turns them into the mean of
the records' rows, which the optimiser steps with as it would with the mean of Gaussian releases.
A debiased mean outside the bound every honest one obeys (R + (2R/g) t / N per coordinate,
:func:`~app.privacy.shuffle.honest_mean_limit`) is never applied: the exchange is dropped.

In a simulation the silos take the shuffler's key from the server and the shuffler takes the
silo keys from it; a deployment pins both in the nodes' configs (docs/privacy.md), so that a
server substituting its own key, or injecting its own "contributions", gets nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from app import wire
from app.algorithms import Phase
from app.privacy.settings import ShuffleSettings
from app.privacy.shuffle import ShuffleCode, debias, honest_mean_limit, row_bound
from strategies.messaging import query_keys
from strategies.replies import Updates, check_bounded, sort_replies


class ShuffleRelay:
    """The binomial shuffle's server half (strategies/server_mechanism.py): the shuffler node's id
    and key, the silos' sender keys, and the exchange counter. ``clip``, ``diff_clip``: the
    per-record bounds R of the releases' rows (app/privacy/shuffle.py ``row_bound``)."""

    helper_nodes = 1
    folds_evaluation = False
    under_flower_start = False

    def __init__(self, shuffle: ShuffleSettings, clip: float, diff_clip: float,
                 client_error: Callable[[Message, str], str]) -> None:
        self.shuffle = shuffle
        self.layout: Mapping[str, tuple[int, ...]] = {}
        self.dim = 0
        self.levels = 0
        self.p = shuffle.p
        self.clip, self.diff_clip = clip, diff_clip
        self.client_error = client_error
        self.shuffler: int | None = None
        self.shuffler_key = ""
        self.silo_keys: dict[int, str] = {}
        self.exchanges = 0
        #: the shuffler's reason when it refused the last relayed sum ("" otherwise)
        self.refusal = ""

    def bind(self, layout: Mapping[str, tuple[int, ...]]) -> None:
        """The model's layout, and the encoding's g levels for its size (``shuffle.levels``)."""
        self.layout = layout
        self.dim = sum(int(np.prod(shape)) for shape in layout.values())
        self.levels = self.shuffle.levels_for(self.dim)

    def discover(self, grid: Grid, nodes: Iterable[int], timeout: float) -> None:
        """Ask every node for its role and key; exactly one shuffler, else RuntimeError."""
        shufflers: dict[int, str] = {}
        for node, (role, key) in query_keys(grid, nodes, timeout, self.client_error).items():
            if role == wire.ROLE_SHUFFLER:
                shufflers[node] = key
            else:
                self.silo_keys[node] = key
        if len(shufflers) != 1:
            raise RuntimeError(f"privacy.mode = shuffle needs exactly one shuffler node (node config role = shuffler, "
                               f"or num-silos + 1 simulation nodes); found {len(shufflers)}")
        ((self.shuffler, self.shuffler_key),) = shufflers.items()

    def silo_nodes(self, nodes: Iterable[int]) -> list[int]:
        """The nodes that are not the shuffler."""
        return [n for n in nodes if n != self.shuffler]

    def silo_count(self, nodes: Iterable[int]) -> int:
        """How many of ``nodes`` are silos: all but the shuffler (one of them, before discovery)."""
        nodes = list(nodes)
        return len(self.silo_nodes(nodes)) if self.shuffler is not None else max(len(nodes) - 1, 0)

    def collect(self, grid: Grid, rnd: int, phase: Phase, ticket: wire.ShuffleTicket, replies: Iterable[Message],
                nodes: list[int], reader: Any, timeout: float, run_id: int) -> Updates:
        """The exchange's sealed replies through the shuffler (:meth:`exchange`), the rows bounded
        by R = clip (or C_diff for a difference)."""
        bound = row_bound(phase == Phase.DIFF, self.clip, self.diff_clip)
        return self.exchange(grid, rnd, str(phase), ticket, run_id, bound, replies, nodes, timeout)

    def row(self, tally: Updates) -> dict[str, Any]:
        """The round's row entries: contributions the shuffler dropped, and its refusal if any
        (app/run_health.py blames it)."""
        extra: dict[str, Any] = {"shuffle_dropped": tally.shuffle_dropped}
        if tally.shuffle_refusal:
            extra["shuffle_refused"] = tally.shuffle_refusal
        return extra

    def open_exchange(self, grid: Grid, rnd: int, phase: Phase, nodes: list[int], timeout: float,
                      run_id: int) -> wire.ShuffleTicket:
        """The next exchange's ticket (no message round before the instructions)."""
        return self.ticket()

    def address(self, messages: list[Message], ticket: wire.ShuffleTicket) -> list[Message]:
        return messages

    def ticket(self) -> wire.ShuffleTicket:
        """The next exchange's ticket (the exchange number binds the contributions' context)."""
        self.exchanges += 1
        return wire.ShuffleTicket(self.shuffler_key, self.exchanges)

    def exchange(self, grid: Grid, rnd: int, phase: str, ticket: wire.ShuffleTicket, run_id: int, bound: float,
                 replies: Iterable[Message], sent_to: Iterable[int], timeout: float) -> Updates:
        """Sort the silos' replies, relay the sealed ones, debias the totals. The returned
        Updates holds one update, the mean of the accepted records' rows; ``nodes`` are the silos
        whose sealed reply was relayed (the shuffler may still drop some: ``answered`` counts
        those it accepted)."""
        out = Updates()
        blobs: list[bytes] = []

        def accept(node: int, content: RecordDict) -> None:
            sealed = wire.SealedReply.decode(content)
            blobs.append(sealed.blob)
            out.nodes.append(node)
            out.metrics.append(wire.TrainReply({}, sealed.eps_spent))

        sort_replies(rnd, replies, sent_to, self.client_error, accept, out)
        out.uplink_floats = sum(len(b) for b in blobs) / 4.0
        if not blobs:
            return out
        context = wire.shuffle_context(run_id, rnd, ticket.exchange, phase)
        request = wire.ShuffleRequest(context, self.dim, self.levels, tuple(blobs),
                                      tuple(self.silo_keys[n] for n in sorted(self.silo_keys)), self.p)
        assert self.shuffler is not None
        message = Message(request.encode(), dst_node_id=self.shuffler, message_type=wire.SHUFFLE_QUERY)
        result = self._relay(grid, rnd, message, timeout)
        if result is None:
            out.shuffle_dropped = len(blobs)
            out.shuffle_refusal = self.refusal
            return out
        code = ShuffleCode(bound, self.levels, self.p)
        mean = debias(result.totals, result.records, result.trials, code) / result.records
        limit = honest_mean_limit(code, result.records, result.trials, self.dim)
        try:
            check_bounded("debiased shuffle mean", mean)
            if not np.all(np.abs(mean) <= limit):  # no honest release lies there (but w.p. 1e-12)
                raise wire.ReplyError(f"the debiased mean leaves [-{limit:.6g}, {limit:.6g}], the bound every "
                                      f"honest mean obeys (R + (2R/g) t / N, app/privacy/shuffle.py)")
        except wire.ReplyError as exc:
            log(WARNING, "round %d: the shuffler's totals were dropped: %s", rnd, exc)
            out.shuffle_dropped = len(blobs)
            return out
        out.updates.append(wire.unflatten(mean.astype(np.float32), self.layout))
        out.shuffle_accepted = result.accepted
        out.shuffle_dropped = result.dropped
        return out

    def _relay(self, grid: Grid, rnd: int, message: Message, timeout: float) -> wire.ShuffleReply | None:
        """The shuffler's reply, or None if nothing usable came (``self.refusal``: the shuffler's
        reason when it refused, else "")."""
        self.refusal = ""
        replies = list(grid.send_and_receive([message], timeout=timeout))
        if not replies:
            log(WARNING, "round %d: the shuffler did not answer", rnd)
            return None
        reply = replies[0]
        if reply.has_error():
            self.client_error(reply, "shuffle")
            return None
        refusal = wire.Refusal.decode(reply.content)
        if refusal is not None:
            log(WARNING, "round %d: %s", rnd, refusal.reason)
            self.refusal = refusal.reason
            return None
        try:
            return wire.ShuffleReply.decode(reply.content, self.dim)
        except wire.ReplyError as exc:
            log(WARNING, "round %d: dropped the shuffler's malformed reply: %s", rnd, exc)
            return None

