"""The typed wire: every message between the server and a silo, and its Flower records.

Messages are dataclasses with ``encode()`` (to a Flower ``RecordDict``) and ``decode()`` (from
one, validated): :class:`Instruction` (server -> silo, train), :class:`TrainReply` and
:class:`Refusal` (silo -> server), :class:`EvaluateRequest` / :class:`EvaluateReply`, the ledger
report and the identity answer. Record and field names live only in this module. Decoding checks
format (keys, types, shapes, finiteness); what a reply's values may be (bounds, identity,
duplicates) is checked by the server's reply validation (strategies/replies.py).

This is the only base-layer module that imports Flower. Everything that arrives from the
network is validated here: a malformed message raises :class:`ReplyError` (the strategy then
drops that silo for the round; a silo answers with a refusal), never anything else. The
low-level helpers (:func:`instruction`, :func:`refusal_of`, the record names) stay public so
tests can build and inspect hostile messages.
"""

from __future__ import annotations

import functools
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, MetricRecord, RecordDict

from app.algorithms.base import Phase
from app.sketch.broadcast import RoundSketch

# Record keys (DESIGN.md section 3).
ARRAYS = "arrays"  # w_r, server -> silo
PREV_ARRAYS = "prev_arrays"  # w_{r-1} or a snapshot, server -> silo
CONFIG = "config"  # round, phase, the round's sketch; local-steps and lr for local releases
UPDATE = "update"  # the silo's message, silo -> server
METRICS = "metrics"  # eps-spent (and the batch loss when privacy is off)
STATUS = "status"  # present when a silo refuses: code + reason
SKETCH = "sketch"  # the single array of a sketched update (payload of S x)

#: Status codes a silo may answer with instead of an update.
REFUSED_BUDGET = "budget-exceeded"
REFUSED_CONFIG = "bad-request"
REFUSED_POLICY = "silo-policy"
REFUSED_LEDGER = "ledger-unusable"
#: the silo's update came out non-finite (the model and step size sent made it overflow)
REFUSED_NON_FINITE = "non-finite"

Layout = Mapping[str, tuple[int, ...]]


class ReplyError(ValueError):
    """A message does not have the expected keys, shapes, dtype or values."""


class NonFiniteReply(ReplyError):
    """A reply's number is NaN or infinite (a diverging model's loss, for one)."""


NUMPY_STYPE = "numpy.ndarray"  # Flower's serialisation type of an Array made from an ndarray (np.save's bytes)


@functools.lru_cache(maxsize=1024)
def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    """The .npy header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape`` (format
    1.0), or None where np.save would use another format (a header over 64 KiB)."""
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                   "fortran_order": False, "shape": shape})
    except ValueError:
        return None
    return buf.getvalue()


def _to_array(arr: np.ndarray) -> Array:
    """``flwr.app.Array(arr)`` for a C-contiguous float32 array: the same bytes as np.save writes
    (the header cached per shape), without np.save's per-call header formatting."""
    shape = tuple(int(n) for n in arr.shape)
    header = _npy_header(arr.dtype, shape)
    if header is None:
        return Array(arr)
    return Array(dtype=str(arr.dtype), shape=shape, stype=NUMPY_STYPE, data=header + arr.tobytes())


def _from_array(array: Any) -> np.ndarray:
    """``array.numpy()`` (np.load of its bytes) for a float array whose bytes are exactly the
    header np.save writes for its dtype and shape plus the values: read directly, with the same
    result; anything else goes through Flower's own np.load (allow_pickle=False)."""
    try:
        dtype = np.dtype(array.dtype)
        shape = tuple(array.shape)
        ok = (array.stype == NUMPY_STYPE and dtype.kind == "f" and all(isinstance(n, int) and n >= 0 for n in shape))
    except (TypeError, ValueError, AttributeError):
        ok = False
    if ok:
        header = _npy_header(dtype, shape)
        data = array.data
        count = math.prod(shape)
        if header is not None and len(data) == len(header) + count * dtype.itemsize and data.startswith(header):
            return np.frombuffer(data, dtype=dtype, count=count, offset=len(header)).reshape(shape).copy()
    return array.numpy()


def params_to_record(params: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Named float arrays -> ArrayRecord (order preserved)."""
    return ArrayRecord({k: _to_array(np.ascontiguousarray(v, dtype=np.float32)) for k, v in params.items()})


def record_to_params(record: Any, layout: Layout | None = None, *, what: str = "arrays") -> dict[str, np.ndarray]:
    """ArrayRecord -> named float32 arrays, checked against ``layout`` when given:
    same names, same shapes, a float dtype and only finite values."""
    if not isinstance(record, ArrayRecord):
        raise ReplyError(f"{what}: expected an ArrayRecord, got {type(record).__name__}")
    out: dict[str, np.ndarray] = {}
    for key in record:
        try:
            arr = _from_array(record[key])
        except Exception as exc:  # a corrupt buffer must not crash the caller
            raise ReplyError(f"{what}[{key!r}]: cannot be decoded ({exc})") from exc
        if arr.dtype.kind != "f":
            raise ReplyError(f"{what}[{key!r}]: dtype {arr.dtype} is not a float type")
        out[key] = arr.astype(np.float32, copy=False)
    if layout is not None:
        if list(out) != list(layout):
            missing = [k for k in layout if k not in out]
            extra = [k for k in out if k not in layout]
            raise ReplyError(f"{what}: wrong array names (missing {missing}, unexpected {extra})")
        for key, shape in layout.items():
            if tuple(out[key].shape) != tuple(shape):
                raise ReplyError(f"{what}[{key!r}]: shape {tuple(out[key].shape)} != expected {tuple(shape)}")
    for key, arr in out.items():
        if not np.all(np.isfinite(arr)):
            raise ReplyError(f"{what}[{key!r}]: contains NaN or inf")
    return out


def unflatten(flat: np.ndarray, layout: Layout, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """A flat vector -> named arrays in ``layout`` order (float32 unless ``dtype`` says)."""
    out, offset = {}, 0
    for key, shape in layout.items():
        size = int(np.prod(shape))
        out[key] = np.asarray(flat[offset: offset + size], dtype=dtype).reshape(shape)
        offset += size
    if offset != flat.size:
        raise ReplyError(f"flat update has {flat.size} values, layout needs {offset}")
    return out


def instruction(arrays: ArrayRecord, config: Mapping[str, Any], prev_arrays: ArrayRecord | None = None) -> RecordDict:
    """The content of a server -> silo message."""
    content = RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(dict(config))})
    if prev_arrays is not None:
        content[PREV_ARRAYS] = prev_arrays
    return content


def update_reply(update: Mapping[str, np.ndarray], metrics: Mapping[str, float]) -> RecordDict:
    """A silo's successful reply: its update and its metrics."""
    return RecordDict({UPDATE: params_to_record(update), METRICS: MetricRecord(dict(metrics))})


TRAIN_GRADIENT = "train-gradient"  # evaluation-only: full gradient of a silo's mean training loss


def metrics_reply(metrics: Mapping[str, float], arrays: Mapping[str, np.ndarray] | None = None) -> RecordDict:
    """An evaluation reply: metrics, and optionally the silo's full training gradient."""
    content = RecordDict({METRICS: MetricRecord(dict(metrics))})
    if arrays is not None:
        content[TRAIN_GRADIENT] = params_to_record(arrays)
    return content


def refusal_reply(code: str, reason: str, metrics: Mapping[str, float]) -> RecordDict:
    """A silo's deliberate refusal (e.g. over budget): not a crash, the server carries on."""
    return RecordDict({STATUS: ConfigRecord({"code": code, "reason": reason}), METRICS: MetricRecord(dict(metrics))})


def refusal_of(content: RecordDict) -> tuple[str, str] | None:
    """(code, reason) when ``content`` is a refusal, else None."""
    if STATUS not in content.config_records:
        return None
    status = content.config_records[STATUS]
    return str(status.get("code", "unknown")), str(status.get("reason", ""))


def read_metrics(content: RecordDict, required: tuple[str, ...], *, what: str = "metrics") -> dict[str, float]:
    """The reply's MetricRecord as floats; ``required`` keys must be present and numbers
    (``eps-spent`` may be +inf for a non-private silo; other values must be finite)."""
    if METRICS not in content.metric_records:
        raise ReplyError(f"{what}: no MetricRecord named {METRICS!r}")
    raw = content.metric_records[METRICS]
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, list):
            continue
        out[key] = float(value)
    for key in required:
        if key not in out:
            raise ReplyError(f"{what}: missing {key!r}")
        if math.isnan(out[key]) or (math.isinf(out[key]) and key != EPS_SPENT):
            raise NonFiniteReply(f"{what}[{key!r}] = {out[key]} is not finite")
    return out


def read_update(content: RecordDict, layout: Layout) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Validate a training reply: the update matches ``layout`` and the metrics are sane."""
    if UPDATE not in content.array_records:
        raise ReplyError(f"reply has no ArrayRecord named {UPDATE!r} (keys: {list(content.keys())})")
    update = record_to_params(content.array_records[UPDATE], layout, what=UPDATE)
    metrics = read_metrics(content, (EPS_SPENT,))
    return update, metrics


# -- typed messages ------------------------------------------------------------------------------
# config and metric field names (only here)
ROUND, PHASE, LOCAL_STEPS, LR = "round", "phase", "local-steps", "lr"
SKETCH_FIELDS = {"kind": "sketch-kind", "ratio": "sketch-ratio", "epsilon": "sketch-epsilon",
                 "layerwise": "sketch-layerwise", "seed": "sketch-seed", "error_feedback": "sketch-error-feedback"}
EPS_SPENT, LOSS = "eps-spent", "loss"
SHUFFLER_KEY, EXCHANGE = "shuffler-key", "exchange"
#: a training instruction that also asks for the evaluation of the model it carries: the round
#: that model comes from (the previous round's result), and whether to add the training gradient
EVALUATE_ROUND = "evaluate-round"


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise ReplyError(f"config[{key!r}] = {value!r} is not an integer")
    return int(value)


def _float(config: Mapping[str, Any], key: str) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ReplyError(f"config[{key!r}] = {value!r} is not a finite number")
    return float(value)


def _phase(value: Any) -> Phase:
    try:
        return Phase(str(value))
    except ValueError:
        raise ReplyError(f"phase {value!r} is unknown; known: {', '.join(p.value for p in Phase)}") from None


@dataclass(frozen=True)
class Instruction:
    """Server -> silo: release ``phase`` at ``arrays`` (w_r), in round ``round``; ``prev`` is the
    second point of a difference release; ``sketch`` the round's broadcast sketch;
    ``local_steps`` and ``lr`` (local releases only) the local SGD the silo runs.

    ``evaluate_round`` (optional) folds the evaluation into the exchange: the silo also answers
    ``EvaluateRequest(evaluate_round, arrays, train_gradient)`` (under its evaluation policy)
    and attaches that reply to its training reply (:func:`with_evaluation`), so a round costs one
    exchange, not two. ``arrays`` is then the model round ``evaluate_round`` produced."""

    round: int
    phase: Phase
    arrays: Mapping[str, np.ndarray]
    prev: Mapping[str, np.ndarray] | None = None
    sketch: RoundSketch | None = None
    local_steps: int | None = None
    lr: float | None = None
    shuffle: ShuffleTicket | None = None
    evaluate_round: int | None = None
    train_gradient: bool = False

    def evaluation(self) -> EvaluateRequest | None:
        """The evaluation request folded into this instruction (None when there is none)."""
        if self.evaluate_round is None:
            return None
        return EvaluateRequest(self.evaluate_round, self.arrays, self.train_gradient)

    def encode(self) -> RecordDict:
        config: dict[str, Any] = {ROUND: int(self.round), PHASE: str(self.phase)}
        if self.shuffle is not None:
            config |= {SHUFFLER_KEY: self.shuffle.shuffler_key, EXCHANGE: int(self.shuffle.exchange)}
        if self.local_steps is not None:
            config[LOCAL_STEPS] = int(self.local_steps)
        if self.lr is not None:
            config[LR] = float(self.lr)
        if self.sketch is not None:
            config |= _encode_sketch(self.sketch)
        if self.evaluate_round is not None:
            config |= {EVALUATE_ROUND: int(self.evaluate_round), TRAIN_GRADIENT: bool(self.train_gradient)}
        return instruction(params_to_record(self.arrays), config,
                           None if self.prev is None else params_to_record(self.prev))

    @classmethod
    def decode(cls, content: RecordDict) -> Instruction:
        arrays, config, prev = read_instruction(content)
        rnd = _int(config, ROUND, 0)
        return cls(round=rnd, phase=_phase(config.get(PHASE, "")), arrays=arrays, prev=prev,
                   sketch=_decode_sketch(config, rnd),
                   local_steps=_int(config, LOCAL_STEPS) if LOCAL_STEPS in config else None,
                   lr=_float(config, LR) if LR in config else None,
                   shuffle=ShuffleTicket(str(config[SHUFFLER_KEY]), _int(config, EXCHANGE))
                   if SHUFFLER_KEY in config else None,
                   evaluate_round=_int(config, EVALUATE_ROUND) if EVALUATE_ROUND in config else None,
                   train_gradient=bool(config.get(TRAIN_GRADIENT, False)))


def _encode_sketch(sketch: RoundSketch) -> dict[str, Any]:
    cfg = {SKETCH_FIELDS["kind"]: sketch.kind, SKETCH_FIELDS["ratio"]: float(sketch.ratio),
           SKETCH_FIELDS["epsilon"]: float(sketch.epsilon), SKETCH_FIELDS["layerwise"]: bool(sketch.layerwise),
           SKETCH_FIELDS["seed"]: int(sketch.seed)}
    if sketch.kind == "powersgd":
        cfg[SKETCH_FIELDS["error_feedback"]] = bool(sketch.error_feedback)
    return cfg


def _decode_sketch(config: Mapping[str, Any], rnd: int) -> RoundSketch | None:
    kind = str(config.get(SKETCH_FIELDS["kind"], "none"))
    if kind == "none":
        return None
    try:
        return RoundSketch(kind=kind, ratio=_float(config, SKETCH_FIELDS["ratio"]),
                           epsilon=_float(config, SKETCH_FIELDS["epsilon"]),
                           layerwise=bool(config.get(SKETCH_FIELDS["layerwise"], False)),
                           seed=_int(config, SKETCH_FIELDS["seed"]), round=rnd,
                           error_feedback=bool(config.get(SKETCH_FIELDS["error_feedback"], True)))
    except ValueError as exc:
        raise ReplyError(f"the round's sketch is malformed: {exc}") from exc


@dataclass(frozen=True)
class TrainReply:
    """Silo -> server: the release (the flat update in the model's layout, or the sketch payload
    under :data:`SKETCH`), the epsilon the silo has spent, and the batch loss without privacy."""

    update: Mapping[str, np.ndarray]
    eps_spent: float
    loss: float | None = None

    def encode(self) -> RecordDict:
        metrics = {EPS_SPENT: float(self.eps_spent)} | ({} if self.loss is None else {LOSS: float(self.loss)})
        return update_reply(self.update, metrics)

    @classmethod
    def decode(cls, content: RecordDict, layout: Layout) -> TrainReply:
        update, metrics = read_update(content, layout)
        loss = metrics.get(LOSS)
        if loss is not None and not math.isfinite(loss):
            raise NonFiniteReply(f"metrics[{LOSS!r}] = {loss} is not finite")
        return cls(update, metrics[EPS_SPENT], loss)


@dataclass(frozen=True)
class Refusal:
    """Silo -> server: a deliberate refusal with a code (:data:`REFUSED_BUDGET`, ...) and a reason."""

    code: str
    reason: str
    eps_spent: float

    def encode(self) -> RecordDict:
        return refusal_reply(self.code, self.reason, {EPS_SPENT: float(self.eps_spent)})

    @classmethod
    def decode(cls, content: RecordDict) -> Refusal | None:
        """The refusal in ``content``, or None when it is not one."""
        found = refusal_of(content)
        if found is None:
            return None
        spent = content.metric_records[METRICS].get(EPS_SPENT, math.nan) if METRICS in content.metric_records else math.nan
        return cls(found[0], found[1], float(spent) if isinstance(spent, (int, float)) else math.nan)


@dataclass(frozen=True)
class EvaluateRequest:
    """Server -> silo: evaluate ``arrays``; ``train_gradient`` asks for the full training
    gradient (answered only by a silo whose policy is ``open``)."""

    round: int
    arrays: Mapping[str, np.ndarray]
    train_gradient: bool = False

    def encode(self) -> RecordDict:
        return instruction(params_to_record(self.arrays), {ROUND: int(self.round), TRAIN_GRADIENT: self.train_gradient})

    @classmethod
    def decode(cls, content: RecordDict) -> EvaluateRequest:
        arrays, config, _ = read_instruction(content)
        return cls(_int(config, ROUND, 0), arrays, bool(config.get(TRAIN_GRADIENT, False)))


#: EvaluateReply field -> metric name
_EVAL_FIELDS = {"test_errors": "test-errors", "test_count": "test-count", "test_loss_sum": "test-loss-sum",
                "train_loss_sum": "train-loss-sum", "train_count": "train-count", "val_errors": "val-errors",
                "val_count": "val-count", "eps_spent": EPS_SPENT}
_EVAL_REQUIRED = ("test_errors", "test_count", "train_loss_sum", "train_count")


@dataclass(frozen=True)
class EvaluateReply:
    """Silo -> server: error counts and loss sums of the model on the silo's splits (exact, or
    noised by a private silo), optionally the full training gradient."""

    test_errors: float
    test_count: float
    train_loss_sum: float
    train_count: float
    test_loss_sum: float = 0.0
    val_errors: float | None = None
    val_count: float | None = None
    eps_spent: float = 0.0
    gradient: Mapping[str, np.ndarray] | None = None

    def encode(self) -> RecordDict:
        metrics = {_EVAL_FIELDS[name]: float(getattr(self, name)) for name in _EVAL_FIELDS
                   if getattr(self, name) is not None}
        return metrics_reply(metrics, self.gradient)

    @classmethod
    def decode(cls, content: RecordDict, layout: Layout) -> tuple[EvaluateReply, str | None]:
        """The reply, and why its training gradient was dropped (None when absent or valid)."""
        m = read_metrics(content, tuple(_EVAL_FIELDS[name] for name in _EVAL_REQUIRED), what="evaluate metrics")
        gradient, dropped = None, None
        if TRAIN_GRADIENT in content.array_records:
            try:
                gradient = record_to_params(content.array_records[TRAIN_GRADIENT], layout, what=TRAIN_GRADIENT)
            except ReplyError as exc:
                dropped = str(exc)
        fields = {name: m[key] for name, key in _EVAL_FIELDS.items() if key in m}
        return cls(**fields, gradient=gradient), dropped


#: the prefix under which a training reply carries the silo's folded evaluation reply
EVALUATION_PREFIX = "evaluation."


def with_evaluation(reply: RecordDict, evaluation: RecordDict) -> RecordDict:
    """``reply`` (a training reply or refusal) carrying ``evaluation`` (an evaluation reply or
    refusal): each of the evaluation's records under :data:`EVALUATION_PREFIX` + its name."""
    out = RecordDict(dict(reply.items()))
    for key, record in evaluation.items():
        out[EVALUATION_PREFIX + key] = record
    return out


def evaluation_of(content: RecordDict) -> RecordDict | None:
    """The evaluation reply folded into a training reply (:func:`with_evaluation`), as the
    RecordDict a separate evaluation exchange would have returned; None when there is none."""
    part = {key[len(EVALUATION_PREFIX):]: record for key, record in content.items()
            if key.startswith(EVALUATION_PREFIX)}
    return RecordDict(part) if part else None


def read_instruction(content: RecordDict) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray] | None]:
    """The raw parts of a server message: (w_r, config, w_{r-1} or None)."""
    if ARRAYS not in content.array_records or CONFIG not in content.config_records:
        raise ReplyError(f"instruction must carry {ARRAYS!r} and {CONFIG!r}; got {list(content.keys())}")
    arrays = record_to_params(content.array_records[ARRAYS], what=ARRAYS)
    prev = None
    if PREV_ARRAYS in content.array_records:
        prev = record_to_params(content.array_records[PREV_ARRAYS], what=PREV_ARRAYS)
    return arrays, dict(content.config_records[CONFIG]), prev


LEDGER = "ledger"
IDENTITY = "identity"
#: message types of the two queries a ServerApp sends besides train and evaluate
LEDGER_QUERY = f"{MessageType.QUERY}.{LEDGER}"
IDENTITY_QUERY = f"{MessageType.QUERY}.{IDENTITY}"


def identity_reply(partition_id: int) -> RecordDict:
    """A node's answer to the attack harness's one-time identity query (simulations only)."""
    return RecordDict({IDENTITY: ConfigRecord({"partition-id": int(partition_id)})})


def read_identity(content: RecordDict, num_partitions: int) -> int:
    """The partition id in an identity reply: an integer in [0, num_partitions), else ReplyError."""
    try:
        value = content.config_records[IDENTITY]["partition-id"]
    except (KeyError, TypeError) as exc:
        raise ReplyError(f"identity reply is malformed: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_partitions:
        raise ReplyError(f"identity reply partition-id = {value!r} is not an integer in [0, {num_partitions})")
    return int(value)


def ledger_reply(report: Mapping[str, Any]) -> RecordDict:
    """A silo's public privacy record (JSON text in a ConfigRecord)."""
    return RecordDict({LEDGER: ConfigRecord({"json": json.dumps(report)})})


def read_ledger(content: RecordDict) -> dict[str, Any]:
    """Parse :func:`ledger_reply`; raises ReplyError when malformed."""
    try:
        data = json.loads(str(content.config_records[LEDGER]["json"]))
    except (KeyError, ValueError) as exc:
        raise ReplyError(f"ledger reply is malformed: {exc}") from exc
    if not isinstance(data, dict):
        raise ReplyError("ledger reply is not an object")
    return data


# -- shuffle DP: silo -> (server relays) -> shuffler ------------------------------------------------
SEALED = "sealed"  # a silo's encrypted contribution (uint8), silo -> server -> shuffler
SHUFFLE = "shuffle"
KEYS = "keys"
#: the server asks every node for its role and public key once; it relays sealed contributions
#: to the shuffler node and gets back only the totals
KEYS_QUERY = f"{MessageType.QUERY}.{KEYS}"
SHUFFLE_QUERY = f"{MessageType.QUERY}.{SHUFFLE}"
ROLE_SILO, ROLE_SHUFFLER = "silo", "shuffler"
#: the largest sealed contribution the server relays (a count vector of 8 bytes per coordinate
#: of an 11M-parameter model plus headers is ~90 MB)
MAX_SEALED_BYTES = 1 << 30


@dataclass(frozen=True)
class ShuffleTicket:
    """What a shuffle-mode instruction adds: the shuffler's public key (hex; a silo that pins one
    in its node config refuses any other) and the exchange's number within the run."""

    shuffler_key: str
    exchange: int


def shuffle_context(run_id: int, rnd: int, exchange: int, phase: str) -> bytes:
    """The bytes every sealed contribution of one exchange is bound to (AEAD associated data):
    a ciphertext cannot be replayed into another run, round, exchange or phase."""
    return f"silofl-shuffle-v1|run={int(run_id)}|round={int(rnd)}|exchange={int(exchange)}|phase={phase}".encode()


def _bytes_array(blob: bytes) -> Array:
    return Array(np.frombuffer(blob, dtype=np.uint8).copy())


def _array_bytes(array: Any, what: str) -> bytes:
    try:
        arr = array.numpy()
    except Exception as exc:
        raise ReplyError(f"{what}: cannot be decoded ({exc})") from exc
    if arr.dtype != np.uint8 or arr.ndim != 1:
        raise ReplyError(f"{what}: expected a 1-D uint8 array, got {arr.dtype} {arr.shape}")
    if arr.size > MAX_SEALED_BYTES:
        raise ReplyError(f"{what}: {arr.size} bytes exceed the {MAX_SEALED_BYTES} allowed")
    return arr.tobytes()


@dataclass(frozen=True)
class SealedReply:
    """Silo -> server: the silo's contribution sealed to the shuffler (the server cannot read
    it) and the epsilon the silo has spent."""

    blob: bytes
    eps_spent: float

    def encode(self) -> RecordDict:
        return RecordDict({SEALED: ArrayRecord({SEALED: _bytes_array(self.blob)}),
                           METRICS: MetricRecord({EPS_SPENT: float(self.eps_spent)})})

    @classmethod
    def decode(cls, content: RecordDict) -> SealedReply:
        if SEALED not in content.array_records or SEALED not in content.array_records[SEALED]:
            raise ReplyError(f"a shuffle-mode reply must carry an ArrayRecord {SEALED!r}; got {list(content.keys())}")
        blob = _array_bytes(content.array_records[SEALED][SEALED], SEALED)
        return cls(blob, read_metrics(content, (EPS_SPENT,))[EPS_SPENT])


@dataclass(frozen=True)
class ShuffleRequest:
    """Server -> shuffler: the exchange's sealed contributions, its context, the vector length
    and levels every contribution must have, (simulation only) the silo keys the server saw, and
    the noise bits' probability p (0: not sent; with it the shuffler drops counts impossible for
    their claimed trials)."""

    context: bytes
    dim: int
    levels: int
    blobs: tuple[bytes, ...]
    senders: tuple[str, ...] = ()
    p: float = 0.0

    def encode(self) -> RecordDict:
        return RecordDict({
            SEALED: ArrayRecord({str(i): _bytes_array(b) for i, b in enumerate(self.blobs)}),
            CONFIG: ConfigRecord({"context": self.context.decode(), "dim": int(self.dim), "levels": int(self.levels),
                                  "senders": list(self.senders)} | ({"p": float(self.p)} if self.p else {})),
        })

    @classmethod
    def decode(cls, content: RecordDict) -> ShuffleRequest:
        if SEALED not in content.array_records or CONFIG not in content.config_records:
            raise ReplyError("a shuffle request must carry the sealed contributions and a config")
        config = content.config_records[CONFIG]
        blobs = tuple(_array_bytes(a, f"{SEALED}[{k}]") for k, a in content.array_records[SEALED].items())
        senders = config.get("senders", [])
        if not isinstance(senders, list) or not all(isinstance(x, str) for x in senders):
            raise ReplyError("shuffle request senders must be a list of hex keys")
        p = config.get("p", 0.0)
        if not isinstance(p, float) or not (p == 0.0 or 0.0 < p < 1.0):
            raise ReplyError(f"shuffle request p must be a float in (0, 1) (or absent), got {p!r}")
        return cls(str(config.get("context", "")).encode(), _int(config, "dim"), _int(config, "levels"), blobs,
                   tuple(senders), p)


@dataclass(frozen=True)
class ShuffleReply:
    """Shuffler -> server: the per-coordinate totals of the accepted contributions, their noise
    trials and records, and how many were accepted and dropped. Nothing per silo."""

    totals: np.ndarray
    trials: int
    records: int
    accepted: int
    dropped: int

    def encode(self) -> RecordDict:
        return RecordDict({
            SHUFFLE: ArrayRecord({"totals": Array(np.ascontiguousarray(self.totals, dtype=np.int64))}),
            CONFIG: ConfigRecord({"trials": int(self.trials), "records": int(self.records),
                                  "accepted": int(self.accepted), "dropped": int(self.dropped)}),
        })

    @classmethod
    def decode(cls, content: RecordDict, dim: int) -> ShuffleReply:
        try:
            totals = content.array_records[SHUFFLE]["totals"].numpy()
            config = content.config_records[CONFIG]
        except (KeyError, TypeError) as exc:
            raise ReplyError(f"shuffle reply is malformed: {exc}") from exc
        except Exception as exc:
            raise ReplyError(f"shuffle reply totals cannot be decoded ({exc})") from exc
        if totals.dtype != np.int64 or totals.shape != (dim,):
            raise ReplyError(f"shuffle reply totals: expected int64 ({dim},), got {totals.dtype} {totals.shape}")
        reply = cls(totals, _int(config, "trials"), _int(config, "records"), _int(config, "accepted"),
                    _int(config, "dropped"))
        if reply.records < 1 or reply.accepted < 1 or reply.trials < 0 or np.any(totals < 0):
            raise ReplyError(f"shuffle reply is impossible: records {reply.records}, accepted {reply.accepted}, "
                             f"trials {reply.trials}, min total {int(totals.min(initial=0))}")
        return reply


def keys_reply(role: str, public_key: str) -> RecordDict:
    """A node's answer to the keys query: its role and its X25519 public key (hex)."""
    return RecordDict({KEYS: ConfigRecord({"role": role, "public-key": public_key})})


def read_keys(content: RecordDict) -> tuple[str, str]:
    """(role, public key hex) of a keys reply; ReplyError when malformed."""
    try:
        record = content.config_records[KEYS]
        role, key = record["role"], record["public-key"]
    except (KeyError, TypeError) as exc:
        raise ReplyError(f"keys reply is malformed: {exc}") from exc
    if role not in (ROLE_SILO, ROLE_SHUFFLER) or not isinstance(key, str) or len(key) != 64:
        raise ReplyError(f"keys reply has role {role!r}, key {key!r}: expected silo|shuffler and 64 hex characters")
    try:
        bytes.fromhex(key)
    except ValueError as exc:
        raise ReplyError(f"keys reply key is not hex: {exc}") from exc
    return str(role), str(key)
