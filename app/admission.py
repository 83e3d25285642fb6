"""Admission: every field of a request is checked before a node acts on it.

A silo records a release in its ledger before it computes anything from its records (the
ledger is the privacy promise), so whatever could make the release fail must be found before
that: a training instruction (or an evaluation request) that fails any check here is answered
with a :class:`Rejection` (a wire status code and a one-line reason) and nothing is recorded.
The shuffler checks its exchange the same way before it consumes the exchange's context.

Pure functions of the request's Flower records and of what the node serves
(:class:`SiloTerms`); the node turns a Rejection into a ``wire.Refusal`` that carries its
epsilon spent. Format (keys, types, finiteness) is read by app.wire's ``decode``; what is
checked here is what each value may be for this node:

* ``round``: an integer in [1, num-rounds] of the silo's run; ``phase``: a training phase this
  silo calibrated for; the model (``arrays``) and the second point (``prev_arrays``, required
  for ``diff``): the silo's layer names and shapes, finite;
* ``local-steps`` >= 1 (for ``local``: the count the silo calibrated for); ``lr`` > 0;
* the round's sketch: a kind of the sketch registry (app/sketch/base.py), ratio in (0, 1], the
  adaptive kind's epsilon in (0, 1), seed >= 0, ``sketch-layerwise`` / ``sketch-error-feedback``
  booleans, and the sketch must build for the silo's model (the silo builds it after the
  release is recorded); no sketch in shuffle mode (the shuffler sums integer counts);
* shuffle mode: the shuffler's key (an X25519 public key) and the exchange number >= 0, and no
  shuffle ticket outside shuffle mode;
* a folded evaluation: ``evaluate-round`` in [0, round) (the model it carries is an earlier
  round's result) and ``train-gradient`` a boolean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from app import wire
from app.algorithms.base import Phase
from app.privacy.envelope import EnvelopeError, parse_public_key
from app.sketch.broadcast import RoundSketch, build_sketch


@dataclass(frozen=True)
class Rejection:
    """Why a request is refused: a wire status code (``wire.REFUSED_*``) and a one-line reason."""

    code: str
    reason: str


@dataclass(frozen=True)
class SiloTerms:
    """What a silo serves: its model's layer names and shapes (in order), the training phases it
    calibrated, its run's number of rounds and local steps, and whether it is in shuffle mode."""

    layout: Mapping[str, tuple[int, ...]]
    phases: frozenset[str]
    num_rounds: int
    local_steps: int
    shuffle: bool
    #: whether its mechanism is secure aggregation's (its instructions carry the exchange's parameters)
    secagg: bool = False


def silo_terms(silo: Any) -> SiloTerms:
    """The terms of a clients.silo.Silo (its model, its calibrated plan, its run settings and whether its
    mechanism seals its replies to a shuffler)."""
    from app.algorithms.base import TRAINING_PHASES

    return SiloTerms(layout={k: tuple(v.shape) for k, v in silo.model.named_parameters()},
                     phases=frozenset(str(p) for p in silo.plan if p in TRAINING_PHASES),
                     num_rounds=int(silo.s.num_rounds), local_steps=int(silo.s.local_steps),
                     shuffle=getattr(silo.mechanism, "ticket", "") == "shuffle",
                     secagg=getattr(silo.mechanism, "ticket", "") == "secagg")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _bad(reason: str, code: str = wire.REFUSED_CONFIG) -> Rejection:
    return Rejection(code, _one_line(reason))


def _layout_error(point: Mapping[str, np.ndarray], layout: Mapping[str, tuple[int, ...]], what: str) -> str | None:
    """Why ``point`` is not a model of ``layout`` (names, order, shapes, finite), or None."""
    got = {k: tuple(v.shape) for k, v in point.items()}
    if list(got) != list(layout) or any(got[k] != tuple(s) for k, s in layout.items()):
        return f"{what} {got} do not match this silo's model {dict(layout)}"
    for key, arr in point.items():
        if not np.all(np.isfinite(arr)):
            return f"{what}[{key!r}] contains NaN or inf"
    return None


def _not_bool(config: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        if key in config and not isinstance(config[key], bool):
            return f"config[{key!r}] = {config[key]!r} is not a boolean"
    return None


def sketch_error(sketch: RoundSketch, layout: Mapping[str, tuple[int, ...]]) -> str | None:
    """Why the round's sketch cannot be applied to a model of ``layout``, or None."""
    from app.sketch.base import SKETCH_KINDS  # torch: only when a request carries a sketch

    if sketch.kind not in SKETCH_KINDS:
        return f"sketch-kind {sketch.kind!r} is unknown; known: none, {', '.join(SKETCH_KINDS)}"
    if sketch.kind == "adaptive":
        if not 0.0 < sketch.epsilon < 1.0:
            return f"sketch-epsilon = {sketch.epsilon!r} is outside (0, 1)"
    elif not 0.0 < sketch.ratio <= 1.0:
        return f"sketch-ratio = {sketch.ratio!r} is outside (0, 1]"
    if sketch.seed < 0:
        return f"sketch-seed = {sketch.seed} is negative"
    try:
        build_sketch(sketch, list(layout.values()))
    except (ValueError, TypeError, OverflowError) as exc:
        return f"the round's {sketch.kind} sketch cannot be built for this model: {exc}"
    return None


def check_instruction(content: RecordDict, terms: SiloTerms) -> wire.Instruction | Rejection:
    """The instruction in ``content`` when every field fits ``terms`` (module docstring), else
    the first Rejection found. Nothing here touches the ledger or the silo's records."""
    try:
        ins = wire.Instruction.decode(content)
    except wire.ReplyError as exc:
        return _bad(f"malformed instruction: {exc}")
    config = dict(wire.record_of(content, wire.CONFIG, ConfigRecord) or {})  # (decoded above: it is there)
    wrong = _not_bool(config, wire.SKETCH_FIELDS["layerwise"], wire.SKETCH_FIELDS["error_feedback"],
                      wire.TRAIN_GRADIENT)
    if wrong:
        return _bad(wrong)
    if wire.ROUND not in config:
        return _bad(f"config[{wire.ROUND!r}] is missing")
    if not 1 <= ins.round <= terms.num_rounds:
        return _bad(f"round {ins.round} is outside this run's rounds 1..{terms.num_rounds}")
    if str(ins.phase) not in terms.phases:
        return _bad(f"phase {str(ins.phase)!r} not served; this silo was set up for {sorted(terms.phases)}")
    error = _layout_error(ins.arrays, terms.layout, "model arrays")
    if error:
        return _bad(error)
    if ins.phase == Phase.DIFF and ins.prev is None:
        return _bad("phase 'diff' needs the previous iterate (prev_arrays)")
    if ins.prev is not None:
        error = _layout_error(ins.prev, terms.layout, "prev_arrays")
        if error:
            return _bad(error)
    if ins.local_steps is not None and ins.local_steps < 1:
        return _bad(f"local-steps {ins.local_steps} is not a positive integer")
    if ins.phase == Phase.LOCAL and (ins.local_steps or 1) != terms.local_steps:
        return _bad(f"local-steps {ins.local_steps or 1} differs from the {terms.local_steps} this silo calibrated for")
    if ins.lr is not None and not (ins.lr > 0 and math.isfinite(ins.lr)):
        return _bad(f"lr = {ins.lr!r} is not a positive step size")
    if ins.sketch is not None:
        if terms.shuffle:
            return _bad(f"sketch-kind {ins.sketch.kind!r} in shuffle mode: the shuffler sums integer counts, "
                        "a sketch of them would not debias")
        error = sketch_error(ins.sketch, terms.layout)
        if error:
            return _bad(error)
    if terms.shuffle:
        if ins.shuffle is None:
            return _bad("a shuffle-mode instruction must carry the shuffler's public key")
        try:
            parse_public_key(ins.shuffle.shuffler_key)
        except EnvelopeError as exc:
            return _bad(f"the shuffler key sent is not a key: {exc}")
        if ins.shuffle.exchange < 0:
            return _bad(f"exchange {ins.shuffle.exchange} is negative")
    elif ins.shuffle is not None:
        return _bad("the instruction carries a shuffle ticket, but this silo's run is not in shuffle mode")
    if terms.secagg and ins.secagg is None:
        return _bad("a secagg-mode instruction must carry the exchange's secagg parameters and shares")
    if not terms.secagg and ins.secagg is not None:
        return _bad("the instruction carries secagg parameters, but this silo's run is not in secagg mode")
    if ins.evaluate_round is not None and not 0 <= ins.evaluate_round < ins.round:
        return _bad(f"evaluate-round {ins.evaluate_round} is outside [0, round {ins.round})")
    return ins


def check_evaluate_request(content: RecordDict, terms: SiloTerms) -> wire.EvaluateRequest | Rejection:
    """The evaluation request in ``content`` when its round is in [0, num-rounds], its
    ``train-gradient`` a boolean and its model the silo's; else the Rejection."""
    try:
        req = wire.EvaluateRequest.decode(content)
    except wire.ReplyError as exc:
        return _bad(f"malformed evaluation request: {exc}")
    wrong = _not_bool(dict(wire.record_of(content, wire.CONFIG, ConfigRecord) or {}), wire.TRAIN_GRADIENT)
    if wrong:
        return _bad(wrong)
    if not 0 <= req.round <= terms.num_rounds:
        return _bad(f"evaluation round {req.round} is outside this run's rounds 0..{terms.num_rounds}")
    error = _layout_error(req.arrays, terms.layout, "model arrays")
    return _bad(error) if error else req


#: the most coordinates an exchange can have: a contribution is 8 bytes per coordinate and the
#: server relays at most wire.MAX_SEALED_BYTES per contribution
MAX_SHUFFLE_DIM = wire.MAX_SEALED_BYTES // 8


def check_shuffle_request(content: RecordDict) -> wire.ShuffleRequest | Rejection:
    """The shuffler's exchange in ``content`` when it names a context (non-empty), a dimension
    in [1, MAX_SHUFFLE_DIM], levels >= 1, at least one contribution and senders that are public
    keys; else the Rejection (and the exchange's context is not consumed)."""
    try:
        req = wire.ShuffleRequest.decode(content)
    except wire.ReplyError as exc:
        return _bad(f"malformed shuffle request: {exc}")
    if not req.context:
        return _bad("malformed shuffle request: the context is empty (it must name the run, round and exchange)")
    if not 1 <= req.dim <= MAX_SHUFFLE_DIM:
        return _bad(f"malformed shuffle request: dim {req.dim} is outside [1, {MAX_SHUFFLE_DIM}]")
    if req.levels < 1:
        return _bad(f"malformed shuffle request: levels {req.levels} < 1")
    if not req.blobs:
        return _bad("malformed shuffle request: no contributions")
    for i, key in enumerate(req.senders):
        try:
            parse_public_key(key)
        except EnvelopeError as exc:
            return _bad(f"malformed shuffle request: senders[{i}] is not a public key: {exc}")
    return req
