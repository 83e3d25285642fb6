"""The federation on one GPU: ``flwr run`` in simulation mode with ``device=cuda`` and fractional
``client-resources-num-gpus``, LeNet-5 and ResNet-18 (GroupNorm) on CIFAR-10-shaped synthetic
images (``dataset=synthetic-image``: 3 x 32 x 32, 10 classes, no download), two federations per
model: ``dp`` = ISRL-DP minibatch SGD with SRHT sketches, ``robust`` = Grad-BANT with SRHT
sketches (no DP noise: with it every Grad-BANT score is 0 at this size and the model would not
move); and the same federations on CPU and GPU with the same seeds.

    scripts/bench/gpu_run.sh                       # on a CUDA machine (budget: under 8 minutes)
    scripts/bench/gpu_run.sh --device cpu --small  # the same path on the CPU, small sizes

Steps (each prints one result line, ``[gpu_run] ...``):

1. ``scripts/bench/gpu_check.py`` (CUDA only): per-sample gradients and noise, CPU vs GPU; and
   ``scripts/bench/server_device_check.py``: the server's trust-set gradients, sketch lifts and a
   short Grad-BANT federation with ``server-device=cuda`` against the CPU.
2. Agreement: per model and federation, one short run (2 rounds, 4 silos, evaluated after round 2)
   on the in-process grid (the real ServerApp and ClientApp, no Flower runtime), once with
   ``device=cpu`` and once with ``--device``, same seeds (run-seeded noise and sketches come from
   CPU generators, so both runs draw the same noise): the final models' difference relative to
   the size of the update (tolerance 1e-2: cuDNN convolutions may use TF32) and the test error.
   On CUDA it also reports ``torch.cuda.max_memory_allocated`` of that process (the silos' work,
   one silo at a time). With ``--device cpu`` the two runs must be bit-identical.
3. Per model and federation, ``python -m app.launch`` (``flwr run`` with the local simulation
   SuperLink): 10 silos (4 with ``--small``), ``device=--device``,
   ``client-resources-num-gpus=--num-gpus`` (0 on the CPU): rounds/s (from rounds.jsonl, and
   including the start-up), test error, and on CUDA the peak GPU memory in use during the run
   (``nvidia-smi`` polled every 0.5 s, all processes, and the idle baseline).

``python -m app.launch`` runs on this checkout's own local SuperLink (its FLWR_HOME, its own
ports: another checkout's SuperLink is no obstacle); at the end this stops the SuperLink of this
checkout that it started (by pid; never anyone else's). Results also go to ``<outdir>/gpu_run.json``.
Exit codes: 0 every check passed, 1 a check or a run failed, 2 prerequisites missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: relative difference of the final models (CPU vs GPU), relative to the norm of the update
AGREE_TOL = 1e-2

#: what every run shares: CIFAR-10-shaped synthetic images, IID silos, SRHT sketches
BASE: dict[str, Any] = {
    "dataset": "synthetic-image", "partition": "iid", "sketch.kind": "srht", "sketch.ratio": 0.5,
    "seed": 1, "eval-every": 1,
}
#: step size per model (ResNet-18 at 0.1 with tiny batches reached train loss 19.6 in 2 rounds)
LR = {"lenet5": 0.1, "resnet18": 0.02}
#: the two federations: ISRL-DP minibatch SGD, and Grad-BANT (without DP noise, whose alignment
#: scores would all be 0 at this size: the model would not move and the check would compare nothing)
CONFIGS: dict[str, dict[str, Any]] = {
    "dp": {"algorithm": "mbsgd", "privacy.mode": "isrl", "privacy.epsilon": 3.0},
    "robust": {"algorithm": "gradbant", "privacy.mode": "off", "trust.size": 100},
}
LABEL = {"dp": "mbsgd+isrl+srht", "robust": "gradbant+srht"}


def sizes(small: bool) -> dict[str, Any]:
    """The federation's size: full (the GPU run) or small (the CPU smoke run)."""
    if small:
        return {"num-silos": 4, "silos-per-round": 4, "rounds": 2, "batch": {"lenet5": 8, "resnet18": 2},
                "trust": 40}
    return {"num-silos": 10, "silos-per-round": 10, "rounds": 5, "batch": {"lenet5": 64, "resnet18": 32},
            "trust": 100}


def log(msg: str) -> None:
    print(f"[gpu_run] {msg}", flush=True)


# --------------------------------------------------------------------------- prerequisites


def prerequisites(device: str) -> list[str]:
    """What is missing to run on ``device`` (empty: nothing)."""
    missing = []
    try:
        import torch
    except ImportError:
        return ["torch is not importable"]
    if device == "cuda" and not torch.cuda.is_available():
        missing.append(f"torch {torch.__version__} sees no CUDA device")
    for mod in ("flwr", "ray"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(f"{mod} is not importable (pip install 'flwr[simulation]==1.42.*')")
    if shutil.which("flwr") is None and not (Path(sys.executable).parent / "flwr").exists():
        missing.append("the flwr command is not on PATH")
    from app.data.sources import SOURCES

    try:
        from app.data.federated import SOURCE_META
    except ImportError as exc:
        missing.append(f"app.data.federated: {exc}")
    else:
        if "synthetic-image" not in SOURCES or "synthetic-image" not in SOURCE_META:
            missing.append("dataset synthetic-image is not registered (app/data/sources.py SOURCES and "
                           "app/data/federated.py SOURCE_META)")
    return missing


# --------------------------------------------------------------------------- step 1


def gpu_check(timeout: float, script: str = "gpu_check") -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", f"scripts.bench.{script}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(proc.stdout + proc.stderr)
    ok = proc.returncode == 0
    log(f"{script}: {'PASS' if ok else f'FAIL (exit {proc.returncode})'} in {time.perf_counter() - t0:.1f}s")
    return {"ok": ok, "returncode": proc.returncode, "wall_s": time.perf_counter() - t0}


# --------------------------------------------------------------------------- step 2


def _in_process(cfg: dict[str, Any], out: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """One federation on the in-process grid; (summary, rounds, checkpoint model {name: array})."""
    from app.checkpoint import load_checkpoint
    from app.launch import merged_run_config
    from app.local_grid import run_local
    from app.results import load_rounds

    full = merged_run_config([]) | cfg | {"outputs-dir": str(out / "out"), "run-name": "run"}
    run_local(full, str(out / "state"))
    run_dir = out / "out" / "run"
    state = load_checkpoint(run_dir / "checkpoint.npz")
    return json.loads((run_dir / "summary.json").read_text()), load_rounds(run_dir / "rounds.jsonl"), state["model"]


def agreement(model: str, kind: str, device: str, small: bool, outdir: Path) -> dict[str, Any]:
    import numpy as np
    import torch

    from app.models import build_model
    from app.seeding import torch_gen

    sz = sizes(small)
    cfg = BASE | CONFIGS[kind] | {
        "model": model, "lr": LR[model], "num-silos": 4, "silos-per-round": 4, "num-rounds": 2, "eval-every": 2,
        "batch-size": sz["batch"][model] if small else min(sz["batch"][model], 16),
    }
    if "trust.size" in cfg:
        cfg["trust.size"] = min(sz["trust"], 40)
    res: dict[str, Any] = {"model": model, "config": kind, "devices": ["cpu", device]}
    # the CPU reference runs in this process: use the machine's cores (OMP_NUM_THREADS=1 is for silos)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))) if device == "cuda" else threads)
    runs = {}
    for tag, dev in (("a", "cpu"), ("b", device)):
        peak = None
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        summary, rows, w = _in_process(cfg | {"device": dev}, outdir / f"agree-{model}-{kind}-{tag}-{dev}")
        wall = time.perf_counter() - t0
        if dev == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**20
        runs[tag] = (summary, rows, w)
        res[f"{tag}_wall_s"] = wall
        if peak is not None:
            res["cuda_max_memory_allocated_mib"] = peak
    torch.set_num_threads(threads)
    (s_a, rows_a, w_a), (s_b, rows_b, w_b) = runs["a"], runs["b"]
    names = sorted(w_a)
    flat_a = np.concatenate([np.asarray(w_a[k], dtype=np.float64).ravel() for k in names])
    flat_b = np.concatenate([np.asarray(w_b[k], dtype=np.float64).ravel() for k in names])
    # w_0 of this run, built as the ServerApp builds it (app/server_app.py: seed, "init")
    from app.config import parse_settings
    from app.data.federated import dataset_meta
    from app.launch import merged_run_config

    st = parse_settings(merged_run_config([]) | cfg)
    shape, classes = dataset_meta(st)
    init = build_model(st.model, shape, classes, hidden=st.model_hidden, generator=torch_gen(st.seed, "init"))
    w0 = {k: v.detach().numpy() for k, v in init.named_parameters()}
    flat_0 = np.concatenate([np.asarray(w0[k], dtype=np.float64).ravel() for k in names])
    update = float(np.linalg.norm(flat_a - flat_0))
    diff = float(np.linalg.norm(flat_b - flat_a))
    rel = diff / max(update, 1e-30)
    res |= {"max_abs_diff": float(np.abs(flat_b - flat_a).max()), "update_norm": update, "diff_norm": diff,
            "relative_to_update": rel,
            "test_error": [[r.get("test_error") for r in rows_a], [r.get("test_error") for r in rows_b]],
            "status": [s_a["status"], s_b["status"]]}
    if device == "cpu":
        ok = bool(np.array_equal(flat_a, flat_b)) and res["test_error"][0] == res["test_error"][1]
        verdict = "bit-identical: PASS" if ok else "bit-identical: FAIL"
    else:
        ok = rel <= AGREE_TOL
        verdict = f"<= {AGREE_TOL:g}: {'PASS' if ok else 'FAIL'}"
    ok = ok and s_a["status"] == s_b["status"] == "completed" and update > 0
    res["ok"] = ok
    mem = f", cuda max_memory_allocated {res['cuda_max_memory_allocated_mib']:.0f} MiB" if device == "cuda" else ""
    log(f"agreement {model} {LABEL[kind]}, cpu vs {device}: |w_{device} - w_cpu| / |w_cpu - w_0| = {rel:.2e} "
        f"({verdict}), max |dw| {res['max_abs_diff']:.2e}, update norm {update:.3g}; test error per round "
        f"cpu {_pct(res['test_error'][0])} {device} {_pct(res['test_error'][1])}{mem}; "
        f"{res['a_wall_s']:.1f}s / {res['b_wall_s']:.1f}s" + ("" if ok else "  <-- FAILED"))
    return res


def _pct(xs: list[Any]) -> str:
    return "[" + ", ".join("-" if x is None else f"{100 * x:.1f}%" for x in xs) + "]"


# --------------------------------------------------------------------------- step 3


class GpuMemoryPoller:
    """Peak of nvidia-smi's memory.used (MiB, GPU 0, every process) while running."""

    def __init__(self, interval: float = 0.5) -> None:
        self.interval, self.peak, self.baseline = interval, None, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def read() -> float | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10)
            return float(out.stdout.strip().splitlines()[0])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None

    def _run(self) -> None:
        while not self._stop.is_set():
            v = self.read()
            if v is not None:
                self.peak = v if self.peak is None else max(self.peak, v)
            self._stop.wait(self.interval)

    def __enter__(self) -> GpuMemoryPoller:
        self.baseline = self.read()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def superlink_pids() -> set[int]:
    """This checkout's running local simulation SuperLinks (its FLWR_HOME); nobody else's."""
    from app.launch import flower_env
    from app.runtime.local_superlink import own_superlink_fast_poll

    return {pid for pid, _ in own_superlink_fast_poll(flower_env())}


def stop_superlinks(pids: set[int], wait_s: float = 10.0) -> None:
    """SIGTERM (then SIGKILL) the SuperLinks this script started, and their process groups."""
    from app.runtime.local_superlink import end_processes

    end_processes(pids, wait_s)
    if pids:
        log(f"stopped the SuperLink(s) this script started: pid {sorted(pids)}")


def flwr_federation(model: str, kind: str, device: str, num_gpus: float, small: bool, outdir: Path, mine: set[int],
                    args: argparse.Namespace) -> dict[str, Any]:
    sz = sizes(small)
    rounds = args.rounds or sz["rounds"]
    name = f"gpu-run-{model}-{kind}-{device}"
    cfg = BASE | CONFIGS[kind] | {
        "model": model, "lr": LR[model], "device": device, "num-silos": sz["num-silos"],
        "silos-per-round": sz["silos-per-round"],
        "num-rounds": rounds, "batch-size": sz["batch"][model],
        "outputs-dir": str(outdir / "flwr"), "run-name": name, "checkpoint": False,
    }
    if "trust.size" in cfg:
        cfg["trust.size"] = sz["trust"]
    from app.launch import toml_value

    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in cfg.items())
    fed = f"client-resources-num-gpus={num_gpus!r} client-resources-num-cpus={args.num_cpus!r}"
    res: dict[str, Any] = {"model": model, "config": kind, "device": device, "num_gpus": num_gpus, "rounds": rounds,
                           "num_silos": sz["num-silos"], "run_config": cfg}
    before = superlink_pids()
    cmd = [sys.executable, "-m", "app.launch", "--run-config", run_config, "--federation-config", fed]
    log(f"flwr run {model} {LABEL[kind]} device={device} client-resources-num-gpus={num_gpus}: "
        f"{sz['num-silos']} silos, {rounds} rounds")
    poller = GpuMemoryPoller() if device == "cuda" and shutil.which("nvidia-smi") else contextlib.nullcontext()
    t0 = time.perf_counter()
    tail: list[str] = []
    with poller as p:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                mine |= superlink_pids() - before  # the SuperLink flwr started for this run is ours
                if line.startswith("[silofl]") or "error" in line.lower() or "Traceback" in line:
                    sys.stdout.write("    " + line)
                    sys.stdout.flush()
                tail = (tail + [line])[-40:]
            rc = proc.wait(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = -9
    wall = time.perf_counter() - t0
    mine |= superlink_pids() - before
    summary_path = outdir / "flwr" / name / "summary.json"
    res |= {"returncode": rc, "launcher_wall_s": wall}
    if rc != 0 or not summary_path.exists():
        sys.stdout.write("".join(tail))
        res["ok"] = False
        log(f"flwr run {model} {LABEL[kind]}: FAILED (exit {rc})")
        return res
    from app.results import load_rounds

    summary = json.loads(summary_path.read_text())
    rows = load_rounds(summary_path.parent / "rounds.jsonl")
    round_s = sum(float(r["wall_s"]) for r in rows)
    res |= {"status": summary["status"], "test_error": summary["test_error"], "server_wall_s": summary["wall_s"],
            "rounds_done": len(rows), "rounds_per_s": len(rows) / round_s if round_s else None,
            # round 1 includes starting the ClientApp actors (imports, CUDA context, data)
            "rounds_per_s_after_first": ((len(rows) - 1) / (round_s - float(rows[0]["wall_s"]))
                                         if len(rows) > 1 and round_s > float(rows[0]["wall_s"]) else None),
            "rounds_per_s_incl_start": len(rows) / wall, "per_round_s": [float(r["wall_s"]) for r in rows]}
    if isinstance(p, GpuMemoryPoller):
        res |= {"gpu_memory_peak_mib": p.peak, "gpu_memory_baseline_mib": p.baseline}
    res["ok"] = summary["status"] == "completed" and len(rows) == rounds
    mem = ""
    if res.get("gpu_memory_peak_mib") is not None:
        mem = (f", GPU memory peak {res['gpu_memory_peak_mib']:.0f} MiB in use (nvidia-smi, all processes; idle "
               f"{res['gpu_memory_baseline_mib']:.0f} MiB)")
    te = summary["test_error"]
    log(f"flwr run {model} {LABEL[kind]} {device}: {'PASS' if res['ok'] else 'FAIL'}: {len(rows)} rounds, "
        f"{res['rounds_per_s']:.3f} rounds/s (rounds only; "
        + (f"{res['rounds_per_s_after_first']:.3f} after round 1" if res["rounds_per_s_after_first"] else "-")
        + f"), {res['rounds_per_s_incl_start']:.3f} rounds/s incl. "
        f"start-up ({wall:.1f}s wall), test error {'-' if te is None else f'{100 * te:.1f}%'}{mem}")
    return res


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--small", action="store_true", help="small sizes (4 silos, 2 rounds, tiny batches)")
    ap.add_argument("--models", default=None,
                    help="comma-separated: lenet5, resnet18 (default both on cuda, lenet5 on cpu)")
    ap.add_argument("--configs", default="dp,robust", help="comma-separated: dp (mbsgd+isrl+srht), robust "
                    "(gradbant+srht)")
    ap.add_argument("--rounds", type=int, default=0, help="flwr run rounds (default 5; 2 with --small)")
    ap.add_argument("--num-gpus", type=float, default=None,
                    help="client-resources-num-gpus (default 0.1 on cuda, 0 on cpu)")
    ap.add_argument("--num-cpus", type=int, default=1, help="client-resources-num-cpus")
    ap.add_argument("--steps", default="check,agree,flwr", help="comma-separated subset of check,agree,flwr")
    ap.add_argument("--outdir", default=None, help="default outputs/gpu-run/<time>")
    ap.add_argument("--run-timeout", type=float, default=480.0, help="seconds per flwr run")
    args = ap.parse_args(argv)

    if args.models is None:  # ResNet-18 on one CPU core: minutes per round (evaluation over every record)
        args.models = "lenet5" if args.device == "cpu" else "lenet5,resnet18"
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    steps = {s.strip() for s in args.steps.split(",") if s.strip()}
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if bad := [c for c in configs if c not in CONFIGS]:
        ap.error(f"--configs: unknown {bad}")
    if bad := [m for m in models if m not in ("lenet5", "resnet18")]:
        ap.error(f"--models: unknown {bad}")
    if bad := sorted(steps - {"check", "agree", "flwr"}):
        ap.error(f"--steps: unknown {bad}")
    num_gpus = args.num_gpus if args.num_gpus is not None else (0.1 if args.device == "cuda" else 0.0)
    if args.device == "cpu" and num_gpus:
        ap.error("--num-gpus must be 0 with --device cpu (Ray would wait for a GPU forever)")
    outdir = Path(args.outdir or ROOT / "outputs" / "gpu-run" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLWR_HOME", str(ROOT / ".flwr"))

    missing = prerequisites(args.device)
    if missing:
        for m in missing:
            log(f"missing: {m}")
        return 2
    import torch

    dev_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    log(f"device {args.device} ({dev_name}), torch {torch.__version__}, models {models}, configs {configs}, "
        f"steps {[x for x in ('check', 'agree', 'flwr') if x in steps]}, "
        f"{'small' if args.small else 'full'} sizes, outputs {outdir}")
    t_start = time.perf_counter()
    report: dict[str, Any] = {"device": args.device, "device_name": dev_name, "small": args.small, "models": models,
                              "torch": torch.__version__, "check": None, "agreement": [], "flwr": []}
    ok = True

    def save() -> None:  # after every step, so a run stopped by the time limit still leaves its results
        report["wall_s"] = time.perf_counter() - t_start
        (outdir / "gpu_run.json").write_text(json.dumps(report, indent=1, default=str) + "\n")

    if "check" in steps:
        if args.device == "cuda":
            report["check"] = gpu_check(timeout=300)
            ok &= report["check"]["ok"]
            report["server_check"] = gpu_check(timeout=240, script="server_device_check")
            ok &= report["server_check"]["ok"]
            save()
        else:
            log("gpu_check.py: skipped (needs CUDA)")
    if "agree" in steps:
        for model in models:
            for kind in configs:
                try:
                    r = agreement(model, kind, args.device, args.small, outdir)
                except Exception as exc:  # report and go on with the other checks
                    r = {"model": model, "config": kind, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
                    log(f"agreement {model} {LABEL[kind]}: FAILED: {r['error']}")
                report["agreement"].append(r)
                ok &= r["ok"]
                save()
    mine: set[int] = set()

    def on_term(signum: int, _frame: object) -> None:  # e.g. gpu_run.sh's timeout: still stop our SuperLink
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        if "flwr" in steps:
            for model in models:
                for kind in configs:
                    r = flwr_federation(model, kind, args.device, num_gpus, args.small, outdir, mine, args)
                    report["flwr"].append(r)
                    ok &= r["ok"]
                    save()
    finally:
        stop_superlinks(mine)
    report["ok"] = ok
    save()
    log(f"RESULT: {'PASS' if ok else 'FAIL'} in {report['wall_s']:.0f}s; {outdir / 'gpu_run.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
