"""Flower ClientApp: a node's role -> the silo logic in ``clients/``.

Node config (set per SuperNode with ``--node-config``; simulation sets the first two):
``partition-id`` (this silo's index), ``num-partitions`` (must equal num-silos),
``state-dir`` (where the privacy ledger lives; default ``$FLWR_HOME/silofl-state``),
``data-dir`` (overrides the run's data-dir), and the silo's own privacy policy, which the run
config (written by whoever submits the run) cannot override: ``epsilon-cap``, ``delta-cap``,
``ledger-scope``, ``noise-seed``, ``evaluation`` and ``evaluation-noise-ratio``
(app/privacy/policy.py: a node that sets a cap gets a lifetime ledger, OS randomness and no
evaluation replies unless its operator says otherwise).

Shuffle DP (``privacy.mode = shuffle``) adds a third role: ``role = "shuffler"`` in a node's
config makes it the trusted shuffler (clients/shuffler.py; its private key stays in its
state-dir; ``silo-keys``, comma-separated hex, pins the silos whose contributions it accepts).
A silo pins the shuffler with ``shuffler-public-key`` (hex). In a simulation (num-partitions =
num-silos + 1) the node with partition-id = num-silos is the shuffler and the keys travel
through the server, which a deployment must not rely on (docs/privacy.md).
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
from app.privacy.envelope import EnvelopeError, StaticKeys, parse_public_key
from clients.shuffler import ShuffleRefused, Shuffler
from clients.silo import RefusingSilo, Silo

app = ClientApp()

_SILOS: dict[tuple, Silo] = {}
_SHUFFLERS: dict[tuple, Shuffler] = {}


def _state_dir(node: dict) -> Path:
    flwr_home = Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
    return Path(str(node.get("state-dir", flwr_home / "silofl-state")))


def node_role(context: Context) -> str:
    """``shuffler`` for the node whose config says so (or, in a shuffle-mode simulation with
    num-silos + 1 nodes, the last one), else ``silo``."""
    node = context.node_config
    role = str(node.get("role", ""))
    if role:
        if role not in (wire.ROLE_SILO, wire.ROLE_SHUFFLER):
            raise ValueError(f"node config role = {role!r} is not allowed; allowed: silo, shuffler")
        return role
    s = parse_settings(context.run_config)
    if (s.privacy.mode == "shuffle" and int(node.get("num-partitions", -1)) == s.num_silos + 1
            and int(node.get("partition-id", -1)) == s.num_silos):
        return wire.ROLE_SHUFFLER
    return wire.ROLE_SILO


def _shuffler(context: Context) -> Shuffler:
    """This node's shuffler (its key pair on its own disk; one per run and state dir)."""
    node = context.node_config
    state_dir = _state_dir(node)
    key = (context.run_id, state_dir)
    if key not in _SHUFFLERS:
        for old in [k for k in _SHUFFLERS if k != key]:
            del _SHUFFLERS[old]
        keys = StaticKeys.load_or_create(state_dir / "shuffler.key")
        pinned = str(node.get("silo-keys", "")).strip()
        allowed = [parse_public_key(k.strip()) for k in pinned.split(",") if k.strip()] if pinned else None
        _SHUFFLERS[key] = Shuffler(keys, allowed, seen_path=state_dir / f"shuffler-seen-run{context.run_id}.json")
    return _SHUFFLERS[key]


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
    if s.privacy.mode == "shuffle" and num == s.num_silos + 1:  # a simulation with its shuffler node
        num = s.num_silos
    if num != s.num_silos or not 0 <= index < s.num_silos:
        raise ValueError(
            f"node config partition-id={index}, num-partitions={num} does not fit num-silos = {s.num_silos}; "
            f"start the federation with {s.num_silos} silo nodes"
        )
    ledger_key = f"run{context.run_id}" if policy.ledger_scope == "run" else "node"
    state_dir = _state_dir(node)
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
        pin = str(node.get("shuffler-public-key", "")).strip() or None
        if pin is not None:
            try:
                parse_public_key(pin)
            except EnvelopeError as exc:  # the operator's typo: refuse everything, say why
                violation = violation or f"node config shuffler-public-key is not an X25519 public key: {exc}"
                pin = None
        if violation is None and s.privacy.mode == "shuffle" and pin is None and policy.epsilon_cap is not None:
            violation = ("this node has a privacy cap and no pinned shuffler key (node config shuffler-public-key): "
                         "it does not seal contributions to a key the server chose")
        try:
            _SILOS[key] = Silo(s, data, fed.num_classes, fed.feature_shape, state_dir, ledger_key,
                               policy_violation=violation, ledger_budget=ledger_budget,
                               evaluation=policy.evaluation, evaluation_noise_ratio=policy.evaluation_noise_ratio,
                               run_id=context.run_id, shuffler_pin=pin)
        except LedgerError as exc:  # no trustworthy record of what was spent: release nothing
            _SILOS[key] = RefusingSilo(index, str(exc))
    return _SILOS[key]


@app.train()
def train(msg: Message, context: Context) -> Message:
    if node_role(context) == wire.ROLE_SHUFFLER:
        return Message(wire.Refusal(wire.REFUSED_CONFIG, "this node is the shuffler; it trains nothing", 0.0).encode(),
                       reply_to=msg)
    silo = _silo(context)
    try:
        content = silo.train(msg.content)
    except wire.ReplyError as exc:  # a malformed instruction is refused, not a crash
        content = wire.Refusal(wire.REFUSED_CONFIG, str(exc), silo.ledger.spent()).encode()
    return Message(content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    if node_role(context) == wire.ROLE_SHUFFLER:
        return Message(wire.Refusal(wire.REFUSED_CONFIG, "this node is the shuffler; it holds no data", 0.0).encode(),
                       reply_to=msg)
    silo = _silo(context)
    try:
        content = silo.evaluate(msg.content)
    except wire.ReplyError as exc:
        content = wire.Refusal(wire.REFUSED_CONFIG, str(exc), silo.ledger.spent()).encode()
    return Message(content, reply_to=msg)


@app.query(wire.LEDGER)
def ledger(msg: Message, context: Context) -> Message:
    """The silo's public privacy record: n, K, budget, releases, epsilon spent."""
    if node_role(context) == wire.ROLE_SHUFFLER:
        return Message(wire.ledger_reply({"role": wire.ROLE_SHUFFLER}), reply_to=msg)
    return Message(wire.ledger_reply(_silo(context).ledger_report()), reply_to=msg)


@app.query(wire.KEYS)
def keys(msg: Message, context: Context) -> Message:
    """This node's role and X25519 public key: the shuffler's (silos seal to it) or a silo's
    sender key (the shuffler accepts only contributions from known senders)."""
    if node_role(context) == wire.ROLE_SHUFFLER:
        return Message(wire.keys_reply(wire.ROLE_SHUFFLER, _shuffler(context).keys.public_hex), reply_to=msg)
    silo = _silo(context)
    sender = getattr(silo, "sender_keys", None)
    if sender is None:
        return Message(wire.Refusal(wire.REFUSED_CONFIG, "this silo has no shuffle key (not a shuffle-mode run)",
                                    0.0).encode(), reply_to=msg)
    return Message(wire.keys_reply(wire.ROLE_SILO, sender.public_hex), reply_to=msg)


@app.query(wire.SHUFFLE)
def shuffle(msg: Message, context: Context) -> Message:
    """The shuffler's one job: decrypt, check and sum one exchange's contributions, and return
    only the totals (or refuse). A malformed request is refused, never a crash."""
    if node_role(context) != wire.ROLE_SHUFFLER:
        return Message(wire.Refusal(wire.REFUSED_CONFIG, "this node is not the shuffler", 0.0).encode(), reply_to=msg)
    shuffler = _shuffler(context)
    try:
        req = wire.ShuffleRequest.decode(msg.content)
        if shuffler.allowed_senders is None:  # simulation: the silo keys the server saw
            senders = [parse_public_key(k) for k in req.senders]
            result = shuffler.aggregate(req.blobs, req.context, req.dim, req.levels, allowed_senders=senders)
        else:
            result = shuffler.aggregate(req.blobs, req.context, req.dim, req.levels)
    except (wire.ReplyError, EnvelopeError) as exc:
        return Message(wire.Refusal(wire.REFUSED_CONFIG, f"malformed shuffle request: {exc}", 0.0).encode(),
                       reply_to=msg)
    except ShuffleRefused as exc:
        return Message(wire.Refusal(wire.REFUSED_POLICY, f"shuffler refused: {exc}", 0.0).encode(), reply_to=msg)
    return Message(wire.ShuffleReply(result.totals, result.trials, result.records, result.accepted,
                                     len(result.dropped)).encode(), reply_to=msg)


@app.query(wire.IDENTITY)
def identity(msg: Message, context: Context) -> Message:
    """This node's partition id, for the simulation's attack harness (which silos are Byzantine
    is the experiment's ground truth). The server never weights a silo by it."""
    return Message(wire.identity_reply(int(context.node_config["partition-id"])), reply_to=msg)
