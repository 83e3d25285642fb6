"""A hostile or broken server against the real node code: every field of a request is checked
before anything is recorded, and every malformed or wrong-role request gets a refusal.

Every request goes through the real ClientApp (app/client_app.py -> app/node_runtime.py -> the
silo or the shuffler), as a SuperNode delivers it. The independent facts: the node's state dir
(the ledger with its calibration row, the keys) is byte for byte what it was before a refused
request and the epsilon spent the node reports has not moved; a refusal is a wire refusal with
the ``bad-request`` code and a one-line reason; the same request without the bad field is
answered (so the refusal is the bad field's alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from app import wire

DELETE = "<delete>"  # a field removed from the request
NAN, INF = math.nan, math.inf
TRAIN, EVALUATE = str(MessageType.TRAIN), str(MessageType.EVALUATE)

#: the runs the silos serve (run config overrides): a sketched MB-SGD run, Local SGD, SPIDER, shuffle DP
RUNS: dict[str, dict[str, Any]] = {
    "sketch": {"sketch.kind": "srht", "sketch.ratio": 0.5, "num-rounds": 40, "privacy.epsilon": 50.0},
    "local": {"algorithm": "localsgd", "local-steps": 3, "lr": 0.1, "num-rounds": 40, "privacy.epsilon": 50.0},
    "spider": {"algorithm": "spider", "spider.q": 2, "num-rounds": 40, "privacy.epsilon": 50.0},
    "shuffle": {"privacy.mode": "shuffle", "num-rounds": 40, "partition": "iid", "privacy.epsilon": 50.0,
                "num-silos": 3, "silos-per-round": 3, "model": "logistic", "lr": 0.5, "privacy.delta": 1e-5},
    "private-eval": {"num-rounds": 40, "privacy.epsilon": 50.0},
}
#: node config additions per run (the node operator's evaluation policy)
NODE_EXTRA: dict[str, dict[str, Any]] = {"private-eval": {"evaluation": "private"}}


def _run_config(name: str) -> dict[str, Any]:
    from app.launch import merged_run_config

    return merged_run_config([]) | RUNS[name]


def _model(run_config: dict[str, Any]) -> dict[str, np.ndarray]:
    """The initial model as the server builds it."""
    from app.config import parse_settings
    from app.data.federated import dataset_meta
    from app.models import build_model
    from app.seeding import torch_gen

    s = parse_settings(run_config)
    shape, classes = dataset_meta(s)
    model = build_model(s.model, shape, classes, hidden=s.model_hidden, generator=torch_gen(s.seed, "init"))
    return {k: v.detach().numpy().copy() for k, v in model.named_parameters()}


class Node:
    """One node (its context: run config, node config, state dir) answered by the real ClientApp."""

    def __init__(self, run_config: dict[str, Any], node_config: dict[str, Any], state: Path, run_id: int) -> None:
        self.run_config, self.state = run_config, state
        self.context = Context(run_id=run_id, node_id=1000 + run_id, node_config=node_config | {"state-dir": str(state)},
                               state=RecordDict(), run_config=dict(run_config))

    def ask(self, message_type: str, content: RecordDict) -> RecordDict:
        from flwr.supercore.task_identity import TaskIdentity

        from app.client_app import app

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = self.context.run_id, self.context.node_id, 0
        msg = Message(content, dst_node_id=self.context.node_id, message_type=message_type)
        return app(msg, self.context).content

    def files(self) -> dict[str, bytes]:
        """Every file of the node's state dir, by relative path (the ledger, its keys)."""
        return {str(p.relative_to(self.state)): p.read_bytes() for p in sorted(self.state.rglob("*")) if p.is_file()}

    def eps_and_releases(self) -> tuple[float, list]:
        report = wire.read_ledger(self.ask(wire.LEDGER_QUERY, RecordDict()))
        return report["eps_spent"], report["releases"]


_NODES: dict[str, Node] = {}


@pytest.fixture(scope="module")
def silo_node(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Node]:
    """Silo 0 of run ``name`` (one state dir and run id per run)."""

    def get(name: str) -> Node:
        if name not in _NODES:
            from app.config import parse_settings

            cfg = _run_config(name)
            num = parse_settings(cfg).num_silos
            _NODES[name] = Node(cfg, {"partition-id": 0, "num-partitions": num} | NODE_EXTRA.get(name, {}),
                                tmp_path_factory.mktemp(f"state-{name}"), run_id=100 + list(RUNS).index(name))
        return _NODES[name]

    yield get
    _NODES.clear()


_SHUFFLER_KEY = "".join(f"{i:02x}" for i in range(1, 33))  # some X25519 public key (any 32 bytes are one)


def _base(name: str, w: dict[str, np.ndarray]) -> tuple[str, RecordDict]:
    """The request the server sends a silo of run ``name`` (strategies/loop.py's Instruction)."""
    from app.algorithms import Phase
    from app.config import parse_settings
    from app.sketch.broadcast import round_sketch

    s = parse_settings(_run_config(name))
    if name == "sketch":
        spec = round_sketch(s.sketch.kind, s.sketch.ratio, s.sketch.epsilon, s.sketch.layerwise, s.seed, 1,
                            s.sketch.error_feedback)
        return TRAIN, wire.Instruction(1, Phase.GRAD, w, sketch=spec).encode()
    if name == "local":
        return TRAIN, wire.Instruction(1, Phase.LOCAL, w, local_steps=s.local_steps, lr=s.lr).encode()
    if name == "spider":
        return TRAIN, wire.Instruction(2, Phase.DIFF, w, prev={k: v * 0.5 for k, v in w.items()}).encode()
    if name == "shuffle":
        return TRAIN, wire.Instruction(1, Phase.GRAD, w, shuffle=wire.ShuffleTicket(_SHUFFLER_KEY, 1)).encode()
    return EVALUATE, wire.EvaluateRequest(1, w).encode()


def _first(point: dict[str, np.ndarray]) -> str:
    return next(iter(point))


#: array mutations: the model (w_r or the second point) -> the ArrayRecord sent instead (or DELETE)
ARRAY_MUTATIONS: dict[str, Callable[[dict[str, np.ndarray]], Any]] = {
    "missing": lambda w: DELETE,
    "renamed": lambda w: wire.params_to_record({("x" + k if i == 0 else k): v for i, (k, v) in enumerate(w.items())}),
    "reshaped": lambda w: wire.params_to_record({k: (v.reshape(-1)[:-1] if i == 0 else v)
                                                 for i, (k, v) in enumerate(w.items())}),
    "extra-layer": lambda w: wire.params_to_record(w | {"extra": np.zeros(3, np.float32)}),
    "reordered": lambda w: wire.params_to_record(dict(reversed(list(w.items())))),
    "nan": lambda w: wire.params_to_record(w | {_first(w): np.full_like(w[_first(w)], np.nan)}),
    "inf": lambda w: wire.params_to_record(w | {_first(w): np.full_like(w[_first(w)], np.inf)}),
    "int-dtype": lambda w: ArrayRecord({k: Array(np.zeros(v.shape, np.int64)) for k, v in w.items()}),
}


def _mutated(base: RecordDict, change: dict[str, Any], w: dict[str, np.ndarray]) -> RecordDict:
    """``base`` with each field of ``change`` set (DELETE: removed); ``arrays`` / ``prev_arrays``
    name an ARRAY_MUTATIONS entry applied to the model."""
    config = dict(base.config_records[wire.CONFIG])
    records = {wire.ARRAYS: base.array_records[wire.ARRAYS]}
    if wire.PREV_ARRAYS in base.array_records:
        records[wire.PREV_ARRAYS] = base.array_records[wire.PREV_ARRAYS]
    for field, value in change.items():
        if field in (wire.ARRAYS, wire.PREV_ARRAYS):
            point = {k: v * 0.5 for k, v in w.items()} if field == wire.PREV_ARRAYS else w
            records[field] = ARRAY_MUTATIONS[value](point)
        else:
            config[field] = value
    out = RecordDict({k: v for k, v in records.items() if v is not DELETE})
    out[wire.CONFIG] = ConfigRecord({k: v for k, v in config.items() if v is not DELETE})
    return out


_SKETCH = {"sketch-kind": "srht", "sketch-ratio": 0.5, "sketch-epsilon": 0.3, "sketch-layerwise": True, "sketch-seed": 7}

#: (run, the fields changed): every field of an instruction, each with values no check may let through
CASES: list[tuple[str, dict[str, Any]]] = [
    *[("sketch", {"round": v}) for v in ("x", 1.5, 0, -1, 41, DELETE)],
    *[("sketch", {"phase": v}) for v in ("bogus", "eval", "diff", "local", DELETE)],
    *[("sketch", {"sketch-kind": v}) for v in ("bogus", "", "SRHT", 7)],
    *[("sketch", {"sketch-ratio": v}) for v in (0.0, -0.5, 1.5, NAN, INF, "half", DELETE)],
    *[("sketch", {"sketch-epsilon": v}) for v in (NAN, "x", DELETE)],
    *[("sketch", {"sketch-layerwise": v}) for v in ("false", 0)],
    *[("sketch", {"sketch-seed": v}) for v in (-1, 0.5, "s", DELETE)],
    ("sketch", {"sketch-kind": "kronecker", "sketch-layerwise": False}),  # kronecker is per layer only
    ("sketch", {"sketch-kind": "adaptive", "sketch-epsilon": 0.0}),
    ("sketch", {"sketch-kind": "adaptive", "sketch-epsilon": 1.5}),
    ("sketch", {"sketch-kind": "powersgd", "sketch-ratio": 2.0}),
    ("sketch", {"sketch-kind": "powersgd", "sketch-error-feedback": "no"}),
    *[("sketch", {"arrays": m}) for m in ARRAY_MUTATIONS],
    *[("sketch", {"prev_arrays": m}) for m in ("reshaped", "nan", "int-dtype")],  # a second point it does not use
    *[("sketch", {"evaluate-round": v}) for v in (-1, 1, 5, "x")],  # the folded evaluation: an earlier round
    ("sketch", {"evaluate-round": 0, "train-gradient": "yes"}),
    ("sketch", {"shuffler-key": _SHUFFLER_KEY, "exchange": 1}),  # a shuffle ticket outside shuffle mode
    ("sketch", {"local-steps": 0}),
    ("sketch", {"lr": -0.1}),
    *[("local", {"local-steps": v}) for v in (2, 0, -3, "3", 2.5, DELETE)],
    *[("local", {"lr": v}) for v in (0.0, -0.1, NAN, INF, "0.1")],
    *[("spider", {"prev_arrays": m}) for m in ARRAY_MUTATIONS],
    ("spider", {"phase": "grad"}),
    *[("shuffle", {"shuffler-key": v}) for v in ("zz", "ab" * 31, DELETE)],
    *[("shuffle", {"exchange": v}) for v in (-1, "x", 0.5, DELETE)],
    ("shuffle", _SKETCH),  # shuffle DP sums integer counts: no sketch
    *[("private-eval", {"round": v}) for v in (-1, "x", 41)],
    ("private-eval", {"train-gradient": "yes"}),
    *[("private-eval", {"arrays": m}) for m in ARRAY_MUTATIONS],
]

# every field of the wire's instruction and evaluation request appears in CASES
_FIELDS = {f for _, change in CASES for f in change}


def test_the_cases_cover_every_field_of_an_instruction() -> None:
    every = {wire.ROUND, wire.PHASE, wire.LOCAL_STEPS, wire.LR, wire.SHUFFLER_KEY, wire.EXCHANGE,
             wire.EVALUATE_ROUND, wire.TRAIN_GRADIENT, wire.ARRAYS, wire.PREV_ARRAYS, *wire.SKETCH_FIELDS.values()}
    assert every <= _FIELDS, every - _FIELDS


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    run, change = case
    return run + ":" + ",".join(f"{k}={v!r}" for k, v in change.items())


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_a_bad_field_is_refused_before_anything_is_recorded(silo_node, case: tuple[str, dict[str, Any]]) -> None:
    """Before: sketch-kind="bogus" raised ValueError after the release was recorded (and so did
    a ratio outside (0, 1], a negative round with a sketch, ...); round 0, -1 or beyond the run, a
    non-positive step size, a second point or a folded evaluation round the silo cannot use were
    released and charged."""
    run, change = case
    node = silo_node(run)
    w = _model(node.run_config)
    kind, base = _base(run, w)
    eps, releases = node.eps_and_releases()
    files = node.files()
    reply = node.ask(kind, _mutated(base, change, w))
    refusal = wire.Refusal.decode(reply)
    after = node.eps_and_releases()
    assert refusal is not None, f"answered, not refused; eps {eps} -> {after[0]}"
    assert refusal.code == wire.REFUSED_CONFIG and refusal.reason and "\n" not in refusal.reason, refusal
    assert after == (eps, releases), f"eps {eps} -> {after[0]}"
    assert node.files() == files  # nothing written: no ledger row, no calibration, no key
    assert refusal.eps_spent == eps or (math.isnan(refusal.eps_spent) and math.isnan(eps))
    answered = node.ask(kind, base)  # the request without the bad field is answered
    assert wire.Refusal.decode(answered) is None, wire.Refusal.decode(answered)


# -------------------------------------------------------------------------------------------------
# every query kind x every role x malformed content: a refusal or the answer, never an exception
# -------------------------------------------------------------------------------------------------

def _sealed(blobs: list[np.ndarray], **config: Any) -> RecordDict:
    base = {"context": "silofl-shuffle-v1|run=1|round=1|exchange=1|phase=grad", "dim": 62, "levels": 4,
            "senders": []}
    return RecordDict({wire.SEALED: ArrayRecord({str(i): Array(b) for i, b in enumerate(blobs)}),
                       wire.CONFIG: ConfigRecord(base | config)})


_BLOB = np.frombuffer(b"\x01" * 80, dtype=np.uint8).copy()


def _contents(w: dict[str, np.ndarray]) -> dict[str, tuple[RecordDict, set[str]]]:
    """Malformed contents and the kinds they are malformed for (TRAIN, EVALUATE, SHUFFLE_QUERY)."""
    every = {TRAIN, EVALUATE, wire.SHUFFLE_QUERY}
    model = wire.params_to_record(w)
    return {
        "empty": (RecordDict(), every),
        "junk": (RecordDict({wire.CONFIG: ConfigRecord({"round": "x", "phase": 3, "dim": "big", "levels": "x",
                                                        "context": 5, "senders": "all"})}), every),
        "shuffle-dim=-1": (_sealed([_BLOB], dim=-1), every),
        "shuffle-dim=0": (_sealed([_BLOB], dim=0), every),
        "shuffle-dim=2^40": (_sealed([_BLOB], dim=2 ** 40), every),
        "shuffle-levels=0": (_sealed([_BLOB], levels=0), every),
        "shuffle-levels=-3": (_sealed([_BLOB], levels=-3), every),
        "shuffle-empty-context": (_sealed([_BLOB], context=""), every),
        "shuffle-senders=zz": (_sealed([_BLOB], senders=["zz"]), every),
        "shuffle-senders=str": (_sealed([_BLOB], senders="ab"), every),
        "shuffle-no-blobs": (_sealed([]), every),
        "shuffle-float-blob": (_sealed([np.ones(4, np.float32)]), every),
        "train-bogus-sketch": (wire.instruction(model, {"round": 1, "phase": "grad"} | _SKETCH | {"sketch-kind": "bogus"}),
                               {TRAIN, wire.SHUFFLE_QUERY}),  # as an evaluation request it is a valid one
        "train-round=-1": (wire.instruction(model, {"round": -1, "phase": "grad"}), every),
        "evaluate-train-gradient=yes": (wire.instruction(model, {"round": 1, "train-gradient": "yes"}), every),
        "wrong-shape": (wire.instruction(wire.params_to_record({"w": np.zeros(3, np.float32)}),
                                         {"round": 1, "phase": "grad"}), every),
    }


KINDS = (TRAIN, EVALUATE, wire.LEDGER_QUERY, wire.KEYS_QUERY, wire.SHUFFLE_QUERY, wire.IDENTITY_QUERY)
ROLES = ("silo", "shuffler", "shuffler-in-simulation")
#: (role, kind) that the role does not serve: always a refusal (the silo's run is not in shuffle mode)
WRONG_ROLE = {("silo", wire.SHUFFLE_QUERY), ("silo", wire.KEYS_QUERY)} | {
    (r, k) for r in ROLES[1:] for k in (TRAIN, EVALUATE, wire.IDENTITY_QUERY)}
CONTENT_NAMES = list(_contents({"w": np.zeros(1, np.float32)}))


@pytest.fixture(scope="module")
def role_node(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Node]:
    from app.config import parse_settings
    from app.launch import merged_run_config

    plain = merged_run_config([]) | {"num-rounds": 40}
    shuffle = _run_config("shuffle")
    num = parse_settings(plain).num_silos
    nodes = {
        "silo": Node(plain, {"partition-id": 0, "num-partitions": num}, tmp_path_factory.mktemp("role-silo"), 201),
        "shuffler": Node(plain, {"role": "shuffler"}, tmp_path_factory.mktemp("role-shuffler"), 202),
        "shuffler-in-simulation": Node(shuffle, {"partition-id": 3, "num-partitions": 4},
                                       tmp_path_factory.mktemp("role-sim-shuffler"), 203),
    }
    return nodes.__getitem__


def _answer_ok(kind: str, role: str, content: RecordDict, node: Node) -> None:
    """``content`` is the well-formed answer to ``kind`` (read by the server's own readers)."""
    if kind == wire.LEDGER_QUERY:
        assert isinstance(wire.read_ledger(content), dict)
    elif kind == wire.KEYS_QUERY:
        assert wire.read_keys(content)[0] == wire.ROLE_SHUFFLER
    elif kind == wire.IDENTITY_QUERY:
        assert wire.read_identity(content, int(node.context.node_config["num-partitions"])) == 0
    elif kind == EVALUATE:
        wire.EvaluateReply.decode(content, {k: v.shape for k, v in _model(node.run_config).items()})
    else:
        raise AssertionError(f"{kind} to the {role} was answered: {list(content.keys())}")


@pytest.mark.parametrize("content_name", CONTENT_NAMES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("role", ROLES)
def test_every_query_to_every_role_is_answered_or_refused_never_raised(role_node, role: str, kind: str,
                                                                       content_name: str) -> None:
    """Before: query.shuffle with dim -1, levels 0 or an empty context raised ValueError,
    query.identity to a deployed shuffler KeyError 'partition-id' (and a simulation's shuffler
    answered with a partition id it does not have), a train instruction with a bogus sketch
    ValueError."""
    node = role_node(role)
    content, malformed_for = _contents(_model(node.run_config))[content_name]
    if role == "silo":
        node.eps_and_releases()  # the silo exists (its ledger and calibration are written)
    before = node.files()
    reply = node.ask(kind, content)  # must not raise
    refusal = wire.Refusal.decode(reply)
    if (role, kind) in WRONG_ROLE or kind in malformed_for:
        assert refusal is not None, f"{kind} to the {role} with {content_name} was answered"
        assert refusal.code == wire.REFUSED_CONFIG and refusal.reason and "\n" not in refusal.reason, refusal
        if role == "silo":
            assert node.files() == before  # nothing recorded for a refused request
    else:
        assert refusal is None, refusal
        _answer_ok(kind, role, reply, node)


def test_a_refused_exchange_does_not_consume_its_context(role_node) -> None:
    """A malformed shuffle request is refused before the shuffler marks its exchange as
    aggregated (the aggregated-exchanges file is not written), so the real exchange of that
    context is still served. Before: dim 0, dim 2^40 or no contributions consumed the context."""
    node = role_node("shuffler")
    bad = ({"dim": 0}, {"dim": 2 ** 40}, {"blobs": []}, {"dim": -1}, {"levels": 0})
    for i, change in enumerate(bad):
        context = f"silofl-shuffle-v1|run=9|round=1|exchange={i}|phase=grad"
        content = _sealed(change.pop("blobs", [_BLOB]), context=context, **change)
        refusal = wire.Refusal.decode(node.ask(wire.SHUFFLE_QUERY, content))
        assert not list(node.state.glob("shuffler-seen-*")), f"{change or 'no blobs'} consumed its context"
        assert refusal is not None and refusal.code == wire.REFUSED_CONFIG, (change, refusal)
