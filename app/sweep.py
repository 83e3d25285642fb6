"""Hydra sweeps: one federation per job, one row per job.

    python -m app.sweep -m privacy.epsilon=0.75,1.5,3 algorithm=mbsgd,localsgd,spider seed=0,1,2
    python -m app.sweep -m experiment=wbcd-eps          # a named grid (conf/experiment/)
    python -m app.report outputs/sweeps/wbcd-eps         # tables and plots from results.csv

Each job composes conf/ (config groups algorithm/, dataset/, model/, privacy/, sketch/,
experiment/), flattens it onto the flat run config (app.config.flatten_run_config, the one
mapping), validates it, and runs the real ServerApp and ClientApp where ``sweep.engine`` says:
``in-process`` (the default; app.federation.run_in_process, the in-process grid, one silo at a
time), ``batched`` (the same grid's batched path, app/privacy/row_batcher.py) or ``flower``
(app.federation.run_federation: Flower's simulation engine, one virtual SuperNode per silo,
Ray). Each job says which path it took. It appends one
row to ``outputs/sweeps/<sweep.name>/results.csv``: every setting, final and best metrics, the epsilon
each silo certified, wall time and engine overhead. A failed job is recorded with its error and
the sweep goes on; rerunning the sweep skips every job that already has a finished row (resume:
status ``completed``, or ``diverged`` / ``no-progress``, whose ``error`` holds the hint of
app/run_health.py; rerunning the same seeds would diverge again) and runs failed ones again.

After each job the sweep prints a progress line (jobs done of the sweep's total, failed,
skipped, ETA); at its end one line per failed job (its overrides and error), and it exits 1 when
any job failed, else 0. A bad value is one line (the config check's), never a traceback; a
``sketch.*`` key given while the job has no sketch is refused (:func:`check_overrides`).
``sweep.tracking=mlflow`` logs each finished job (app/tracking.py); ``sweep.ray-address`` (or
``RAY_ADDRESS``) runs the engine on an existing Ray cluster (app.federation.engine_backend_config).

On ``sweep.engine=flower``, a job whose engine lost a Ray actor, raylet or node (app.federation.EngineLost: Ray's
ActorDiedError, ActorUnavailableError, NodeDiedError, ...; never a ClientApp that raised) is not
failed: the sweep restarts the engine (fresh actors on what remains of the cluster) and resumes the
federation from its last checkpoint (``resume = true``, the same ``ledger-run-key``: no silo spends
the cut round twice), at most ``sweep.retries`` times (2); the row's ``retries`` column counts them.
For fixed seeds the resumed job's numbers are those of an uninterrupted one.

This module runs the jobs (expansion of a tuning grid, checks, the row); the rest has a module of
its own: app.federation (one federation), app.sweep_results (results.csv, job ids, repeated
federations) and app.sweep_progress, re-exported here; the engine's patches, app/runtime/engine_patches.py.

Hyper-parameter selection (``sweep.tuning=grid``): the job runs one federation per point of
``sweep.grid`` with ``sweep.validation-fraction`` of each silo's training records held out,
selects the point with the lowest validation error, and reports the test metrics of that point
only. Tuning itself is not private (the paper's Appendix I says the same of its experiments);
``sweep.tuning=fixed`` (the default) runs the settings as given.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.config import ALGORITHMS, OPTIONS, SCHEMA, ConfigError, flatten_run_config, parse_settings, resolve_presets
from app.federation import EngineLost, retry_config, run_federation, run_in_process
from app.runtime.engine_patches import named_ray_cluster
from app.presets import PRESET_KEYS
from app.run_health import FINISHED, UNHEALTHY
from app.sweep_progress import Progress, sweep_size
from app.sweep_results import RESULT_FIELDS, ResultsFile, job_key, same_federation
from strategies.options import AGGREGATORS

ROOT = Path(__file__).resolve().parent.parent
SWEEPS_DIR = Path("outputs") / "sweeps"


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


def preflight(cfg: dict[str, Any]) -> None:
    """The launcher's pre-flight check (app.launch.preflight: settings, the data split, K <= n for
    every silo) before the engine starts; what it raises is the job's one-line ConfigError, as
    ``python -m app.launch`` prints it. Before, a split the data cannot make (``num-silos=4`` on
    WBCD by label: 2 classes) failed inside the engine's ServerApp and printed tracebacks. The
    data it loads is cached in this process, where the job's ServerApp loads it again."""
    from app.launch import preflight as launch_preflight

    try:
        launch_preflight(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # e.g. ValueError from the partition: a setting the data cannot meet
        raise ConfigError(f"{type(exc).__name__}: {exc}") from None


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
    retries = 0  # engine restarts, over the job's federations
    for i, point in enumerate(points):
        # each point's own presets: a point that sets the model or the algorithm gets their values
        cfg = resolve_presets(base | point) | {"run-name": f"{job}-{i}" if len(points) > 1 else job}
        preflight(cfg)
        ray = {k: sweep[k] for k, default in (("ray-address", None), ("client-cpus", 1), ("client-gpus", 0.0))
               if sweep.get(k) is not None and sweep[k] != default}  # passed only when not the default
        result = federation_with_retries(cfg, sweep, job, **({"backend": ray} if ray else {}))
        retries += result["retries"]
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
        "rounds_done": len(res["rounds_rows"]), "retries": retries, "selected": best["point"] or None,
        "grid_points": len(points), "wall_s": res["wall_s"], "overhead_s": res["overhead_s"], "run_dir": res["run_dir"],
    } | {k: best["config"][k] for k in PRESET_KEYS} | dict(best["point"])


def sweep_retries(sweep: Mapping[str, Any]) -> int:
    """``sweep.retries``: how many times a job whose engine was lost is resumed (2 by default)."""
    raw = sweep.get("retries", 2)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 10:
        raise ConfigError(f"sweep.retries = {raw!r}; allowed: an integer in [0, 10]")
    return raw


#: ``sweep.engine``: in-process (the default: the in-process grid, one silo at a time), batched
#: (the in-process grid's batched path, app/privacy/row_batcher.py), flower (Flower's simulation
#: engine, one virtual SuperNode per silo on Ray)
SWEEP_ENGINES = ("in-process", "batched", "flower")
#: the sweep settings that only Flower's engine reads
ENGINE_ONLY = ("ray-address", "client-cpus", "client-gpus")
_SAID: list[str] = []  # what this process has told the user once already


def sweep_engine(sweep: Mapping[str, Any]) -> str:
    """``sweep.engine`` (in-process by default), checked against :data:`SWEEP_ENGINES`; a Ray
    setting (:data:`ENGINE_ONLY`) given for another engine is refused, not ignored."""
    engine = str(sweep.get("engine") or "in-process")
    if engine not in SWEEP_ENGINES:
        raise ConfigError(f"sweep.engine = {engine!r}; allowed: {', '.join(SWEEP_ENGINES)}")
    defaults = {"ray-address": None, "client-cpus": 1, "client-gpus": 0.0}
    given = [k for k in ENGINE_ONLY if sweep.get(k) is not None and sweep.get(k) != defaults[k]]
    if engine != "flower" and given:
        raise ConfigError(f"sweep.{given[0]} is set but sweep.engine = {engine!r} runs no Ray; set sweep.engine=flower "
                          "to run the jobs on Flower's simulation engine (docs/ray-cluster.md)")
    if engine != "flower" and named_ray_cluster() and not _SAID:
        _SAID.append("ray-address")
        print(f"[sweep] RAY_ADDRESS names a Ray cluster, but sweep.engine = {engine} runs each job in this process; "
              "set sweep.engine=flower to run the jobs on the cluster (docs/ray-cluster.md)", file=sys.stderr, flush=True)
    return engine


def federation_with_retries(cfg: dict[str, Any], sweep: Mapping[str, Any], job: str, **backend: Any) -> dict[str, Any]:
    """:func:`run_federation`, restarted on a fresh engine and resumed from its last checkpoint
    (app.federation.retry_config) each time the engine loses an actor, a raylet or a node
    (:class:`EngineLost`), ``sweep.retries`` times at most; any other error goes up as it is. The
    result holds ``retries`` (how many), and the wall time of every attempt and restart
    (``overhead_s``: all of it but the time inside the rounds, so the restarts count as overhead)."""
    from app.runtime.engine_patches import restart_engine

    engine = sweep_engine(sweep)  # (checked again here: a caller may pass its own sweep settings)
    if engine != "flower":  # in this process, without Flower's engine: nothing to lose or restart
        result = run_in_process(cfg, batched=engine == "batched")
        print(f"[sweep] job {job}: sweep.engine = {engine}, simulation path: {result.get('simulation_path', '?')}",
              flush=True)
        return result | {"retries": 0}
    limit, retries, lost_s, attempt = sweep_retries(sweep), 0, 0.0, dict(cfg)
    while True:
        try:
            result = run_federation(attempt, warm=bool(sweep.get("warm-engine", True)), fast=sweep.get("fast-poll"),
                                    **backend)
            break
        except EngineLost as lost:
            lost_s += lost.wall_s
            if retries >= limit:
                raise EngineLost(f"{lost} (resumed {retries} time(s); sweep.retries = {limit})",
                                 lost.ledger_run_key, lost.wall_s) from lost
            retries += 1
            t0 = time.perf_counter()
            restart_engine()
            lost_s += time.perf_counter() - t0
            attempt = retry_config(cfg, lost)
            how = "resuming from its last checkpoint" if attempt.get("resume") else "running it again from round 1"
            print(f"[sweep] job {job}: {lost}; the engine is restarted, {how} "
                  f"(retry {retries} of sweep.retries = {limit})", file=sys.stderr, flush=True)
    if retries:
        wall = float(result["wall_s"]) + lost_s
        inside = sum(float(r["wall_s"]) for r in result["rounds_rows"])
        result = result | {"wall_s": wall, "overhead_s": wall - inside}
    return result | {"retries": retries}


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


def track(row: Mapping[str, Any], sweep: Mapping[str, Any]) -> None:
    """``sweep.tracking=mlflow`` (else ``SILOFL_TRACKING``): log a finished job's run to the
    experiment ``silofl/<sweep.name>`` (app.tracking.track_from_env: a tracker that fails is a
    warning line, not a failed job)."""
    if row.get("status") not in FINISHED or not row.get("run_dir"):
        return
    from app import tracking

    tracking.track_from_env(row["run_dir"], tags={"silofl.job": str(row.get("job", ""))}, kind=sweep.get("tracking"),
                            experiment=f"{tracking.DEFAULT_EXPERIMENT}/{sweep.get('name', 'default')}",
                            uri=sweep.get("tracking-uri"))


PROGRESS = Progress()


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
            row |= {k: twin.get(k) for k in RESULT_FIELDS if k not in ("job", "error", "retries")}
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
    register(ALGORITHMS, AGGREGATORS)  # algorithm=<name>, +aggregator=<rule>: the registered ones conf/ has no file for

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
