"""One federation in this process on Flower's simulation engine: silofl's ServerApp and ClientApp
with a given run config, one virtual SuperNode per silo (what each sweep job and the benchmark
scripts run; ``python -m app.launch`` runs the same apps through ``flwr run`` instead).

The engine is started with ``flwr.simulation.run_simulation``, deprecated in Flower 1.42 and kept on
purpose (why: the comment at the call, and docs/configuration.md, "Sweeps and Flower's deprecated
run_simulation").

An engine that loses an actor, a raylet or a node in the middle of a federation
(app.runtime.engine_patches.watch_engine_losses) stops the federation with :class:`EngineLost` at the
ServerApp's next look at its replies (:class:`EngineWatchGrid`), before the round in which it
happened is aggregated or checkpointed; :func:`retry_config` is the run config that continues it
(app/sweep.py restarts the engine and runs it, ``sweep.retries`` times at most).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app.config import ConfigError, parse_settings
from app.launch import flower_env
from app.results import load_rounds
from app.runtime.engine_patches import (LOCAL_RAY, actor_niceness, engine_losses, fast_poll, fast_poll_setting,
                                        index_engine_messages, keep_engine_warm, lean_ray_start, named_ray_cluster,
                                        watch_engine_losses)

ROOT = Path(__file__).resolve().parent.parent


def engine_env() -> None:
    """What every Flower process of a sweep needs (inherited by the Ray workers): the launcher's
    environment (app.launch.flower_env) set in this process, plus Ray's accelerator setting."""
    os.environ.update(flower_env(ROOT))
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


class EngineLost(RuntimeError):
    """The simulation engine lost an actor, its worker, a raylet or a node during a federation
    (app.runtime.engine_patches.ENGINE_LOSS_ERRORS). ``ledger_run_key``: the silos' per-run ledger name the
    lost federation used (None if it never started), ``wall_s``: how long it ran."""

    def __init__(self, message: str, ledger_run_key: str | None = None, wall_s: float = 0.0) -> None:
        super().__init__(message)
        self.ledger_run_key, self.wall_s = ledger_run_key, wall_s


class EngineWatchGrid:
    """The ServerApp's grid in a federation of :func:`run_federation`: Flower's, except that once
    the engine has lost an actor, a raylet or a node since the federation began (``since``, a mark
    of app.runtime.engine_patches.engine_losses), pulling replies raises :class:`EngineLost` instead of
    handing the ServerApp the engine's error replies, which it would count as ClientApp failures
    (or, with fail-on-client-error = false, as dropped silos, and train on). The round under way
    is neither aggregated nor checkpointed; the checkpoint of the round before is where a retry
    resumes (:func:`retry_config`)."""

    def __init__(self, grid: Any, since: int, ledger_run_key: str | None) -> None:
        self._grid, self._since, self._key = grid, since, ledger_run_key

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def _check(self) -> None:
        lost = engine_losses(self._since)
        if lost:
            raise EngineLost(f"the simulation engine lost {len(lost)} actor(s) or node(s): {lost[0]}",
                             ledger_run_key=self._key)

    def get_node_ids(self) -> Any:
        return self._grid.get_node_ids()

    def push_messages(self, messages: Any) -> Any:
        self._check()
        return self._grid.push_messages(messages)

    def pull_messages(self, message_ids: Any) -> Any:
        replies = self._grid.pull_messages(message_ids)
        self._check()
        return replies

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        replies = self._grid.send_and_receive(messages, timeout=timeout)
        self._check()
        return replies


def simulation_apps(run_config: dict[str, Any], watch: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """A ServerApp and a ClientApp that run silofl's apps with ``run_config``
    (``run_simulation`` gives the apps an empty run config). ``watch``: ``{"since": mark}`` to
    give the ServerApp an :class:`EngineWatchGrid` (the ServerApp notes its ledger run key there)."""
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

        if watch is not None:  # the silos' per-run ledger name, as the ServerApp derives it (a retry keeps it)
            watch["ledger_run_key"] = str(run_config.get("ledger-run-key") or "") or f"run{context.run_id}"
            grid = EngineWatchGrid(grid, watch["since"], watch["ledger_run_key"])
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
    for action in ("secagg_keys", "secagg_share", "secagg_unmask"):  # secure aggregation's rounds 1, 2, 4
        client.query(action)(forward(action))
    return server, client


def engine_backend_config(num_silos: int, sweep: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Flower's simulation backend config for one federation. Each virtual silo's ClientApp runs
    in a Ray actor holding ``sweep.client-cpus`` CPUs and ``sweep.client-gpus`` GPUs (1 and 0 by
    default); Flower sizes its actor pool from the resources Ray reports for the cluster
    (``flwr.simulation.ray_transport.ray_actor.pool_size_from_resources``). On an existing Ray
    cluster (``sweep.ray-address``, else the ``RAY_ADDRESS`` environment variable: ``auto`` or
    ``HOST:PORT`` of a ``ray start --head``) Ray is joined, not started, and every node's CPUs
    count; otherwise a Ray of this federation's own starts (``address="local"``: never another
    run's Ray on this machine, which ``ray.init`` would otherwise join) with min(CPUs of this
    machine, silos) CPUs."""
    sweep = sweep or {}
    address = named_ray_cluster(sweep.get("ray-address"))
    cpus, gpus = float(sweep.get("client-cpus") or 1), float(sweep.get("client-gpus") or 0.0)
    if cpus <= 0 or gpus < 0:
        raise ConfigError(f"sweep.client-cpus = {cpus:g} / sweep.client-gpus = {gpus:g}; allowed: cpus > 0, gpus >= 0")
    init: dict[str, Any] = ({"address": address} if address else
                            {"address": LOCAL_RAY, "num_cpus": min(os.cpu_count() or 1, num_silos)})
    return {"client_resources": {"num_cpus": cpus, "num_gpus": gpus}, "init_args": init}


def run_federation(run_config: dict[str, Any], warm: bool = True, fast: Any = None,
                   backend: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run one federation on the simulation engine; returns its summary.json plus wall time and
    engine overhead (wall time minus the time inside rounds). Raises if it left no summary.
    ``warm``: reuse the engine's actors across the federations of this process (and end each
    federation's engine promptly). ``fast``: the engine poll patch (:func:`fast_poll`): True, a
    period in seconds, False; None = as :data:`FAST_POLL_ENV` says (off when unset). ``backend``:
    the sweep's Ray settings (:func:`engine_backend_config`). The engine's message index
    (:func:`index_engine_messages`) is on unless ``SILOFL_ENGINE_INDEX=0``; the actors of a Ray
    started here run at niceness 0 unless ``RAY_worker_niceness`` says otherwise
    (:func:`actor_niceness`)."""
    from flwr.simulation import run_simulation

    engine_env()
    actor_niceness()
    lean_ray_start()
    index_engine_messages()
    watch_engine_losses()
    if warm:
        keep_engine_warm()
    fast_poll(fast_poll_setting(fast))
    from app.data.schema import with_inline_schema

    run_config = with_inline_schema(run_config)  # the silos read the schema's text, never a path
    s = parse_settings(run_config)
    out = _fresh_outputs(s)
    watch: dict[str, Any] = {"since": len(engine_losses()), "ledger_run_key": None}
    server, client = simulation_apps(run_config, watch)
    t0 = time.perf_counter()
    # Deprecated in Flower 1.42 (its DEPRECATED FEATURE warning is logged for every federation, not
    # silenced) and kept: the replacement its message names, `flwr run`, is not in-process. There a
    # SuperLink starts one `flwr-simulation` process per run, which installs the app bundle, loads the
    # apps by name and starts (then shuts down) its own Ray: no actors kept warm from job to job
    # (13-15 s from launch to the end of round 1 for `make run` against 0.13 s of overhead for a warm
    # sweep job, docs/results.md), no apps built here with the job's config, no stand-in engine in
    # tests. flwr.simulation has no other public entry: run_simulation_process is that per-run
    # process (it needs a SuperLink's Runtime API address and token), _run_simulation is private.
    try:
        run_simulation(server_app=server, client_app=client, num_supernodes=s.simulation_nodes(),
                       backend_config=engine_backend_config(s.num_silos, backend))
    except Exception as exc:  # the ServerApp's error, re-raised by Flower: an engine loss, or the run's own
        lost = engine_losses(watch["since"])
        if lost:  # e.g. EngineWatchGrid's, or a failure the lost actor caused on its way there
            raise EngineLost(str(exc) if isinstance(exc, EngineLost) else
                             f"the simulation engine lost {len(lost)} actor(s) or node(s): {lost[0]}",
                             ledger_run_key=watch["ledger_run_key"], wall_s=time.perf_counter() - t0) from exc
        raise
    return _federation_result(out, time.perf_counter() - t0)


def _fresh_outputs(s: Any) -> Path:
    """The run's outputs folder, without the summary and rows of an earlier run of that name."""
    out = Path(s.outputs_dir) / s.run_name
    for name in ("summary.json", "rounds.jsonl"):
        (out / name).unlink(missing_ok=True)
    return out


def _federation_result(out: Path, wall: float) -> dict[str, Any]:
    """A finished federation's summary.json with its rounds, wall time and overhead (wall time
    minus the time inside rounds); RuntimeError when it left no summary."""
    if not (out / "summary.json").exists():
        raise RuntimeError(f"the federation left no summary in {out} (see the log above)")
    summary = json.loads((out / "summary.json").read_text())
    rounds = load_rounds(out / "rounds.jsonl")
    inside = sum(float(r["wall_s"]) for r in rounds)
    return summary | {"wall_s": wall, "overhead_s": wall - inside, "rounds_rows": rounds, "run_dir": str(out)}


def run_in_process(run_config: dict[str, Any], batched: bool = False) -> dict[str, Any]:
    """Run one federation in this process on the in-process grid (app/local_grid.py: the real
    ServerApp and ClientApp, no Flower engine or Ray), one silo at a time; ``batched``: the
    batched simulation path (app/privacy/row_batcher.py). The silos keep their state where the engine's virtual
    SuperNodes do (app.node_context.state_dir). Returns what :func:`run_federation` returns."""
    from app.data.schema import with_inline_schema
    from app.local_grid import run_local
    from app.node_context import state_dir

    run_config = with_inline_schema(run_config)
    out = _fresh_outputs(parse_settings(run_config))
    t0 = time.perf_counter()
    # a fresh 63-bit run id, as Flower's engine draws one: the run-scoped ledgers in the shared
    # state dir are named by it, so this run never meets another run's
    grid = run_local(run_config, str(state_dir({})), run_id=secrets.randbits(63), batched=batched)
    result = _federation_result(out, time.perf_counter() - t0)
    path = ("batched: each exchange's per-record gradients and model outputs in one call per model, point "
            f"and kind ({grid.batcher.requests} requests in {grid.batcher.batches} calls)" if grid.batcher is not None
            else "one silo at a time")
    return result | {"simulation_path": path}


def retry_config(run_config: dict[str, Any], lost: EngineLost) -> dict[str, Any]:
    """The run config that continues a federation the engine lost (``run_config``: the lost one's).
    With the checkpoint the lost federation left (its ledger run key is ``lost``'s): ``resume =
    true`` from it, under that ledger run key (app.launch.resume_config does the same for
    ``--resume``); the ServerApp checks the checkpoint and the settings and replays the round that
    was cut, and each silo answers what it already released from its ledger (charged once). With no
    checkpoint of its own (lost before its first round ended, or nothing to say who wrote
    one that is there): the federation again from round 1, under the same ledger run key, so a
    release of the lost first round is answered from the ledger, not charged again."""
    from app.checkpoint import CheckpointError, load_checkpoint
    from app.server_app import CHECKPOINT_FILE

    cfg = dict(run_config)
    if lost.ledger_run_key is None:  # lost before the ServerApp started: nothing was asked of a silo
        return cfg
    cfg["ledger-run-key"] = lost.ledger_run_key
    s = parse_settings(cfg)
    try:
        state = load_checkpoint(Path(s.outputs_dir) / s.run_name / CHECKPOINT_FILE) if s.checkpoint else None
    except CheckpointError:
        state = None
    if state is not None and state.get("ledger_run_key") == lost.ledger_run_key:
        cfg["resume"] = True
    else:
        cfg["resume"] = False
    return cfg
