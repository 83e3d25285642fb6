"""Reply validation and decoding: the one place where the server reads what silos send.

Nothing in a reply is trusted for identity or weight: a silo is the node Flower delivered its
reply from (``src_node_id``), mapped once to a slot by :class:`NodeRoster`; a reply from a node
that was not asked, or a second reply from one node in one exchange, is ignored. Every update is
bounded (:data:`MAX_UPDATE_ABS` per coordinate, as sent and after lifting a sketch). An invalid,
refused or failed reply counts as a dropped silo and never raises. A sketched reply is lifted
here, once (S^T y), then decoded by the run's mechanism; the optimisers get the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING

import numpy as np
import torch
from flwr.app import Message, RecordDict
from flwr.common import log

from app import wire
from app.sketch.base import PayloadError, Sketch
from strategies.messaging import is_unavailable
from strategies.node_order import by_position

Params = dict[str, np.ndarray]

#: the largest |value| accepted in an update, as sent and after lifting (2^64 ~ 1.8e19). Honest
#: updates are many orders of magnitude below it; with it, sums and squared norms of up to 10^9
#: coordinates stay finite in float64, and 10^6 rounds of steps of size lr <= 1 cannot take a
#: float32 model out of range.
MAX_UPDATE_ABS = float(2.0 ** 64)
FLOAT32_MAX = float(np.finfo(np.float32).max)
#: the largest record count an evaluation reply may claim (a silo's split sizes)
MAX_EVAL_COUNT = 1e12


class NodeRoster:
    """The server's own map from Flower node ids (what Flower authenticates as a reply's source)
    to silo slots 0..N-1: the nodes connected at the start in sorted order, later ones appended.
    Grad-BANT's per-silo momentum and every per-silo weight are indexed by this slot, never by
    anything a reply says."""

    def __init__(self) -> None:
        self.slots: dict[int, int] = {}

    def add(self, nodes: Iterable[int]) -> None:
        for node in sorted(nodes):
            self.slots.setdefault(int(node), len(self.slots))

    def slot(self, node: int) -> int:
        self.add([node])
        return self.slots[int(node)]


def check_bounded(what: str, values: np.ndarray) -> None:
    """ReplyError unless every value is finite with |value| <= MAX_UPDATE_ABS."""
    arr = np.asarray(values)
    if not np.all(np.isfinite(arr)):
        raise wire.ReplyError(f"{what} contains NaN or inf")
    peak = float(np.max(np.abs(arr))) if arr.size else 0.0
    if peak > MAX_UPDATE_ABS:
        raise wire.ReplyError(f"{what} has |value| {peak:.3g} > {MAX_UPDATE_ABS:.3g}, the bound on any update")


def model_in_range(w: Mapping[str, np.ndarray]) -> bool:
    """Whether every value of the model is finite and representable in float32."""
    return all(np.all(np.isfinite(v)) and float(np.max(np.abs(v), initial=0.0)) <= FLOAT32_MAX for v in w.values())


def flatten(update: Mapping[str, np.ndarray]) -> np.ndarray:
    """The update as one float32 vector (layer order)."""
    return np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1) for v in update.values()])


@dataclass
class Updates:
    """The valid, decoded replies of one exchange, in reply order, and how the others fared.

    ``updates[i]`` is node ``nodes[i]``'s update in the model's layout (lifted and decoded);
    ``messages[node]`` the vector it sent (flat update, or sketch payload y)."""

    nodes: list[int] = field(default_factory=list)
    updates: list[Params] = field(default_factory=list)
    metrics: list[wire.TrainReply] = field(default_factory=list)
    messages: dict[int, np.ndarray] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    malformed: dict[int, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    missing: int = 0
    #: S^T y (decoded) in the model's layout for a vector in this exchange's message space
    lift: Callable[[np.ndarray], Params] | None = None
    #: shuffle DP: ``updates`` holds one update, the debiased mean; the shuffler accepted
    #: ``shuffle_accepted`` contributions and dropped ``shuffle_dropped``; the sealed bytes sent
    #: in float32 equivalents
    shuffle_accepted: int | None = None
    shuffle_dropped: int = 0
    uplink_floats: float | None = None
    #: shuffle DP: the shuffler's reason when it refused the whole sum ("" if it did not)
    shuffle_refusal: str = ""

    def __bool__(self) -> bool:
        return bool(self.updates)

    @property
    def answered(self) -> int:
        """How many silos' releases the update holds."""
        return self.shuffle_accepted if self.shuffle_accepted is not None else len(self.updates)

    def mean(self) -> Params:
        """Uniform average (1/M) sum_i u_i over the silos that answered (the paper's aggregation)."""
        return mean_update(self.updates)

    def eps_max(self) -> float:
        values = [r.eps_spent for r in self.metrics]
        return max(values) if values else math.nan

    def merge(self, other: Updates) -> Updates:
        """The tally of two exchanges of one round (Fed-SPIDER's two uploads)."""
        shuffled = self.shuffle_accepted is not None or other.shuffle_accepted is not None
        floats = None if self.uplink_floats is None and other.uplink_floats is None else \
            (self.uplink_floats or 0.0) + (other.uplink_floats or 0.0)
        return Updates(self.nodes + other.nodes, self.updates + other.updates, self.metrics + other.metrics,
                       self.messages | other.messages, self.refused | other.refused, self.malformed | other.malformed,
                       self.errors | other.errors, self.missing + other.missing, self.lift,
                       (self.shuffle_accepted or 0) + (other.shuffle_accepted or 0) if shuffled else None,
                       self.shuffle_dropped + other.shuffle_dropped, floats,
                       self.shuffle_refusal or other.shuffle_refusal)


def mean_update(updates: Sequence[Mapping[str, np.ndarray]]) -> Params:
    """Uniform average (1/M) sum_i u_i (float32)."""
    return {k: np.mean([u[k] for u in updates], axis=0).astype(np.float32) for k in updates[0]}


def check_evaluation_reply(r: wire.EvaluateReply) -> None:
    """ReplyError unless the counts and sums are possible (so one silo cannot claim an
    impossible error rate or swamp the totals)."""
    for name in ("test_count", "train_count"):
        if not 0 <= getattr(r, name) <= MAX_EVAL_COUNT:
            raise wire.ReplyError(f"{name} = {getattr(r, name)} is not a possible record count")
    if not 0 <= r.test_errors <= r.test_count:
        raise wire.ReplyError(f"test_errors = {r.test_errors} is not in [0, test_count = {r.test_count}]")
    for name in ("test_loss_sum", "train_loss_sum"):
        if not math.isfinite(getattr(r, name)):
            raise wire.NonFiniteReply(f"{name} = {getattr(r, name)} is not a finite sum >= 0")
        if getattr(r, name) < 0:
            raise wire.ReplyError(f"{name} = {getattr(r, name)} is not a finite sum >= 0")


class ReplyReader:
    """Validates and decodes one exchange's replies for a model ``layout`` and the round's
    ``sketch`` (None: flat updates)."""

    def __init__(self, layout: Mapping[str, tuple[int, ...]], sketch: Sketch | None,
                 client_error: Callable[[Message, str], str],
                 decode: Callable[[np.ndarray], np.ndarray] | None = None, device: torch.device | None = None) -> None:
        self.layout = layout
        self.sketch = sketch
        self.device = device  # where S^T y is computed (server-device; None: the CPU)
        self.client_error = client_error  # records a ClientApp failure, returns its text
        self.decode = decode  # the mechanism's server half (None: the identity)

    def read(self, content: object) -> tuple[Params, wire.TrainReply, np.ndarray]:
        """A validated update in the model's layout (lifted S^T y when the round is sketched),
        the reply, and the message vector as sent (flat update, or payload y)."""
        if self.sketch is None:
            reply = wire.TrainReply.decode(content, self.layout)
            message = flatten(reply.update)
            check_bounded("update", message)
            if self.decode is not None:
                return self.lift(message), reply, message
            return dict(reply.update), reply, message
        reply = wire.TrainReply.decode(content, {wire.SKETCH: (self.sketch.payload_size,)})
        message = np.asarray(reply.update[wire.SKETCH], dtype=np.float32)
        check_bounded("sketch payload", message)
        return self.lift(message), reply, message

    def lift(self, message: np.ndarray) -> Params:
        """S^T y in the model's layout for this round's sketch (the identity without one)."""
        if self.sketch is None:
            return self._decoded(np.asarray(message, dtype=np.float32))
        try:
            y = torch.as_tensor(np.asarray(message, dtype=np.float32), device=self.device)
            flat = self.sketch.decompress(y).cpu().numpy()
        except PayloadError as exc:
            raise wire.ReplyError(f"sketch payload rejected: {exc}") from exc
        check_bounded("lifted update S^T y", flat)
        return self._decoded(flat)

    def _decoded(self, flat: np.ndarray) -> Params:
        if self.decode is not None:
            flat = self.decode(flat)
            check_bounded("decoded update", flat)
        return wire.unflatten(flat, self.layout)

    def classify(self, server_round: int, replies: Iterable[Message], sent_to: Iterable[int]) -> Updates:
        """Sort replies into valid / refused / malformed / failed (:func:`sort_replies`); a valid
        one is lifted and decoded by :meth:`read`."""
        out = Updates(lift=self.lift)

        def accept(node: int, content: RecordDict) -> None:
            update, reply, message = self.read(content)
            out.nodes.append(node)
            out.updates.append(update)
            out.metrics.append(reply)
            out.messages[node] = message

        return sort_replies(server_round, replies, sent_to, self.client_error, accept, out)


def sort_replies(server_round: int, replies: Iterable[Message], sent_to: Iterable[int],
                 client_error: Callable[[Message, str], str], accept: Callable[[int, RecordDict], None],
                 out: Updates) -> Updates:
    """Sort one exchange's training replies into ``out``: failed, refused, malformed (``accept``
    raised ReplyError) or valid (``accept`` recorded it); nothing here raises. Only the first
    reply of each node that was sent an instruction counts; others are ignored. Replies are taken
    in the order of ``sent_to`` (the server's node order, strategies/node_order.py), not arrival
    order, so the aggregate's floating-point sums do not depend on which silo happened to answer
    first (a resumed run ends bit-identical to an uninterrupted one)."""
    sent_to = list(sent_to)
    expected = set(sent_to)
    answered: set[int] = set()
    ignored: dict[int, int] = {}  # node -> replies ignored (one warning per node, after the loop)
    for msg in sorted(replies, key=by_position(sent_to)):
        node = msg.metadata.src_node_id
        if node not in expected or node in answered:
            ignored[node] = ignored.get(node, 0) + 1
            continue
        answered.add(node)
        if msg.has_error():
            if is_unavailable(msg):  # the node is gone: a dropped silo (counted missing), not a failure
                client_error(msg, "train")
                answered.discard(node)
                continue
            out.errors[node] = client_error(msg, "train")
            continue
        refusal = wire.Refusal.decode(msg.content)
        if refusal is not None and refusal.code == wire.REFUSED_INTERNAL:  # the silo failed: a ClientApp failure
            out.errors[node] = client_error(msg, "train")
            continue
        if refusal is not None:
            out.refused[node] = f"{refusal.code}: {refusal.reason}"
            log(WARNING, "round %d: silo node %d refused: %s", server_round, node, out.refused[node])
            continue
        try:
            accept(node, msg.content)
        except wire.ReplyError as exc:
            out.malformed[node] = str(exc)
            log(WARNING, "round %d: dropped malformed reply of node %d: %s", server_round, node, exc)
    for node, count in sorted(ignored.items()):
        log(WARNING, "round %d: ignored %d reply(ies) from node %d (%s)", server_round, count, node,
            "replies after its first in this exchange" if node in expected else "not sent an instruction")
    out.missing = len(expected - answered)
    return out
