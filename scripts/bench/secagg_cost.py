"""Per-round cost of secure aggregation against shuffle DP and ISRL-DP on the same task (issue 38):
bytes a silo sends the server and receives from it, CPU per silo and at the server, at N silos.

Each run is the real ServerApp and ClientApp on the in-process grid (app/local_grid.py), MB-SGD,
full batches, ``--rounds`` rounds, all N silos every round, no evaluation. What is measured:

* **bytes**: every message the server sends and every reply it receives, as Flower's protobuf
  of the message's content (``flwr.common.serde.recorddict_to_proto(...).ByteSize()``: the
  arrays' bytes plus the records' keys and framing; the envelope's metadata is not counted), per
  message type. Uplink per silo per round = what the server receives from one silo in a round:
  in secagg mode the advert, the sealed share payloads, the masked vector and the unmask shares;
  in shuffle mode the sealed encoding (the server relays it to the shuffler node, whose traffic
  is shown apart); in ISRL mode the noisy update. Downlink: what the server sends one silo.
* **CPU** (``time.process_time``, one process, one thread): each node's handler call is timed
  where the grid calls the ClientApp (per silo; the shuffler node apart); the server's CPU of a
  round is the round's CPU less its nodes'; "relay" is the part of it spent in the mode's server
  mechanism (SecAggRelay / ShuffleRelay methods, less the node calls they make). Round 1 also
  holds each silo's one-time noise calibration; the steady columns are rounds 2.. (mean).
* the keys discovery before round 1 (one message per node) is shown as "setup" bytes.

  python -m scripts.bench.secagg_cost                       # 10, 25, 100 silos, digits, logistic
  python -m scripts.bench.secagg_cost --silos 10 --modes secagg --rounds 2

Prints the tables (markdown) and writes them to <out>/cost.md with <out>/cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from app.launch import merged_run_config  # noqa: E402

MODES = ("isrl", "shuffle", "secagg")
EVALUATE = "evaluate"


def _size(msg: Any) -> int:
    """Bytes of a message's content as Flower serialises it (0 for an error reply)."""
    from flwr.common.serde import recorddict_to_proto

    if msg is None or msg.has_error():
        return 0
    return recorddict_to_proto(msg.content).ByteSize()


class Meter:
    """Per (round, node, message type): bytes down, bytes up, node CPU; per round: total CPU and
    the mechanism's (relay) CPU, each less the node calls inside; the meter's own time apart."""

    def __init__(self) -> None:
        self.round = 0
        self.calls: list[dict[str, Any]] = []
        self.node_cpu = 0.0  # running total of the nodes' CPU
        self.own = 0.0  # running total of the meter's own CPU (sizes)
        self.round_cpu: dict[int, float] = defaultdict(float)
        self.relay_cpu: dict[int, float] = defaultdict(float)

    def client(self, inner):
        """A ClientApp stand-in: ``inner`` timed and its messages sized."""

        def call(msg, context):
            c0 = time.process_time()
            reply = inner(msg, context)
            c1 = time.process_time()
            self.node_cpu += c1 - c0
            self.calls.append({"round": self.round, "node": msg.metadata.dst_node_id,
                               "type": msg.metadata.message_type, "down": _size(msg), "up": _size(reply),
                               "cpu": c1 - c0})
            self.own += time.process_time() - c1
            return reply

        return call

    def timed(self, fn, bucket: dict[int, float]):
        """``fn`` with its CPU, less the node calls and the meter's time inside it, added to ``bucket``."""

        def wrapper(*args, **kwargs):
            c0, n0, o0 = time.process_time(), self.node_cpu, self.own
            try:
                return fn(*args, **kwargs)
            finally:
                bucket[self.round] += (time.process_time() - c0) - (self.node_cpu - n0) - (self.own - o0)

        return wrapper

    def rounds(self, fn):
        """FederatedOptimizer.round, marking the round its messages belong to."""

        def wrapper(opt, grid, rnd, *args, **kwargs):
            self.round = int(rnd)
            return self.timed(fn, self.round_cpu)(opt, grid, rnd, *args, **kwargs)

        return wrapper


def run_mode(mode: str, silos: int, rounds: int, dataset: str, model: str, seed: int) -> dict[str, Any]:
    """One federation of ``mode`` at ``silos`` silos; returns the metered totals (see module docstring)."""
    from app.client_app import app as client_app
    from app.local_grid import run_local
    from strategies.loop import FederatedOptimizer
    from strategies.secagg_relay import SecAggRelay
    from strategies.shuffle_relay import ShuffleRelay

    meter = Meter()
    relay = {"secagg": SecAggRelay, "shuffle": ShuffleRelay}.get(mode)
    patched: list[tuple[Any, str, Any]] = [(FederatedOptimizer, "round", FederatedOptimizer.round)]
    FederatedOptimizer.round = meter.rounds(FederatedOptimizer.round)
    if relay is not None:
        for name in ("discover", "open_exchange", "address", "collect"):
            patched.append((relay, name, getattr(relay, name)))
            setattr(relay, name, meter.timed(getattr(relay, name), meter.relay_cpu))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = merged_run_config([]) | {
            "dataset": dataset, "model": model, "partition": "iid", "num-silos": silos, "silos-per-round": silos,
            "algorithm": "mbsgd", "batch-size": 0, "num-rounds": rounds, "lr": 0.5, "privacy.clip": 1.0,
            "privacy.epsilon": 3.0, "privacy.mode": mode, "seed": seed, "eval-every": 0, "checkpoint": False,
            "outputs-dir": str(Path(tmp) / "out"), "run-name": "r", "fail-on-client-error": True}
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            run_local(cfg, str(Path(tmp) / "state"), client=meter.client(client_app))
        finally:
            for owner, name, fn in patched:
                setattr(owner, name, fn)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        summary = json.loads((Path(tmp) / "out" / "r" / "summary.json").read_text())
        rows = [json.loads(x) for x in (Path(tmp) / "out" / "r" / "rounds.jsonl").read_text().splitlines() if x]
    helper = 1000 + silos  # shuffle mode: the shuffler node is the last one (partition-id = num-silos)
    silo_calls = [c for c in meter.calls if c["node"] != helper and c["type"] != EVALUATE]
    steady = list(range(2, rounds + 1)) or [1]

    def per_silo_round(key: str, rnds: list[int], types: set[str] | None = None) -> float:
        total = sum(c[key] for c in silo_calls if c["round"] in rnds and (types is None or c["type"] in types))
        return total / (silos * len(rnds))

    types = sorted({c["type"] for c in silo_calls if c["round"] >= 1})
    helper_calls = [c for c in meter.calls if c["node"] == helper and c["round"] in steady]
    return {
        "mode": mode, "silos": silos, "rounds": rounds, "status": summary["status"],
        "answered": [r.get("answered") for r in rows], "test_error": summary["test_error"],
        "up": per_silo_round("up", steady), "down": per_silo_round("down", steady),
        "up_by_type": {t: per_silo_round("up", steady, {t}) for t in types},
        "down_by_type": {t: per_silo_round("down", steady, {t}) for t in types},
        "setup_up": per_silo_round("up", [0]) * 1, "setup_down": per_silo_round("down", [0]),
        "silo_cpu_ms": 1e3 * per_silo_round("cpu", steady), "silo_cpu_round1_ms": 1e3 * per_silo_round("cpu", [1]),
        "silo_cpu_by_type_ms": {t: 1e3 * per_silo_round("cpu", steady, {t}) for t in types},
        "server_cpu_ms": 1e3 * statistics.mean(meter.round_cpu[r] for r in steady),
        "relay_cpu_ms": 1e3 * statistics.mean(meter.relay_cpu[r] for r in steady),
        "helper_cpu_ms": 1e3 * sum(c["cpu"] for c in helper_calls) / len(steady),
        "helper_down": sum(c["down"] for c in helper_calls) / len(steady),
        "helper_up": sum(c["up"] for c in helper_calls) / len(steady),
        "dim": summary["silos"][0]["releases"][0].get("dim") if summary.get("silos") else None,
        "wall_s": wall, "cpu_s": cpu,
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _kib(b: float) -> str:
    return f"{b / 1024:,.1f}"


def tables(results: list[dict[str, Any]]) -> str:
    lines = ["| silos | mode | uplink KiB / silo / round | downlink KiB / silo / round | silo CPU ms / round "
             "(round 1) | server CPU ms / round (relay) | shuffler: KiB in / out, CPU ms / round | run wall s (CPU s) |",
             "|---:|---|---:|---:|---:|---:|---|---:|"]
    for r in results:
        helper = (f"{_kib(r['helper_down'])} / {_kib(r['helper_up'])}, {r['helper_cpu_ms']:.0f}"
                  if r["mode"] == "shuffle" else "")
        lines.append(f"| {r['silos']} | {r['mode']} | {_kib(r['up'])} | {_kib(r['down'])} | "
                     f"{r['silo_cpu_ms']:.1f} ({r['silo_cpu_round1_ms']:.0f}) | {r['server_cpu_ms']:.1f} "
                     f"({r['relay_cpu_ms']:.1f}) | {helper} | {r['wall_s']:.1f} ({r['cpu_s']:.1f}) |")
    secagg = [r for r in results if r["mode"] == "secagg"]
    if secagg:
        types = sorted({t for r in secagg for t in r["up_by_type"]})
        lines += ["", "Secagg, per silo per round, by message (uplink KiB / downlink KiB / silo CPU ms):", "",
                  "| silos | " + " | ".join(types) + " |", "|---:|" + "---|" * len(types)]
        for r in secagg:
            lines.append(f"| {r['silos']} | " + " | ".join(
                f"{_kib(r['up_by_type'].get(t, 0))} / {_kib(r['down_by_type'].get(t, 0))} / "
                f"{r['silo_cpu_by_type_ms'].get(t, 0):.1f}" for t in types) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--silos", type=int, nargs="+", default=[10, 25, 100])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--model", default="logistic")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("outputs") / "bench" / "secagg_cost")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in args.silos:
        for mode in args.modes:
            r = run_mode(mode, n, args.rounds, args.dataset, args.model, args.seed)
            results.append(r)
            print(f"[secagg-cost] {n} silos {mode}: {r['status']}, up {_kib(r['up'])} KiB, silo CPU "
                  f"{r['silo_cpu_ms']:.1f} ms, server {r['server_cpu_ms']:.1f} ms ({r['wall_s']:.1f}s)", flush=True)
    head = (f"{args.dataset}, {args.model}, MB-SGD K = n, {args.rounds} rounds, eps 3; {_cpu_name()}, "
            f"{os.cpu_count()} CPU(s), one thread; Python {platform.python_version()}, torch {torch.__version__}")
    md = head + "\n\n" + tables(results)
    (args.out / "cost.md").write_text(md + "\n")
    (args.out / "cost.json").write_text(json.dumps(results, indent=1))
    print(md)


if __name__ == "__main__":
    main()
