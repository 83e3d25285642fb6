"""Flower ClientApp: a node's role -> the silo logic in ``clients/``.

Node config (set per SuperNode with ``--node-config``; simulation sets the first two):
``partition-id`` (this silo's index), ``num-partitions`` (must equal num-silos),
``state-dir`` (where the privacy ledger lives; default ``$FLWR_HOME/silofl-state``),
``ledger-scope`` (``run``: one budget per Flower run, the default; ``node``: one lifetime budget,
``epsilon-cap`` / ``delta-cap``, for everything this node ever releases), ``data-dir`` (overrides
the run's data-dir).

The silo's own privacy policy, which the run config (written by whoever submits the run) cannot
override: ``epsilon-cap`` and ``delta-cap`` (the silo refuses to train in a run that asks for a
larger budget, or for no privacy at all), and ``noise-seed`` (``os`` forces secret randomness
whatever the run config says; a real deployment should set it).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from app import wire
from app.config import Settings, parse_settings
from app.data.federated import build_federated_data
from clients.byzantine import DATA_ATTACKS, byzantine_indices, poison_labels
from clients.silo import Silo

app = ClientApp()

_SILOS: dict[tuple, Silo] = {}


def _settings(context: Context) -> Settings:
    s = parse_settings(context.run_config)
    node = context.node_config
    if node.get("data-dir"):
        s = replace(s, data_dir=str(node["data-dir"]))
    if "noise-seed" in node:
        seed_mode = str(node["noise-seed"])
        if seed_mode not in ("run", "os"):
            raise ValueError(f"node config noise-seed = {seed_mode!r}; allowed: run, os")
        s = replace(s, privacy=replace(s.privacy, noise_seed=seed_mode))
    return s


def policy_violation(s: Settings, node: dict) -> str | None:
    """Why this silo's own caps forbid training in this run, or None."""
    eps_cap = node.get("epsilon-cap")
    delta_cap = node.get("delta-cap")
    if eps_cap is not None and (not s.privacy.enabled or s.privacy.epsilon > float(eps_cap)):
        asked = "no privacy" if not s.privacy.enabled else f"epsilon={s.privacy.epsilon:g}"
        return f"this silo's policy caps epsilon at {float(eps_cap):g}; the run asks for {asked}"
    if delta_cap is not None and s.privacy.delta is not None and s.privacy.delta > float(delta_cap):
        return f"this silo's policy caps delta at {float(delta_cap):g}; the run asks for delta={s.privacy.delta:g}"
    return None


def _silo(context: Context) -> Silo:
    """The silo of this node and run (built once per process and reused across rounds)."""
    s = _settings(context)
    node = context.node_config
    if "partition-id" not in node:
        raise ValueError("node config must set partition-id (this silo's index) and num-partitions")
    index = int(node["partition-id"])
    num = int(node.get("num-partitions", s.num_silos))
    if num != s.num_silos or not 0 <= index < s.num_silos:
        raise ValueError(
            f"node config partition-id={index}, num-partitions={num} does not fit num-silos = {s.num_silos}; "
            f"start the federation with {s.num_silos} silo nodes"
        )
    scope = str(node.get("ledger-scope", "run"))
    if scope not in ("run", "node"):
        raise ValueError(f"node config ledger-scope = {scope!r}; allowed: run, node")
    ledger_key = f"run{context.run_id}" if scope == "run" else "node"
    if scope == "node" and node.get("epsilon-cap") is None:
        raise ValueError("node config ledger-scope = 'node' needs epsilon-cap (the silo's lifetime budget)")
    flwr_home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
    state_dir = Path(str(node.get("state-dir", flwr_home / "silofl-state")))
    key = (context.run_id, index, state_dir, ledger_key)
    if key not in _SILOS:
        # a warm process (simulation actors, the in-process grid) serves run after run: keep only
        # the silos of this run, or the old runs' data would pile up in memory
        for old in [k for k in _SILOS if (k[0], k[2]) != (context.run_id, state_dir)]:
            del _SILOS[old]
        fed = build_federated_data(s)
        data = fed.silos[index]
        if s.attack_kind in DATA_ATTACKS and index in byzantine_indices(s):  # a Byzantine silo poisons its labels
            data = poison_labels(data, s, fed.num_classes)
        ledger_budget = None
        if scope == "node":  # one lifetime budget across runs: the silo's own, from its node config
            n = fed.silos[index].n
            ledger_budget = (float(node["epsilon-cap"]), float(node.get("delta-cap", s.delta_for(n))))
        _SILOS[key] = Silo(s, data, fed.num_classes, fed.feature_shape, state_dir, ledger_key,
                           policy_violation=policy_violation(s, dict(node)), ledger_budget=ledger_budget)
    return _SILOS[key]


@app.train()
def train(msg: Message, context: Context) -> Message:
    silo = _silo(context)
    try:
        content = silo.train(msg.content)
    except wire.ReplyError as exc:  # a malformed instruction is refused, not a crash
        content = wire.refusal_reply(wire.REFUSED_CONFIG, str(exc), {"eps-spent": silo.ledger.spent()})
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    silo = _silo(context)
    try:
        content = silo.evaluate(msg.content)
    except wire.ReplyError as exc:
        content = wire.refusal_reply(wire.REFUSED_CONFIG, str(exc), {"eps-spent": silo.ledger.spent()})
    return Message(content, reply_to=msg)


@app.query("ledger")
def ledger(msg: Message, context: Context) -> Message:
    """The silo's public privacy record: n, K, budget, releases, epsilon spent."""
    return Message(wire.ledger_reply(_silo(context).ledger_report()), reply_to=msg)
