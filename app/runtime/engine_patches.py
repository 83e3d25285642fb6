"""Patches to Flower 1.42's simulation engine, each checked against the code it replaces.

In-process sweeps (app.sweep, app.federation) and the ``flwr-simulation`` process of ``flwr run``
(app/client_app.py applies them there) share these: the lean Ray start (:func:`lean_ray_start`,
on by default), the ClientApp actors at niceness 0 (:func:`actor_niceness`, on by default), the
message index (:func:`index_engine_messages`, one pass over the stored instructions per sweep, on
by default), the opt-in poll period (:func:`fast_poll`), and the warm engine of a sweep
(:func:`keep_engine_warm`, :func:`prompt_engine_stop`). What the apps compute is unchanged; on a
Flower release other than 1.42, or when a replaced function is not the code it was checked on, a
patch is skipped with a RuntimeWarning and Flower runs unpatched. Standard library only at import
(the ClientApp imports this module in the engine's process): Flower and Ray are imported by each
patch when it is applied.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

from app.runtime import FLOWER_VERSION

#: environment variable naming an existing Ray cluster (Ray's own): ``auto`` or ``HOST:PORT``
RAY_ADDRESS_ENV = "RAY_ADDRESS"
#: Ray's address for "start a Ray of this run's own". Without an address ``ray.init`` joins the
#: latest Ray started on this machine (``/tmp/ray/ray_current_cluster``: another run's, or a
#: ``ray start``): a simulation started while another one ran printed ``Found multiple active Ray
#: instances ... Connecting to latest cluster`` and hung. A run joins a cluster only when named.
LOCAL_RAY = "local"


def named_ray_cluster(address: Any = None) -> str:
    """The Ray cluster the user named: ``address`` (``sweep.ray-address``), else ``RAY_ADDRESS``;
    "" when none (``local``, Ray's word for a new local instance, names none)."""
    named = str(address or os.environ.get(RAY_ADDRESS_ENV, "") or "").strip()
    return "" if named == LOCAL_RAY else named


def own_ray() -> None:
    """In the engine's process: unless the user named a cluster, ``RAY_ADDRESS=local``, so that
    whatever calls ``ray.init`` there (Flower's own start, or silofl's lean one) starts a Ray of
    this run's own instead of joining another run's (:data:`LOCAL_RAY`)."""
    if not named_ray_cluster():
        os.environ[RAY_ADDRESS_ENV] = LOCAL_RAY

#: Ray's setting for the niceness of the worker processes its raylet starts (the ClientApp actors),
#: read from the raylet's environment, which ``ray.init`` starts from this process's
#: (ray/_private/ray_constants.py: ``RAY_WORKER_NICENESS``; Ray's default is 15)
RAY_WORKER_NICENESS_ENV = "RAY_worker_niceness"
#: the actors' niceness in silofl's own simulations: the driver's (Ray's 15 let a busy machine
#: starve the actors: a launcher run made no round in 12 minutes)
ACTOR_NICENESS = 0


def actor_niceness(value: int = ACTOR_NICENESS) -> None:
    """In the engine's process, before Ray starts: the ClientApp actors of a Ray this run starts
    run at niceness ``value`` instead of Ray's 15 (:data:`RAY_WORKER_NICENESS_ENV`). Flower's
    engine waits on every actor's reply, so at nice 15 on a machine busy with anything else at
    nice 0 the rounds stall. A value the user set in the environment wins; a Ray cluster
    started elsewhere (``RAY_ADDRESS``) keeps its own raylets' setting."""
    os.environ.setdefault(RAY_WORKER_NICENESS_ENV, str(int(value)))


_WARM_POOLS: dict[str, Any] = {}

#: the Flower release whose simulation engine the patches below were written against and checked on
#: (flwr/server/superlink/fleet/vce/vce_api.py and .../backend/raybackend.py); on any other release
#: they are skipped with a warning and Flower runs unpatched
PATCHED_FLWR = f"{FLOWER_VERSION}."
#: environment variable that turns the engine poll patch on (see :func:`fast_poll`): "1" (or
#: "true") for :data:`FAST_POLL_S`, a number for that many seconds, unset / "0" / "false" off. It
#: is read by :func:`run_federation` (sweeps, scripts) and, for ``flwr run``, by the ClientApp
#: when Flower loads it in the engine's process (app/client_app.py; ``python -m app.launch
#: --fast-poll`` sets it for the local SuperLink)
FAST_POLL_ENV = "SILOFL_FAST_POLL"
#: the engine's poll period with the patch (Flower 1.42: 0.1 s)
FAST_POLL_S = 0.005
#: the wait in Flower 1.42's ``vce_api.add_messages_to_queue`` that the poll patch replaces
POLL_WAIT_CALL = "f_stop.wait(0.1)"
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
        seconds = math.nan
    if not 0.0 < seconds <= 0.1:  # also NaN
        from app.options import ConfigError  # only for the error: the ClientApp's import stays stdlib-only

        raise ConfigError(f"{FAST_POLL_ENV} / sweep.fast-poll = {raw!r}; allowed: true, false or seconds "
                          "in (0, 0.1]")
    return seconds


def fast_poll(seconds: float = FAST_POLL_S) -> bool:
    """Opt-in: make Flower's simulation engine look for new instructions every ``seconds``.

    Flower 1.42's engine moves the ServerApp's messages to its workers in a loop that sleeps a
    hard-coded 0.1 s between looks (``vce_api.add_messages_to_queue``: ``f_stop.wait(0.1)``), so
    every exchange of a simulated round waits up to 0.1 s for nothing. This replaces that
    function (``run_api`` looks it up by name when it starts its threads, so the patch applies to
    every engine started afterwards in this process) with the same loop and period ``seconds``
    (together with the message index when that is on, :func:`index_engine_messages`: one loop,
    :func:`_install_engine_loop`). What the apps compute is unchanged (messages are handled in
    the same order by the same code); the engine thread wakes 1/``seconds`` times a second
    instead of 10 (a few hundred microseconds of CPU each at 5 ms). ``seconds`` <= 0 turns the
    poll patch off (Flower's 0.1 s). Returns whether the patch is in place; skipped with a
    warning on a Flower release other than 1.42."""
    from flwr.server.superlink.fleet.vce import vce_api

    if seconds <= 0:
        _ENGINE_LOOP["poll_s"] = 0.0
        _install_engine_loop(vce_api)
        return False
    original = _flower_loop(vce_api)
    if not _engine_patchable("the engine poll patch (fast-poll)", original, POLL_WAIT_CALL):
        return False
    _ENGINE_LOOP["poll_s"] = float(seconds)
    _install_engine_loop(vce_api)
    return True


# -- the engine's instruction loop: one sweep over the nodes instead of one store scan per node ------
#: environment variable that turns the engine's message index (:func:`index_engine_messages`, on by
#: default) off: "0"
ENGINE_INDEX_ENV = "SILOFL_ENGINE_INDEX"
#: Flower 1.42's poll period in ``vce_api.add_messages_to_queue``
FLOWER_POLL_S = 0.1
#: sha256 of the source of the Flower 1.42 functions whose behaviour one sweep of the index
#: reproduces: ``vce_api.add_messages_to_queue`` (the loop it replaces) and
#: ``InMemoryLinkState.get_message_ins`` (the scan it folds into one pass); the index calls
#: ``InMemoryLinkState._check_stored_messages`` itself, so that one is checked by name only
INDEX_SOURCE_SHA256 = {
    "add_messages_to_queue": "953f4bd41a931a77",
    "InMemoryLinkState.get_message_ins": "6547c8dcbc62e12f",
}
#: what the engine's instruction loop does in this process: ``poll_s`` (0.0 = Flower's 0.1 s,
#: :func:`fast_poll`) and ``index`` (one pass per sweep, :func:`index_engine_messages`)
_ENGINE_LOOP: dict[str, Any] = {"poll_s": 0.0, "index": False}


def _source_sha256(function: Any) -> str:
    """The first 16 hex digits of the sha256 of ``function``'s source text."""
    import hashlib
    import inspect

    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def one_pass_sweep(state: Any, nodes_mapping: Any) -> list[Any]:
    """One sweep of Flower 1.42's ``add_messages_to_queue`` over an ``InMemoryLinkState``, in one
    pass over the stored instructions instead of one full scan per node.

    Flower's sweep calls ``state.get_message_ins(node_id, limit=1)`` for every node in
    ``nodes_mapping`` order; each call walks the store in insertion order, runs
    ``_check_stored_messages`` on every message it passes (deleting the expired ones and those
    whose nodes left the federation), and takes the first valid, undelivered message to that node
    (marking it delivered): O(nodes x messages) per sweep. Here the store is walked once, in the
    same order, under the state's lock: each message passed is checked by Flower's own
    ``_check_stored_messages``; a valid undelivered message to a node that has none yet this sweep
    is taken (marked delivered, ``now().isoformat()`` as Flower does) and that node is served. The
    walk stops when every node has one, which is exactly where Flower's last per-node scan would
    stop (the farthest message taken), and goes through the whole store when some node has none,
    as Flower's scan for that node does: the same messages are checked (so the same expired ones
    deleted), each node gets the same message (the first valid undelivered one to it in store
    order), and the messages are returned in ``nodes_mapping`` order, the order Flower puts them
    in the workers' queue. O(messages) per sweep. The one difference is timing: Flower releases
    the lock between nodes, so an instruction the ServerApp stores in the middle of a sweep may
    be taken in that sweep or the next; here it is the next (as if it had been stored a moment
    later). Likewise Flower checks a message once per node scan that passes it, so one whose TTL
    runs out in the middle of a sweep may go in that sweep; here at its next check (as if the
    sweep had run a moment sooner); an expired message is never delivered either way."""
    from flwr.server.superlink.linkstate import in_memory_linkstate

    wanted = set(nodes_mapping.keys())
    taken: dict[int, Any] = {}
    with state.lock:
        store = state.message_ins_store
        for msg_id in list(store.keys()):
            if not wanted:
                break
            state._check_stored_messages({msg_id})
            msg = store.get(msg_id)
            if msg is not None and msg.metadata.dst_node_id in wanted and msg.metadata.delivered_at == "":
                msg.metadata.delivered_at = in_memory_linkstate.now().isoformat()
                taken[msg.metadata.dst_node_id] = msg
                wanted.discard(msg.metadata.dst_node_id)
    return [taken[node_id] for node_id in nodes_mapping.keys() if node_id in taken]


def _flower_loop(vce_api: Any) -> Any:
    """The ``add_messages_to_queue`` silofl's loop replaces: ``vce_api``'s own unless that is
    silofl's (:func:`_install_engine_loop`), then the one it replaced."""
    current = vce_api.add_messages_to_queue
    return vce_api._silofl_original_add_messages if hasattr(current, "_silofl_index") else current


def _install_engine_loop(vce_api: Any) -> None:
    """Put in ``vce_api`` the instruction loop :data:`_ENGINE_LOOP` asks for: Flower's own
    function when neither the poll patch nor the index is on; else Flower's loop (put the nodes'
    pending instructions in the workers' queue, then wait) with the poll period of
    :func:`fast_poll` (Flower's 0.1 s when off) and, with the index on, :func:`one_pass_sweep`
    on Flower's in-memory state (any other state: Flower's per-node calls)."""
    original = _flower_loop(vce_api)
    poll_s, index = float(_ENGINE_LOOP["poll_s"]), bool(_ENGINE_LOOP["index"])
    if not poll_s and not index:
        vce_api.add_messages_to_queue = original
        return
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    period = poll_s or FLOWER_POLL_S

    def add_messages_to_queue(state: Any, queue: Any, nodes_mapping: Any, f_stop: Any) -> None:
        """Flower 1.42's loop with silofl's engine patches (poll period, one-pass sweep)."""
        one_pass = index and type(state) is InMemoryLinkState
        while not f_stop.is_set():
            if one_pass:
                for msg in one_pass_sweep(state, nodes_mapping):
                    queue.put(msg)
            else:  # Flower's own sweep
                for node_id in nodes_mapping.keys():
                    for msg in state.get_message_ins(node_id=node_id, limit=1):
                        queue.put(msg)
            f_stop.wait(period)

    add_messages_to_queue._silofl_poll_s = period  # type: ignore[attr-defined]
    add_messages_to_queue._silofl_index = index  # type: ignore[attr-defined]
    vce_api._silofl_original_add_messages = original
    vce_api.add_messages_to_queue = add_messages_to_queue


def index_engine_messages(on: bool | None = None) -> bool:
    """Hand the ServerApp's instructions to the engine's workers with one pass over the stored
    messages per sweep (:func:`one_pass_sweep`) instead of one full scan per virtual SuperNode.

    Flower 1.42's engine looks for each node's next instruction every 0.1 s with
    ``InMemoryLinkState.get_message_ins(node_id, limit=1)``, which walks every stored instruction
    (those delivered and not yet answered included): with N nodes and a round's N instructions in
    the store, N^2 checks every 0.1 s (69 % of the driver's time at 1,000 nodes). The one-pass
    sweep does the same checks, deliveries and queue order in O(N) (see its docstring). ``on``:
    True / False; None = on unless :data:`ENGINE_INDEX_ENV` is "0". On by default (sweeps,
    ``run_federation`` and ``flwr run``). Skipped with a RuntimeWarning on a Flower release
    other than 1.42, or when ``add_messages_to_queue`` or ``InMemoryLinkState.get_message_ins``
    is not the code it was checked against (:data:`INDEX_SOURCE_SHA256`). Returns whether the
    index is in place."""
    import warnings

    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    if on is None:
        on = os.environ.get(ENGINE_INDEX_ENV, "").strip().lower() not in ("0", "false", "no", "off")
    if not on:
        _ENGINE_LOOP["index"] = False
        _install_engine_loop(vce_api)
        return False
    if not _engine_patchable("the engine message index"):
        return False
    original = _flower_loop(vce_api)
    for name, function in (("add_messages_to_queue", original),
                           ("InMemoryLinkState.get_message_ins", InMemoryLinkState.get_message_ins)):
        if _source_sha256(function) != INDEX_SOURCE_SHA256[name]:
            warnings.warn(f"silofl: flwr's {name} is not the code the engine message index was checked "
                          "against; not applied (Flower runs unpatched)", RuntimeWarning, stacklevel=2)
            return False
    if not callable(getattr(InMemoryLinkState, "_check_stored_messages", None)):
        warnings.warn("silofl: flwr's InMemoryLinkState has no _check_stored_messages; the engine message "
                      "index is not applied", RuntimeWarning, stacklevel=2)
        return False
    _ENGINE_LOOP["index"] = True
    _install_engine_loop(vce_api)
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
RUNTIME_ENV_CALL = 'runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}'


def lean_ray_start() -> bool:
    """Start the engine's Ray without the ``runtime_env`` Flower 1.42 passes for PYTHONPATH.

    ``RayBackend.init_ray`` puts the driver's ``sys.path`` into ``os.environ["PYTHONPATH"]`` and
    then also asks ``ray.init(runtime_env={"env_vars": {"PYTHONPATH": ...}})`` for the same
    value. Ray's processes are started by ``ray.init`` from this process's environment, so they
    have it already; the runtime environment only makes Ray set up its runtime-env agent before
    the first actor (about 1.2 s of every simulation's round 1 on a 2-core machine). This
    replaces ``init_ray`` with the same code minus that argument; when the init args name an
    ``address`` or ``RAY_ADDRESS`` names a cluster (one started elsewhere, which does not inherit
    this environment; :func:`engine_backend_config`) it calls Flower's own; otherwise it starts a
    Ray of the run's own (``address="local"``, :data:`LOCAL_RAY`). On by default
    (``SILOFL_LEAN_RAY=0`` turns it off); skipped with a warning on a Flower release other than
    1.42 or when ``init_ray`` is not the code it was checked against. Returns whether the patch
    is in place."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if os.environ.get(LEAN_RAY_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    if getattr(RayBackend.init_ray, "_silofl_lean", False):
        return True
    original = RayBackend.init_ray
    if not _engine_patchable("the lean Ray start", original, RUNTIME_ENV_CALL):
        return False

    def init_ray(self: Any, backend_config: Any) -> None:
        """Flower 1.42's init_ray without the redundant runtime_env (silofl's lean Ray start)."""
        import ray

        if ray.is_initialized():
            return
        ray_init_args: dict[str, Any] = dict(backend_config.get(self.init_args_key) or {})
        if named_ray_cluster(ray_init_args.get("address")):  # a cluster started elsewhere, whose
            original(self, backend_config)  # workers do not inherit this environment: Flower's way
            return
        ray_init_args["address"] = LOCAL_RAY  # a Ray of this run's own, never another run's
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


# -- engine losses: a Ray actor, worker, raylet or node gone in the middle of a federation -------
#: the Ray errors that mean the engine lost what ran a ClientApp (an actor, its worker process, the
#: raylet or node under it, an object held there), not that the ClientApp failed: Ray's
#: RayActorError (ActorDiedError, ActorUnavailableError), NodeDiedError, WorkerCrashedError,
#: LocalRayletDiedError, ObjectLostError (OwnerDiedError, ...). A ClientApp that raised reaches the
#: driver as a RayTaskError (wrapping Flower's ClientAppException) and is never one of these; nor
#: is Ray's OutOfMemoryError (the same job would be killed again).
ENGINE_LOSS_ERRORS = ("RayActorError", "NodeDiedError", "WorkerCrashedError", "LocalRayletDiedError",
                      "ObjectLostError")

#: the engine losses seen in this process, oldest first (one line each: the Ray error's class and
#: its first line); a federation compares the count before and after (:func:`engine_losses`)
_LOSSES: list[str] = []


def is_engine_loss(exc: BaseException) -> bool:
    """Whether ``exc`` (raised where the engine ran a message) is the loss of an actor, its
    worker, a raylet or a node (:data:`ENGINE_LOSS_ERRORS`), not a failure of the ClientApp."""
    import ray.exceptions as rex

    if isinstance(exc, rex.RayTaskError):  # the ClientApp (or Flower in the actor) raised: not a loss
        return False
    return isinstance(exc, tuple(getattr(rex, name) for name in ENGINE_LOSS_ERRORS))


def engine_losses(since: int = 0) -> list[str]:
    """The engine losses :func:`watch_engine_losses` recorded in this process after the first
    ``since`` (``len(engine_losses())`` is the mark to pass later)."""
    return _LOSSES[since:]


def watch_engine_losses() -> bool:
    """Record every engine loss (:func:`is_engine_loss`) of Flower's simulation engine in this process.

    Flower 1.42's ``RayBackend.process_message`` lets Ray's error escape (after putting the dead
    actor back in the pool); the engine's worker turns it into an error reply with code UNKNOWN, and
    the ServerApp cannot tell it from a ClientApp that raised (with ``fail-on-client-error`` the
    run stops as failed, without it the run goes on with a dead actor in the pool). This wraps
    ``process_message`` to note the loss (class and first line) before the error goes on as
    before: what the engine does is unchanged, and app.federation reads the record, from this
    process, never from the text of a reply. Skipped with a warning on a Flower release other
    than 1.42. Returns whether the watch is in place."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    if getattr(RayBackend.process_message, "_silofl_watch", False):
        return True
    if not _engine_patchable("the engine-loss watch"):
        return False
    original = RayBackend.process_message

    def process_message(self: Any, message: Any, context: Any) -> Any:
        try:
            return original(self, message, context)
        except Exception as exc:
            if is_engine_loss(exc):
                first = (str(exc).strip().splitlines() or [""])[0]
                _LOSSES.append(f"{type(exc).__name__}: {first}"[:300])
            raise

    process_message._silofl_watch = True  # type: ignore[attr-defined]
    RayBackend.process_message = process_message
    return True


#: the longest :func:`restart_engine` waits for Ray to settle the fate of an actor it reports
#: "temporarily unavailable" (a node whose raylet is gone stays alive in Ray's view, with its CPUs,
#: until the GCS misses its health checks: about 15 s with Ray's defaults)
ENGINE_SETTLE_S = 60.0


def restart_engine(settle_s: float = ENGINE_SETTLE_S) -> None:
    """Drop the engine this process holds, so that the next federation starts a fresh one on what
    remains of the cluster: the warm actor pools (:func:`keep_engine_warm`) and the driver's Ray
    connection (``ray.shutdown``: a local Ray stops with its processes; on a cluster named by
    ``ray-address`` the driver disconnects and the next ``ray.init`` joins it again, where Flower
    sizes the new pool from the nodes Ray reports alive, ``pool_size_from_resources``).

    First, up to ``settle_s`` seconds, each old actor is asked whether it is ready until it answers
    or Ray declares it dead: an actor on a node that lost its raylet is "temporarily unavailable"
    (ActorUnavailableError) while Ray still counts that node's CPUs, and a pool sized then would
    hold an actor that can never be placed (its messages would wait forever). Then every actor is
    killed (those already gone ignored) and Ray is shut down."""
    import time

    import ray
    import ray.exceptions as rex

    pools = list(_WARM_POOLS.values())
    _WARM_POOLS.clear()
    if not ray.is_initialized():
        return
    actors = [a for pool in pools for a in [*pool.pool, *pool._future_to_actor.values()]]
    deadline, pending = time.monotonic() + settle_s, list(actors)
    while pending and time.monotonic() < deadline:
        unsettled = []
        for actor in pending:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            except (rex.ActorUnavailableError, rex.GetTimeoutError):
                unsettled.append(actor)  # its node may be gone, and Ray does not know it yet
            except Exception:  # noqa: BLE001 - dead (ActorDiedError, ...): settled
                pass
        pending = unsettled
        if pending:
            time.sleep(0.5)
    for actor in actors:
        try:
            ray.kill(actor)
        except Exception:  # noqa: BLE001 - already dead, or its node is gone
            pass
    ray.shutdown()
