"""Start-up and whole-run wall time of ``make run`` (``python -m app.launch``, the default config).

Runs the launcher ``--runs`` times, each with a fresh outputs dir, and reports per run:

* launcher to flwr run: launch -> the launcher's ``[silofl] stage:`` line, printed just before it
  starts ``flwr run`` (its pre-flight, the SuperLink check and the staged copy done);
* round 1 done: launch -> the first row of the run's rounds.jsonl on disk (polled every 20 ms;
  the streamed console lines arrive in batches and cannot be timed);
* whole run: launch -> the launcher's exit;
* CPU: the launcher and the ``flwr`` CLI (rusage of the child), and this checkout's local
  SuperLink process tree (SuperLink, SuperExec, the run's flwr-simulation process, Ray and its
  actors: utime + stime, children included, before vs after); the load average before each run;
* whether that run had to start the local SuperLink (the first run after ``make stop`` does).

Then the import-time breakdown of what the engine's actors load: ``python -X importtime`` of
``app.client_app`` (imported to unpickle the first message) and ``app.node_runtime`` (the silo,
imported on the first message), top modules by cumulative time.

With ``--noop``, each silofl run is followed by one of Flower's no-op app (scripts/bench/noop_app:
numpy only, the same train and evaluate exchange per round, as many nodes and rounds as the
default run) through ``flwr run`` on the same local SuperLink, timed the same way, and the
medians are compared side by side (issue 37's goal: silofl's launch -> round 1 within 1.5x).

Targets (issue 14, on a quiet machine): round 1 done <= 8 s, whole run <= 20 s, as medians over
the runs that found the SuperLink running (all runs if none did); PASS/FAIL and the ratios.

The launcher reads a noise plan it computed before back from ``$FLWR_HOME`` (app/noise_plan_cache.py),
so every run after the first skips the dp-accounting import; ``--cold-plan`` removes the stored
plans before each run, to time the pre-flight of a plan not seen before.

With ``--direct``, the silofl runs are ``flwr run <checkout> --stream`` as a Flower user types it
(no launcher: no pre-flight, no staged copy), on the launcher's SuperLink.

    python -m scripts.bench.startup [--runs 3] [--noop] [--direct] [--fast-poll] [--cold-plan] [--no-imports] [-- launcher args]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from app.launch import default_run_config, flower_env
from app.noise_plan_cache import CACHE_DIR
from app.runtime.local_superlink import own_local_superlink, own_superlink_fast_poll

ROOT = Path(__file__).resolve().parents[2]
NOOP_APP = Path(__file__).resolve().parent / "noop_app"

TICKS = os.sysconf("SC_CLK_TCK")


def _tree_cpu(root_pid: int) -> float:
    """utime + stime (+ reaped children's) of ``root_pid`` and its live descendants, seconds."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d.name)] = fields
        children.setdefault(int(fields[1]), []).append(int(d.name))
    total, todo = 0.0, [root_pid]
    while todo:
        pid = todo.pop()
        if pid in stats:
            f = stats[pid]
            total += sum(int(x) for x in f[11:15]) / TICKS  # utime stime cutime cstime
        todo.extend(children.get(pid, []))
    return total


def _superlink_cpu(env: dict[str, str]) -> float:
    return sum(_tree_cpu(pid) for pid, _ in own_superlink_fast_poll(env))


def timed_run(cmd: list[str], tmp: str, env: dict[str, str]) -> dict[str, float | bool | int | str]:
    """Run ``cmd`` (whose run writes ``<tmp>/<run>/rounds.jsonl``) and time it: launch -> the
    first row on disk (polled every 20 ms), launch -> exit, CPU of the child and of this
    checkout's local SuperLink tree, the load before."""
    load = os.getloadavg()[0]
    cpu_link0 = _superlink_cpu(env)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_round: list[float] = []

    def watch() -> None:
        while proc.poll() is None and not first_round:
            for f in Path(tmp).glob("*/rounds.jsonl"):
                if f.read_text().endswith("\n"):
                    first_round.append(time.perf_counter() - t0)
                    return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out_lines, to_stage = [], float("nan")
    for line in proc.stdout or ():  # the launcher flushes its own lines: "stage:" is timed as printed
        if line.startswith("[silofl] stage:") and to_stage != to_stage:
            to_stage = time.perf_counter() - t0
        out_lines.append(line)
    out = "".join(out_lines)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    watcher.join(timeout=1)
    cpu_link = _superlink_cpu(env) - cpu_link0
    return {"rc": proc.returncode, "started_superlink": "Starting local SuperLink" in out,
            "round1_done_s": first_round[0] if first_round else float("nan"), "to_flwr_run_s": to_stage, "wall_s": wall,
            "cpu_launcher_s": usage.ru_utime + usage.ru_stime, "cpu_superlink_s": max(cpu_link, 0.0),
            "load_1min": load, "out": out}


def one_run(extra: list[str], env: dict[str, str], direct: bool = False) -> dict[str, float | bool | int | str]:
    """One default run through the launcher, or (``direct``) through ``flwr run <checkout> --stream``
    as a Flower user types it (no pre-flight, no staged copy) on the launcher's SuperLink."""
    with tempfile.TemporaryDirectory() as tmp:
        if direct:
            env = dict(env)
            own_local_superlink(env)  # the launcher's SuperLink and ports (it keeps the running one)
            cmd = ["flwr", "run", str(ROOT), "--stream", "--run-config", f'outputs-dir="{tmp}"']
        else:
            cmd = [sys.executable, "-m", "app.launch", "--run-config", f'outputs-dir="{tmp}"', *extra]
        r = timed_run(cmd, tmp, env)
    out = str(r.pop("out"))
    rounds = [float(x) for x in re.findall(r"round +\d+/\d+ .*? ([0-9.]+)s\n", out)]
    return r | {"round_median_s": statistics.median(rounds[1:]) if len(rounds) > 1 else float("nan"),
                "log_tail": out[-600:] if r["rc"] else ""}


def noop_run(nodes: int, rounds: int, env: dict[str, str]) -> dict[str, float | bool | int | str]:
    """Flower's no-op app through ``flwr run`` on this checkout's local SuperLink (the one the
    launcher uses: its ports are set in ``env``), ``nodes`` virtual SuperNodes, ``rounds`` rounds."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = ["flwr", "run", str(NOOP_APP), "--stream", "--run-config", f'outputs-dir="{tmp}" num-rounds={rounds}',
               "--federation-config", f"num-supernodes={nodes}"]
        r = timed_run(cmd, tmp, env)
    out = str(r.pop("out"))
    return r | {"round_median_s": float("nan"), "log_tail": out[-600:] if r["rc"] else ""}


def _line(label: str, r: dict) -> str:
    pre = "" if r["to_flwr_run_s"] != r["to_flwr_run_s"] else f"launcher to flwr run {r['to_flwr_run_s']:.2f} s, "
    return (f"{label}: rc {r['rc']}, {pre}round 1 done {r['round1_done_s']:.1f} s, whole run {r['wall_s']:.1f} s, "
            f"CPU launcher+CLI {r['cpu_launcher_s']:.1f} s, SuperLink tree {r['cpu_superlink_s']:.1f} s, "
            f"median round {r['round_median_s']:.3f} s, load {r['load_1min']:.2f}"
            + (" (started the local SuperLink)" if r["started_superlink"] else "") + str(r["log_tail"]))


def import_breakdown(module: str, top: int = 8) -> list[tuple[float, str]]:
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], cwd=ROOT,
                         env=flower_env(ROOT), capture_output=True, text=True, timeout=300)
    rows = []
    for line in out.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if m and len(m.group(2)) <= 6:  # the module itself and three levels below it
            rows.append((int(m.group(1)) / 1e6, "  " * (len(m.group(2)) // 2) + m.group(3)))
    return sorted(rows, reverse=True)[:top]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fast-poll", action="store_true", help="python -m app.launch --fast-poll")
    ap.add_argument("--cold-plan", action="store_true",
                    help="remove the launcher's stored noise plans before each run (app/noise_plan_cache.py)")
    ap.add_argument("--no-imports", action="store_true", help="skip the import-time breakdown")
    ap.add_argument("--noop", action="store_true", help="after each run, Flower's no-op app on the same SuperLink")
    ap.add_argument("--direct", action="store_true",
                    help="each silofl run is `flwr run <checkout> --stream` (no launcher), after a launcher run starts the SuperLink")
    ap.add_argument("--round1-target", type=float, default=8.0)
    ap.add_argument("--wall-target", type=float, default=20.0)
    ap.add_argument("launcher_args", nargs="*", help="more arguments for python -m app.launch (after --)")
    args = ap.parse_args(argv)
    env = flower_env(ROOT)
    extra = [*(["--fast-poll"] if args.fast_poll else []), *args.launcher_args]
    rows, floor = [], []
    if args.noop:
        from app.config import parse_settings

        settings = parse_settings(default_run_config(ROOT))
        nodes, num_rounds = settings.simulation_nodes(), settings.num_rounds
    print(f"{os.cpu_count()} CPUs; " + ("flwr run . --stream" if args.direct else f"python -m app.launch {' '.join(extra)}")
          + (" (stored noise plans removed before each run)" if args.cold_plan else ""), flush=True)
    if args.direct:  # the launcher's SuperLink (its ports, no dependency installation), started once
        print(_line("launcher run (starts the SuperLink)", one_run(extra, env)), flush=True)
    for i in range(args.runs):
        if args.cold_plan:
            shutil.rmtree(Path(env["FLWR_HOME"]) / CACHE_DIR, ignore_errors=True)
        r = one_run(extra, env, direct=args.direct)
        rows.append(r)
        print(_line(f"run {i + 1}", r), flush=True)
        if args.noop:
            noop_env = dict(env)
            own_local_superlink(noop_env)  # the launcher's SuperLink and ports (it keeps the running one)
            f = noop_run(nodes, num_rounds, noop_env)
            floor.append(f)
            print(_line(f"no-op {i + 1}", f), flush=True)
    ok_rows = [r for r in rows if r["rc"] == 0]
    warm = [r for r in ok_rows if not r["started_superlink"]] or ok_rows
    if not args.no_imports:
        for module in ("app.client_app", "app.node_runtime"):
            print(f"\nimport {module} in a fresh process (cumulative s, python -X importtime):")
            for sec, name in import_breakdown(module):
                print(f"  {sec:6.2f}  {name}")
    if not warm:
        print("\nFAIL: no run succeeded")
        return 1
    r1 = statistics.median(r["round1_done_s"] for r in warm)
    wall = statistics.median(r["wall_s"] for r in warm)
    load = statistics.median(r["load_1min"] for r in warm)
    print(f"\nmedian of {len(warm)} run(s){' with the SuperLink already running' if warm is not ok_rows else ''}, "
          f"load {load:.2f} on {os.cpu_count()} CPUs (the targets are for a quiet machine):")
    print(f"  launch -> round 1 done {r1:.1f} s (target {args.round1_target:g} s, ratio {r1 / args.round1_target:.2f}): "
          f"{'PASS' if r1 <= args.round1_target else 'FAIL'}")
    pre = [r["to_flwr_run_s"] for r in warm if r["to_flwr_run_s"] == r["to_flwr_run_s"]]
    if pre:
        print(f"  launch -> the launcher starts flwr run (its pre-flight done) {statistics.median(pre):.2f} s")
    print(f"  whole run {wall:.1f} s (target {args.wall_target:g} s, ratio {wall / args.wall_target:.2f}): "
          f"{'PASS' if wall <= args.wall_target else 'FAIL'}")
    ok_floor = [f for f in floor if f["rc"] == 0 and not f["started_superlink"]]
    if ok_floor:
        f1 = statistics.median(f["round1_done_s"] for f in ok_floor)
        fw = statistics.median(f["wall_s"] for f in ok_floor)
        fc = statistics.median(f["cpu_superlink_s"] for f in ok_floor)
        sc = statistics.median(r["cpu_superlink_s"] for r in warm)
        print(f"  Flower's no-op app on the same SuperLink ({len(ok_floor)} run(s), {nodes} nodes, {num_rounds} rounds): "
              f"round 1 done {f1:.1f} s, whole run {fw:.1f} s, SuperLink tree CPU {fc:.1f} s")
        print(f"  silofl / no-op: launch -> round 1 {r1 / f1:.2f}x (goal <= 1.5x: {'PASS' if r1 <= 1.5 * f1 else 'FAIL'}), "
              f"whole run {wall / fw:.2f}x, SuperLink tree CPU {sc / max(fc, 1e-9):.2f}x")
    return 0 if len(ok_rows) == len(rows) and len(ok_floor) == len(floor) else 1


if __name__ == "__main__":
    sys.exit(main())
