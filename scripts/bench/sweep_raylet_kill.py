"""A raylet killed in the middle of a sweep job (issue 35, section 3): the job resumes on what
remains of the Ray cluster and ends as an uninterrupted one.

Starts a two-raylet Ray cluster on this machine (``ray.cluster_utils.Cluster``: a head and a
second node on loopback, one CPU each, as tests/test_ray_cluster.py), runs one sweep job through
``RAY_ADDRESS`` without a fault (the reference), then the same job in another sweep, and once that
job's rounds.jsonl holds ``--kill-after`` rounds, SIGKILLs the second node's raylet by its pid and
(``--what node``, the default: the node lost, as a crashed machine) every process under it, its
ClientApp actor's worker among them: the driver gets Ray's ActorUnavailableError within about 2 s,
and ActorDiedError once the GCS marks the node dead (about 15 s). ``--what raylet`` kills the raylet
alone; with Ray 2.55 its actor's worker keeps answering the driver for a while (measured: a 30-round
job ran to its end on it, no error), so the job may end with retries 0.
Checks that the job's row reads completed with retries >= 1, one row in results.csv, and the
reference's test error, rounds done and ε per silo; prints the measurements as JSON. Every
process it starts (the cluster's, the sweeps') is ended before it exits.

    python -m scripts.bench.sweep_raylet_kill [--rounds 30] [--kill-after 10] [--what node|raylet]

Exit code 0 when the checks hold. Heavy (two raylets, two sweeps: about a minute or two on 2
cores); the CI's check is tests/test_sweep_engine_loss.py (a simulation actor killed with ray.kill).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def sweep(cwd: Path, name: str, rounds: int, address: str) -> subprocess.Popen:
    env = dict(os.environ, RAY_ADDRESS=address, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "app.sweep", f"sweep.name={name}", f"num-rounds={rounds}"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (Linux /proc), children first."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier]
        out += kids
        frontier = kids
    return out


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()[:60]
    except OSError:
        return "?"


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int | str, str]:
    """(exit code, or "timeout after N s" when it had to be killed; its output)."""
    try:
        log = proc.communicate(timeout=timeout)[0]
        return proc.returncode, log
    except subprocess.TimeoutExpired:
        proc.kill()
        return f"timeout after {timeout:.0f} s", proc.communicate()[0]


def rounds_written(cwd: Path, name: str) -> int:
    files = list((cwd / "outputs" / "sweeps" / name / "runs").glob("*/rounds.jsonl"))
    return max((len(f.read_text().splitlines()) for f in files), default=0)


def row_of(cwd: Path, name: str) -> list[dict[str, str]]:
    path = cwd / "outputs" / "sweeps" / name / "results.csv"
    return list(csv.DictReader(path.open())) if path.exists() else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--kill-after", type=int, default=10, help="kill the raylet once this many rounds are written")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds each sweep may take")
    ap.add_argument("--what", choices=("node", "raylet"), default="node",
                    help="kill the raylet and every process under it (node), or the raylet alone")
    args = ap.parse_args(argv)
    from ray.cluster_utils import Cluster

    out: dict = {"rounds": args.rounds, "kill_after": args.kill_after, "what": args.what}
    procs: list[subprocess.Popen] = []
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory() as tmp:
            cwd = Path(tmp)
            t0 = time.perf_counter()
            ref = sweep(cwd, "ref", args.rounds, cluster.address)
            procs.append(ref)
            out["ref_exit"], ref_log = finish(ref, args.timeout)
            out["ref_s"] = round(time.perf_counter() - t0, 1)
            t0 = time.perf_counter()
            cut = sweep(cwd, "cut", args.rounds, cluster.address)
            procs.append(cut)
            while rounds_written(cwd, "cut") < args.kill_after and cut.poll() is None:
                time.sleep(0.02)
            raylet = worker.all_processes["raylet"][0].process.pid
            victims = [raylet, *(descendants(raylet) if args.what == "node" else [])]
            out["killed"] = [f"{pid} {command(pid)}" for pid in victims]
            out["killed_at_round"], out["finished_before_the_kill"] = rounds_written(cwd, "cut"), cut.poll() is not None
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            out["cut_exit"], cut_log = finish(cut, args.timeout)
            out["cut_s"] = round(time.perf_counter() - t0, 1)
            refs, cuts = row_of(cwd, "ref"), row_of(cwd, "cut")
            out["lines"] = [ln[:300] for ln in cut_log.splitlines()
                            if ln.startswith("[sweep] job") or "resuming after" in ln][:8]
            keys = ("status", "retries", "rounds_done", "test_error", "eps_per_silo", "wall_s", "overhead_s")
            out["ref_row"] = {k: r.get(k) for r in refs[:1] for k in keys}
            out["cut_rows"] = [{k: r.get(k) for k in keys} for r in cuts]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        cluster.shutdown()
    ok = (out.get("ref_exit") == 0 and out.get("cut_exit") == 0 and len(out.get("cut_rows", [])) == 1
          and out["cut_rows"][0]["status"] == "completed" and int(out["cut_rows"][0]["retries"] or 0) >= 1
          and all(out["cut_rows"][0][k] == out["ref_row"].get(k) for k in ("rounds_done", "test_error", "eps_per_silo")))
    out["ok"] = ok
    print(json.dumps(out, indent=1))
    if not ok:
        print(ref_log[-3000:] if "ref_log" in locals() else "", cut_log[-6000:] if "cut_log" in locals() else "",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
