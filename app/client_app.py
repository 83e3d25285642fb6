"""Flower ClientApp: each message -> this node's silo (or shuffler), in process or in its service.

The ClientApp is thin: importing it loads no torch, scipy, matplotlib or hydra, because Flower
1.42's SuperNode starts a new ``flwr-clientapp`` process for every message. What a node does
with a message lives in app/node_runtime.py (node config keys, roles, policy: see there), and
runs in one of two places:

* with ``silo-service = '<socket>'`` in the node config, the long-lived silo service of this
  node (app/runtime/silo_service.py, started by the node's operator) answers it: each handler forwards
  the message type, its content, the run id and the run config over the Unix socket and
  returns the service's reply; the service uses its own node config, never one sent to it.
  A service that does not answer gives a refusal (``bad-request``, naming the socket), not a
  crash; a service that answers with an error is a ClientApp failure, as in process;
* without it (simulations, the in-process grid, or an operator's choice), app/node_runtime.py
  is imported on the first message and runs here. A ClientApp in a ``flwr-clientapp`` process
  is a deployed node (app/privacy/policy.py); a simulation's is not.

With ``SILOFL_FAST_POLL`` set (``python -m app.launch --fast-poll``), importing this module in the
process of Flower's simulation engine (which loads the ClientApp before it starts its threads)
applies the opt-in engine poll patch, app.runtime.engine_patches.fast_poll; anywhere else it does nothing.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from app.node_context import deployed_process
from app.runtime import silo_protocol

app = ClientApp()

#: the query actions, as app.wire names them (LEDGER, IDENTITY, KEYS, SHUFFLE); app.wire imports
#: torch (through app.sketch), so they are spelled here and tests/test_lazy_imports.py checks them
LEDGER, IDENTITY, KEYS, SHUFFLE = "ledger", "identity", "keys", "shuffle"
SECAGG_KEYS, SECAGG_SHARE, SECAGG_UNMASK = "secagg_keys", "secagg_share", "secagg_unmask"


def _unavailable(path: str, exc: Exception) -> RecordDict:
    from app import wire  # only on this failure path: it imports torch

    return wire.Refusal(wire.REFUSED_CONFIG, f"this node's silo service is unavailable (socket {path}): {exc}",
                        math.nan).encode()


def _answer(message_type: str, msg: Message, context: Context) -> Message:
    node = context.node_config
    path = str(node.get("silo-service", "") or "")
    if path:
        try:
            content = silo_protocol.request(path, message_type, msg.content, context.run_id, context.run_config,
                                            node_id=context.node_id)
        except silo_protocol.ServiceUnavailable as exc:
            content = _unavailable(path, exc)
    else:
        from app import node_runtime

        content = node_runtime.handle(message_type, msg.content, context, deployed=deployed_process())
    return Message(content, reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return _answer(MessageType.TRAIN, msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return _answer(MessageType.EVALUATE, msg, context)


@app.query(LEDGER)
def ledger(msg: Message, context: Context) -> Message:
    """The silo's public privacy record: n, K, budget, releases, epsilon spent."""
    return _answer(f"{MessageType.QUERY}.{LEDGER}", msg, context)


@app.query(KEYS)
def keys(msg: Message, context: Context) -> Message:
    """This node's role and X25519 public key (shuffle DP)."""
    return _answer(f"{MessageType.QUERY}.{KEYS}", msg, context)


@app.query(SHUFFLE)
def shuffle(msg: Message, context: Context) -> Message:
    """The shuffler's sum of one exchange's contributions (or its refusal)."""
    return _answer(f"{MessageType.QUERY}.{SHUFFLE}", msg, context)


@app.query(IDENTITY)
def identity(msg: Message, context: Context) -> Message:
    """This node's partition id, for the simulation's attack harness (never a weight)."""
    return _answer(f"{MessageType.QUERY}.{IDENTITY}", msg, context)


@app.query(SECAGG_KEYS)
def secagg_keys(msg: Message, context: Context) -> Message:
    """Secure aggregation, round 1: a fresh mask key for the exchange (app/wire/secagg.py)."""
    return _answer(f"{MessageType.QUERY}.{SECAGG_KEYS}", msg, context)


@app.query(SECAGG_SHARE)
def secagg_share(msg: Message, context: Context) -> Message:
    """Secure aggregation, round 2: the shares sealed to each neighbour."""
    return _answer(f"{MessageType.QUERY}.{SECAGG_SHARE}", msg, context)


@app.query(SECAGG_UNMASK)
def secagg_unmask(msg: Message, context: Context) -> Message:
    """Secure aggregation, round 4: the shares that open the sum (or a refusal)."""
    return _answer(f"{MessageType.QUERY}.{SECAGG_UNMASK}", msg, context)


def _engine_patches() -> None:
    """``flwr run`` on the local SuperLink: the engine runs in the run's ``flwr-simulation``
    process, which imports this module (to check the ClientApp loads) before it starts Ray and
    the loop the poll patch replaces. There, and only there: a Ray of the run's own (unless
    ``RAY_ADDRESS`` names a cluster) whose actors run at niceness 0 (unless ``RAY_worker_niceness``
    is set), the lean Ray start (on unless ``SILOFL_LEAN_RAY=0``), the engine's message index (on
    unless ``SILOFL_ENGINE_INDEX=0``) and, if asked for, the engine poll patch
    (app/runtime/engine_patches.py)."""
    if "flwr.server.superlink.fleet.vce.vce_api" not in sys.modules:  # not the engine's process
        return
    from app.runtime.engine_patches import (actor_niceness, fast_poll, fast_poll_setting, index_engine_messages,
                                            lean_ray_start, own_ray)

    own_ray()  # a Ray of this run's own unless RAY_ADDRESS names a cluster (app/runtime/engine_patches.py)
    actor_niceness()
    lean_ray_start()
    index_engine_messages()
    if os.environ.get("SILOFL_FAST_POLL", "").strip().lower() not in ("", "0", "false", "no", "off"):
        fast_poll(fast_poll_setting())


_engine_patches()


def __getattr__(name: str) -> Any:
    """``_SILOS`` / ``_SHUFFLERS``: the in-process caches, now app.node_runtime's (kept for
    callers that inspect the silos a simulation built)."""
    if name in ("_SILOS", "_SHUFFLERS"):
        from app import node_runtime

        return getattr(node_runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
