"""What a node does with each message: its role, its silo (or shuffler) and their state.

One implementation for both ways a node runs (DESIGN.md section 2, composition root):

* in process: the ClientApp (app/client_app.py) imports this module lazily and calls
  :func:`handle` (simulations, the in-process grid, or a SuperNode without a silo service);
* in the silo service (app/runtime/silo_service.py): a long-lived process per SuperNode that keeps the
  data, the model, the ledger, the calibration and the PowerSGD state across messages and runs,
  while Flower starts a fresh ``flwr-clientapp`` process for every message.

Node config (the node operator's, never the run's): ``partition-id`` (this silo's index),
``num-partitions`` (must equal num-silos), ``state-dir`` (where the privacy ledger lives;
default ``$FLWR_HOME/silofl-state``), ``ledger-mark-dir`` (the ledger's high-water marks, best on
another volume; default ``<state-dir>/ledger-marks``), ``ledger-key-file`` (the key its ledger is
chained and its witness MAC'd with; default ``<state-dir>/ledger.key``), ``ledger-witness-dir``
(optional: a second place for the ledger's witness, app/privacy/ledger/witness.py), ``data-dir``
(overrides the run's data-dir), ``data-file`` /
``data-format`` (the silo's own records, docs/your-data.md), ``role``, the
shuffle-DP pins ``shuffler-public-key`` / ``silo-keys``, and the silo's own privacy policy
(app/privacy/policy.py: a node that sets a cap, or a deployed node, gets OS randomness, no
evaluation replies and no runs without privacy unless its operator says otherwise; a node with
a cap gets a lifetime ledger).

Shuffle DP (``privacy.mode = shuffle``) adds a third role: ``role = "shuffler"`` in a node's
config makes it the trusted shuffler (clients/shuffler.py; its private key stays in its
state-dir; ``silo-keys``, comma-separated hex, pins the silos whose contributions it accepts).
A silo pins the shuffler with ``shuffler-public-key`` (hex). In a simulation (num-partitions =
num-silos + 1) the node with partition-id = num-silos is the shuffler and the keys travel
through the server, which a deployment must not rely on (docs/privacy.md).
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from flwr.app import Context, MessageType, RecordDict

from app import refusal, wire
from app.admission import Rejection, check_shuffle_request
from app.config import ConfigError, Settings, parse_settings
from app.data.federated import SiloData, build_federated_data
from app.data.schema import DataSchema, SchemaError, inline_schema, load_schema
from app.data.sources import DataUnavailableError
from app.node_context import state_dir
from app.privacy.envelope import EnvelopeError, StaticKeys, parse_public_key
from app.privacy.ledger import BudgetExceededError, LedgerError
from app.privacy.policy import (NodePolicy, node_policy, policy_violation, secagg_trust_violation,
                                shuffle_trust_violation)
from clients.byzantine import DATA_ATTACKS, byzantine_indices, poison_labels
from clients.shuffler import ShuffleRefused, Shuffler

if TYPE_CHECKING:  # the silo imports torch: loaded by the message that builds one (silo, below)
    from clients.silo import RefusingSilo, Silo

#: the silos (and shufflers) this process serves, built once per run and reused across messages
_SILOS: dict[tuple, Silo] = {}
_SHUFFLERS: dict[tuple, Shuffler] = {}
#: the (run id, state dir) whose silos _SILOS holds: the others were dropped when it last changed
_SILO_SCOPE: tuple[int, Any] | None = None


#: canonical run config -> its parsed Settings (a node parses each run's config once, not per message)
_PARSED: dict[Any, Settings] = {}


def run_settings(run_config: Mapping[str, Any]) -> Settings:
    """``parse_settings(run_config)``, cached by the config's items (Settings is
    frozen, so sharing it is safe); a malformed config raises as parse_settings does."""
    try:  # a run config's values are scalars: its items (with their types: 1, 1.0 and True are
        # equal keys but not equal values to parse_settings) are the key, without a JSON text per message
        key: Any = frozenset((k, type(v), v) for k, v in run_config.items())
    except TypeError:  # an unhashable value (a malformed config): parse_settings says what is wrong
        key = json.dumps(dict(run_config), sort_keys=True, default=repr)
    s = _PARSED.get(key)
    if s is None:
        s = parse_settings(run_config)
        if len(_PARSED) >= 16:
            _PARSED.clear()
        _PARSED[key] = s
    return s


def node_role(context: Context) -> str:
    """``shuffler`` for the node whose config says so (or, in a shuffle-mode simulation with
    num-silos + 1 nodes, the last one), else ``silo``."""
    node = context.node_config
    role = str(node.get("role", ""))
    if role:
        if role not in (wire.ROLE_SILO, wire.ROLE_SHUFFLER):
            raise ValueError(f"node config role = {role!r} is not allowed; allowed: silo, shuffler")
        return role
    s = run_settings(context.run_config)
    if (s.privacy.mode == "shuffle" and int(node.get("num-partitions", -1)) == s.num_silos + 1
            and int(node.get("partition-id", -1)) == s.num_silos):
        return wire.ROLE_SHUFFLER
    return wire.ROLE_SILO


#: the shuffler's memory of aggregated exchanges: one file per state dir, across runs and restarts
SHUFFLER_SEEN = "shuffler-seen.json"


def shuffler(context: Context) -> Shuffler:
    """This node's shuffler (its key pair on its own disk; one per run and state dir). It serves
    only the run Flower started it for (context.run_id) and remembers every exchange it ever
    aggregated in its state dir (SHUFFLER_SEEN; the per-run files of older versions are read too),
    so no context is aggregated twice, in this run or any other."""
    node = context.node_config
    where = state_dir(node)
    key = (context.run_id, where)
    if key not in _SHUFFLERS:
        for old in [k for k in _SHUFFLERS if k != key]:
            del _SHUFFLERS[old]
        keys = StaticKeys.load_or_create(where / "shuffler.key")
        pinned = str(node.get("silo-keys", "")).strip()
        allowed = [parse_public_key(k.strip()) for k in pinned.split(",") if k.strip()] if pinned else None
        _SHUFFLERS[key] = Shuffler(keys, allowed, seen_path=where / SHUFFLER_SEEN, run_id=context.run_id,
                                   legacy_seen=sorted(where.glob("shuffler-seen-run*.json")),
                                   silo_sample=int(node.get("shuffle-silo-sample", 0)))
    return _SHUFFLERS[key]


def settings(context: Context, policy: NodePolicy) -> Settings:
    """The run's settings as this node applies them (its data-dir, its noise-seed)."""
    s = run_settings(context.run_config)
    node = context.node_config
    if node.get("data-dir"):
        s = replace(s, data_dir=str(node["data-dir"]))
    if policy.noise_seed is not None:  # the node's choice (or its safe default, os) wins
        s = replace(s, privacy=replace(s.privacy, noise_seed=policy.noise_seed))
    return s


#: held while a silo is looked up or built: a batched simulation's threads (app/local_grid.py)
#: ask for their silos at once, and each must be built once
_SILOS_LOCK = threading.Lock()


def silo(context: Context, deployed: bool = False) -> Silo | RefusingSilo:
    """The silo of this node and run (built once per process and reused across rounds)."""
    with _SILOS_LOCK:
        return _silo(context, deployed)


def _silo(context: Context, deployed: bool) -> Silo | RefusingSilo:
    from clients.silo import RefusingSilo, Silo  # torch: only when a message needs this node's silo

    node = context.node_config
    policy = node_policy(node, deployed=deployed)
    s = run_settings(context.run_config)  # the node's own settings (settings()) only to build the silo
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
    # a run-scoped ledger is named by the run (a resumed run names its original's: ledger-run-key)
    run_key = getattr(s, "ledger_run_key", "") or f"run{context.run_id}"
    ledger_key = run_key if policy.ledger_scope == "run" else "node"
    where = state_dir(node)
    key = (context.run_id, index, where, ledger_key, deployed)
    if key not in _SILOS:
        # a warm process (simulation actors, the in-process grid, the silo service) serves run
        # after run: keep only the silos of this run, or the old runs' data would pile up in memory
        # (looked at when the run or state dir changes, not for each of a simulation's silos)
        global _SILO_SCOPE
        if _SILO_SCOPE != (context.run_id, where):
            for old in [k for k in _SILOS if (k[0], k[2]) != (context.run_id, where)]:
                del _SILOS[old]
            _SILO_SCOPE = (context.run_id, where)
        s = settings(context, policy)
        try:
            data, num_classes, feature_shape = silo_records(s, node, index, deployed, policy.safe)
        except SchemaPinError as exc:  # the run's schema is not the operator's: says nothing about the records
            _SILOS[key] = RefusingSilo(index, str(exc), wire.REFUSED_POLICY)
            return _SILOS[key]
        except DataUnavailableError as exc:
            # a simulation's virtual silo missing a public data set's files (no own records, no cap, not
            # deployed): the reason names the data set and its files, not a record; anywhere else, fixed text
            public = not (node.get("data-file") or policy.safe)
            _SILOS[key] = RefusingSilo(index, str(exc) if public else refusal.data_reason(index, exc),
                                       wire.REFUSED_DATA)
            return _SILOS[key]
        except Exception as exc:  # noqa: BLE001 - before any ledger: nothing is spent; the server learns only
            # that the records cannot be used (a fixed text), the detail goes to this node's log (app/refusal.py)
            _SILOS[key] = RefusingSilo(index, refusal.data_reason(index, exc), wire.REFUSED_DATA)
            return _SILOS[key]
        model_refused = model_violation(s.model, node, policy)
        if model_refused:  # before the model is imported or built: the server names no code this node runs
            _SILOS[key] = RefusingSilo(index, model_refused, wire.REFUSED_POLICY)
            return _SILOS[key]
        n = data.n
        if (s.attack.kind in DATA_ATTACKS and index in byzantine_indices(s.attack, s.num_silos, s.seed)
                and not policy.safe):  # a simulated Byzantine silo poisons its labels; a real one never
            data = poison_labels(data, s.attack.kind, s.seed, num_classes)
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
        if violation is None and s.privacy.mode == "shuffle" and pin is None and policy.safe:
            # only a simulation takes the shuffler's key from the server (docs/privacy.md)
            why = "is deployed" if deployed else "has a privacy cap"
            violation = (f"this node {why} and pinned no shuffler key (node config shuffler-public-key): "
                         "it does not seal contributions to a key the server chose")
        if violation is None and s.privacy.mode == "shuffle":
            violation = shuffle_trust_violation(policy, s.shuffle.count_on or s.silos_per_round)
        peer_keys, peer_violation = secagg_peers(policy, deployed) if s.privacy.mode == "secagg" else (None, None)
        if violation is None and s.privacy.mode == "secagg":
            violation = peer_violation or secagg_trust_violation(policy, s.secagg.count_on or s.silos_per_round)
        try:
            _SILOS[key] = Silo(s, data, num_classes, feature_shape, where, ledger_key,
                               policy_violation=violation, ledger_budget=ledger_budget,
                               evaluation=policy.evaluation, evaluation_noise_ratio=policy.evaluation_noise_ratio,
                               run_id=context.run_id, shuffler_pin=pin,
                               trust_silo_sampling=policy.shuffle_trust_silo_sampling,
                               ledger_mark_dir=node.get("ledger-mark-dir") or None,
                               ledger_key_file=node.get("ledger-key-file") or None,
                               ledger_witness_dir=node.get("ledger-witness-dir") or None,
                               # a deployed silo, or one whose operator set a cap, fsyncs every
                               # release; a simulation's virtual silo once per exchange (PrivacyLedger.sync)
                               ledger_sync=deployed or policy.safe, secagg_peer_keys=peer_keys)
        except LedgerError as exc:  # no trustworthy record of what was spent: release nothing
            _SILOS[key] = RefusingSilo(index, refusal.ledger_reason(index, exc))
        except BudgetExceededError as exc:  # the pre-processing release did not fit: ledger totals only
            _SILOS[key] = RefusingSilo(index, str(exc), wire.REFUSED_BUDGET)
        except Exception as exc:  # noqa: BLE001 - a silo that cannot be built refuses; its detail stays here
            _SILOS[key] = RefusingSilo(index, refusal.internal_reason(index, exc), wire.REFUSED_INTERNAL)
    return _SILOS[key]


def secagg_peers(policy: NodePolicy, deployed: bool) -> tuple[frozenset[str] | None, str | None]:
    """(the peer keys this silo's operator pinned, or None; why it refuses secagg, or None). A
    silo that guards real records (deployed, or with a cap) seals shares to no key the server
    chose: without node config secagg-peer-keys it refuses."""
    path = policy.secagg_peer_keys
    if path is None:
        if policy.safe:
            why = "is deployed" if deployed else "has a privacy cap"
            return None, (f"this node {why} and pinned no peer keys (node config secagg-peer-keys): it does not seal "
                          "its secure-aggregation shares to keys the server chose")
        return None, None
    try:
        lines = [ln.strip().lower() for ln in Path(path).read_text().splitlines()]
    except OSError as exc:
        return None, f"node config secagg-peer-keys: cannot read {path} ({exc.strerror})"
    keys = [ln for ln in lines if ln and not ln.startswith("#")]
    bad = [k for k in keys if len(k) != 64 or any(c not in "0123456789abcdef" for c in k)]
    if bad or not keys:
        return None, (f"node config secagg-peer-keys: {path} must list X25519 public keys, 64 hex characters a line "
                      f"({len(bad)} malformed line(s), {len(keys)} key(s))")
    return frozenset(keys), None


def model_violation(model: str, node: Mapping[str, Any], policy: NodePolicy) -> str | None:
    """Why this node refuses to build ``model`` (the run config's), or None. A zoo model or an
    installed ``silofl.models`` entry point (the node's own packages) is built anywhere; an import
    path (``package.module:Attr``, which the silo would import and call with the run's
    model-kwargs: any callable of the node's environment) only in a simulation without caps, or
    when the node's operator lists it in node config ``allowed-models``."""
    from app.model_spec import is_import_path

    if not is_import_path(model):
        return None
    allowed = {m.strip() for m in str(node.get("allowed-models", "") or "").split(",") if m.strip()}
    if model in allowed or not policy.safe:
        return None
    return (f"model = {model!r} is an import path this node's operator did not allow (node config "
            "allowed-models); a deployed or capped silo imports and calls no code the run config names")


class SchemaPinError(ValueError):
    """The run's data.schema is not the one this node's operator pinned (node config data-schema)."""


def silo_schema(s: Settings, node: Mapping[str, Any], require_pin: bool = False) -> DataSchema:
    """The schema this silo checks its own records against: the run's ``data.schema``, read only
    as inline JSON (a silo never opens a path the server names; the launcher inlines a file),
    and, when the node config pins one (``data-schema``, a file of the node's operator), equal
    to it (SchemaPinError otherwise: a refusal that depends on no record). ``require_pin`` (a
    deployed or capped node): without a pin the silo refuses, since a schema of the server's
    choosing turns whether the silo refuses into one bit about its records per run (a class
    list that leaves out one value refuses only if some record holds it)."""
    if not s.data_schema:
        raise SchemaError("a silo's own data-file needs the run's data.schema (the schema it must match)")
    pinned = str(node.get("data-schema", "") or "")
    if require_pin and not pinned:
        raise SchemaPinError("this node pins no data.schema (node config data-schema = <the schema file on this "
                             "node>): a deployed or capped silo checks its own records only against its operator's "
                             "schema, so a run cannot choose what a refusal says about them (docs/your-data.md)")
    run = inline_schema(s.data_schema)
    if pinned:
        own = load_schema(pinned)  # the operator's own file, on this node
        if own != run:
            raise SchemaPinError("the run's data.schema is not the schema this node's operator pinned (node config "
                                 "data-schema); the silo trains only against its own schema")
    return run


def silo_records(s: Settings, node: Mapping[str, Any], index: int, deployed: bool,
                 require_pin: bool = False) -> tuple[SiloData, int, tuple[int, ...]]:
    """(this silo's records, number of classes, feature shape): from its own ``data-file`` (node
    config; ``data-format`` when the name does not tell), checked against the run's data.schema
    and the node's limits (``data-min-records``, ``data-max-records``, ``data-max-bytes``), or
    its part of the run's data set. A deployed silo of an own-data run (data.schema) reads only
    its own file, never one the run config names; ``require_pin`` (a deployed or capped node):
    only against the schema its node config pins (:func:`silo_schema`). SchemaError /
    DataUnavailableError: one line."""
    own_file = str(node.get("data-file", "") or "")
    if own_file:
        from app.data.own_data import own_silo_data
        from app.data.own_files import DataLimits

        schema = silo_schema(s, node, require_pin)
        limits = DataLimits.from_node(node.get("data-min-records"), node.get("data-max-records"),
                                      node.get("data-max-bytes"))
        data = own_silo_data(s, s.seed, own_file, str(node.get("data-format", "") or ""), index, limits,
                             schema=schema)
        return data, schema.num_classes, schema.feature_shape
    if s.data_schema and deployed:
        raise SchemaError("this run trains on the silos' own records (data.schema) and this node config names no "
                          "data-file; set data-file=<path of this silo's records> (docs/your-data.md)")
    if deployed:  # a deployed silo opens no path the run config names: its data-dir is its own
        if s.data_simulation_file:
            raise SchemaError("data.simulation-file names a file on the server's side; a deployed silo reads only "
                              "its own records (node config data-file)")
        s = replace(s, data_dir=str(node.get("data-dir", "") or ""))  # "": the source's default place
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    return fed.silos[index], fed.num_classes, fed.feature_shape


# -- one function per message type: (content, context, deployed) -> reply content ----------------

def _silo_answer(method: str, not_here: str, content: RecordDict, context: Context, deployed: bool) -> RecordDict:
    """The silo's ``method`` (train or evaluate) answer to ``content``; the shuffler refuses
    (``not_here``), and a malformed request is refused, not a crash."""
    if node_role(context) == wire.ROLE_SHUFFLER:
        return wire.Refusal(wire.REFUSED_CONFIG, f"this node is the shuffler; {not_here}", 0.0).encode()
    from clients.silo import witnessed_answer  # torch: with the silo, on the first message that needs one

    node_silo = silo(context, deployed)
    try:
        return witnessed_answer(node_silo, method, content)
    except wire.ReplyError as exc:
        return wire.Refusal(wire.REFUSED_CONFIG, str(exc), node_silo.ledger.spent()).encode()
    except LedgerError as exc:  # the ledger stopped matching its mark while serving: release nothing
        return wire.Refusal(wire.REFUSED_LEDGER, refusal.ledger_reason(getattr(node_silo, "index", "?"), exc),
                            math.nan).encode()


def train(content: RecordDict, context: Context, deployed: bool = False) -> RecordDict:
    return _silo_answer("train", "it trains nothing", content, context, deployed)


def evaluate(content: RecordDict, context: Context, deployed: bool = False) -> RecordDict:
    return _silo_answer("evaluate", "it holds no data", content, context, deployed)


def ledger(content: RecordDict, context: Context, deployed: bool = False) -> RecordDict:
    """The silo's public privacy record: n, K, budget, releases, epsilon spent."""
    if node_role(context) == wire.ROLE_SHUFFLER:
        return wire.ledger_reply({"role": wire.ROLE_SHUFFLER})
    node_silo = silo(context, deployed)
    try:
        if hasattr(getattr(node_silo, "ledger", None), "check_witnesses"):  # the server's copies: a restored state dir
            node_silo.ledger.check_witnesses(wire.witnesses_of(content))
        report = node_silo.ledger_report()
        adopted = getattr(getattr(node_silo, "ledger", None), "adoptions", None)
        if adopted:  # a ledger adopted after a mismatch with its mark (python -m app.ledger adopt): what it forgot
            keep = ("time", "accept_loss", "from_version", "ledger", "mark")
            report["ledger_adoptions"] = [{k: a.get(k) for k in keep} for a in adopted]
        return wire.ledger_reply(report)
    except LedgerError as exc:
        index = int(context.node_config["partition-id"])
        return wire.ledger_reply({"silo": index, "error": refusal.ledger_reason(index, exc)})


def keys(content: RecordDict, context: Context, deployed: bool = False) -> RecordDict:
    """This node's role and X25519 public key: the shuffler's (silos seal to it) or a silo's
    sender key (the shuffler accepts only contributions from known senders)."""
    if node_role(context) == wire.ROLE_SHUFFLER:
        return wire.keys_reply(wire.ROLE_SHUFFLER, shuffler(context).keys.public_hex)
    from clients.silo import Silo  # torch: with the silo, on the first message that needs one

    node_silo = silo(context, deployed)
    sender = node_silo.mechanism.sender_keys if isinstance(node_silo, Silo) else None
    if sender is None:
        return wire.Refusal(wire.REFUSED_CONFIG, "this silo has no shuffle key (not a shuffle-mode run)", 0.0).encode()
    return wire.keys_reply(wire.ROLE_SILO, sender.public_hex)


def shuffle(content: RecordDict, context: Context, deployed: bool = False) -> RecordDict:
    """The shuffler's one job: decrypt, check and sum one exchange's contributions, and return
    only the totals (or refuse). A malformed request is refused, never a crash."""
    if node_role(context) != wire.ROLE_SHUFFLER:
        return wire.Refusal(wire.REFUSED_CONFIG, "this node is not the shuffler", 0.0).encode()
    node_shuffler = shuffler(context)
    req = check_shuffle_request(content)  # every field, before the exchange's context is consumed
    if isinstance(req, Rejection):
        return wire.Refusal(req.code, req.reason, 0.0).encode()
    try:
        if node_shuffler.allowed_senders is None:  # simulation: the silo keys the server saw
            senders = [parse_public_key(k) for k in req.senders]
            result = node_shuffler.aggregate(req.blobs, req.context, req.dim, req.levels, allowed_senders=senders,
                                             p=req.p or None)
        else:
            result = node_shuffler.aggregate(req.blobs, req.context, req.dim, req.levels, p=req.p or None)
    except (wire.ReplyError, EnvelopeError) as exc:
        return wire.Refusal(wire.REFUSED_CONFIG, f"malformed shuffle request: {exc}", 0.0).encode()
    except ShuffleRefused as exc:
        return wire.Refusal(wire.REFUSED_POLICY, f"shuffler refused: {exc}", 0.0).encode()
    return wire.ShuffleReply(result.totals, result.trials, result.records, result.accepted,
                             len(result.dropped)).encode()


def identity(content: RecordDict, context: Context, deployed: bool = False) -> RecordDict:
    """This node's partition id, for the simulation's attack harness (which silos are Byzantine
    is the experiment's ground truth). The server never weights a silo by it. The shuffler, and
    a node whose config sets no integer partition-id, refuse."""
    if node_role(context) == wire.ROLE_SHUFFLER:
        return wire.Refusal(wire.REFUSED_CONFIG, "this node is the shuffler; it has no partition id", 0.0).encode()
    pid = context.node_config.get("partition-id")
    if isinstance(pid, bool) or not isinstance(pid, int):
        return wire.Refusal(wire.REFUSED_CONFIG, f"this node's config sets no integer partition-id (got {pid!r})",
                            0.0).encode()
    return wire.identity_reply(pid)


def secagg(content: RecordDict, context: Context, deployed: bool = False, *, message_type: str = "") -> RecordDict:
    """Secure aggregation's keys, share and unmask rounds (app/wire/secagg.py), answered by the
    silo's secagg mechanism (clients/silo_secagg.py); the shuffler and a refusing silo refuse."""
    if node_role(context) == wire.ROLE_SHUFFLER:
        return wire.Refusal(wire.REFUSED_CONFIG, "this node is the shuffler; it takes no part in secure aggregation",
                            0.0).encode()
    from clients.silo import Silo  # torch: with the silo, on the first message that needs one

    node_silo = silo(context, deployed)
    if not isinstance(node_silo, Silo):
        return node_silo.train(content)  # its refusal, the same for every request
    return node_silo.secagg(message_type, content, int(context.node_id))


def _secagg_handler(message_type: str) -> Callable[[RecordDict, Context, bool], RecordDict]:
    def handler(content: RecordDict, context: Context, deployed: bool = False) -> RecordDict:
        return secagg(content, context, deployed, message_type=message_type)

    handler.__name__ = f"secagg_{message_type.rpartition('_')[2]}"
    return handler


#: Flower message type -> handler; the ClientApp registers exactly these
HANDLERS: dict[str, Callable[[RecordDict, Context, bool], RecordDict]] = {
    str(MessageType.TRAIN): train,
    str(MessageType.EVALUATE): evaluate,
    wire.LEDGER_QUERY: ledger,
    wire.KEYS_QUERY: keys,
    wire.SHUFFLE_QUERY: shuffle,
    wire.IDENTITY_QUERY: identity,
    wire.SECAGG_KEYS_QUERY: _secagg_handler(wire.SECAGG_KEYS_QUERY),
    wire.SECAGG_SHARE_QUERY: _secagg_handler(wire.SECAGG_SHARE_QUERY),
    wire.SECAGG_UNMASK_QUERY: _secagg_handler(wire.SECAGG_UNMASK_QUERY),
}


def handle(message_type: str, content: RecordDict, context: Context, *, deployed: bool) -> RecordDict:
    """The reply content for one message of ``message_type`` (a key of :data:`HANDLERS`)."""
    try:
        fn = HANDLERS[message_type]
    except KeyError:
        raise ValueError(f"unknown message type {message_type!r}; known: {', '.join(HANDLERS)}") from None
    try:
        return fn(content, context, deployed)
    except ConfigError as exc:  # the run config itself is malformed: its own one-line reason reads no record
        return wire.Refusal(wire.REFUSED_CONFIG, str(exc), math.nan).encode()
    except Exception as exc:  # noqa: BLE001 - never a crash whose text reaches the server (app/refusal.py)
        index = context.node_config.get("partition-id", "?")
        return wire.Refusal(wire.REFUSED_INTERNAL, refusal.internal_reason(index, exc), math.nan).encode()
