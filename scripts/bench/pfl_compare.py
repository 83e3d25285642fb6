"""silofl vs pfl-research on the same task, side by side in one run (issue 37), plus the vectorised floor.

For each data set and client count, two fresh processes back to back:

1. **silofl**: ``app.local_grid.run_local`` (the real ServerApp / ClientApp code, strategies, silos,
   ledgers, accounting, on the in-process grid, one silo at a time; ``--silofl-path batched``:
   the batched simulation path) with ``app.launch.default_run_config()`` and

       dataset = D, partition = "iid", num-silos = silos-per-round = N, num-rounds = R,
       privacy.delta = 1e-5, eval-every = 1, checkpoint = false, outputs-dir = a temp dir

   (ISRL-DP MB-SGD at the default epsilon = 3; the data set's preset for the rest: digits = MLP
   64-64-10, full batches, lr 1, clip 2; Fashion-MNIST = PCA 50, MLP 50-64-10, batch 64, lr 1,
   clip 2), plus any ``--silofl-config KEY=VALUE``;
2. **pfl**: ``scripts/bench/pfl_runner.py`` under ``--pfl-python`` (pfl's own venv): the same
   data set, N users, R rounds, every user every round, one local SGD step on the same batch
   size with silofl's lr, FedAvg, local ``GaussianMechanism``.

**The privacy differs in kind, by design of each library**: silofl clips each *record's*
gradient to C and adds N(0, sigma^2) to each silo's mean gradient, sigma = z * 2C / K (record-level
ISRL-DP, replace-one, epsilon = 3 per silo over R rounds); pfl's local ``GaussianMechanism``
clips each *user's update* (lr x its one-step gradient) to C and adds N(0, (z' C)^2). The bench
gives pfl the same noise standard deviation per coordinate of a client's update as silofl's
median silo (z' C = lr * sigma) so both do the same arithmetic and learn comparably, and prints
the epsilon pfl's accountant gives that noise for its unit (a user's whole update; computed in a
separate, untimed process: pfl's timed run builds ``GaussianMechanism(C, z')`` directly, while
silofl's timed run includes its own per-silo noise calibration). The cost of a round does not
depend on the noise's size.

Measured per side: wall and CPU (user + system, the process and the children it waited for:
``os.wait4``'s rusage), CPU per client-round (CPU / (N R)), the final central test accuracy, and
the 1-minute load average before and after. Then the floor (``scripts.bench.dp_floor``, a fresh
process): a per-record-clipped noisy step for 1,000 silos at once with torch.func, K = 32 and 2.

    python -m scripts.bench.pfl_compare                       # digits 100 and 1,000, Fashion-MNIST 100, floor
    python -m scripts.bench.pfl_compare --datasets digits --clients 100 --no-floor
    python -m scripts.bench.pfl_compare --silofl-config lr=0.5 --silofl-config 'privacy.epsilon=6'

Both sides run with ``OMP_NUM_THREADS=1`` (and torch's intra-op threads = 1 through it) unless the
environment sets it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "scripts" / "bench" / "pfl_runner.py"
DEFAULT_PFL_PYTHON = "/work/pfl-venv/bin/python"
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                 "t10k-labels-idx1-ubyte.gz")


def parse_value(text: str) -> Any:
    """A ``--silofl-config`` value: JSON where it parses (1, 0.5, true, "x"), else the bare string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def silofl_config(dataset: str, clients: int, rounds: int, outputs: str, extra: list[str]) -> dict[str, Any]:
    """The run config of silofl's side (the module docstring), ``extra`` KEY=VALUE on top."""
    from app.launch import default_run_config

    cfg = default_run_config() | {"dataset": dataset, "partition": "iid", "num-silos": clients,
                                  "silos-per-round": clients, "num-rounds": rounds, "privacy.delta": 1e-5,
                                  "eval-every": 1, "checkpoint": False, "outputs-dir": outputs}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--silofl-config {item!r}: expected KEY=VALUE")
        cfg[key.strip()] = parse_value(value.strip())
    return cfg


def silofl_child(dataset: str, clients: int, rounds: int, extra: list[str], path: str = "alone") -> None:
    """silofl's side, in this (fresh) process: one run_local on ``path`` (batched: the batched
    simulation path, app/privacy/row_batcher.py; alone: one silo at a time); prints ``SILOFL_RESULT {json}``."""
    from app.local_grid import run_local

    tmp = tempfile.mkdtemp(prefix="pflbench-silofl-")
    try:
        cfg = silofl_config(dataset, clients, rounds, tmp, extra)
        run_local(cfg, str(Path(tmp) / "state"), **({"batched": True} if path == "batched" else {}))
        summary = json.loads(next(Path(tmp).glob("*/summary.json")).read_text())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    silos = summary["silos"]
    med = sorted(silos, key=lambda s: s["sigma"])[len(silos) // 2]
    conf = summary["config"]
    print("SILOFL_RESULT " + json.dumps({
        "status": summary["status"], "test_accuracy": summary["test_accuracy"], "rounds_done": summary["rounds_done"],
        "lr": conf["lr"], "batch_size": conf["batch_size"], "clip": med["clip"], "median_sigma": med["sigma"],
        "median_records": med["n"], "median_batch": med["batch"],
        "noise_multiplier": med["planned"][0]["noise_multiplier"], "eps_max_spent": summary["eps_max_spent"],
        "delta": med["delta"], "unit": "a record (record-level ISRL-DP, per silo)"}), flush=True)


def run_measured(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run ``cmd`` as a fresh process; its wall, CPU (user + sys of it and the children it reaped),
    exit code, output, and the load average before and after."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    return {"rc": proc.returncode, "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "user_s": usage.ru_utime, "sys_s": usage.ru_stime, "output": out,
            "load_before": load0, "load_after": os.getloadavg()[0]}


def result_line(output: str, tag: str) -> dict[str, Any] | None:
    """The JSON after the last line starting with ``tag``, or None."""
    lines = [ln for ln in output.splitlines() if ln.startswith(tag + " ")]
    return json.loads(lines[-1][len(tag) + 1:]) if lines else None


def pfl_available(python: str, env: dict[str, str]) -> str | None:
    """None when ``python`` exists and imports pfl; else the reason why not."""
    if not Path(python).exists():
        return f"interpreter {python} absent (python3 -m venv /work/pfl-venv && /work/pfl-venv/bin/pip install " \
               f"'pfl==0.6.0' torch scikit-learn)"
    probe = subprocess.run([python, "-c", "import pfl, sys; sys.stdout.write(pfl.__version__)"], env=env,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"{python} cannot import pfl ({(probe.stderr.strip().splitlines() or ['?'])[-1]})"
    return None


def fmt_side(name: str, run: dict[str, Any], res: dict[str, Any] | None, client_rounds: int) -> str:
    """One table row."""
    acc = "n/a" if res is None or res.get("test_accuracy") is None else f"{res['test_accuracy']:.3f}"
    return (f"| {name} | {run['wall_s']:.1f} | {run['cpu_s']:.1f} ({run['user_s']:.1f} + {run['sys_s']:.1f}) | "
            f"{1e3 * run['cpu_s'] / client_rounds:.2f} | {acc} | {run['load_before']:.2f} → {run['load_after']:.2f} |")


def compare(dataset: str, clients: int, rounds: int, args: argparse.Namespace, env: dict[str, str],
            pfl_skip: str | None) -> dict[str, Any]:
    """Both sides for one (data set, clients); prints the rows; returns what was measured."""
    n_cr = clients * rounds
    print(f"\n### {dataset}, {clients} clients x {rounds} rounds ({n_cr} client-rounds)", flush=True)
    cmd = [sys.executable, "-m", "scripts.bench.pfl_compare", "--child", "silofl", "--datasets", dataset,
           "--clients", str(clients), "--rounds", str(rounds)]
    for item in args.silofl_config:
        cmd += ["--silofl-config", item]
    cmd += ["--silofl-path", args.silofl_path]
    s_run = run_measured(cmd, env)
    s_res = result_line(s_run["output"], "SILOFL_RESULT")
    if s_run["rc"] != 0 or s_res is None:
        print(f"silofl side FAILED (rc {s_run['rc']}):\n{s_run['output'][-3000:]}", flush=True)
    out: dict[str, Any] = {"dataset": dataset, "clients": clients, "rounds": rounds, "silofl": s_run | {"result": s_res}}
    p_run = p_res = None
    if pfl_skip:
        print(f"pfl side: SKIPPED ({pfl_skip})", flush=True)
    elif s_res is not None:
        noise = s_res["lr"] * s_res["median_sigma"]
        batch = s_res["batch_size"] if isinstance(s_res["batch_size"], int) else 0
        p_cmd = [args.pfl_python, str(RUNNER), "--dataset", dataset, "--clients", str(clients), "--rounds",
                 str(rounds), "--lr", str(s_res["lr"]), "--clip", str(s_res["clip"]), "--batch", str(batch),
                 "--delta", str(s_res["delta"]), "--noise-std", repr(noise)]
        p_run = run_measured(p_cmd, env)
        p_res = result_line(p_run["output"], "PFL_RESULT")
        eps_run = None if args.no_pfl_epsilon else subprocess.run([args.pfl_python, str(RUNNER), "--epsilon-only", "--noise-std", repr(noise), "--clip",
                                  str(s_res["clip"]), "--rounds", str(rounds), "--delta", str(s_res["delta"])],
                                 cwd=ROOT, env=env, capture_output=True, text=True)
        eps = None if eps_run is None else result_line(eps_run.stdout, "PFL_EPSILON")
        if p_res is not None and eps is not None:
            p_res["epsilon"], p_res["accountant_cpu_s"] = eps["epsilon"], eps["accountant_cpu_s"]
        if p_run["rc"] != 0 or p_res is None:
            print(f"pfl side FAILED (rc {p_run['rc']}):\n{p_run['output'][-3000:]}", flush=True)
        out["pfl"] = p_run | {"result": p_res}
    for run in (s_run, p_run):
        if run is not None:
            del run["output"]
    if s_res is not None:
        print(f"silofl noise: clips each RECORD's gradient to C = {s_res['clip']}, adds N(0, sigma^2) to each silo's "
              f"mean gradient, sigma = z 2C/K = {s_res['median_sigma']:.4g} (median silo: z = "
              f"{s_res['noise_multiplier']:.4g}, K = {s_res['median_batch']} of n = {s_res['median_records']} "
              f"records); epsilon {s_res['eps_max_spent']:.3g} per silo at delta {s_res['delta']:g}, unit: a record",
              flush=True)
    if p_res is not None:
        print(f"pfl noise:    clips each USER's update (lr x gradient) to C = {p_res['clip']}, adds N(0, (z' C)^2) "
              f"per coordinate, z' C = {p_res['noise_std_per_update_coordinate']:.4g} (= silofl's lr x sigma; z' = "
              f"{p_res['noise_multiplier']:.4g}); epsilon {p_res['epsilon'] or float('nan'):.3g} at delta {p_res['delta']:g} "
              f"by pfl's PLD accountant over {rounds} rounds (untimed, {p_res.get('accountant_cpu_s', float('nan')):.1f} s "
              f"CPU), unit: a user's whole update", flush=True)
    print("| side | wall (s) | CPU (s, user + sys) | CPU / client-round (ms) | final test accuracy | load 1-min |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(fmt_side("silofl (in-process grid)", s_run, s_res, n_cr))
    if p_run is not None:
        print(fmt_side("pfl 0.6.0 (SimulatedBackend)", p_run, p_res, n_cr))
        print(f"ratio silofl / pfl: CPU {s_run['cpu_s'] / p_run['cpu_s']:.2f}x, wall "
              f"{s_run['wall_s'] / p_run['wall_s']:.2f}x", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", default="digits,fashion-mnist")
    ap.add_argument("--clients", default="100,1000", help="comma-separated client counts")
    ap.add_argument("--fmnist-clients", default="100",
                    help="client counts for Fashion-MNIST (default 100 only: 1,000 is minutes per side here)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pfl-python", default=DEFAULT_PFL_PYTHON)
    ap.add_argument("--silofl-config", action="append", default=[], metavar="KEY=VALUE",
                    help="a run-config key for silofl's side (repeatable), e.g. a simulation-path switch")
    ap.add_argument("--silofl-path", choices=("alone", "batched"), default="alone",
                    help="silofl's simulation path: alone (the default: one silo at a time, the fastest on CPU) or "
                         "batched (app/privacy/row_batcher.py)")
    ap.add_argument("--no-floor", action="store_true", help="skip the vectorised floor")
    ap.add_argument("--no-pfl-epsilon", action="store_true",
                    help="skip the untimed epsilon of pfl's noise (its PLD accountant takes ~1 min of CPU at "
                         "Fashion-MNIST's small noise)")
    ap.add_argument("--floor-silos", type=int, default=1000)
    ap.add_argument("--floor-records", default="32,2")
    ap.add_argument("--json", default="", help="also write every figure to this JSON file")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child == "silofl":
        silofl_child(args.datasets, int(args.clients), args.rounds, args.silofl_config, args.silofl_path)
        return

    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    pfl_skip = pfl_available(args.pfl_python, env)
    print(f"machine: {platform.node()}, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
          f"OMP_NUM_THREADS={env['OMP_NUM_THREADS']}; silofl python {sys.executable}; pfl python "
          f"{args.pfl_python}{' (SKIPPED: ' + pfl_skip + ')' if pfl_skip else ''}; "
          f"uptime load {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    print(f"silofl simulation path: {args.silofl_path}", flush=True)
    if args.silofl_config:
        print(f"silofl extra config: {args.silofl_config}", flush=True)

    results: list[dict[str, Any]] = []
    for dataset in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        counts = args.fmnist_clients if dataset == "fashion-mnist" else args.clients
        if dataset == "fashion-mnist":
            missing = [f for f in FASHION_FILES if not (FASHION_MNIST_DIR / f).exists()]
            if missing:
                print(f"\n### fashion-mnist: SKIPPED (absent: {FASHION_MNIST_DIR}/{missing[0]}; install the "
                      f"Debian package dataset-fashion-mnist)", flush=True)
                continue
        for n in [int(c) for c in counts.split(",") if c.strip()]:
            results.append(compare(dataset, n, args.rounds, args, env, pfl_skip))

    floor: list[dict[str, Any]] = []
    if not args.no_floor:
        print("\n### the vectorised floor (scripts.bench.dp_floor, a fresh process)", flush=True)
        f_run = run_measured([sys.executable, "-m", "scripts.bench.dp_floor", "--silos", str(args.floor_silos),
                              "--records", args.floor_records], env)
        print("\n".join(ln for ln in f_run["output"].splitlines() if not ln.startswith("FLOOR_RESULT")), flush=True)
        floor = [json.loads(ln.split(" ", 1)[1]) for ln in f_run["output"].splitlines() if ln.startswith("FLOOR_RESULT")]
        if f_run["rc"] != 0:
            print(f"floor FAILED (rc {f_run['rc']})", flush=True)

    summary_rows = [r for r in results if r.get("pfl") and r["silofl"]["result"] and r["pfl"]["result"]]
    if summary_rows:
        print("\n### summary: CPU per client-round (ms), silofl / pfl", flush=True)
        for r in summary_rows:
            s = 1e3 * r["silofl"]["cpu_s"] / (r["clients"] * r["rounds"])
            p = 1e3 * r["pfl"]["cpu_s"] / (r["clients"] * r["rounds"])
            print(f"  {r['dataset']} {r['clients']}: silofl {s:.2f}, pfl {p:.2f} -> {s / p:.2f}x", flush=True)
    if floor and results:
        by_k = statistics.median(f["cpu_per_silo_round_ms"] for f in floor if f["records"] == max(x["records"] for x in floor))
        print(f"  floor at K = {max(f['records'] for f in floor)}: {by_k:.3f} ms per silo-round", flush=True)
    print(f"load at the end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"runs": results, "floor": floor, "pfl_skip": pfl_skip}, indent=1))


if __name__ == "__main__":
    main()
