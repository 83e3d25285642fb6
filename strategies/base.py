"""Common server loop of every silofl optimiser.

A :class:`FederatedOptimizer` is a ``flwr.serverapp.strategy.Strategy``. Each round it samples
M of the N silo nodes uniformly at random (the paper's Assumption 3), sends them w_r, validates
every reply (an invalid, refused or failed reply counts as a dropped silo and never stops the
round), applies its server step to the valid updates, optionally evaluates, and records the round.
Subclasses define the phase silos run and the server step.

Nothing in a reply is trusted for identity or weight: a silo is the node Flower delivered its
reply from (``src_node_id``), mapped once to a slot by :class:`NodeRoster`; a reply from a node
that was not asked, or a second reply from one node in one exchange, is ignored. Every update is
bounded (:data:`MAX_UPDATE_ABS` per coordinate, as sent and after lifting a sketch), and a server
step that would leave a non-finite model or one outside float32's range is skipped and logged,
so no reply can crash the server or poison the model with inf/NaN.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from app import wire
from app.config import Settings
from app.prox import Prox, gradient_mapping, make_prox
from app.sketch.base import PayloadError, Sketch
from app.sketch.broadcast import sketch_from_config, sketch_round_config
from app.seeding import np_rng

RoundCallback = Callable[[dict[str, Any]], None]

#: the largest |value| accepted in an update, as sent and after lifting (2^64 ~ 1.8e19). Honest
#: updates are many orders of magnitude below it; with it, sums and squared norms of up to 10^9
#: coordinates stay finite in float64, and 10^6 rounds of steps of size lr <= 1 cannot take a
#: float32 model out of range.
MAX_UPDATE_ABS = float(2.0 ** 64)
FLOAT32_MAX = float(np.finfo(np.float32).max)


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


def model_in_range(w: dict[str, np.ndarray]) -> bool:
    """Whether every value of the model is finite and representable in float32."""
    return all(np.all(np.isfinite(v)) and float(np.max(np.abs(v), initial=0.0)) <= FLOAT32_MAX for v in w.values())


@dataclass
class ReplyTally:
    """How the replies of one round were classified."""

    valid: list[tuple[int, dict[str, np.ndarray], dict[str, float]]] = field(default_factory=list)
    refused: dict[int, str] = field(default_factory=dict)
    malformed: dict[int, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    missing: int = 0
    #: each valid reply's message as sent: the flat update, or the sketch payload y (node -> vector)
    messages: dict[int, np.ndarray] = field(default_factory=dict)

    def eps_max(self) -> float:
        values = [m["eps-spent"] for _, _, m in self.valid]
        return max(values) if values else math.nan

    def merge(self, other: ReplyTally) -> ReplyTally:
        """The tally of two exchanges of one round (Fed-SPIDER's two uploads)."""
        return ReplyTally(self.valid + other.valid, self.refused | other.refused, self.malformed | other.malformed,
                          self.errors | other.errors, self.missing + other.missing, self.messages | other.messages)


class IterateSampler:
    """One iterate drawn uniformly from all those offered so far (reservoir sampling: the t-th
    offer replaces the kept one with probability 1/t), in O(1) memory. This is how the paper's
    output w_priv ~ Unif{w_1, ..., w_R} is drawn without storing R models."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.seen = 0
        self.round: int | None = None
        self.value: dict[str, np.ndarray] | None = None

    def offer(self, rnd: int, w: dict[str, np.ndarray]) -> None:
        self.seen += 1
        if self.rng.random() < 1.0 / self.seen:
            self.round, self.value = rnd, {k: np.array(v, copy=True) for k, v in w.items()}


class FederatedOptimizer(Strategy):
    """Sampling, messaging, validation and bookkeeping shared by all optimisers."""

    #: the phase silos run for this optimiser ("grad" or "local").
    phase: str = ""

    def __init__(self, settings: Settings, layout: dict[str, tuple[int, ...]], on_round: RoundCallback | None = None,
                 node_wait_s: float = 120.0) -> None:
        self.s = settings
        self.layout = layout
        self.on_round = on_round or (lambda row: None)
        self.node_wait_s = node_wait_s
        self.client_errors: list[str] = []
        self.rows: list[dict[str, Any]] = []
        self._last_tally = ReplyTally()
        self._w: dict[str, np.ndarray] = {}
        self._sent_nodes: list[int] = []
        self.roster = NodeRoster()
        self._sketch: Sketch | None = None
        self._eval_w: dict[str, np.ndarray] = {}
        self.prox = composite_prox(settings)
        self.uploads = 0.0  # G(t): cumulative uploads in full-gradient equivalents
        self.n_params = sum(int(np.prod(shape)) for shape in layout.values())
        self.sent_messages = 0  # this round's instructions and the floats their replies carried
        self.uplink_floats = 0
        #: the output iterate: uniform over w_1..w_R when ``output`` = random (else the last one)
        self.sampler = IterateSampler(np_rng(settings.seed, "output-iterate"))
        self.output_round: int | None = None
        self.output_metrics: dict[str, float] = {}

    # -- the server step (subclasses) ------------------------------------------------------
    def server_step(self, w: dict[str, np.ndarray], updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def round_config(self, server_round: int) -> dict[str, Any]:
        """What a silo needs besides w_r (DESIGN.md section 3)."""
        return {"round": server_round, "phase": self.phase, "batch-size": self.s.batch_size,
                "clip": self.s.privacy.clip} | sketch_round_config(
            self.s.sketch_kind, self.s.sketch_ratio, self.s.sketch_epsilon, self.s.sketch_layerwise, self.s.seed,
            server_round, self.s.sketch_error_feedback)

    def prev_arrays(self, server_round: int) -> ArrayRecord | None:
        """A second point the silos need this round (e.g. w_{r-1} for SPIDER), or None."""
        return None

    # -- Strategy interface ---------------------------------------------------------------
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Sample M silos and send each w_r with the round's config."""
        self._w = wire.record_to_params(arrays, self.layout, what="global arrays")
        nodes = self.sample_nodes(grid, server_round)
        self._sent_nodes = list(nodes)
        cfg = dict(config) | self.round_config(server_round)
        self._sketch = sketch_from_config(cfg, list(self.layout.values()))
        prev = self.prev_arrays(server_round)
        return [Message(wire.instruction(arrays, cfg, prev), dst_node_id=n, message_type=MessageType.TRAIN)
                for n in nodes]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate the replies and apply the server step; None (model unchanged) when no silo
        answered with a valid update."""
        tally = self._last_tally = self.classify(server_round, replies, self._sent_nodes)
        if not tally.valid:
            log(WARNING, "round %d: no silo answered with a valid update; the model is unchanged", server_round)
            return None, None
        if not self.accept_model(server_round, self.server_step(self._w, [u for _, u, _ in tally.valid])):
            return None, None
        metrics = MetricRecord({"answered": len(tally.valid), "eps-max": tally.eps_max()})
        return wire.params_to_record(self._w), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        nodes = sorted(grid.get_node_ids())
        self._eval_w = wire.record_to_params(arrays, self.layout, what="global arrays")
        cfg = dict(config) | {"round": server_round, wire.TRAIN_GRADIENT: True}
        return [Message(wire.instruction(arrays, cfg), dst_node_id=n, message_type=MessageType.EVALUATE) for n in nodes]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        sums: dict[str, float] = {}
        grads: list[dict[str, np.ndarray]] = []
        refused: list[int] = []
        answered: set[int] = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            if node in answered:
                log(WARNING, "round %d: ignored a second evaluation reply of node %d", server_round, node)
                continue
            answered.add(node)
            if msg.has_error():
                self._client_error(msg, "evaluate")
                continue
            if wire.refusal_of(msg.content) is not None:  # the silo's policy (evaluation off, or budget)
                refused.append(node)
                continue
            try:
                m = wire.read_metrics(msg.content, ("test-errors", "test-count", "train-loss-sum", "train-count"),
                                      what="evaluate metrics")
                check_evaluation_metrics(m)
            except wire.ReplyError as exc:
                log(WARNING, "round %d: dropped evaluation reply of node %d: %s", server_round, node, exc)
                continue
            if wire.TRAIN_GRADIENT in msg.content.array_records:
                try:
                    grad = wire.record_to_params(msg.content.array_records[wire.TRAIN_GRADIENT], self.layout,
                                                 what=wire.TRAIN_GRADIENT)
                    check_bounded(wire.TRAIN_GRADIENT, flatten(grad))
                    grads.append(grad)
                except wire.ReplyError as exc:
                    log(WARNING, "round %d: dropped training gradient of node %d: %s", server_round, node, exc)
            val = (m.get("val-errors", 0.0), m.get("val-count", 0.0))
            if not (math.isfinite(val[0]) and math.isfinite(val[1]) and 0 <= val[0] <= val[1]):
                log(WARNING, "round %d: ignored the validation counts of node %d: %s", server_round, node, val)
                m = m | {"val-errors": 0.0, "val-count": 0.0}
            for k in ("test-errors", "test-count", "test-loss-sum", "train-loss-sum", "train-count", "val-errors",
                      "val-count"):
                sums[k] = sums.get(k, 0.0) + m.get(k, 0.0)
        if refused:
            log(INFO, "round %d: %d silo node(s) declined evaluation by their policy", server_round, len(refused))
        if not sums or sums.get("test-count", 0) <= 0:
            return None
        out = {
            "test-error": sums["test-errors"] / sums["test-count"],
            "test-loss": sums["test-loss-sum"] / sums["test-count"],
            "train-loss": sums["train-loss-sum"] / max(sums["train-count"], 1.0),
        }
        if sums.get("val-count", 0) > 0:
            out["val-error"] = sums["val-errors"] / sums["val-count"]
        if grads and self._eval_w:
            # grad F0 = (1/N) sum_i grad F_i (uniform over silos, the objective the server optimises)
            out["grad-mapping-norm"] = gradient_mapping(self._eval_w, mean_update(grads), self.prox, self.s.lr)
        return MetricRecord(out)

    def summary(self) -> None:
        log(INFO, "%s: %d rounds, %d of %d silos per round, lr=%g, privacy=%s eps=%g clip=%g",
            type(self).__name__, self.s.num_rounds, self.s.silos_per_round, self.s.num_silos, self.s.lr,
            self.s.privacy.mode, self.s.privacy.epsilon, self.s.privacy.clip)

    # -- the loop -------------------------------------------------------------------------
    def begin_round(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """The point round ``server_round`` starts from (PL-SVRG restarts change it)."""
        return arrays

    def train_round(self, server_round: int, arrays: ArrayRecord, grid: Grid, config: ConfigRecord,
                    timeout: float) -> ArrayRecord:
        """One round: one exchange with the sampled silos and the server step. Sets ``_last_tally``
        and returns the new global arrays (unchanged when no silo answered)."""
        tally = self._last_tally = self.exchange(server_round, arrays, config, grid, timeout)
        if not tally.valid:
            log(WARNING, "round %d: no silo answered with a valid update; the model is unchanged", server_round)
            return arrays
        if not self.accept_model(server_round, self.server_step(self._w, [u for _, u, _ in tally.valid])):
            return arrays
        return wire.params_to_record(self._w)

    def accept_model(self, server_round: int, new_w: dict[str, np.ndarray]) -> bool:
        """Take ``new_w`` as the model, unless it is non-finite or outside float32's range: then
        the step is skipped (the model stays) and logged."""
        if not model_in_range(new_w):
            log(WARNING, "round %d: the server step would leave a non-finite model (or one outside float32's "
                "range); the step is skipped and the model is unchanged", server_round)
            return False
        self._w = {k: np.asarray(v, dtype=np.float32) for k, v in new_w.items()}
        return True

    def exchange(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                 timeout: float) -> ReplyTally:
        """Send the round's instruction to the sampled silos and classify their replies; counts
        the messages sent and the uplink (in full-gradient equivalents, G(t))."""
        messages = list(self.configure_train(server_round, arrays, config, grid))
        self.sent_messages += len(messages)
        tally = self.classify(server_round, grid.send_and_receive(messages, timeout=timeout),
                              [m.metadata.dst_node_id for m in messages])
        floats = len(tally.valid) * (self._sketch.payload_size if self._sketch is not None else self.n_params)
        self.uplink_floats += floats
        self.uploads += floats / self.n_params
        return tally

    def round_metrics(self) -> dict[str, Any]:
        """Extra entries for this round's row (e.g. the weight each silo got)."""
        return {}

    def output_iterate(self, last: ArrayRecord) -> tuple[ArrayRecord, int]:
        """The run's output and the round it comes from (``output`` = last or random)."""
        if self.s.output == "random" and self.sampler.value is not None:
            return wire.params_to_record(self.sampler.value), int(self.sampler.round or 0)
        return last, self.s.num_rounds

    def sample_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """M of the connected silo nodes, uniformly without replacement, from (seed, round)."""
        nodes = sorted(self.wait_for_nodes(grid))
        rng = np_rng(self.s.seed, "server-sampling", server_round)
        chosen = rng.choice(len(nodes), size=self.s.silos_per_round, replace=False)
        return [nodes[i] for i in sorted(chosen)]

    def wait_for_nodes(self, grid: Grid) -> list[int]:
        """Block until num-silos nodes are connected (grid.get_node_ids() can be empty at start);
        the nodes seen are added to the roster."""
        deadline = time.monotonic() + self.node_wait_s
        while True:
            nodes = list(grid.get_node_ids())
            if len(nodes) >= self.s.num_silos:
                self.roster.add(nodes)
                return nodes
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(nodes)} silo nodes connected after {self.node_wait_s:.0f} s; num-silos = {self.s.num_silos}"
                )
            time.sleep(0.2)

    def classify(self, server_round: int, replies: Iterable[Message], sent_to: Iterable[int]) -> ReplyTally:
        """Sort replies into valid / refused / malformed / failed; nothing here raises. Only the
        first reply of each node that was sent an instruction counts; others are ignored."""
        tally = ReplyTally()
        expected = set(sent_to)
        answered: set[int] = set()
        for msg in replies:
            node = msg.metadata.src_node_id
            if node not in expected or node in answered:
                log(WARNING, "round %d: ignored a reply from node %d (%s)", server_round, node,
                    "a second reply in this exchange" if node in answered else "not sent an instruction")
                continue
            answered.add(node)
            if msg.has_error():
                tally.errors[node] = self._client_error(msg, "train")
                continue
            refusal = wire.refusal_of(msg.content)
            if refusal is not None:
                tally.refused[node] = f"{refusal[0]}: {refusal[1]}"
                log(WARNING, "round %d: silo node %d refused: %s", server_round, node, tally.refused[node])
                continue
            try:
                update, metrics, message = self.read_update(msg.content)
            except wire.ReplyError as exc:
                tally.malformed[node] = str(exc)
                log(WARNING, "round %d: dropped malformed reply of node %d: %s", server_round, node, exc)
                continue
            tally.valid.append((node, update, metrics))
            tally.messages[node] = message
        tally.missing = len(expected - answered)
        return tally

    def read_update(self, content: Any) -> tuple[dict[str, np.ndarray], dict[str, float], np.ndarray]:
        """A validated update in the model's layout (lifted S^T y when the round is sketched),
        its metrics, and the message vector as sent (flat update, or payload y)."""
        if self._sketch is None:
            update, metrics = wire.read_update(content, self.layout)
            message = flatten(update)
            check_bounded("update", message)
            return update, metrics, message
        payload, metrics = wire.read_update(content, {wire.SKETCH: (self._sketch.payload_size,)})
        message = np.asarray(payload[wire.SKETCH], dtype=np.float32)
        check_bounded("sketch payload", message)
        return self.lift(message), metrics, message

    def lift(self, message: np.ndarray) -> dict[str, np.ndarray]:
        """S^T y in the model's layout for this round's sketch (the identity without one)."""
        if self._sketch is None:
            return wire.unflatten(np.asarray(message, dtype=np.float32), self.layout)
        try:
            flat = self._sketch.decompress(torch.as_tensor(np.asarray(message, dtype=np.float32))).numpy()
        except PayloadError as exc:
            raise wire.ReplyError(f"sketch payload rejected: {exc}") from exc
        check_bounded("lifted update S^T y", flat)
        return wire.unflatten(flat, self.layout)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Run ``num_rounds`` rounds; returns Flower's Result with the final arrays."""
        self.summary()
        result = Result()
        arrays = initial_arrays
        self.wait_for_nodes(grid)
        for rnd in range(1, num_rounds + 1):
            t0 = time.perf_counter()
            arrays = self.begin_round(rnd, arrays)
            self.sent_messages = self.uplink_floats = 0
            arrays = self.train_round(rnd, arrays, grid, train_config or ConfigRecord(), timeout)
            if self.s.output == "random":  # only the random output needs the iterates
                self.sampler.offer(rnd, wire.record_to_params(arrays, self.layout, what="global arrays"))
            tally = self._last_tally
            row: dict[str, Any] = {
                "round": rnd, "sampled": self.sent_messages, "answered": len(tally.valid),
                "refused": len(tally.refused), "malformed": len(tally.malformed), "failed": len(tally.errors),
                "missing": tally.missing, "eps_max": tally.eps_max(),
                "train_loss_private_batch": _mean([m.get("loss", math.nan) for _, _, m in tally.valid]),
            }
            row |= {"uplink_floats": self.uplink_floats, "uploads_G": self.uploads}
            row |= self.round_metrics()
            if self.s.eval_every and (rnd % self.s.eval_every == 0 or rnd == num_rounds):
                ev = self.evaluate_point(rnd, arrays, grid, evaluate_config, timeout)
                if ev is not None:
                    row |= ev
                    result.evaluate_metrics_clientapp[rnd] = MetricRecord(ev)
            row["wall_s"] = time.perf_counter() - t0
            self.rows.append(row)
            self.on_round(row)
        result.arrays, self.output_round = self.output_iterate(arrays)
        if self.s.output == "random" and self.s.eval_every:
            self.output_metrics = self.evaluate_point(num_rounds, result.arrays, grid, evaluate_config, timeout) or {}
        return result

    def evaluate_point(self, rnd: int, arrays: ArrayRecord, grid: Grid, config: ConfigRecord | None,
                       timeout: float) -> dict[str, float] | None:
        """Non-private evaluation of ``arrays`` on every silo: test error and loss, training loss
        and the gradient mapping ||G_eta|| from the silos' full training gradients."""
        ev_msgs = list(self.configure_evaluate(rnd, arrays, config or ConfigRecord(), grid))
        ev = self.aggregate_evaluate(rnd, grid.send_and_receive(ev_msgs, timeout=timeout))
        if ev is None:
            return None
        out = {"test_error": ev["test-error"], "test_loss": ev["test-loss"], "train_loss": ev["train-loss"]}
        if "grad-mapping-norm" in ev:
            out["grad_mapping_norm_eval"] = ev["grad-mapping-norm"]
        if "val-error" in ev:
            out["val_error"] = ev["val-error"]
        return out

    def _client_error(self, msg: Message, what: str) -> str:
        reason = (msg.error.reason or "").strip().splitlines()
        short = reason[-1] if reason else f"error code {msg.error.code}"
        text = f"node {msg.metadata.src_node_id} ({what}): {short}"
        self.client_errors.append(text)
        log(WARNING, "ClientApp failure: %s", text)
        return text


#: the largest record count an evaluation reply may claim (a silo's split sizes)
MAX_EVAL_COUNT = 1e12


def check_evaluation_metrics(m: dict[str, float]) -> None:
    """ReplyError unless the evaluation counts and sums are possible: 0 <= errors <= count <=
    MAX_EVAL_COUNT, finite loss sums >= 0 (so one silo cannot claim an impossible error rate)."""
    for count_key in ("test-count", "train-count"):
        if not 0 <= m[count_key] <= MAX_EVAL_COUNT:
            raise wire.ReplyError(f"{count_key} = {m[count_key]} is not a possible record count")
    if not 0 <= m["test-errors"] <= m["test-count"]:
        raise wire.ReplyError(f"test-errors = {m['test-errors']} is not in [0, test-count = {m['test-count']}]")
    for key in ("test-loss-sum", "train-loss-sum"):
        if key in m and not (math.isfinite(m[key]) and m[key] >= 0):
            raise wire.ReplyError(f"{key} = {m[key]} is not a finite sum >= 0")


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def composite_prox(s: Settings) -> Prox:
    """prox_{eta f1} for the run's composite loss (``prox.kind``, ``prox.strength``, ``prox.l2``)."""
    extra = {"l2": s.prox_l2} if s.prox_kind == "elastic-net" else {}
    return make_prox(s.prox_kind, s.prox_strength, **extra)


def flatten(update: dict[str, np.ndarray]) -> np.ndarray:
    """The update as one float32 vector (layer order)."""
    return np.concatenate([np.asarray(v, dtype=np.float32).reshape(-1) for v in update.values()])


def mean_update(updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Uniform average (1/M) sum_i u_i over the silos that answered (the paper's aggregation)."""
    return {k: np.mean([u[k] for u in updates], axis=0).astype(np.float32) for k in updates[0]}
