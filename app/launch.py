"""Run a federation with ``flwr run`` and exit non-zero when anything failed.

``flwr run`` exits 0 even when the ServerApp or a ClientApp fails, so this launcher:
1. validates the run config (pyproject defaults + ``--run-config`` overrides) and the data
   (K <= n for every silo) before any Flower process starts, with a one-line error;
2. sets a project-local ``FLWR_HOME``, disables telemetry and runtime dependency installation,
   and ``OMP_NUM_THREADS=1``;
3. runs ``flwr run --stream`` with ``num-supernodes = num-silos`` (+ 1, the shuffler, in shuffle mode) and an absolute outputs dir, on
   a staged copy of the app's sources (``flwr run .`` would walk the whole checkout, a multi-GB
   ``.venv`` included, to build the app bundle: about 7 s per run on a 2-core machine; app/runtime/flwr_run.py);
4. decides from the run's own ``summary.json``: the run succeeded when the summary that the
   ServerApp writes as its last step names this Flower run id and says ``completed``; a summary
   that says ``failed``, or none when the stream ends, fails the launch (exit 1); one that says
   ``diverged`` or ``no-progress`` (app/run_health.py: the run ran to its end, its outputs are
   written, but its model is not one to use) exits 3 with the diagnosis and the setting most
   likely to blame as the last line, so that a script or CI job stops. It returns as soon as
   that summary is there and the ServerApp's last line has been streamed, instead of waiting for
   Flower to shut its engine down and starting the ``flwr`` CLI again for ``flwr ls`` (about 8 s);
   the engine's teardown finishes inside the SuperLink. ``flwr ls`` is read only to explain a
   run that ended without a summary.

The local simulation SuperLink is this checkout's own: ``flwr run`` starts it (detached, with
this environment) when nothing answers on its port, and Flower 1.42 takes that port and the
Control API's from ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` / ``FLWR_LOCAL_CONTROL_API_PORT``
(``flwr/cli/constant.py``; default 39091 / 39093, the same for every checkout). The launcher sets
both to this checkout's ports (app.runtime.local_superlink.own_local_superlink): the ones remembered in
``$FLWR_HOME/silofl-local-superlink.json`` when this checkout's SuperLink (found by its
FLWR_HOME) holds them or they are free, else two new free ports (never Flower's defaults), which
it remembers. So checkouts on one machine never share a SuperLink or a port, and a SuperLink that
is not this checkout's (another FLWR_HOME, Flower's default ports) is neither used nor touched.
This checkout's SuperLink is restarted when it runs on other ports or with other settings.

``--fast-poll`` turns on the opt-in engine poll patch (app.runtime.engine_patches.fast_poll: the simulation
engine looks for instructions every 5 ms instead of 0.1 s) in the local SuperLink's runs: it sets
``SILOFL_FAST_POLL`` for the SuperLink (restarting this checkout's local SuperLink when it runs
with the other setting) and the ClientApp applies the patch in the engine's process.

Usage: ``python -m app.launch [--run-config "key=value ..."] [--superlink NAME] [--no-preflight] [--fast-poll]``,
``python -m app.launch --resume RUN_NAME [--superlink NAME]`` (continue a run from its last
checkpoint, with its own run config) and ``python -m app.launch --stop`` (end the local
simulation SuperLink of this checkout and its runs' processes, by pid; nobody else's; its ports
stay remembered).
Exit codes: 0 success, 1 the run failed, 2 bad configuration (one line ``config error: ...``, before
any Flower process starts: a ``--run-config`` fragment that does not parse, a bad key or value, an
outputs-dir that cannot be written, device = "cuda" without CUDA for the local simulation, a
checkpoint that cannot be resumed), 3 the run diverged or made no progress.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.runtime.flwr_run import follow_run, run_status, stage_app
from app.runtime.local_superlink import own_local_superlink, stop_own_superlinks

if TYPE_CHECKING:
    from app.noise_plan import NoiseRun

ROOT = Path(__file__).resolve().parent.parent


def flower_env(root: Path = ROOT) -> dict[str, str]:
    """Environment for every Flower process started from here (inherited by the local SuperLink)."""
    env = dict(os.environ)
    env.setdefault("FLWR_HOME", str(root / ".flwr"))
    env |= {
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
    }
    # the local SuperLink's SuperExec looks for a new run every second by default (flwr 1.42);
    # 0.2 s starts a run 0.4 s sooner on average for a few HTTP requests a second while idle
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def default_run_config(root: Path = ROOT) -> dict[str, Any]:
    from flwr.common.config import flatten_dict

    with (root / "pyproject.toml").open("rb") as fh:
        return flatten_dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def merged_run_config(overrides: list[str], root: Path = ROOT) -> dict[str, Any]:
    """pyproject's run config with the ``--run-config`` strings ``overrides`` on top;
    ConfigError (one line naming the fragment) for anything in them Flower's parser would drop
    or misread (app.run_config_args.check_run_config_args)."""
    parsed = parse_config_overrides(overrides)
    cfg = default_run_config(root)
    cfg.update(parsed)
    return cfg


def preflight(cfg: dict[str, Any]) -> Any:
    """Validate settings and data; returns Settings or raises ConfigError."""
    from app.config import check_silo_sizes, parse_settings
    from app.data.federated import silo_splits

    settings = parse_settings(cfg)
    if settings.data_schema:  # own records (docs/your-data.md): the schema, and a simulation's file, here
        from app.config import ConfigError
        from app.data.schema import SchemaError, load_schema

        try:
            load_schema(settings.data_schema)
            if not settings.data_simulation_file:  # the records are the silos' own files: each silo checks K <= n itself
                bounds = settings.robust.gradbant_silo_records
                print_noise_plan(settings, list(bounds) if bounds else None,
                                 "assumed from gradbant.silo-records (the smallest and the largest silo)" if bounds
                                 else "unknown to the server (the silos' own records): shown for a few sizes")
                return settings
            _, splits, _, _ = silo_splits(settings, settings.seed, settings.robust.trust_size)
        except SchemaError as exc:
            raise ConfigError(str(exc)) from None
    else:
        _, splits, _, _ = silo_splits(settings, settings.seed, settings.robust.trust_size)
    check_silo_sizes(settings, [len(train) for train, _ in splits])
    print_noise_plan(settings, [len(train) for train, _ in splits], "from the run's partition")
    from app.config import MODELS

    if settings.model not in MODELS:  # your own model: imported and checked for DP before any process starts
        model_layout(settings)
    return settings


def print_noise_plan(settings: Any, sizes: list[int] | None, sizes_from: str) -> None:
    """The pre-flight's noise plan (app/noise_plan.py): each silo's planned sigma against its
    signal, and a warning when the plan cannot learn; before anything is spent. The lines of a plan
    computed before with the same inputs and code are read back (app/noise_plan_cache.py: exact,
    and no dp-accounting import)."""
    if not settings.privacy.enabled:
        return
    from app.noise_plan import preflight_lines
    from app.noise_plan_cache import noise_plan_lines

    dim = sum(math.prod(shape) for shape in model_layout(settings).values())
    run = noise_run(settings)
    home = Path(flower_env()["FLWR_HOME"])
    for line in noise_plan_lines(run, sizes, dim, sizes_from, home,
                                 lambda: preflight_lines(run, sizes, dim, sizes_from)):
        print(line, flush=True)


def noise_run(settings: Any) -> NoiseRun:
    """What the noise plan reads of the run ``settings`` (app/noise_plan.py ``NoiseRun``)."""
    from app.noise_plan import NoiseRun

    return NoiseRun(settings.algorithm, settings.algorithm_options(), settings.privacy, settings.aggregation_rule(),
                    settings.silos_per_round)


def toml_value(v: Any) -> str:
    """A run-config value as a TOML literal, for `flwr run --run-config`. A string with a double
    quote in it (model-kwargs' JSON) is a TOML literal string '...': Flower's parser reads a
    quoted value up to the next quote of its kind, so an escaped \" would cut it short."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        if '"' in v and "'" not in v and "\n" not in v:
            return f"'{v}'"
        return json.dumps(v)
    return repr(v)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-config", "-c", action="append", default=[], help='e.g. "privacy.epsilon=0.75 seed=1"')
    ap.add_argument("--superlink", default=None, help="SuperLink connection name (default: the local simulation one)")
    ap.add_argument("--federation-config", action="append", default=[], help="extra simulation settings")
    ap.add_argument("--no-preflight", action="store_true", help="skip the data check (config is still validated)")
    ap.add_argument("--resume", metavar="RUN_NAME", default=None,
                    help="continue RUN_NAME (under outputs-dir) from its last checkpoint, with its run config")
    ap.add_argument("--fast-poll", action="store_true",
                    help="opt-in engine poll patch for the local SuperLink's runs (5 ms instead of 0.1 s; flwr 1.42)")
    ap.add_argument("--stop", action="store_true", help="end this checkout's local simulation SuperLink and exit")
    args = ap.parse_args(argv)

    if args.stop:
        stopped = stop_own_superlinks(flower_env())
        print(f"[silofl] stopped local SuperLink pid(s) {stopped}" if stopped else
              "[silofl] no local SuperLink of this checkout is running")
        return 0

    from app.config import ConfigError, parse_settings

    try:
        cfg = merged_run_config(args.run_config)
        if args.resume:
            cfg, args.run_config = resume_config(cfg, args.resume)
        settings = parse_settings(cfg) if args.no_preflight else preflight(cfg)
        outputs = Path(settings.outputs_dir)
        outputs = outputs if outputs.is_absolute() else (ROOT / outputs)
        check_outputs_dir(outputs)
        if not args.superlink:
            check_local_device(settings)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. data missing
        print(f"config error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2

    # The ServerApp's name for the run, fixed here and passed as run-name so that the launcher
    # knows where summary.json will be. Flower's run id is not known before the run starts: the
    # five-digit suffix that tells apart runs started in the same second is drawn here instead.
    from app.results import run_name  # light: not the ServerApp (torch)

    name = settings.run_name if args.resume else run_name(settings, secrets.randbelow(100_000))
    if settings.data_schema:  # the silos read the schema's text, never a path the run names (app/refusal.py)
        from app.data.schema import with_inline_schema

        cfg = with_inline_schema(cfg)
    overrides = {k: v for k, v in cfg.items() if k in parse_config_overrides(args.run_config)}
    overrides |= {"outputs-dir": str(outputs), "run-name": name}
    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in overrides.items())
    fed_cfg = [f"num-supernodes={settings.simulation_nodes()}", *args.federation_config]
    env = flower_env()
    if args.fast_poll:
        env["SILOFL_FAST_POLL"] = "1"
    else:
        env.pop("SILOFL_FAST_POLL", None)
    if not args.superlink:
        # this checkout's own SuperLink, on its own ports; the engine runs in its processes, with
        # the environment it started with (own_local_superlink restarts one with other settings)
        http_port, _ = own_local_superlink(env)
        print(f"[silofl] local SuperLink: 127.0.0.1:{http_port} (this checkout's, FLWR_HOME={env['FLWR_HOME']})",
              flush=True)
    cmd = ["flwr", "run", str(stage_app(env)), *([args.superlink] if args.superlink else []), "--stream", "--run-config", run_config]
    if not args.superlink:
        cmd += ["--federation-config", " ".join(fed_cfg)]
    summary_path = outputs / name / "summary.json"
    where = f"SuperLink {args.superlink}" if args.superlink else f"{settings.simulation_nodes()} virtual SuperNodes"
    print(f"[silofl] stage: flwr run {name} ({where}); start-up lines follow until round 1", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rc, run_id, summary = follow_run(proc, name, summary_path, simulation=not args.superlink)
    wall = time.perf_counter() - t0
    if run_id is None or (rc not in (None, 0) and summary is None):
        print(f"[silofl] flwr run failed (exit code {rc}, run id {run_id})", file=sys.stderr)
        return 1
    if summary is None:  # the stream ended without this run's summary: ask Flower why
        status = run_status(run_id, env, args.superlink)
        print(f"[silofl] FAILED: run {run_id} ended with status {status} and wrote no {summary_path}; "
              f"see `flwr log {run_id}`", file=sys.stderr)
        return 1
    # in Flower's words (finished:completed / finished:failed), as `flwr ls` would say it
    status = f"finished:{summary.get('status')}"
    print(f"[silofl] run {run_id}: status {status}, {wall:.1f}s wall, summary {summary_path}", flush=True)
    code, line = summary_verdict(summary, run_id, summary_path)
    from app.tracking import track_from_env  # SILOFL_TRACKING=mlflow: the run's files to MLflow

    track_from_env(summary_path.parent)
    if line:
        print(line, file=sys.stderr, flush=True)
    return code


#: exit code of a run that ran to its end but diverged or made no progress (app/run_health.py)
EXIT_UNHEALTHY = 3


def summary_verdict(summary: dict[str, Any], run_id: str, summary_path: Path) -> tuple[int, str | None]:
    """The launcher's exit code for this run's summary, and its last line (None on success):
    0 ``completed``; 3 ``diverged`` / ``no-progress`` with what was seen and the setting most
    likely to blame; 1 anything else (``failed``)."""
    from app.run_health import UNHEALTHY

    status = str(summary.get("status"))
    reason = summary.get("status_reason") or ""
    if status == "completed":
        return 0, None
    if status in UNHEALTHY:
        health = summary.get("health") or {}
        blame = health.get("blame") or {}
        seen = health.get("reason") or reason
        hint = f"; most likely {blame['suggestion']}" if blame.get("suggestion") else ""
        return EXIT_UNHEALTHY, (f"[silofl] {status.replace('-', ' ').upper()}: run {run_id}: {seen}{hint} "
                                f"(its outputs are in {summary_path.parent}; exit code {EXIT_UNHEALTHY})")
    return 1, (f"[silofl] FAILED: run {run_id} ended with status finished:{status}"
               + (f": {reason}" if reason else "") + f"; see `flwr log {run_id}`")


def resume_config(cfg: dict[str, Any], name: str) -> tuple[dict[str, Any], list[str]]:
    """The run config to continue run ``name`` with: the checkpoint's own run config, plus
    resume = true and the silos' original per-run ledger name. Returns it and the overrides to
    pass (every key, so the ServerApp sees exactly the original's settings)."""
    from app.checkpoint import CheckpointError, check_resume_state, load_checkpoint
    from app.config import ConfigError, parse_settings

    outputs = Path(parse_settings(cfg).outputs_dir)
    outputs = outputs if outputs.is_absolute() else (ROOT / outputs)
    try:
        state = load_checkpoint(outputs / name / "checkpoint.npz")
    except Exception as exc:
        raise ConfigError(f"--resume {name}: cannot resume: {exc}") from exc
    original = state.get("run_config")
    if not original or not isinstance(original, dict):
        raise ConfigError(f"--resume {name}: the checkpoint holds no run config (written by an older version)")
    resumed = default_run_config() | original | {"resume": True, "run-name": name}
    try:  # the same checks as the ServerApp's (app.server_app.load_resume_state), before any process starts
        settings = parse_settings(resumed)
        check_resume_state(state, settings.num_rounds, model_layout(settings))
    except (CheckpointError, ConfigError) as exc:
        raise ConfigError(f"--resume {name}: cannot resume: checkpoint {outputs / name / 'checkpoint.npz'} "
                          f"is malformed: {exc}") from exc
    resumed["ledger-run-key"] = state["ledger_run_key"]
    return resumed, [" ".join(f"{k}={toml_value(v)}" for k, v in resumed.items())]


def model_layout(settings: Any) -> dict[str, tuple[int, ...]]:
    """The shapes of the run's model parameters (what the ServerApp builds): a zoo model's from its
    spec alone (app.model_spec.zoo_layout, no torch); your own model, or a spec the zoo refuses, built
    with torch (its checks and its error)."""
    from app.data.federated import dataset_meta
    from app.model_spec import zoo_layout

    feature_shape, num_classes = dataset_meta(settings)
    layout = zoo_layout(settings.model, feature_shape, num_classes, settings.model_hidden)
    if layout is not None:
        return layout
    from app.models import build_model

    model = build_model(settings.model, feature_shape, num_classes, hidden=settings.model_hidden,
                        kwargs=settings.model_kwargs)
    return {k: tuple(v.shape) for k, v in model.named_parameters()}


def parse_config_overrides(overrides: list[str]) -> dict[str, Any]:
    """The ``--run-config`` strings parsed as Flower parses them, after refusing (ConfigError)
    what Flower's parser would drop or misread."""
    from flwr.common.config import parse_config_args

    from app.run_config_args import check_run_config_args

    check_run_config_args(overrides)
    return parse_config_args(overrides)


def check_outputs_dir(outputs: Path) -> None:
    """ConfigError unless ``outputs`` (the run's outputs-dir) exists or can be made, and a file can be
    written in it: checked before the run starts rather than when its first file is written."""
    import tempfile

    from app.config import ConfigError

    try:
        outputs.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=outputs, prefix=".silofl-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"outputs-dir = {str(outputs)!r} cannot be written ({type(exc).__name__}: "
                          f"{exc.strerror or exc}); choose a folder this user can write") from None


def check_local_device(settings: Any) -> None:
    """ConfigError for device = "cuda" (or server-device = "cuda") on a machine without CUDA, for a run
    of the local simulation (its silos and its ServerApp run on this machine). A run on a SuperLink
    (--superlink) is not checked here: its machines may have what this one lacks; there, the
    ServerApp refuses before round 1, and the first round whose ClientApps fail ends the run with
    their reason (strategies.loop.ClientAppsFailed)."""
    from app.config import ConfigError
    from app.server_device import server_device, server_device_name

    if settings.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError('device = "cuda" but this machine has no CUDA device that torch can use (the local '
                              'simulation runs its silos here); use device = "cpu", or "auto" (CUDA where there is one)')
    if server_device_name(settings) == "cuda":
        server_device(settings)  # the ServerApp runs here too


if __name__ == "__main__":
    sys.exit(main())
