"""Flower ClientApp: a node's role -> the silo logic in ``clients/``.

Node config (set per SuperNode with ``--node-config``; simulation sets the first two):
``partition-id`` (this silo's index), ``num-partitions`` (must equal num-silos),
``state-dir`` (where the privacy ledger lives; default ``$FLWR_HOME/silofl-state``),
``data-dir`` (overrides the run's data-dir), and the silo's own privacy policy, which the run
config (written by whoever submits the run) cannot override: ``epsilon-cap``, ``delta-cap``,
``ledger-scope``, ``noise-seed``, ``evaluation`` and ``evaluation-noise-ratio``
(app/privacy/policy.py: a node that sets a cap gets a lifetime ledger, OS randomness and no
evaluation replies unless its operator says otherwise).
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
from app.privacy.policy import NodePolicy, node_policy, policy_violation
from clients.byzantine import DATA_ATTACKS, byzantine_indices, poison_labels
from app.privacy.ledger import LedgerError
from clients.silo import RefusingSilo, Silo

app = ClientApp()

_SILOS: dict[tuple, Silo] = {}


def _settings(context: Context, policy: NodePolicy) -> Settings:
    s = parse_settings(context.run_config)
    node = context.node_config
    if node.get("data-dir"):
        s = replace(s, data_dir=str(node["data-dir"]))
    if policy.noise_seed is not None:  # the node's choice (or its capped default, os) wins
        s = replace(s, privacy=replace(s.privacy, noise_seed=policy.noise_seed))
    return s


def _silo(context: Context) -> Silo:
    """The silo of this node and run (built once per process and reused across rounds)."""
    node = context.node_config
    policy = node_policy(node)
    s = _settings(context, policy)
    if "partition-id" not in node:
        raise ValueError("node config must set partition-id (this silo's index) and num-partitions")
    index = int(node["partition-id"])
    num = int(node.get("num-partitions", s.num_silos))
    if num != s.num_silos or not 0 <= index < s.num_silos:
        raise ValueError(
            f"node config partition-id={index}, num-partitions={num} does not fit num-silos = {s.num_silos}; "
            f"start the federation with {s.num_silos} silo nodes"
        )
    ledger_key = f"run{context.run_id}" if policy.ledger_scope == "run" else "node"
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
        if s.attack.kind in DATA_ATTACKS and index in byzantine_indices(s):  # a Byzantine silo poisons its labels
            data = poison_labels(data, s, fed.num_classes)
        n = fed.silos[index].n
        ledger_budget = None
        if policy.ledger_scope == "node":  # one lifetime budget across runs: the silo's own, from its node config
            # (epsilon-cap, delta-cap), or delta = 1/n^2 without a delta cap: never what one run asks
            ledger_budget = (float(policy.epsilon_cap), policy.delta_cap if policy.delta_cap is not None else 1.0 / (n * n))
        delta_asked = "1/n^2" if s.privacy.delta is None else f"{s.privacy.delta:g}"
        violation = policy_violation(policy, s.privacy.enabled, s.privacy.epsilon, s.delta_for(n), delta_asked)
        try:
            _SILOS[key] = Silo(s, data, fed.num_classes, fed.feature_shape, state_dir, ledger_key,
                               policy_violation=violation, ledger_budget=ledger_budget,
                               evaluation=policy.evaluation, evaluation_noise_ratio=policy.evaluation_noise_ratio)
        except LedgerError as exc:  # no trustworthy record of what was spent: release nothing
            _SILOS[key] = RefusingSilo(index, str(exc))
    return _SILOS[key]


@app.train()
def train(msg: Message, context: Context) -> Message:
    silo = _silo(context)
    try:
        content = silo.train(msg.content)
    except wire.ReplyError as exc:  # a malformed instruction is refused, not a crash
        content = wire.Refusal(wire.REFUSED_CONFIG, str(exc), silo.ledger.spent()).encode()
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    silo = _silo(context)
    try:
        content = silo.evaluate(msg.content)
    except wire.ReplyError as exc:
        content = wire.Refusal(wire.REFUSED_CONFIG, str(exc), silo.ledger.spent()).encode()
    return Message(content, reply_to=msg)


@app.query(wire.LEDGER)
def ledger(msg: Message, context: Context) -> Message:
    """The silo's public privacy record: n, K, budget, releases, epsilon spent."""
    return Message(wire.ledger_reply(_silo(context).ledger_report()), reply_to=msg)


@app.query(wire.IDENTITY)
def identity(msg: Message, context: Context) -> Message:
    """This node's partition id, for the simulation's attack harness (which silos are Byzantine
    is the experiment's ground truth). The server never weights a silo by it."""
    return Message(wire.identity_reply(int(context.node_config["partition-id"])), reply_to=msg)
