"""How the server exchanges messages with the nodes: push, poll, attribute each reply.

Flower 1.42's ``Grid.send_and_receive`` sleeps 3 s between pulls on a deployed SuperLink (and
the simulation's 0.1 s), which is most of a deployed round. :class:`ExchangeGrid` wraps the
run's grid and does the same exchange through the grid's public ``push_messages`` /
``pull_messages``, polling every max(5 ms, elapsed / 10) up to ``poll_s`` (so a reply is seen at
most ~10% after it arrives, and a long exchange costs few pulls), bounded by the exchange's
timeout.

It also attributes every reply to the node it answers for. When a node is gone, the SuperLink
answers for it with an error reply whose source is the SuperLink itself
(``SUPERLINK_NODE_ID``), not the node; matched through ``reply_to_message_id``, such a reply is
credited to the node that was asked, so the round log names the right node. Only error replies
are re-attributed: a content reply keeps the source Flower authenticated.

It is also where the server keeps the silos' ledger witnesses (app/privacy/ledger/witness.py,
issue 34): each training or evaluation instruction to a node carries the witnesses the server
holds for it, and each witness a node's reply carries is kept (the latest per node and ledger),
in a store that outlives the run.

Every instruction lives only as long as its exchange: its time-to-live is set to the exchange's
timeout, so a SuperNode that comes back after a crash is not handed the instructions of rounds
that are over (each would be a release its silo pays for and the server ignores).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from logging import WARNING
from typing import Any

from flwr.app import Message, MessageType, RecordDict
from flwr.common import log
from flwr.common.constant import ErrorCode

#: error codes meaning "the node (or its reply) is not there": a dropped silo, not a ClientApp failure
UNAVAILABLE_CODES = frozenset({ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
                               ErrorCode.NODE_UNAVAILABLE})
#: the first poll interval of an exchange (then a tenth of the time elapsed, up to the grid's poll_s)
FIRST_POLL_S = 0.005
#: the poll interval as a fraction of the exchange's elapsed time
POLL_FRACTION = 0.1


def is_unavailable(msg: Message) -> bool:
    """Whether ``msg`` is Flower's error reply for a node or reply that is not available."""
    return msg.has_error() and int(msg.error.code) in UNAVAILABLE_CODES


class ExchangeGrid:
    """A Flower Grid whose ``send_and_receive`` polls every ``poll_s`` (at most) and attributes
    error replies to the node asked. Everything else is the wrapped grid's."""

    def __init__(self, grid: Any, poll_s: float = 0.05, witnesses: Any = None) -> None:
        """``witnesses``: the server's store of ledger witnesses (a ``WitnessStore``; None: none kept)."""
        if not poll_s > 0:
            raise ValueError(f"poll interval must be > 0, got {poll_s}")
        self._grid = grid
        self.poll_s = float(poll_s)
        self.witnesses = witnesses

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def get_node_ids(self) -> Iterable[int]:
        return self._grid.get_node_ids()

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        sent = list(messages)
        if not sent:
            return []
        if self.witnesses is None:
            return self._exchange(sent, timeout)
        from app import wire  # (here: importing the wire loads torch, which this module does not need otherwise)

        for m in sent:  # each silo gets back the witnesses of its ledger the server holds
            if m.metadata.message_type in _WITNESSED or m.metadata.message_type == wire.LEDGER_QUERY:
                m.content = wire.with_witnesses(m.content, self.witnesses.get(m.metadata.dst_node_id))
        replies = self._exchange(sent, timeout)
        for reply in replies:
            if not reply.has_error():
                for text in wire.witnesses_of(reply.content):
                    self.witnesses.put(reply.metadata.src_node_id, text)
        self.witnesses.flush()
        return replies

    def _exchange(self, sent: list[Message], timeout: float | None) -> list[Message]:
        if not (hasattr(self._grid, "push_messages") and hasattr(self._grid, "pull_messages")):
            replies = list(self._grid.send_and_receive(sent, timeout=timeout))
            return attribute(replies, {m.metadata.message_id: m.metadata.dst_node_id for m in sent
                                       if m.metadata.message_id})
        if timeout is not None:
            for m in sent:  # an instruction expires with its exchange
                m.metadata.ttl = min(float(m.metadata.ttl), float(timeout))
        ids = list(self._grid.push_messages(sent))
        asked = {mid: m.metadata.dst_node_id for mid, m in zip(ids, sent, strict=False) if mid}
        pending = set(asked)
        start = time.monotonic()
        end = None if timeout is None else start + float(timeout)
        replies: list[Message] = []
        while pending:
            got = list(self._grid.pull_messages(pending))
            replies += got
            pending -= {m.metadata.reply_to_message_id for m in got}
            now = time.monotonic()
            if not pending or (end is not None and now >= end):
                break
            delay = min(self.poll_s, max(FIRST_POLL_S, POLL_FRACTION * (now - start)))
            time.sleep(delay if end is None else max(0.0, min(delay, end - now)))
        return attribute(replies, asked)


#: the message types whose instructions carry the node's ledger witnesses
_WITNESSED = frozenset({str(MessageType.TRAIN), str(MessageType.EVALUATE)})


def attribute(replies: list[Message], asked: dict[str, int]) -> list[Message]:
    """Credit each error reply to the node its instruction went to (``asked``: message id ->
    destination node); content replies are left as Flower delivered them."""
    for reply in replies:
        node = asked.get(reply.metadata.reply_to_message_id)
        if node is not None and reply.has_error() and reply.metadata.src_node_id != node:
            reply.metadata.__dict__["_src_node_id"] = int(node)
    return replies


def query_keys(grid: Any, nodes: Iterable[int], timeout: float,
               client_error: Callable[[Message, str], str]) -> dict[int, tuple[str, str]]:
    """Each node's (role, X25519 public key hex) from the keys query (wire.KEYS_QUERY): the
    shuffler relay's and secure aggregation's discovery. A failed, refused or malformed answer
    leaves its node out (logged), never raises."""
    from app import wire

    msgs = [Message(RecordDict(), dst_node_id=n, message_type=wire.KEYS_QUERY) for n in sorted(nodes)]
    found: dict[int, tuple[str, str]] = {}
    for reply in grid.send_and_receive(msgs, timeout=timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            client_error(reply, "keys")
            continue
        refusal = wire.Refusal.decode(reply.content)
        if refusal is not None:
            log(WARNING, "keys query: node %d refused: %s", node, refusal.reason)
            continue
        try:
            found[node] = wire.read_keys(reply.content)
        except wire.ReplyError as exc:
            log(WARNING, "keys query: node %d answered a malformed reply: %s", node, exc)
    return found
