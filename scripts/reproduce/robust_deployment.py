"""Robust rules in a deployment and FLTrust's trust update on digits (issue 23, sections 4 and 8).

Every run is the real ServerApp / ClientApp on the in-process grid (app/local_grid.py) with no
attack harness (attack.kind = none, as a deployed server), digits, 10 IID silos, the preset's
MLP 64-64-10 and 15 rounds, privacy off:

1. trimmed mean and Multi-Krum with byzantine.f = 1, one hostile silo (node 1000) sending -10
   times its own update (IPM with epsilon = 10 from the one message it sees) or 2^64 (the reply
   bound) with a fixed random sign per coordinate: final test accuracy;
2. the geometric median with 4 of the 10 silos at the bound, and the pure rule's distance from
   the honest mean with 4 of 10 and 4 of 9 rows at the bound (d = 200) against its breakdown
   bound 2h/(h - f) * max_H ||u_i - honest mean||;
3. FLTrust (trust set 100) for seeds 0-2, ISRL-DP at the default epsilon 3 and privacy off:
   ||g0|| of round 1 and the median over rounds, the median honest ||u_i||, final test accuracy.

    python -m scripts.reproduce.robust_deployment [--parts 1 2 3] [--seeds 0 1 2]
    python -m scripts.reproduce.robust_deployment --no-f   # at a commit without byzantine.f (f = 0)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from flwr.app import Array, ArrayRecord, Message  # noqa: E402

from app import wire  # noqa: E402
from app.launch import merged_run_config  # noqa: E402
from app.local_grid import run_local  # noqa: E402
from strategies import aggregation  # noqa: E402
from strategies.replies import MAX_UPDATE_ABS  # noqa: E402

BASE = {"algorithm": "robust", "dataset": "digits", "partition": "iid", "privacy.mode": "off", "attack.kind": "none"}


def at_bound(shape: tuple[int, ...], layer: int) -> np.ndarray:
    """2^64 with a fixed random sign per coordinate, the same for every hostile node."""
    return (np.random.default_rng([23, layer]).choice([-1.0, 1.0], size=shape) * MAX_UPDATE_ABS).astype(np.float32)


def hostile(nodes: set[int], kind: str):
    def hook(node: int, msg: Message, reply: Message) -> Message:
        if node not in nodes or msg.metadata.message_type != "train" or reply.has_error() \
                or wire.UPDATE not in reply.content.array_records:
            return reply
        rec = reply.content.array_records[wire.UPDATE]
        new = {k: at_bound(rec[k].numpy().shape, i) if kind == "bound" else (-10.0 * rec[k].numpy()).astype(np.float32)
               for i, k in enumerate(rec)}
        reply.content.array_records[wire.UPDATE] = ArrayRecord({k: Array(v) for k, v in new.items()})
        return reply
    return hook


def run_one(over: dict[str, Any], hook=None) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = merged_run_config([]) | BASE | over | {"outputs-dir": f"{tmp}/o", "run-name": "r", "checkpoint": False}
        try:
            run_local(cfg, f"{tmp}/s", hook=hook)
        except Exception as exc:  # a config refusal is a result here
            return f"{type(exc).__name__}: {exc}"
        s = json.loads(Path(f"{tmp}/o/r/summary.json").read_text())
    acc = s["test_accuracy"]
    return f"accuracy {'-' if acc is None else f'{acc:.3f}'} ({s['status']})"


def part1(no_f: bool) -> None:
    for rule in ("trimmed-mean", "multi-krum"):
        over = {"aggregator": rule} | ({} if no_f else {"byzantine.f": 1})
        print(f"| {rule} | none | {run_one(over)} |", flush=True)
        for kind in ("ipm10", "bound"):
            print(f"| {rule} | {kind} | {run_one(over, hostile({1000}, kind))} |", flush=True)
        if not no_f:
            print(f"| {rule} | byzantine.f not set | {run_one({'aggregator': rule})} |", flush=True)


def part2() -> None:
    over = {"aggregator": "geometric-median"}
    print(f"| geometric-median | none | {run_one(over)} |", flush=True)
    print(f"| geometric-median | 4 of 10 at the bound | {run_one(over, hostile({1000, 1001, 1002, 1003}, 'bound'))} |",
          flush=True)
    rng = np.random.default_rng(7)
    for n, f in ((10, 4), (9, 4)):
        h, d = n - f, 200
        honest = 0.3 + 0.1 * rng.standard_normal((h, d))
        rows = np.vstack([honest, np.full((f, d), MAX_UPDATE_ABS)])
        x = honest.mean(axis=0)
        agg = aggregation.geometric_median(rows, f=f)
        bound = 2 * h / (h - f) * np.linalg.norm(honest - x, axis=1).max()
        print(f"geometric median, {f} of {n} rows at 2^64: ||z - honest mean|| = {np.linalg.norm(agg.vector - x):.3g} "
              f"(breakdown bound {bound:.3g}); weight on the far rows {agg.weights[h:].sum():.2g}", flush=True)


def part3(seeds: list[int]) -> None:
    seen: list[tuple[float, float]] = []
    rule = aggregation.RULES["fltrust"]

    def spy(updates: np.ndarray, trust_update: np.ndarray) -> aggregation.Aggregate:
        seen.append((float(np.linalg.norm(trust_update)), float(np.median(np.linalg.norm(updates, axis=1)))))
        return rule.fn(updates, trust_update)

    aggregation.RULES["fltrust"] = dataclasses.replace(rule, fn=spy)
    try:
        for seed in seeds:
            for privacy in ({}, {"privacy.mode": "off"}):
                seen.clear()
                over = {"aggregator": "fltrust", "seed": seed, "privacy.mode": "isrl"} | privacy
                result = run_one(over)
                g0, honest = np.array([s[0] for s in seen]), np.array([s[1] for s in seen])
                print(f"| {seed} | {over['privacy.mode']} | {g0[0]:.3g} | {np.median(g0):.3g} | {np.median(honest):.3g} "
                      f"| {result} |", flush=True)
    finally:
        aggregation.RULES["fltrust"] = rule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--no-f", action="store_true", help="leave byzantine.f out (a commit before the key existed)")
    args = ap.parse_args()
    if 1 in args.parts:
        part1(args.no_f)
    if 2 in args.parts:
        part2()
    if 3 in args.parts:
        print("| seed | privacy | round-1 ||g0|| | median ||g0|| | median honest ||u|| | result |", flush=True)
        part3(args.seeds)


if __name__ == "__main__":
    main()
