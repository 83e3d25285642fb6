"""Scale: wall time, CPU time and peak memory per silo-round for 10 / 100 / 1,000 virtual silos.

Each federation runs in a fresh process through the project's simulation path
(``app.federation.run_federation``: ``flwr.simulation.run_simulation``, the engine ``flwr run`` starts
in the local SuperLink), with this set-up unless overridden by ``--run-config``:

    dataset = digits (1,797 records), partition = iid, MLP 64-64-10 (the digits preset),
    full-batch ISRL-DP MB-SGD at eps = 3, privacy.delta = 1e-5 (fixed: "auto" = 1/n^2 is
    undefined for a 1-record silo), silos-per-round = all silos, eval-every = 1.

With 1,000 silos a silo holds 1-2 records: the figure is the engine's and the silo glue's cost
per silo-round, not the model's (which is negligible for this MLP at any of these sizes).

Measured, per federation (N silos, R rounds, N*R silo-rounds):

* wall: the whole federation (engine start included) and the steady rounds (rounds.jsonl's
  ``wall_s`` of rounds 2..R; round 1 pays for the actors' start), each divided by the silo-rounds;
* CPU: user + system time of the whole process tree (the federation's process, the Ray processes
  it starts, and with ``--ray-address`` also the raylets named by ``--extra-roots`` and their
  workers), sampled from /proc every ``--interval`` s (a process that ends between two samples
  loses at most one interval of CPU); the parent's ``RUSAGE_CHILDREN`` (processes reaped in the
  tree) is printed beside it as a lower bound;
* peak memory: the largest sum of RSS over the tree seen in any sample (shared pages counted in
  every process that maps them, so an upper bound on the memory the tree needs).

    python -m scripts.bench.scale_silos --silos 10,100,1000 --rounds 3
    # on a running Ray cluster (docs/ray-cluster.md): join it; add the raylets' trees to the sample
    python -m scripts.bench.scale_silos --ray-address 127.0.0.1:6379 --extra-roots PID,PID
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
BASE = ['dataset="digits"', 'partition="iid"', "privacy.delta=1e-5", "eval-every=1"]


# -- /proc sampling --------------------------------------------------------------------------
def _procs() -> dict[int, tuple[int, float, int]]:
    """pid -> (parent pid, user + system CPU seconds, RSS bytes) for every readable process."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        # fields[0] = state (field 3); ppid = field 4; utime 14, stime 15; rss 24 (pages)
        out[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK, int(fields[21]) * PAGE)
    return out


def _tree(procs: dict[int, tuple[int, float, int]], roots: list[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    seen, stack = set(), [r for r in roots if r in procs]
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            stack.extend(children.get(pid, []))
    return seen


class TreeSampler(threading.Thread):
    """Sample the process trees under ``roots`` every ``interval`` s: the last CPU time seen per
    process (minus what it had at the start) and the peak of the summed RSS."""

    def __init__(self, roots: list[int], interval: float) -> None:
        super().__init__(daemon=True)
        self.roots, self.interval = roots, interval
        self.stop = threading.Event()
        procs = _procs()
        self.base = {pid: procs[pid][1] for pid in _tree(procs, roots)}  # CPU before the run
        self.cpu: dict[int, float] = dict(self.base)
        self.peak_rss, self.max_procs = 0, 0

    def sample(self) -> None:
        procs = _procs()
        pids = _tree(procs, self.roots)
        self.peak_rss = max(self.peak_rss, sum(procs[p][2] for p in pids))
        self.max_procs = max(self.max_procs, len(pids))
        for p in pids:
            self.cpu[p] = max(self.cpu.get(p, 0.0), procs[p][1])

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)

    def cpu_s(self) -> float:
        return sum(c - self.base.get(p, 0.0) for p, c in self.cpu.items())


@dataclass
class SampledRun:
    """A finished (or killed) process and what :class:`TreeSampler` saw of its tree."""

    out: str
    err: str
    returncode: int
    wall_s: float
    sampler: TreeSampler
    timed_out: bool


def run_sampled(cmd: list[str], env: dict[str, str], *, cwd: str | Path = ROOT, roots: Sequence[int] = (),
                interval: float = 0.2, timeout: float | None = None, stderr: int = subprocess.PIPE) -> SampledRun:
    """Run ``cmd`` as a fresh process and sample its tree (and ``roots``') every ``interval`` s
    until it exits, or until ``timeout`` s have passed (then it is killed: ``timed_out``).
    ``stderr=subprocess.STDOUT`` folds its error output into ``out``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=cwd)
    sampler = TreeSampler([proc.pid, *roots], interval)
    sampler.start()
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        timed_out = True
    wall = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    return SampledRun(out, err or "", proc.returncode, wall, sampler, timed_out)


# -- one federation (in the child process) -----------------------------------------------------
def one(silos: int, rounds: int, extra: list[str], address: str | None) -> dict:
    import tempfile

    from app.launch import merged_run_config
    from app.federation import run_federation

    overrides = BASE + [f"num-silos={silos}", f"silos-per-round={silos}", f"num-rounds={rounds}"] + extra
    with tempfile.TemporaryDirectory() as tmp:
        cfg = merged_run_config([" ".join(overrides)]) | {"outputs-dir": tmp, "run-name": "scale"}
        res = run_federation(cfg, warm=False, backend={"ray-address": address} if address else None)
    walls = [float(r["wall_s"]) for r in res["rounds_rows"]]
    return {"status": res["status"], "round_walls_s": walls, "fed_wall_s": res["wall_s"],
            "test_error": res["rounds_rows"][-1].get("test_error"), "run_config": overrides}


def measure(silos: int, rounds: int, extra: list[str], address: str | None, roots: list[int],
            interval: float, timeout: float) -> dict:
    """Run ``one`` in a fresh process and sample its tree (and ``roots``) until it exits."""
    cmd = [sys.executable, __file__, "--one", str(silos), "--rounds", str(rounds)]
    cmd += [a for e in extra for a in ("--run-config", e)] + (["--ray-address", address] if address else [])
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = run_sampled(cmd, env, roots=roots, interval=interval, timeout=timeout)
    sampler, out, err, wall = run.sampler, run.out, run.err, run.wall_s
    if run.timed_out:
        return {"silos": silos, "rounds": rounds, "failed": f"timed out after {timeout:.0f} s",
                "wall_s": wall, "cpu_s": sampler.cpu_s(), "peak_rss_mb": sampler.peak_rss / 2**20,
                "stderr_tail": err[-1500:]}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    row = {"silos": silos, "rounds": rounds, "silo_rounds": silos * rounds, "process_wall_s": wall,
           "cpu_s": sampler.cpu_s(), "cpu_s_reaped_children": reaped, "peak_rss_mb": sampler.peak_rss / 2**20,
           "max_processes": sampler.max_procs}
    if run.returncode or line is None:
        return row | {"failed": f"rc {run.returncode}", "stderr_tail": err[-3000:]}
    res = json.loads(line[len("RESULT "):])
    steady = res["round_walls_s"][1:] or res["round_walls_s"]
    sr = silos * rounds
    return row | res | {
        "startup_s": wall - sum(res["round_walls_s"]),
        "wall_ms_per_silo_round": 1000 * wall / sr,
        "steady_wall_ms_per_silo_round": 1000 * sum(steady) / (silos * len(steady)),
        "cpu_ms_per_silo_round": 1000 * row["cpu_s"] / sr,
        "peak_rss_mb_per_silo": row["peak_rss_mb"] / silos,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--silos", default="10,100,1000", help="comma-separated numbers of virtual silos")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--run-config", action="append", default=[], help="extra run-config fragment(s)")
    ap.add_argument("--ray-address", help="join this Ray cluster (HOST:PORT) instead of starting a local Ray")
    ap.add_argument("--extra-roots", default="", help="pids whose process trees count too (the raylets)")
    ap.add_argument("--interval", type=float, default=0.2, help="sampling period (s)")
    ap.add_argument("--timeout", type=float, default=900.0, help="per federation (s)")
    ap.add_argument("--label", default="one machine")
    ap.add_argument("--out", default=str(ROOT / "outputs" / "bench" / "scale_silos.json"))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: run one federation, print JSON
    args = ap.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.rounds, args.run_config, args.ray_address)), flush=True)
        return
    roots = [int(p) for p in args.extra_roots.split(",") if p.strip()]
    rows = []
    for n in [int(x) for x in args.silos.split(",")]:
        row = measure(n, args.rounds, args.run_config, args.ray_address, roots, args.interval, args.timeout)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("round_walls_s", "run_config")}), flush=True)
    load = os.getloadavg()
    meta = {"label": args.label, "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.node()}, {os.cpu_count()} CPUs, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
            "command": " ".join([Path(sys.executable).name, "scripts/bench/scale_silos.py"] + (argv or sys.argv[1:])),
            "set-up": BASE + ["silos-per-round = num-silos"] + args.run_config,
            "ray_address": args.ray_address}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\n{meta['label']}: {meta['machine']}; {args.rounds} rounds, all silos every round\n")
    print("| silos | silo-rounds | process wall (s) | start-up + end (s) | wall / silo-round (ms) "
          "| steady round / silo (ms) | CPU (s) | CPU / silo-round (ms) | peak RSS tree (MiB) | test error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "failed" in r:
            print(f"| {r['silos']} | failed: {r['failed']} (wall {r.get('process_wall_s', r.get('wall_s', 0)):.0f} s, "
                  f"CPU {r['cpu_s']:.0f} s, peak RSS {r['peak_rss_mb']:.0f} MiB) ||||||||")
            continue
        print(f"| {r['silos']} | {r['silo_rounds']} | {r['process_wall_s']:.1f} | {r['startup_s']:.1f} | "
              f"{r['wall_ms_per_silo_round']:.1f} | "
              f"{r['steady_wall_ms_per_silo_round']:.1f} | {r['cpu_s']:.1f} | {r['cpu_ms_per_silo_round']:.1f} | "
              f"{r['peak_rss_mb']:.0f} | {r['test_error']:.3f} |")
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
