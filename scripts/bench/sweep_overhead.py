"""Per-job overhead of a sweep on Flower's simulation engine (issue: Hydra sweeps).

Runs ``--jobs`` short WBCD federations one after the other exactly as ``python -m app.sweep``
runs its jobs (app.sweep.run_federation: ``flwr.simulation.run_simulation`` with one virtual
SuperNode per silo) and reports, per job:

* overhead = wall time - time inside rounds (the sweep's ``overhead_s`` column);
* start-up = round 1's time - the median of the other rounds (round 1 also pays for starting the
  Ray actors, importing torch and Flower in them and building each silo: engine start-up that
  the first definition counts as "inside a round");
* both together, the engine's whole cost per job.

    python scripts/bench/sweep_overhead.py [--jobs 5] [--rounds 5] [--cold]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from app.launch import merged_run_config
from app.sweep import run_federation


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cold", action="store_true", help="start the engine afresh for every job (sweep.warm-engine=false)")
    args = ap.parse_args(argv)
    rows = []
    for i in range(args.jobs):
        with tempfile.TemporaryDirectory() as tmp:
            cfg = merged_run_config([]) | {"num-rounds": args.rounds, "seed": i, "outputs-dir": tmp, "run-name": "b"}
            t0 = time.perf_counter()
            res = run_federation(cfg, warm=not args.cold)
            wall = time.perf_counter() - t0
        rounds = [float(r["wall_s"]) for r in res["rounds_rows"]]
        startup = rounds[0] - statistics.median(rounds[1:]) if len(rounds) > 1 else 0.0
        rows.append({"job": i, "wall_s": wall, "overhead_s": res["overhead_s"], "startup_s": startup,
                     "engine_s": res["overhead_s"] + startup, "inside_rounds_s": sum(rounds)})
        print(json.dumps(rows[-1]), flush=True)
    print("\n| job | wall (s) | overhead (s) | round-1 start-up (s) | engine total (s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['job']} | {r['wall_s']:.1f} | {r['overhead_s']:.1f} | {r['startup_s']:.1f} | {r['engine_s']:.1f} |")
    med = {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "overhead_s", "startup_s", "engine_s")}
    print(f"| median | {med['wall_s']:.1f} | {med['overhead_s']:.1f} | {med['startup_s']:.1f} | {med['engine_s']:.1f} |")
    print(f"\ntarget: median overhead < 5 s: {'PASS' if med['overhead_s'] < 5 else 'FAIL'} "
          f"(overhead {med['overhead_s']:.1f} s; with round-1 start-up {med['engine_s']:.1f} s)")


if __name__ == "__main__":
    main()
