"""A transcript of everything the ServerApp receives (run config ``transcript = true``).

For audits: what does the server actually hold? Each reply is written to
``<outputs>/<run>/transcript/<n>-node<id>-<type>.npz``: every array of its ArrayRecords under
``<record>/<key>``, and a JSON entry in ``index.jsonl`` with the sender, the message type, the
record names and the config/metric records' scalar values. Off by default (it copies every
update to disk)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message


class TranscriptGrid:
    """Wraps a Flower Grid; every reply passes through :meth:`record` unchanged."""

    def __init__(self, grid: Any, directory: Path) -> None:
        self._grid = grid
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._counter = itertools.count()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        sent = list(messages)
        types = {m.metadata.dst_node_id: m.metadata.message_type for m in sent}
        replies = list(self._grid.send_and_receive(sent, timeout=timeout))
        for reply in replies:
            self.record(reply, types.get(reply.metadata.src_node_id, "?"))
        return replies

    def record(self, reply: Message, message_type: str) -> None:
        n = next(self._counter)
        node = reply.metadata.src_node_id
        entry: dict[str, Any] = {"n": n, "node": node, "type": message_type, "error": reply.has_error()}
        arrays: dict[str, np.ndarray] = {}
        if not reply.has_error():
            content = reply.content
            entry["array_records"] = {name: list(rec) for name, rec in content.array_records.items()}
            entry["config_records"] = {name: {k: v for k, v in rec.items() if isinstance(v, (int, float, str, bool))}
                                       for name, rec in content.config_records.items()}
            entry["metric_records"] = {name: {k: v for k, v in rec.items() if isinstance(v, (int, float))}
                                       for name, rec in content.metric_records.items()}
            for name, rec in content.array_records.items():
                for key in rec:
                    arrays[f"{name}/{key}"] = rec[key].numpy()
        safe_type = message_type.replace(".", "-").replace("/", "-")
        file = self.directory / f"{n:06d}-node{node}-{safe_type}.npz"
        np.savez(file, **arrays)
        entry["file"] = file.name
        with (self.directory / "index.jsonl").open("a") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")
