"""Hydra sweeps: one federation per job on Flower's simulation engine, one row per job.

    python -m app.sweep -m privacy.epsilon=0.75,1.5,3 algorithm=mbsgd,localsgd,spider seed=0,1,2
    python -m app.sweep -m experiment=wbcd-eps          # a named grid (conf/experiment/)
    python -m app.report outputs/sweeps/wbcd-eps         # tables and plots from results.csv

Each job composes conf/ (config groups algorithm/, dataset/, model/, privacy/, sketch/,
experiment/), flattens it onto the flat run config (app.config.flatten_run_config, the one
mapping), validates it, and runs the real ServerApp and ClientApp on Flower's simulation engine
(``flwr.simulation.run_simulation``, one virtual SuperNode per silo). It appends one row to
``outputs/sweeps/<sweep.name>/results.csv``: every setting, final and best metrics, the epsilon
each silo certified, wall time and engine overhead. A failed job is recorded with its error and
the sweep goes on; rerunning the sweep skips every job that already has a finished row (resume:
status ``completed``, or ``diverged`` / ``no-progress``, whose ``error`` holds the hint of
app/run_health.py; rerunning the same seeds would diverge again) and runs failed ones again.

After each job the sweep prints a progress line (jobs done of the sweep's total, failed,
skipped, ETA); at its end one line per failed job (its overrides and error), and it exits 1 when
any job failed, else 0. A bad value is one line (the config check's), never a traceback; a
``sketch.*`` key given while the job has no sketch is refused (:func:`check_overrides`).
``sweep.tracking=mlflow`` logs each finished job (app/tracking.py); ``sweep.ray-address`` (or
``RAY_ADDRESS``) runs the engine on an existing Ray cluster (:func:`engine_backend_config`).

Hyper-parameter selection (``sweep.tuning=grid``): the job runs one federation per point of
``sweep.grid`` with ``sweep.validation-fraction`` of each silo's training records held out,
selects the point with the lowest validation error, and reports the test metrics of that point
only. Tuning itself is not private (the paper's Appendix I says the same of its experiments);
``sweep.tuning=fixed`` (the default) runs the settings as given.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import os
import statistics
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.config import OPTIONS, SCHEMA, ConfigError, flatten_run_config, inert_options, parse_settings, resolve_presets
from app.filelock import exclusive_lock
from app.launch import flower_env
from app.presets import PRESET_KEYS
from app.results import load_rounds
from app.run_health import FINISHED, UNHEALTHY

ROOT = Path(__file__).resolve().parent.parent
SWEEPS_DIR = Path("outputs") / "sweeps"
RESULT_FIELDS = ["job", "status", "error", "test_error", "test_accuracy", "best_test_error", "val_error",
                 "train_loss", "grad_mapping_norm", "eps_max_spent", "eps_per_silo", "uploads_G", "rounds_done",
                 "selected", "grid_points", "wall_s", "overhead_s", "run_dir"]


def job_key(flat: Mapping[str, Any], sweep: Mapping[str, Any]) -> str:
    """A stable id for a job: its run config and its tuning settings."""
    blob = json.dumps({"run": dict(sorted(flat.items())), "tuning": sweep.get("tuning"),
                       "grid": sweep.get("grid") if sweep.get("tuning") == "grid" else None,
                       "validation-fraction": sweep.get("validation-fraction") if sweep.get("tuning") == "grid" else None},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ResultsFile:
    """``results.csv`` of one sweep, appended under a file lock (jobs may run concurrently)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fields = RESULT_FIELDS + sorted(SCHEMA)

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with self.path.open(newline="") as fh:
            return list(csv.DictReader(fh))

    def completed(self, job: str) -> bool:
        """Whether ``job`` has a row of a run that ran to its end (healthy or not)."""
        return any(r["job"] == job and r["status"] in FINISHED for r in self.rows())

    def append(self, row: Mapping[str, Any]) -> None:
        with exclusive_lock(self.path.with_suffix(".lock")):
            new = not self.path.exists()
            with self.path.open("a", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=self.fields, extrasaction="ignore")
                if new:
                    writer.writeheader()
                writer.writerow({k: _cell(v) for k, v in row.items()})


def _cell(v: Any) -> Any:
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    if v is None:
        return ""
    return v


# -- one federation on Flower's simulation engine -------------------------------------------
def engine_env() -> None:
    """What every Flower process of a sweep needs (inherited by the Ray workers): the launcher's
    environment (app.launch.flower_env) set in this process, plus Ray's accelerator setting."""
    os.environ.update(flower_env(ROOT))
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


_WARM_POOLS: dict[str, Any] = {}

#: the Flower release whose simulation engine the patches below were written against and checked on
#: (flwr/server/superlink/fleet/vce/vce_api.py and .../backend/raybackend.py); on any other release
#: they are skipped with a warning and Flower runs unpatched
PATCHED_FLWR = "1.42."
#: environment variable that turns the engine poll patch on (see :func:`fast_poll`): "1" (or
#: "true") for :data:`FAST_POLL_S`, a number for that many seconds, unset / "0" / "false" off. It
#: is read by :func:`run_federation` (sweeps, scripts) and, for ``flwr run``, by the ClientApp
#: when Flower loads it in the engine's process (app/client_app.py; ``python -m app.launch
#: --fast-poll`` sets it for the local SuperLink)
FAST_POLL_ENV = "SILOFL_FAST_POLL"
#: the engine's poll period with the patch (Flower 1.42: 0.1 s)
FAST_POLL_S = 0.005
#: the longest an engine thread waits on its queue before it looks at the stop event again
#: (Flower 1.42: 1.0 s, paid once at the end of every federation)
PROMPT_WAIT_S = 0.02


def _engine_patchable(what: str, original: Any = None, expected: str | None = None) -> bool:
    """Whether the installed Flower is the release the engine patches were checked on and, given
    ``original`` and ``expected``, whether the function a patch replaces still holds that code
    (else a warning: the patch is not applied and Flower runs unpatched)."""
    import warnings
    from importlib.metadata import version

    found = version("flwr")
    if not found.startswith(PATCHED_FLWR):
        warnings.warn(f"silofl: {what} was written for flwr {PATCHED_FLWR}x, found flwr {found}; "
                      "not applied (Flower runs unpatched)", RuntimeWarning, stacklevel=3)
        return False
    if original is not None and expected is not None:
        import inspect

        if expected not in inspect.getsource(original):
            warnings.warn(f"silofl: flwr's {original.__qualname__} is not the code {what} replaces; not applied",
                          RuntimeWarning, stacklevel=3)
            return False
    return True


def fast_poll_setting(value: Any = None) -> float:
    """The engine poll period asked for: ``value`` (True / a number of seconds / a string as in
    :data:`FAST_POLL_ENV`), else the environment variable; 0.0 = off (Flower's own 0.1 s)."""
    raw = os.environ.get(FAST_POLL_ENV, "") if value is None else value
    if isinstance(raw, bool):
        return FAST_POLL_S if raw else 0.0
    text = str(raw).strip().lower()
    if text in ("", "0", "false", "no", "off"):
        return 0.0
    if text in ("1", "true", "yes", "on"):
        return FAST_POLL_S
    try:
        seconds = float(text)
    except ValueError:
        raise ConfigError(f"{FAST_POLL_ENV} / sweep.fast-poll = {raw!r}; allowed: true, false or seconds "
                          "in (0, 0.1]") from None
    if not 0.0 < seconds <= 0.1:
        raise ConfigError(f"{FAST_POLL_ENV} / sweep.fast-poll = {raw!r}; allowed: true, false or seconds "
                          "in (0, 0.1]")
    return seconds


def fast_poll(seconds: float = FAST_POLL_S) -> bool:
    """Opt-in: make Flower's simulation engine look for new instructions every ``seconds``.

    Flower 1.42's engine moves the ServerApp's messages to its workers in a loop that sleeps a
    hard-coded 0.1 s between looks (``vce_api.add_messages_to_queue``: ``f_stop.wait(0.1)``), so
    every exchange of a simulated round waits up to 0.1 s for nothing. This replaces that
    function (``run_api`` looks it up by name when it starts its threads, so the patch applies to
    every engine started afterwards in this process) with the same loop and period ``seconds``.
    What the apps compute is unchanged (messages are handled in the same order by the same
    code); the engine thread wakes 1/``seconds`` times a second instead of 10 (a few hundred
    microseconds of CPU each at 5 ms). ``seconds`` <= 0 restores Flower's function. Returns
    whether the patch is in place; skipped with a warning on a Flower release other than 1.42."""
    from flwr.server.superlink.fleet.vce import vce_api

    original = getattr(vce_api, "_silofl_original_add_messages", vce_api.add_messages_to_queue)
    if seconds <= 0:
        vce_api.add_messages_to_queue = original
        return False
    if not _engine_patchable("the engine poll patch (fast-poll)", original, "f_stop.wait(0.1)"):
        return False

    def add_messages_to_queue(state: Any, queue: Any, nodes_mapping: Any, f_stop: Any) -> None:
        """Flower 1.42's loop (put the nodes' pending instructions in the workers' queue), polling
        every ``seconds`` instead of 0.1 s (silofl's fast-poll patch)."""
        while not f_stop.is_set():
            for node_id in nodes_mapping.keys():
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(msg)
            f_stop.wait(seconds)

    add_messages_to_queue._silofl_poll_s = seconds  # type: ignore[attr-defined]
    vce_api._silofl_original_add_messages = original
    vce_api.add_messages_to_queue = add_messages_to_queue
    return True


def prompt_engine_stop() -> bool:
    """End each federation's engine threads within :data:`PROMPT_WAIT_S` of the ServerApp's end.

    Flower 1.42's engine workers and reply mover wait on their queues with ``timeout=1.0`` and
    only then look at the stop event, so ``run_simulation`` returns about 1 s after the
    ServerApp finished (most of a warm sweep job's overhead). This gives ``run_api``'s queues
    (``vce_api.Queue``, looked up when each federation starts) a ``get`` that waits at most
    :data:`PROMPT_WAIT_S` per call; Flower's loops already retry on ``Empty``, so a message is
    still taken the moment it arrives and nothing else changes. Part of the warm-engine patches
    (``sweep.warm-engine``); skipped with a warning on a Flower release other than 1.42."""
    from queue import Queue

    from flwr.server.superlink.fleet.vce import vce_api

    if getattr(vce_api.Queue, "_silofl_prompt", False):
        return True
    if not _engine_patchable("the prompt engine stop"):
        return False

    class PromptQueue(Queue):  # type: ignore[type-arg]
        _silofl_prompt = True

        def get(self, block: bool = True, timeout: float | None = None) -> Any:
            if block and timeout is not None:
                timeout = min(timeout, PROMPT_WAIT_S)
            return super().get(block, timeout)

    vce_api.Queue = PromptQueue
    return True


#: environment variable that turns the lean Ray start (:func:`lean_ray_start`, on by default) off: "0"
LEAN_RAY_ENV = "SILOFL_LEAN_RAY"
#: what Flower 1.42's RayBackend.init_ray passes to ray.init besides its init args
_RUNTIME_ENV_CALL = 'runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}'


def lean_ray_start() -> bool:
    """Start the engine's Ray without the ``runtime_env`` Flower 1.42 passes for PYTHONPATH.

    ``RayBackend.init_ray`` puts the driver's ``sys.path`` into ``os.environ["PYTHONPATH"]`` and
    then also asks ``ray.init(runtime_env={"env_vars": {"PYTHONPATH": ...}})`` for the same
    value. Ray's processes are started by ``ray.init`` from this process's environment, so they
    have it already; the runtime environment only makes Ray set up its runtime-env agent before
    the first actor (about 1.2 s of every simulation's round 1 on a 2-core machine). This
    replaces ``init_ray`` with the same code minus that argument; when the init args name an
    ``address`` or ``RAY_ADDRESS`` is set (a Ray cluster started elsewhere, which does not inherit
    this environment; :func:`engine_backend_config`) it calls Flower's own. On by default
    (``SILOFL_LEAN_RAY=0`` turns it off); skipped with a warning on a Flower release other than
    1.42 or when ``init_ray`` is not the code it was checked against. Returns whether the patch
    is in place."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if os.environ.get(LEAN_RAY_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    if getattr(RayBackend.init_ray, "_silofl_lean", False):
        return True
    original = RayBackend.init_ray
    if not _engine_patchable("the lean Ray start", original, _RUNTIME_ENV_CALL):
        return False

    def init_ray(self: Any, backend_config: Any) -> None:
        """Flower 1.42's init_ray without the redundant runtime_env (silofl's lean Ray start)."""
        import ray

        if ray.is_initialized():
            return
        ray_init_args: dict[str, Any] = dict(backend_config.get(self.init_args_key) or {})
        if "address" in ray_init_args or os.environ.get(RAY_ADDRESS_ENV):  # a cluster started elsewhere,
            original(self, backend_config)  # whose workers do not inherit this environment: Flower's way
            return
        ray_init_args.setdefault("include_dashboard", False)
        pythonpath = os.pathsep.join(sys.path)
        if os.environ.get("PYTHONPATH"):
            pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
        os.environ["PYTHONPATH"] = pythonpath  # Ray's processes start from this environment
        ray.init(**ray_init_args)

    init_ray._silofl_lean = True  # type: ignore[attr-defined]
    RayBackend.init_ray = init_ray
    return True


def keep_engine_warm() -> None:
    """Keep Ray and its ClientApp actors alive from one job to the next in this process.

    ``run_simulation`` starts Ray, creates one actor per CPU (each a Python process that imports
    Flower, torch and the app) and shuts everything down at the end of every run: that start-up
    dominates short jobs. Jobs of one sweep run one after another in one process, so the sweep
    keeps the first job's actor pool and gives it to the next job's backend (each message
    still carries that job's ClientApp; the actors only cache silos by run id). Ray and the
    actors are shut down when the process exits. This patches Flower's RayBackend (build and
    terminate) and the engine's queues (:func:`prompt_engine_stop`), and is checked against
    flwr 1.42 (skipped with a warning on another release); ``sweep.warm-engine=false`` turns it off."""
    import atexit

    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if getattr(RayBackend, "_silofl_warm", False):
        return
    if not _engine_patchable("the warm-engine patch"):
        return
    prompt_engine_stop()
    build, terminate = RayBackend.build, RayBackend.terminate

    def warm_build(self: Any, app_fn: Any) -> None:
        key = json.dumps([self.client_resources, self.actor_kwargs], sort_keys=True, default=str)
        if key in _WARM_POOLS:
            self.pool, self.app_fn = _WARM_POOLS[key], app_fn
        else:
            build(self, app_fn)
            _WARM_POOLS[key] = self.pool

    def warm_terminate(self: Any) -> None:
        """Leave Ray and the actors running for the next job (see atexit below)."""

    def shutdown() -> None:
        import ray

        for pool in _WARM_POOLS.values():
            pool.terminate_all_actors()
        _WARM_POOLS.clear()
        if ray.is_initialized():
            ray.shutdown()

    RayBackend.build, RayBackend.terminate = warm_build, warm_terminate
    RayBackend._silofl_warm = True
    RayBackend._silofl_original = (build, terminate)
    atexit.register(shutdown)


def simulation_apps(run_config: dict[str, Any]) -> tuple[Any, Any]:
    """A ServerApp and a ClientApp that run silofl's apps with ``run_config``
    (``run_simulation`` gives the apps an empty run config)."""
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

    from app import wire

    def with_config(context: Context) -> Context:
        return Context(run_id=context.run_id, node_id=context.node_id, node_config=context.node_config,
                       state=context.state, run_config=dict(run_config))

    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        import app.server_app as server_app

        server_app.main(grid, with_config(context))

    client = ClientApp()

    def forward(name: str) -> Any:
        def handler(msg: Message, context: Context) -> Message:
            import app.client_app as client_app

            return getattr(client_app, name)(msg, with_config(context))

        return handler

    client.train()(forward("train"))
    client.evaluate()(forward("evaluate"))
    client.query(wire.LEDGER)(forward("ledger"))
    client.query(wire.IDENTITY)(forward("identity"))  # the attack harness's ground truth
    client.query(wire.KEYS)(forward("keys"))  # shuffle DP: roles and public keys
    client.query(wire.SHUFFLE)(forward("shuffle"))  # shuffle DP: the shuffler's sum
    return server, client


#: environment variable naming an existing Ray cluster (Ray's own): ``auto`` or ``HOST:PORT``
RAY_ADDRESS_ENV = "RAY_ADDRESS"


def engine_backend_config(num_silos: int, sweep: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Flower's simulation backend config for one federation. Each virtual silo's ClientApp runs
    in a Ray actor holding ``sweep.client-cpus`` CPUs and ``sweep.client-gpus`` GPUs (1 and 0 by
    default); Flower sizes its actor pool from the resources Ray reports for the cluster
    (``flwr.simulation.ray_transport.ray_actor.pool_size_from_resources``). On an existing Ray
    cluster (``sweep.ray-address``, else the ``RAY_ADDRESS`` environment variable: ``auto`` or
    ``HOST:PORT`` of a ``ray start --head``) Ray is joined, not started, and every node's CPUs
    count; otherwise a local Ray starts with min(CPUs of this machine, silos) CPUs."""
    sweep = sweep or {}
    address = str(sweep.get("ray-address") or os.environ.get(RAY_ADDRESS_ENV, "")).strip()
    cpus, gpus = float(sweep.get("client-cpus") or 1), float(sweep.get("client-gpus") or 0.0)
    if cpus <= 0 or gpus < 0:
        raise ConfigError(f"sweep.client-cpus = {cpus:g} / sweep.client-gpus = {gpus:g}; allowed: cpus > 0, gpus >= 0")
    init: dict[str, Any] = {"address": address} if address else {"num_cpus": min(os.cpu_count() or 1, num_silos)}
    return {"client_resources": {"num_cpus": cpus, "num_gpus": gpus}, "init_args": init}


def run_federation(run_config: dict[str, Any], warm: bool = True, fast: Any = None,
                   backend: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run one federation on the simulation engine; returns its summary.json plus wall time and
    engine overhead (wall time minus the time inside rounds). Raises if it left no summary.
    ``warm``: reuse the engine's actors across the federations of this process (and end each
    federation's engine promptly). ``fast``: the engine poll patch (:func:`fast_poll`): True, a
    period in seconds, False; None = as :data:`FAST_POLL_ENV` says (off when unset). ``backend``:
    the sweep's Ray settings (:func:`engine_backend_config`)."""
    from flwr.simulation import run_simulation

    engine_env()
    lean_ray_start()
    if warm:
        keep_engine_warm()
    fast_poll(fast_poll_setting(fast))
    s = parse_settings(run_config)
    out = Path(s.outputs_dir) / s.run_name
    for name in ("summary.json", "rounds.jsonl"):
        (out / name).unlink(missing_ok=True)
    server, client = simulation_apps(run_config)
    t0 = time.perf_counter()
    run_simulation(server_app=server, client_app=client, num_supernodes=s.simulation_nodes(),
                   backend_config=engine_backend_config(s.num_silos, backend))
    wall = time.perf_counter() - t0
    if not (out / "summary.json").exists():
        raise RuntimeError(f"the federation left no summary in {out} (see the log above)")
    summary = json.loads((out / "summary.json").read_text())
    rounds = load_rounds(out / "rounds.jsonl")
    inside = sum(float(r["wall_s"]) for r in rounds)
    return summary | {"wall_s": wall, "overhead_s": wall - inside, "rounds_rows": rounds, "run_dir": str(out)}


# -- one job -------------------------------------------------------------------------------
def grid_points(grid: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of ``{flat key: [values]}`` ({} -> one empty point). Nested keys, as
    ``+sweep.grid.privacy.clip=[0.5,2]`` on the command line makes them, are flattened first."""
    grid = {k: v for k, v in flatten_run_config(grid).items()}
    keys = sorted(grid)
    for k in keys:
        if k not in SCHEMA:
            raise ConfigError(f"sweep.grid key {k!r} is not a run-config key")
        if not isinstance(grid[k], (list, tuple)) or not grid[k]:
            raise ConfigError(f"sweep.grid.{k} = {grid[k]!r} must be a non-empty list")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def run_job(flat: dict[str, Any], sweep: Mapping[str, Any], job: str, sweep_dir: Path) -> dict[str, Any]:
    """The job's row: run the federation (or its tuning grid) and keep the selected one's metrics."""
    tuning = str(sweep.get("tuning", "fixed"))
    if tuning not in ("fixed", "grid"):
        raise ConfigError(f"sweep.tuning = {tuning!r}; allowed: fixed, grid")
    points = grid_points(sweep.get("grid") or {}) if tuning == "grid" else [{}]
    base = dict(flat) | {"outputs-dir": str(sweep_dir / "runs")}
    if tuning == "grid":
        base["validation-fraction"] = float(sweep.get("validation-fraction", 0.2))
    metric = str(sweep.get("select", "val_error"))
    best: dict[str, Any] | None = None
    for i, point in enumerate(points):
        # each point's own presets: a point that sets the model or the algorithm gets their values
        cfg = resolve_presets(base | point) | {"run-name": f"{job}-{i}" if len(points) > 1 else job}
        parse_settings(cfg)
        ray = {k: sweep[k] for k, default in (("ray-address", None), ("client-cpus", 1), ("client-gpus", 0.0))
               if sweep.get(k) is not None and sweep[k] != default}  # passed only when not the default
        result = run_federation(cfg, warm=bool(sweep.get("warm-engine", True)), fast=sweep.get("fast-poll"),
                                **({"backend": ray} if ray else {}))
        score = result.get(metric) if tuning == "grid" else 0.0
        if score is None:
            raise RuntimeError(f"selection metric {metric!r} missing from the summary (is eval-every 0?)")
        if tuning == "grid":
            print(f"[sweep] job {job} grid point {i + 1}/{len(points)} {point}: {metric} {score}", flush=True)
        if best is None or score < best["score"]:
            best = {"score": score, "point": point, "result": result, "config": cfg}
    assert best is not None
    res = best["result"]
    evals = [r for r in res["rounds_rows"] if r.get("test_error") is not None]
    error = "; ".join(res.get("client_errors", [])[:3])
    if res["status"] in UNHEALTHY:  # the diagnosis and the setting most likely to blame
        error = "; ".join(e for e in (res.get("status_reason") or "", error) if e)
    return {
        "status": res["status"], "error": error,
        "test_error": res.get("test_error"), "test_accuracy": res.get("test_accuracy"),
        "best_test_error": min((r["test_error"] for r in evals), default=None),
        "val_error": res.get("val_error"), "train_loss": res.get("train_loss"),
        "grad_mapping_norm": res.get("grad_mapping_norm_eval"), "eps_max_spent": res.get("eps_max_spent"),
        "eps_per_silo": [s.get("eps_spent") for s in res.get("silos", [])],
        "uploads_G": res["rounds_rows"][-1]["uploads_G"] if res["rounds_rows"] else None,
        "rounds_done": len(res["rounds_rows"]), "selected": best["point"] or None,
        "grid_points": len(points), "wall_s": res["wall_s"], "overhead_s": res["overhead_s"], "run_dir": res["run_dir"],
    } | {k: best["config"][k] for k in PRESET_KEYS} | dict(best["point"])


def _resolved(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``flat`` with its presets filled in (app.config.resolve_presets); as given when that fails
    (the job then fails with parse_settings' error in its row)."""
    try:
        return resolve_presets(flat)
    except ConfigError:
        return dict(flat)


#: run-config keys that mean nothing without a sketch (declared ``inert=("sketch.kind", ...)``):
#: setting one with sketch.kind none would run the same federation under another name (issue 27)
SKETCH_ONLY_KEYS = tuple(k for k, opt in OPTIONS.items() if opt.switch == "sketch.kind")


def override_keys(overrides: list[str]) -> list[str]:
    """The keys a job's Hydra overrides set (``sketch.ratio=0.1`` -> sketch.ratio, ``+a.b=1`` -> a.b)."""
    return [o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o]


def check_overrides(overrides: list[str], flat: Mapping[str, Any]) -> None:
    """Refuse what would run a different experiment than the one asked for: a sketch setting
    given on the command line (or swept) while the job runs without a sketch."""
    given = [k for k in override_keys(overrides) if k in SKETCH_ONLY_KEYS]
    if given and str(flat.get("sketch.kind", "none")) == "none":
        key = given[0]
        raise ConfigError(f"{key} = {flat.get(key)!r} is set but sketch.kind = 'none' (no sketch, so every value "
                          f"would run the same federation); choose a sketch, e.g. sketch=srht or sketch.kind=srht")


def acting_settings(flat: Mapping[str, Any]) -> dict[str, str]:
    """The settings as results.csv holds them (strings), less those that do not act, as each
    option declares it (app.config.inert_options: the other ``privacy.*`` keys when privacy.mode
    is off, ``sketch.*`` without a sketch, an algorithm's own knobs under another algorithm; not
    ``attack.*`` without an attack: attack.fraction is also Krum's f). Two jobs with the same
    acting settings run the same federation."""
    out = {k: str(_cell(flat[k])) for k in SCHEMA if k in flat}
    inert = inert_options(out)
    return {k: v for k, v in out.items() if k not in inert}


def same_federation(results: ResultsFile, flat: Mapping[str, Any], sweep: Mapping[str, Any]) -> dict[str, str] | None:
    """A finished row of this sweep whose federation is this job's (:func:`acting_settings`
    equal; fixed tuning only), e.g. privacy=off jobs of a sweep over ε: it need not run again."""
    if str(sweep.get("tuning", "fixed")) != "fixed":
        return None
    mine = acting_settings(flat)
    for r in results.rows():
        if r["status"] in FINISHED and r.get("grid_points") in ("", "1") and acting_settings(r) == mine:
            return r
    return None


def track(row: Mapping[str, Any], sweep: Mapping[str, Any]) -> None:
    """``sweep.tracking=mlflow``: log the job's run (from its files, app/tracking.py) to the
    experiment ``silofl/<sweep.name>``; a tracker that fails is a warning line, not a failed job."""
    kind = str(sweep.get("tracking") or os.environ.get("SILOFL_TRACKING") or "none")
    if kind == "none" or row.get("status") not in FINISHED or not row.get("run_dir"):
        return
    from app import tracking

    try:
        if kind not in tracking.TRACKERS:
            raise tracking.TrackingError(f"sweep.tracking = {kind!r}; allowed: {', '.join(tracking.TRACKERS)}")
        tracking.log_run(row["run_dir"], experiment=f"{tracking.DEFAULT_EXPERIMENT}/{sweep.get('name', 'default')}",
                         uri=sweep.get("tracking-uri"), tags={"silofl.job": str(row.get("job", ""))})
    except Exception as exc:  # the job's result stands in results.csv
        print(f"[sweep] job {row.get('job')}: not tracked: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


class Progress:
    """The sweep's progress in this process (Hydra's basic launcher runs jobs one after another in
    it): jobs done, failed and skipped, the failed ones, and an ETA from the jobs that ran."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.t0 = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.ran_s: list[float] = []

    def record(self, row: Mapping[str, Any], overrides: list[str], seconds: float) -> str:
        """Note one finished job; returns its progress line."""
        self.rows.append(dict(row) | {"overrides": " ".join(overrides)})
        if row.get("status") != "skipped":
            self.ran_s.append(seconds)
        done = len(self.rows)
        counts = {st: sum(r.get("status") == st for r in self.rows) for st in ("failed", "skipped")}
        finished = done - counts["failed"] - counts["skipped"]
        eta = ""
        if self.total is not None and self.ran_s:
            left = max(self.total - done, 0)
            eta = f", ETA {_duration(left * statistics.mean(self.ran_s))}"
        of = f"/{self.total}" if self.total is not None else ""
        return (f"[sweep] progress {done}{of} jobs: {finished} ran to their end, {counts['failed']} failed, "
                f"{counts['skipped']} skipped; elapsed {_duration(time.perf_counter() - self.t0)}{eta}")

    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("status") == "failed"]

    def closing(self) -> list[str]:
        """The sweep's last lines: counts, and one line per failed job (its overrides, its error)."""
        failed = self.failed()
        statuses = sorted({str(r.get("status")) for r in self.rows})
        counts = ", ".join(f"{sum(r.get('status') == st for r in self.rows)} {st}" for st in statuses)
        lines = [f"[sweep] done: {len(self.rows)} jobs ({counts or 'none'}) in "
                 f"{_duration(time.perf_counter() - self.t0)}"]
        for r in failed[:20]:
            lines.append(f"[sweep] FAILED job {r.get('job')} ({r['overrides'] or 'no overrides'}): {r.get('error')}")
        if len(failed) > 20:
            lines.append(f"[sweep] ... and {len(failed) - 20} more failed jobs (status failed in results.csv)")
        return lines


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


PROGRESS = Progress()


def sweep_size(argv: list[str], params: Mapping[str, Any] | None) -> int | None:
    """How many jobs Hydra's basic sweeper makes of the config's ``hydra.sweeper.params`` and the
    command line's overrides (their product); None when it cannot tell."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        args = [f"{k}={v}" for k, v in (params or {}).items()]
        args += [a for a in argv if "=" in a and not a.startswith("-")]
        overrides = OverridesParser.create().parse_overrides(args)
        return len(BasicSweeper.split_arguments(overrides, None)[0])
    except Exception:  # a sweep type only Hydra's config loader can expand: no total
        return None


def sweep_job(nested: Mapping[str, Any], overrides: list[str] | None = None) -> dict[str, Any]:
    """Run (or skip) one job of a sweep from its composed config; returns the row written.
    ``overrides``: the job's Hydra overrides (checked by :func:`check_overrides`)."""
    sweep = dict(nested.get("sweep") or {})
    given = flatten_run_config(nested)
    flat = _resolved(given)  # the row and the job id hold the values run, not "preset"
    sweep_dir = SWEEPS_DIR / str(sweep.get("name", "default"))
    results = ResultsFile(sweep_dir / "results.csv")
    job = job_key(flat, sweep)
    if results.completed(job):
        print(f"[sweep] job {job} already has a result in {results.path}; skipped", flush=True)
        return {"job": job, "status": "skipped"}
    row: dict[str, Any] = dict(flat) | {"job": job}
    t0 = time.perf_counter()
    try:
        check_overrides(list(overrides or []), flat)
        twin = same_federation(results, flat, sweep)
        if twin is not None:  # its result is the twin's: one row that says so, nothing runs
            print(f"[sweep] job {job} runs the same federation as job {twin['job']} (settings that do not act "
                  "differ, e.g. privacy.epsilon with privacy.mode off); its row repeats that result", flush=True)
            row |= {k: twin.get(k) for k in RESULT_FIELDS if k not in ("job", "error")}
            row["error"] = f"same federation as job {twin['job']}"
            results.append(row)
            return row
        parse_settings(given)
        row |= run_job(given, sweep, job, sweep_dir)
    except ConfigError as exc:  # a bad value: one line (below), as app.launch says it; no traceback
        row |= {"status": "failed", "error": f"ConfigError: {exc}"[:500], "wall_s": time.perf_counter() - t0}
    except Exception as exc:  # recorded, and the sweep goes on
        traceback.print_exc()
        row |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500], "wall_s": time.perf_counter() - t0}
    results.append(row)
    track(row, sweep)
    if row["status"] == "failed":
        what = f"config error: {row['error'].removeprefix('ConfigError: ')}" if row["error"].startswith("ConfigError") \
            else f"failed: {row['error'][:300]}"
        print(f"[sweep] job {job}: {what} -> {results.path}", file=sys.stderr, flush=True)
    else:
        te = row.get("test_error")
        print(f"[sweep] job {job}: {row['status']}, test error {'-' if te in (None, '') else f'{te:.2%}'}, "
              f"wall {row.get('wall_s', 0):.1f}s, overhead {row.get('overhead_s', math.nan):.1f}s -> {results.path}",
              flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    """Hydra's entry; exit code 0 when every job ran to its end (or was skipped), 1 when any job
    failed (each listed with its overrides and error; results.csv has them all)."""
    import hydra
    from omegaconf import DictConfig, OmegaConf

    from app.hydra_options import register

    argv = sys.argv[1:] if argv is None else argv
    register()  # algorithm=<name>, +aggregator=<rule> for the registered ones conf/ has no file for

    @hydra.main(config_path=str(ROOT / "conf"), config_name="config", version_base=None)
    def _job(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
        if PROGRESS.total is None and not PROGRESS.rows:
            params = OmegaConf.to_container(hc.sweeper.params, resolve=True) if hc.sweeper.get("params") else None
            PROGRESS.total = sweep_size(argv, params) if str(hc.mode) == "RunMode.MULTIRUN" else 1
        overrides = list(hc.overrides.task)
        t0 = time.perf_counter()
        row = sweep_job(OmegaConf.to_container(cfg, resolve=True), overrides)
        print(PROGRESS.record(row, overrides, time.perf_counter() - t0), flush=True)

    _job()
    for line in PROGRESS.closing() if PROGRESS.rows else []:  # nothing ran: --help, --cfg
        print(line, file=sys.stderr if "FAILED" in line else sys.stdout, flush=True)
    return 1 if PROGRESS.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
