"""Time of one simulated round of the default run on Flower's simulation engine (issue: speed).

Runs the embedded default (WBCD, 2 silos, ISRL-DP MB-SGD, 25 rounds) through
``flwr.simulation.run_simulation`` (app.federation.run_federation: the same engine ``flwr run``
starts in the local SuperLink) in four set-ups, each in a fresh process:

* ``separate``: the evaluation in an exchange of its own after every round (two exchanges per
  round: the loop before folding, ``FederatedOptimizer.fold_evaluation = False``);
* ``folded``: round r's evaluation in round r+1's training exchange (one exchange per round);
* both again with the opt-in engine poll patch (app.runtime.engine_patches.fast_poll: 5 ms instead of 0.1 s).

A round's time is the loop's ``wall_s`` (round r's exchanges, its folded evaluation of w_{r-1}
included); the figure is the median over rounds 2..R-1 (round 1 pays for the engine's start, the
last round for its own evaluation exchange). Targets: folded, no patch <= 100 ms; with the patch
<= 50 ms.

    python -m scripts.bench.sim_round [--rounds 25] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETUPS = {  # name -> (fold the evaluation, engine poll patch)
    "separate": (False, False),
    "folded": (True, False),
    "separate + fast-poll": (False, True),
    "folded + fast-poll": (True, True),
}
TARGETS = {"folded": 0.100, "folded + fast-poll": 0.050}


def one(fold: bool, fast: bool, rounds: int) -> dict:
    """Run one federation in this process; its per-round times and totals."""
    import tempfile

    from app.launch import merged_run_config
    from app.federation import run_federation
    from strategies.loop import FederatedOptimizer

    FederatedOptimizer.fold_evaluation = fold
    with tempfile.TemporaryDirectory() as tmp:
        cfg = merged_run_config([]) | {"num-rounds": rounds, "outputs-dir": tmp, "run-name": "b"}
        t0 = time.perf_counter()
        res = run_federation(cfg, warm=True, fast=fast)
        wall = time.perf_counter() - t0
    walls = [float(r["wall_s"]) for r in res["rounds_rows"]]
    return {"round_s": statistics.median(walls[1:-1]), "round1_s": walls[0], "wall_s": wall,
            "test_error": res["rounds_rows"][-1].get("test_error")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every set-up")
    ap.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated, of: {', '.join(SETUPS)}")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one set-up, print JSON
    args = ap.parse_args(argv)
    if args.one:
        fold, fast = SETUPS[args.one]
        print("RESULT " + json.dumps(one(fold, fast, args.rounds)), flush=True)
        return
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    chosen = [name.strip() for name in args.setups.split(",")]
    unknown = [name for name in chosen if name not in SETUPS]
    if unknown:
        ap.error(f"unknown set-up(s) {unknown}; known: {', '.join(SETUPS)}")
    results: dict[str, list[dict]] = {name: [] for name in chosen}
    for rep in range(args.repeats):
        for name in chosen:
            proc = subprocess.run([sys.executable, __file__, "--one", name, "--rounds", str(args.rounds)],
                                  capture_output=True, text=True, env=env, check=False)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                sys.exit(f"{name} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            results[name].append(json.loads(line[len("RESULT "):]))
            print(f"repeat {rep + 1} {name}: {results[name][-1]}", flush=True)
    print(f"\nmedian round (rounds 2..{args.rounds - 1}) of the default, {args.repeats} process(es) each\n")
    print("| set-up | round (ms) | round 1 (s) | whole federation (s) | test error |")
    print("|---|---|---|---|---|")
    med = {}
    for name, rows in results.items():
        med[name] = statistics.median(r["round_s"] for r in rows)
        print(f"| {name} | {1000 * med[name]:.0f} | {statistics.median(r['round1_s'] for r in rows):.1f} | "
              f"{statistics.median(r['wall_s'] for r in rows):.1f} | {rows[-1]['test_error']:.4f} |")
    errors = {rows[-1]["test_error"] for rows in results.values()}
    print(f"\nsame final test error in every set-up: {len(errors) == 1}")
    if "separate" in med and "folded" in med:
        print(f"folding: {med['separate'] / med['folded']:.2f}x faster per round")
    for name, target in TARGETS.items():
        if name not in med:
            continue
        print(f"target {name} <= {1000 * target:.0f} ms: {'PASS' if med[name] <= target else 'FAIL'} "
              f"({1000 * med[name]:.0f} ms)")


if __name__ == "__main__":
    main()
