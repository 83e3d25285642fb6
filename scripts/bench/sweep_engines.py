"""A sweep's job on each ``sweep.engine`` (issue 37): flower (Flower's simulation engine, Ray),
batched and in-process (the in-process grid in the sweep's own process), back to back.

For each number of silos N (``--silos``) and engine, ``python -m app.sweep -m`` runs one job (a
fresh process, a sweep name of its own under a temporary directory) with this set-up:

    dataset = digits, partition = iid, every silo every round, ISRL-DP MB-SGD at eps = 3,
    delta = 1e-5, lr = 0.1, 3 rounds, eval-every = 1

Measured: wall of the whole sweep command (start-up, engine start and stop included), CPU of its
process tree (the sweep and, for flower, the Ray processes it starts: sampled from /proc every
0.2 s, scripts/bench/scale_silos.TreeSampler), CPU per silo-round (CPU / (N x 3)), the job's
test error and largest epsilon (the same model on every engine: the engines differ in how the
messages travel, not in what the silos compute), and the load before.

    python -m scripts.bench.sweep_engines [--silos 10,100,1000] [--engines flower,in-process,batched]
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.scale_silos import run_sampled

ROOT = Path(__file__).resolve().parents[2]
JOB = ["dataset=digits", "partition=iid", "privacy.delta=1e-5", "lr=0.1", "num-rounds=3", "eval-every=1"]


def one(n: int, engine: str) -> dict:
    """One sweep of one job on ``engine`` in a fresh process; what it cost and its row."""
    with tempfile.TemporaryDirectory() as tmp:
        env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0",
                            "FLWR_HOME": str(Path(tmp) / "flwr")}
        cmd = [sys.executable, "-m", "app.sweep", "-m", *JOB, f"num-silos={n}", f"silos-per-round={n}",
               f"sweep.engine={engine}", "sweep.name=bench", f"hydra.sweep.dir={tmp}/hydra"]
        load = os.getloadavg()[0]
        run = run_sampled(cmd, env, cwd=tmp, stderr=subprocess.STDOUT)
        rows = list(csv.DictReader((Path(tmp) / "outputs/sweeps/bench/results.csv").open())) if run.returncode == 0 \
            else []
        if not rows or rows[0]["status"] not in ("completed", "diverged", "no-progress"):  # a run to its end
            raise RuntimeError(f"{engine}, {n} silos: the sweep failed (rc {run.returncode}):\n{run.out[-3000:]}")
        return {"wall": run.wall_s, "cpu": run.sampler.cpu_s(), "test_error": float(rows[0]["test_error"] or "nan"),
                "eps": float(rows[0]["eps_max_spent"]), "load": load, "status": rows[0]["status"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--silos", default="10,100,1000")
    ap.add_argument("--engines", default="flower,in-process,batched")
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {os.cpu_count()} CPUs")
    print("| N silos | sweep.engine | wall s | CPU s | CPU ms / silo-round | status | test error | max eps | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.silos.split(",")):
        for engine in args.engines.split(","):
            r = one(n, engine)
            print(f"| {n} | {engine} | {r['wall']:.1f} | {r['cpu']:.1f} | {1000 * r['cpu'] / (3 * n):.2f} | "
                  f"{r['status']} | {r['test_error']:.4f} | {r['eps']:.4f} | {r['load']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
