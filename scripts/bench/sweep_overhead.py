"""Per-job overhead of a sweep on Flower's simulation engine (issue: Hydra sweeps).

Runs ``--jobs`` short WBCD federations one after the other exactly as ``python -m app.sweep``
runs its jobs (app.federation.run_federation: ``flwr.simulation.run_simulation`` with one virtual
SuperNode per silo) and reports, per job:

* overhead = wall time - time inside rounds (the sweep's ``overhead_s`` column);
* start-up = round 1's time - the median of the other rounds (round 1 also pays for starting the
  Ray actors, importing torch and Flower in them and building each silo: engine start-up that
  the first definition counts as "inside a round");
* both together, the engine's whole cost per job.

* the median round time (all Flower polling for this model: what the engine poll patch cuts).

Target (issue 14): median overhead on the warm engine <= 0.5 s per job (was 1.1 s: Flower's
engine threads took up to 1 s to see the end of each federation; app.runtime.engine_patches.prompt_engine_stop).

    python -m scripts.bench.sweep_overhead [--jobs 5] [--rounds 5] [--cold] [--fast-poll]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from app.launch import merged_run_config
from app.federation import run_federation


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="start the engine afresh for every job (sweep.warm-engine=false)")
    ap.add_argument("--fast-poll", action="store_true", help="the engine poll patch (sweep.fast-poll=true)")
    ap.add_argument("--target", type=float, default=0.5, help="median overhead target in seconds")
    args = ap.parse_args(argv)
    rows = []
    for i in range(args.jobs):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = merged_run_config([]) | {"num-rounds": args.rounds, "seed": i, "outputs-dir": tmp, "run-name": "b"}
            t0 = time.perf_counter()
            res = run_federation(cfg, warm=not args.cold, fast=args.fast_poll)
            wall = time.perf_counter() - t0
        rounds = [float(r["wall_s"]) for r in res["rounds_rows"]]
        startup = rounds[0] - statistics.median(rounds[1:]) if len(rounds) > 1 else 0.0
        rows.append({"job": i, "wall_s": wall, "overhead_s": res["overhead_s"], "startup_s": startup,
                     "engine_s": res["overhead_s"] + startup, "inside_rounds_s": sum(rounds),
                     "round_median_s": statistics.median(rounds[1:] or rounds)})
        print(json.dumps(rows[-1]), flush=True)
    print("\n| job | wall (s) | overhead (s) | round-1 start-up (s) | engine total (s) | median round (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['job']} | {r['wall_s']:.2f} | {r['overhead_s']:.2f} | {r['startup_s']:.2f} | {r['engine_s']:.2f} "
              f"| {r['round_median_s']:.3f} |")
    # the first job starts the engine (Ray, the actors' imports); on a warm engine the others do not
    later = rows[1:] if len(rows) > 1 and not args.cold else rows
    med = {k: statistics.median(r[k] for r in later) for k in rows[0]}
    print(f"| median{' (jobs 2..)' if later is not rows else ''} | {med['wall_s']:.2f} | {med['overhead_s']:.2f} "
          f"| {med['startup_s']:.2f} | {med['engine_s']:.2f} | {med['round_median_s']:.3f} |")
    ok = med["overhead_s"] <= args.target
    print(f"\ntarget: median per-job overhead <= {args.target:g} s{' on the warm engine' if not args.cold else ''}: "
          f"{'PASS' if ok else 'FAIL'} (overhead {med['overhead_s']:.2f} s, ratio {med['overhead_s'] / args.target:.2f} "
          f"of the target; with round-1 start-up {med['engine_s']:.2f} s)")


if __name__ == "__main__":
    main()
