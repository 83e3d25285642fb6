"""The typed messages of a round (DESIGN.md section 3): :class:`Instruction` (server -> silo,
train), :class:`TrainReply` and :class:`Refusal` (silo -> server), :class:`EvaluateRequest` /
:class:`EvaluateReply` and the evaluation folded into a training reply. Encoded with the
records of app/wire/records.py; decoding validates (a malformed message raises ``ReplyError``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from app.algorithms.base import Phase
from app.sketch.broadcast import RoundSketch
from app.wire.secagg import SECAGG_SHARES, SecAggParams, shares_of, shares_record
from app.wire.records import (ARRAYS, CONFIG, EPS_SPENT, EVALUATE_ROUND, EXCHANGE, LOCAL_STEPS, LOSS, LR, METRICS, PHASE,
                      PREV_ARRAYS, ROUND, SHUFFLER_KEY, SKETCH_FIELDS, TRAIN_GRADIENT, Layout, NonFiniteReply,
                      ReplyError, instruction, metrics_reply, params_to_record, read_metrics, read_update,
                      record_of, record_to_params, refusal_of, refusal_reply, update_reply)


#: an instruction's config keys of its secagg parameters
_SECAGG_PREFIX = "secagg-"


@dataclass(frozen=True)
class ShuffleTicket:
    """What a shuffle-mode instruction adds: the shuffler's public key (hex; a silo that pins one
    in its node config refuses any other) and the exchange's number within the run."""

    shuffler_key: str
    exchange: int


def config_int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
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
    #: privacy.mode secagg: the exchange's parameters (app/wire/secagg.py); the share payloads
    #: sealed to this silo travel beside them, one record per recipient (secagg.SECAGG_SHARES)
    secagg: SecAggParams | None = None
    #: privacy.mode secagg: the share payloads sealed to this silo (sender node -> blob)
    shares: Mapping[int, bytes] | None = None

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
        if self.secagg is not None:
            config |= {_SECAGG_PREFIX + k: v for k, v in self.secagg.config().items()}
        content = instruction(params_to_record(self.arrays), config,
                              None if self.prev is None else params_to_record(self.prev))
        if self.shares is not None:
            content[SECAGG_SHARES] = shares_record(self.shares)
        return content

    @classmethod
    def decode(cls, content: RecordDict) -> Instruction:
        arrays, config, prev = read_instruction(content)
        rnd = config_int(config, ROUND, 0)
        return cls(round=rnd, phase=_phase(config.get(PHASE, "")), arrays=arrays, prev=prev,
                   sketch=_decode_sketch(config, rnd),
                   local_steps=config_int(config, LOCAL_STEPS) if LOCAL_STEPS in config else None,
                   lr=_float(config, LR) if LR in config else None,
                   shuffle=ShuffleTicket(str(config[SHUFFLER_KEY]), config_int(config, EXCHANGE))
                   if SHUFFLER_KEY in config else None,
                   evaluate_round=config_int(config, EVALUATE_ROUND) if EVALUATE_ROUND in config else None,
                   train_gradient=bool(config.get(TRAIN_GRADIENT, False)),
                   secagg=SecAggParams.read({k[len(_SECAGG_PREFIX):]: v for k, v in config.items()
                                             if k.startswith(_SECAGG_PREFIX)})
                   if _SECAGG_PREFIX + "exchange" in config else None,
                   shares=shares_of(content) if _SECAGG_PREFIX + "exchange" in config else None)


def with_secagg(content: RecordDict, params: SecAggParams, shares: Mapping[int, bytes]) -> RecordDict:
    """An encoded instruction for one silo of a secure-aggregation exchange: the same records (the
    model's arrays are shared, not copied or re-encoded), its config with the exchange's parameters,
    and the share payloads sealed to that silo. Decodes as ``Instruction(..., secagg=params,
    shares=shares)``."""
    out = RecordDict({name: record for name, record in content.items()})
    config = record_of(content, CONFIG, ConfigRecord)
    out[CONFIG] = ConfigRecord(dict(config or {}) | {_SECAGG_PREFIX + k: v for k, v in params.config().items()})
    out[SECAGG_SHARES] = shares_record(shares)
    return out


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
                           seed=config_int(config, SKETCH_FIELDS["seed"]), round=rnd,
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
        metrics = record_of(content, METRICS, MetricRecord)
        spent = metrics.get(EPS_SPENT, math.nan) if metrics is not None else math.nan
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
        return cls(config_int(config, ROUND, 0), arrays, bool(config.get(TRAIN_GRADIENT, False)))


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
        record = record_of(content, TRAIN_GRADIENT, ArrayRecord)
        if record is not None:
            try:
                gradient = record_to_params(record, layout, what=TRAIN_GRADIENT)
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
    record, config = record_of(content, ARRAYS, ArrayRecord), record_of(content, CONFIG, ConfigRecord)
    if record is None or config is None:
        raise ReplyError(f"instruction must carry {ARRAYS!r} and {CONFIG!r}; got {list(content.keys())}")
    arrays = record_to_params(record, what=ARRAYS)
    prev_record = record_of(content, PREV_ARRAYS, ArrayRecord)
    prev = None if prev_record is None else record_to_params(prev_record, what=PREV_ARRAYS)
    return arrays, dict(config), prev


#: the ledger witnesses (app/privacy/ledger/witness.py): the silo's own with its reply, the ones
#: the server holds for the node with an instruction; a ConfigRecord {"witnesses": [text, ...]}
WITNESS = "ledger-witness"
#: the most witnesses a message carries, and the longest one (longer ones are not witnesses)
MAX_WITNESSES, MAX_WITNESS_CHARS = 16, 1024


def with_witnesses(content: RecordDict, texts: list[str]) -> RecordDict:
    """A copy of ``content`` carrying the witnesses ``texts`` (``content`` itself when there are none)."""
    if not texts:
        return content
    out = RecordDict(dict(content.items()))
    out[WITNESS] = ConfigRecord({"witnesses": [str(t) for t in texts[:MAX_WITNESSES]]})
    return out


def witnesses_of(content: RecordDict) -> list[str]:
    """The witnesses ``content`` carries (the texts only; what they say is the reader's check):
    [] when none, or when the record is not in form."""
    record = record_of(content, WITNESS, ConfigRecord)
    if record is None:
        return []
    texts = record.get("witnesses", [])
    if not isinstance(texts, list):
        return []
    return [t for t in texts[:MAX_WITNESSES] if isinstance(t, str) and len(t) <= MAX_WITNESS_CHARS]
