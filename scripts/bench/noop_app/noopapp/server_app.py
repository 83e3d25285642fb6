"""No-op ServerApp: per round, one train and one evaluate exchange with every node (what
silofl's default run does), one JSON row per round in <outputs-dir>/<run-name>/rounds.jsonl."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


def exchange(grid: Grid, messages: list[Message], poll_s: float, timeout: float) -> list[Message]:
    """Push, then pull every 5 ms growing to ``poll_s`` (as silofl's strategies/messaging.py);
    ``poll_s = 0``: Flower's own send_and_receive."""
    if poll_s <= 0:
        return list(grid.send_and_receive(messages, timeout=timeout))
    pending = set(grid.push_messages(messages))
    end, delay, replies = time.monotonic() + timeout, min(0.005, poll_s), []
    while pending and time.monotonic() < end:
        got = list(grid.pull_messages(pending))
        replies += got
        pending -= {m.metadata.reply_to_message_id for m in got}
        if pending:
            time.sleep(delay)
            delay = min(poll_s, delay * 1.5)
    return replies


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    rounds, poll_s, timeout = int(cfg["num-rounds"]), float(cfg["poll-interval"]), float(cfg["round-timeout"])
    out = Path(str(cfg["outputs-dir"])) / str(cfg["run-name"])
    out.mkdir(parents=True, exist_ok=True)
    rows = out / "rounds.jsonl"
    rows.write_text("")
    w = np.zeros(int(cfg["num-params"]), dtype=np.float32)
    t_start = time.perf_counter()
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        nodes = sorted(grid.get_node_ids())
        train = [Message(RecordDict({"arrays": ArrayRecord([w]), "config": ConfigRecord({"round": rnd})}),
                         dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes]
        replies = [r for r in exchange(grid, train, poll_s, timeout) if r.has_content()]
        if replies:
            w = np.mean([r.content.array_records["update"].to_numpy_ndarrays()[0] for r in replies], axis=0)
        evaluate = [Message(RecordDict({"arrays": ArrayRecord([w])}), dst_node_id=n,
                            message_type=MessageType.EVALUATE) for n in nodes]
        answered = len([r for r in exchange(grid, evaluate, poll_s, timeout) if r.has_content()])
        row = {"round": rnd, "answered": len(replies), "evaluated": answered, "wall_s": time.perf_counter() - t0}
        with rows.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(f"[noop] round {rnd}/{rounds} {row['wall_s']:.2f}s", flush=True)
    (out / "summary.json").write_text(json.dumps({"status": "completed", "rounds": rounds,
                                                  "wall_s": time.perf_counter() - t_start}))
