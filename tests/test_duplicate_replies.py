"""A broken transport that delivers one reply many times (issue 23, item 9): the server keeps
the first reply of each node and warns once per node and exchange, whatever the number of copies.
The fake transport is a Grid whose ``send_and_receive`` returns each real reply many times; the
code under test is the ServerApp's own ledger query and the round loop's reply sorting."""

from __future__ import annotations

from flwr.app import Message, RecordDict

from app import server_app, wire
from strategies import replies as replies_module
from strategies.replies import Updates, sort_replies

COPIES = 100_000


class DuplicatingGrid:
    """Answers every message with ``copies`` copies of one reply (node 1000) and one reply (node 1001)."""

    def __init__(self, content: dict[int, RecordDict], copies: dict[int, int]) -> None:
        self.content, self.copies = content, copies

    def get_node_ids(self) -> list[int]:
        return sorted(self.content)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        out: list[Message] = []
        for msg in messages:
            reply = Message(self.content[msg.metadata.dst_node_id], reply_to=msg)
            out += [reply] * self.copies[msg.metadata.dst_node_id]
        return out


def _warnings(monkeypatch, module) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(module, "log", lambda level, fmt, *args: lines.append(fmt % args))
    return lines


def test_a_ledger_reply_delivered_100000_times_is_one_entry_and_one_warning(monkeypatch) -> None:
    ledgers = {1000: wire.ledger_reply({"silo": 0, "eps_spent": 0.5, "releases": []}),
               1001: wire.ledger_reply({"silo": 1, "eps_spent": 0.7, "releases": []})}
    grid = DuplicatingGrid(ledgers, {1000: COPIES, 1001: 1})
    lines = _warnings(monkeypatch, server_app)
    silos = server_app.query_ledgers(grid, timeout=1.0)
    assert [s["silo"] for s in silos] == [0, 1]  # one entry per node (was 100,001 + 1)
    assert len(lines) == 1 and "node 1000 answered 100000 times" in lines[0], lines[:3]


def test_a_train_reply_delivered_many_times_counts_once_and_warns_once(monkeypatch) -> None:
    refusal = wire.Refusal(wire.REFUSED_BUDGET, "no budget left", 0.5).encode()
    grid = DuplicatingGrid({1000: refusal, 1001: refusal}, {1000: 1000, 1001: 3})
    sent = [Message(RecordDict(), dst_node_id=n, message_type="train") for n in (1000, 1001)]
    lines = _warnings(monkeypatch, replies_module)
    out = sort_replies(4, grid.send_and_receive(sent), [1000, 1001], lambda m, w: "", lambda n, c: None, Updates())
    assert sorted(out.refused) == [1000, 1001] and out.missing == 0
    ignored = [line for line in lines if "ignored" in line]
    assert len(ignored) == 2 and "ignored 999 reply(ies) from node 1000" in ignored[0], ignored[:3]
