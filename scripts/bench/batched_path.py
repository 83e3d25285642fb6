"""The batched simulation path against the one-silo-at-a-time path (issue 37).

For each number of silos N (``--silos``), data set (``--datasets``) and path, one federation runs
in a fresh process (``app.local_grid.run_local``: the real ServerApp and ClientApp, no Flower
engine) with this set-up unless overridden (``--run-config KEY=JSON``):

    partition = iid, every silo every round, ISRL-DP MB-SGD at eps = 3, delta = 1e-5,
    lr = 0.1, 3 rounds, eval-every = 1 (each silo's open evaluation, folded into training),
    checkpoint off; digits: MLP 64-64-10 (the preset), fashion-mnist: PCA 50 + MLP 50-64-10 with
    batch-size 32 (the preset's 64 exceeds a silo's records at N = 1,000).

Reported per run: whole-process CPU (user + system of the child, from its rusage), wall, CPU per
silo-round (CPU / (N x rounds); start-up included, so the marginal cost is the difference
between two N), the final test error, and the load average before it. ``--before DIR`` also runs
the one-at-a-time path from another checkout (e.g. a worktree of the commit before the speed
work) with the same interpreter, back to back.

Then the agreement of the two paths (``--agree N``): one federation each way in this process with
every reply captured; the largest difference of any released value, and whether every silo's
ledger (its releases and epsilon) is identical.

    python -m scripts.bench.batched_path [--silos 100,1000] [--datasets digits,fashion-mnist]
        [--before /work/wt-before] [--agree 100] [--paths alone,batched] [--run-config num-rounds=25]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE = {"partition": "iid", "privacy.delta": 1e-5, "eval-every": 1, "checkpoint": False, "lr": 0.1,
        "num-rounds": 3}
PER_DATASET = {"digits": {"dataset": "digits"}, "fashion-mnist": {"dataset": "fashion-mnist", "batch-size": 32}}

CHILD = r"""
import json, sys, tempfile, time
from app.launch import default_run_config
from app.local_grid import run_local
cfg, batched = json.loads(sys.argv[1]), sys.argv[2] == "batched"
out = tempfile.mkdtemp()
rc = default_run_config() | cfg | {"outputs-dir": out, "run-name": "bench"}
t = time.perf_counter()
kw = {"batched": True} if batched else {}
run_local(rc, out + "/state", **kw)
wall = time.perf_counter() - t
summary = json.load(open(out + "/bench/summary.json"))
print("RESULT " + json.dumps({"wall": wall, "test_error": summary.get("test_error"),
                             "eps": max(s.get("eps_spent", 0) for s in summary["silos"])}))
"""


def one(root: Path, cfg: dict, path: str) -> dict:
    """One federation in a fresh process from checkout ``root``; its CPU, wall and result."""
    env = os.environ | {"PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "FLWR_TELEMETRY_ENABLED": "0"}
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg), path], cwd=root, env=env,
                          capture_output=True, text=True)
    total = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{path} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    res = json.loads(lines[-1][7:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res | {"cpu": cpu, "process_wall": total, "load": load}


def agreement(n: int, dataset: str) -> tuple[float, bool, int]:
    """Largest |batched - alone| over every released value (the updates, not the open
    evaluation's statistics, which the batched path sums in another order), whether every ledger is the same,
    and how many replies were compared (one federation each way, in this process)."""
    import numpy as np

    from app.launch import default_run_config
    from app.local_grid import run_local

    got = []
    for batched in (False, True):
        replies: list = []

        def hook(nid, msg, reply, replies=replies):
            if reply.has_content():
                replies.append({f"{r}/{k}": np.asarray(v.numpy()) for r, rec in reply.content.array_records.items()
                                for k, v in rec.items()})
            return reply

        out = tempfile.mkdtemp()
        cfg = default_run_config() | BASE | PER_DATASET[dataset] | {"num-silos": n, "silos-per-round": n,
                                                                     "outputs-dir": out, "run-name": "a"}
        run_local(cfg, out + "/state", hook=hook, batched=batched)
        ledgers = {}
        for p in sorted(Path(out, "state").glob("ledger-*.json")):
            rows = [json.loads(line) for line in p.read_text().splitlines()[1:]]
            ledgers[p.name.split("-silo")[1]] = [{k: v for k, v in r["release"].items() if k != "time"}
                                                 for r in rows if "release" in r]
        got.append((replies, ledgers))
    (r1, l1), (r2, l2) = got
    worst = max((float(np.max(np.abs(a[k].astype(np.float64) - b[k]), initial=0.0))
                 for a, b in zip(r1, r2, strict=True) for k in a if k.startswith(("update/", "sketch/"))),
                default=0.0)
    return worst, l1 == l2, len(r1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--silos", default="100,1000")
    ap.add_argument("--datasets", default="digits,fashion-mnist")
    ap.add_argument("--before", type=Path, help="another checkout: its one-at-a-time path, back to back")
    ap.add_argument("--agree", type=int, default=100, help="silos for the agreement check (0: skip)")
    ap.add_argument("--paths", default="alone,batched", help="which of this checkout's paths to run")
    ap.add_argument("--run-config", nargs="*", default=[], help="KEY=JSON overrides")
    args = ap.parse_args()
    extra = {kv.split("=", 1)[0]: json.loads(kv.split("=", 1)[1]) for kv in args.run_config}
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print("| data | N | path | CPU s | wall s | CPU ms / silo-round | test error | max eps | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dataset in args.datasets.split(","):
        for n in (int(x) for x in args.silos.split(",")):
            cfg = BASE | PER_DATASET[dataset] | {"num-silos": n, "silos-per-round": n} | extra
            runs = [("before: one at a time", args.before, "alone")] if args.before else []
            runs += [(label, ROOT, path) for label, path in (("one at a time", "alone"), ("batched", "batched"))
                     if path in args.paths.split(",")]
            for label, root, path in runs:
                r = one(root, cfg, path)
                per = 1000 * r["cpu"] / (n * cfg["num-rounds"])
                print(f"| {dataset} | {n} | {label} | {r['cpu']:.1f} | {r['process_wall']:.1f} | {per:.2f} | "
                      f"{r['test_error']:.4f} | {r['eps']:.4f} | {r['load']:.1f} |", flush=True)
    if args.agree:
        for dataset in args.datasets.split(","):
            worst, same, count = agreement(args.agree, dataset)
            print(f"agreement, {dataset}, {args.agree} silos: {count} replies, max |batched - one at a time| = "
                  f"{worst:.3g}; every silo's ledger (releases, z, seq) identical: {same}", flush=True)


if __name__ == "__main__":
    main()
