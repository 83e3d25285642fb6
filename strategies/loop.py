"""The server's round loop, shared by every optimiser.

Each round the loop samples M of the N silo nodes uniformly at random (the paper's Assumption 3)
and runs the optimiser's one hook, a generator of exchanges (strategies/exchange.py),

    exchanges(rnd, w): updates = yield Exchange(phase, at, prev); ...; return StepResult(model, row)

each yielded exchange sends the sampled silos an :class:`~app.wire.Instruction` for one release
and gets back their valid decoded replies (:class:`~strategies.replies.Updates`; an invalid,
refused or failed reply counts as a dropped silo). A round may hold several exchanges
(Fed-SPIDER's two uploads) under :meth:`FederatedOptimizer.run`, silofl's driver; a round of one
exchange also runs under Flower's own ``Strategy.start`` (strategies/flower_rounds.py). The loop then guards the model (a step that would leave it
non-finite or outside float32's range is skipped and logged, and the row says ``step_skipped``),
evaluates, and records the round (``non_finite_updates``: silos that refused because their update
came out non-finite; both keys only when it happened, for app/run_health.py).
The algorithm's schedule (``app/algorithms/``) says which phase each round asks for.

Evaluation rides on the next round's training exchange: round r's row waits (``pending``) until
round r+1's first exchange, whose instruction (it carries w_r) also asks the sampled silos to
evaluate w_r and whose same send asks every other silo node for its evaluation alone. A round then
costs one exchange instead of two; the row, its numbers and the silos' ledgers are what a separate
evaluation exchange after round r gives (each silo evaluates w_r before its round r+1 release).
The last round's result, a first exchange at another point than w_r (SPIDER-alt's difference
round), a round that asks nothing, and shuffle mode (whose replies go to the shuffler) get an
evaluation exchange of their own, in the same order as before.

Faults are the paper's Assumption 6 (M_r of the N silos available in round r): the loop waits
at most ``node-wait`` seconds for the silo nodes, then each round asks min(M, connected) of
those connected; a node that is gone is a dropped silo (Flower's node-unavailable reply), never
a ClientApp failure; below ``min-silos`` connected nodes (after the wait) the run stops with
:class:`TooFewSilos`. After every round the optimiser's whole state (:meth:`state`) can be
written to a checkpoint, and :meth:`start` can continue from one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from logging import INFO, WARNING
from typing import Any, ClassVar

import numpy as np
from flwr.app import Message, MessageType
from flwr.common import log
from flwr.serverapp import Grid

from app import wire
from app.algorithms import Algorithm, Phase, get_algorithm
from app.config import ConfigError, Settings, knob_keys, parse_settings, with_knobs
from app.privacy.mechanism import server_decoder
from app.seeding import np_rng
from app.server_device import server_device
from app.sketch.broadcast import build_sketch, round_sketch
from strategies.evaluation import EvaluationTally, evaluate_point, evaluation_messages
from strategies.aggregators import Aggregator, make_aggregator, with_harness
from strategies.exchange import Exchange, Round, RoundContext, StepResult
from strategies.flower_rounds import FlowerRounds
from strategies.nodes import SiloNodes
from strategies.server_mechanism import ServerMechanism, server_mechanism
from strategies.steps import IterateSampler, RunResult, composite_prox, nan_mean, same_point
from strategies.replies import NodeRoster, Params, ReplyReader, Updates, model_in_range

RoundCallback = Callable[[dict[str, Any]], None]
Ask = Callable[..., Updates]
#: called after every round with (round, model): write the checkpoint
Checkpointer = Callable[[int, Params], None]


class FederatedOptimizer(FlowerRounds):
    """Sampling, messaging, validation, guarding and bookkeeping shared by all optimisers: a
    ``flwr.serverapp.strategy.Strategy``. Subclasses name the algorithms they serve and implement
    :meth:`exchanges`. Flower's own ``start`` runs a one-exchange optimiser
    (strategies/flower_rounds.py); :meth:`run` is silofl's driver of the same class (node
    waiting, checkpoints, folded evaluation, the shuffler relay, several exchanges a round)."""

    #: the algorithm names (app/algorithms/) this optimiser is the server step of
    algorithms: ClassVar[tuple[str, ...]] = ()
    #: the instance attributes, besides the loop's own, that make up the optimiser's state
    #: (what a checkpoint must hold for a resumed run to go on exactly as an uninterrupted one):
    #: the keys of the optimiser's state TypedDict (spider.SpiderState, spider_alt.SpiderAltState;
    #: the aggregator's, gradbant.RobustState, rides under "aggregator")
    state_attrs: ClassVar[tuple[str, ...]] = ()
    #: carry each round's evaluation in the next round's first exchange (False: an exchange of its own)
    fold_evaluation: ClassVar[bool] = True
    #: the most exchanges one round asks (1: the optimiser also runs under Flower's own start)
    exchanges_per_round: ClassVar[int] = 1
    #: the option group whose keys the constructor takes without their prefix (``q`` = ``spider.q``)
    knob_group: ClassVar[str] = ""

    def __init__(self, settings: Settings | None = None, layout: dict[str, tuple[int, ...]] | None = None,
                 on_round: RoundCallback | None = None, node_wait_s: float | None = None, *,
                 aggregator: Aggregator | None = None, **knobs: Any) -> None:
        """``settings``: the run's (app.config.parse_settings), or None: the declared defaults
        for this optimiser's algorithm with ``knobs`` over them, no run config needed (a Flower
        user's own app); ``layout``: the model's parameter shapes (None: those of the
        ``initial_arrays`` that ``start`` gets); ``aggregator``: how each exchange's updates are
        combined (default: the run config's ``aggregator``, strategies/aggregators.py);
        ``knobs``: run-config keys with ``.``/``-`` written ``_`` (``lr=0.1``, ``spider_q=5``,
        ``local_steps=2``; the optimiser's own group without its prefix: ``q=5``), checked as the
        run config is."""
        if settings is None:
            keys = knob_keys(knobs, self.knob_group)
            settings = parse_settings({"algorithm": self.algorithms[0]} | keys)
        elif knobs:
            settings = with_knobs(settings, knobs, self.knob_group)
        if self.algorithms and settings.algorithm not in self.algorithms:
            raise ConfigError(f"algorithm = {settings.algorithm!r} is not served by {type(self).__name__}; "
                              f"allowed: {', '.join(self.algorithms)}")
        self.s = settings
        self.algorithm: Algorithm = get_algorithm(settings.algorithm)
        self.on_round = on_round or (lambda row: None)
        #: the privacy mechanism's server half: direct replies, or the shuffler relay (shuffle DP)
        self.mechanism: ServerMechanism = server_mechanism(settings, lambda msg, what: self.nodes.client_error(msg, what))
        self.roster = NodeRoster()
        #: the silo nodes: waiting, sampling, ClientApp failures and gone nodes
        self.nodes = SiloNodes(num_silos=settings.num_silos, min_silos=settings.min_silos,
                               silos_per_round=settings.silos_per_round, seed=settings.seed,
                               node_wait_s=settings.node_wait if node_wait_s is None else node_wait_s,
                               fail_on_client_error=settings.fail_on_client_error, mechanism=self.mechanism,
                               roster=self.roster, query_timeout=settings.round_timeout)
        #: the distinct reasons silos gave for refusing (for the end-of-run report)
        self.refusal_reasons: set[str] = set()
        self.rows: list[dict[str, Any]] = []
        self.prox = composite_prox(settings.prox)
        self.decode = server_decoder(settings.privacy.mode) if settings.privacy.enabled else None
        #: where the server lifts sketched replies (server-device, app/server_device.py)
        self.device = server_device(settings)
        #: the model's parameter shapes and size (:meth:`bind_layout`)
        self.layout: dict[str, tuple[int, ...]] = {}
        self.n_params = 0
        #: the Flower run id (set by the ServerApp): shuffle DP binds contributions to it
        self.run_id = 0
        self.uploads = 0.0  # G(t): cumulative uploads in full-gradient equivalents
        #: the output iterate: uniform over w_1..w_R when ``output`` = random (else the last one)
        self.sampler = IterateSampler(np_rng(settings.seed, "output-iterate"))
        #: the last round's row while its evaluation travels with the next round's first exchange
        self.pending: dict[str, Any] | None = None
        #: how each exchange's updates are combined (the mean, Grad-BANT, Krum, ...)
        self.aggregator: Aggregator = with_harness(
            aggregator if aggregator is not None else make_aggregator(settings.robust, settings.algorithm),
            settings.attack.kind)
        #: the aggregator's entries for the round's row (each silo's weight, ...)
        self.aggregate_row: dict[str, Any] = {}
        #: run health during the run (the ServerApp sets it; app/run_health.py ``Watch``): called
        #: after every round with (round, model, row); what it returns, when not None, stops the
        #: run after that round (:attr:`stopped`)
        self.health_check: Callable[[int, Params, dict[str, Any]], Any] | None = None
        #: what :attr:`health_check` returned when it stopped the run, and after which round
        self.stopped: Any = None
        self.stopped_after: int | None = None
        if layout is not None:
            self.bind_layout(layout)

    def bind_layout(self, layout: dict[str, tuple[int, ...]]) -> None:
        """Once, with the model's parameter shapes: the mechanism's encoding (the shuffle's levels)
        and the aggregator (a trust-set rule builds its reference model for them)."""
        self.layout = {k: tuple(int(d) for d in shape) for k, shape in layout.items()}
        self.n_params = sum(int(np.prod(shape)) for shape in self.layout.values())
        self.mechanism.bind(self.layout)
        self.aggregator.bind(self)

    @property
    def client_errors(self) -> list[str]:
        """The run's ClientApp failures (node, what, the last line of the reason)."""
        return self.nodes.client_errors

    @property
    def unavailable(self) -> int:
        """Replies Flower gave for nodes that were gone (dropped silos, not ClientApp failures)."""
        return self.nodes.unavailable

    # -- the optimiser's hooks ----------------------------------------------------------------
    def exchanges(self, rnd: int, w: Params) -> Round:
        """One round from model ``w``: yield an :class:`Exchange` per release asked of the
        sampled silos (receiving their valid replies), return the :class:`StepResult`."""
        raise NotImplementedError
        yield  # pragma: no cover (a generator)

    def step(self, rnd: int, w: Params, ask: Ask) -> StepResult:
        """Run :meth:`exchanges` with ``ask(phase, at, prev)`` answering each exchange."""
        gen = self.exchanges(rnd, w)
        try:
            ex = next(gen)
            while True:
                ex = gen.send(ask(ex.phase, ex.at, ex.prev))
        except StopIteration as stop:
            return self.finish_step(stop.value)

    def finish_step(self, result: StepResult | None) -> StepResult:
        """The step's result with the aggregator's row entries of the round (its weights, ...)."""
        result = result if result is not None else StepResult(None)
        row, self.aggregate_row = self.aggregate_row | result.row, {}
        return StepResult(result.model, row)

    def prepare(self, grid: Grid, timeout: float) -> None:
        """Once, after the nodes have connected and before round 1."""
        self.aggregator.prepare(grid, timeout)

    def combine(self, rnd: int, ex: Exchange, updates: Updates) -> Params | None:
        """The aggregator's combination of one exchange's updates (None: it kept nothing)."""
        out, row = self.aggregator.combine(rnd, ex, updates)
        self.aggregate_row |= row
        return out

    def scheduled_phase(self, rnd: int) -> Phase:
        """The (first) phase round ``rnd`` asks for in the algorithm's schedule."""
        return self.algorithm.round_phases(self.s.algorithm_options(), rnd)[0]

    # -- the state a checkpoint holds -------------------------------------------------------------
    def optimizer_state(self) -> dict[str, Any]:
        """The optimiser's own state (its ``state_attrs`` and its aggregator's), what it carries
        from round to round."""
        agg = self.aggregator.state()
        return {name: getattr(self, name) for name in self.state_attrs} | ({"aggregator": agg} if agg else {})

    def restore_optimizer_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`optimizer_state`'s output."""
        missing = [name for name in self.state_attrs if name not in state]
        if missing:
            raise KeyError(f"{type(self).__name__}: the checkpoint has no {', '.join(missing)}")
        for name in self.state_attrs:
            setattr(self, name, state[name])
        if "aggregator" in state:
            self.aggregator.restore(state["aggregator"])
        elif self.aggregator.state():  # a rule with state (Grad-BANT's p) must not restart silently
            raise KeyError(f"{type(self).__name__}: the checkpoint has no state for aggregator "
                           f"{self.aggregator.name!r}")

    def state(self, rnd: int, w: Params) -> dict[str, Any]:
        """Everything the loop and the optimiser carry from round ``rnd`` to the next."""
        return {
            "round": rnd, "model": dict(w), "rows": list(self.rows), "uploads": self.uploads,
            "client_errors": list(self.nodes.client_errors), "unavailable": self.nodes.unavailable,
            "roster": {str(k): v for k, v in self.roster.slots.items()},
            "sampler": {"seen": self.sampler.seen, "round": self.sampler.round, "value": self.sampler.value,
                        "rng": self.sampler.rng},
            "relay_exchanges": self.mechanism.exchanges,
            "pending": self.pending,
            "optimizer": self.optimizer_state(),
        }

    def load_state(self, state: dict[str, Any]) -> tuple[int, Params]:
        """Restore :meth:`state`'s output; returns (its round, its model)."""
        self.rows = list(state["rows"])
        self.uploads = float(state["uploads"])
        self.nodes.client_errors = list(state["client_errors"])
        self.nodes.unavailable = int(state["unavailable"])
        self.roster.slots = {int(k): int(v) for k, v in state["roster"].items()}
        sampler = state["sampler"]
        self.sampler = IterateSampler(sampler["rng"])
        self.sampler.seen, self.sampler.round, self.sampler.value = sampler["seen"], sampler["round"], sampler["value"]
        self.mechanism.exchanges = int(state["relay_exchanges"])
        self.pending = state.get("pending")
        self.restore_optimizer_state(state["optimizer"])
        w = {k: np.asarray(v, dtype=np.float32) for k, v in state["model"].items()}
        return int(state["round"]), w

    # -- the loop -------------------------------------------------------------------------------
    def run(self, grid: Grid, initial: Params, num_rounds: int, timeout: float,
            checkpoint: Checkpointer | None = None, resume: dict[str, Any] | None = None) -> RunResult:
        """silofl's driver (Flower's ``start`` is the other). Run rounds 1..``num_rounds`` from ``initial`` (or, with ``resume``, a checkpoint's
        state, the rounds after its round); ``checkpoint`` is called after every round.
        Returns the output iterate."""
        self.summary()
        w = {k: np.asarray(v, dtype=np.float32) for k, v in initial.items()}
        first = 1
        if resume is not None:
            done, w = self.load_state(resume)
            first = done + 1
            log(INFO, "resuming after round %d of %d", done, num_rounds)
        nodes = self.nodes.wait_for_nodes(grid, at_start=True)
        self.mechanism.discover(grid, nodes, timeout)
        self.prepare(grid, timeout)
        try:
            for rnd in range(first, num_rounds + 1):
                t0 = time.perf_counter()
                failures_before = len(self.nodes.client_errors)
                w, row = self.round(grid, rnd, w, timeout)
                if self.s.output == "random":  # only the random output needs the iterates
                    self.sampler.offer(rnd, w)
                if self.s.eval_every and (rnd % self.s.eval_every == 0 or rnd == num_rounds):
                    if rnd < num_rounds and self.mechanism.folds_evaluation and self.fold_evaluation:  # with rnd + 1's
                        self.pending = row
                    else:
                        row |= self.evaluate(grid, rnd, w, timeout) or {}
                row["wall_s"] = time.perf_counter() - t0
                if self.pending is not row:
                    self._record(row)
                if checkpoint is not None:
                    checkpoint(rnd, w)
                self.nodes.stop_on_new_failures(rnd, failures_before)
                if self.health_check is not None and rnd < num_rounds:
                    verdict = self.health_check(rnd, w, row)
                    if verdict is not None:  # it cannot learn: stop before more budget is spent
                        self.stopped, self.stopped_after = verdict, rnd
                        log(WARNING, "run health: %s", getattr(verdict, "reason", verdict))
                        if self.pending is not None:  # the last round's evaluation, as at a run's end
                            self._evaluate_pending(grid, w, timeout)
                        break
        finally:  # a run stopped with a row still waiting for its evaluation keeps the row
            if self.pending is not None:
                self._finish_pending(None)
        if self.s.output == "random" and self.sampler.value is not None:
            result = RunResult(self.sampler.value, int(self.sampler.round or 0))
        else:
            result = RunResult(w, num_rounds if self.stopped_after is None else self.stopped_after)
        if self.s.output == "random" and self.s.eval_every:
            last = num_rounds if self.stopped_after is None else self.stopped_after
            result.metrics = self.evaluate(grid, last, result.model, timeout) or {}
        return result

    def _record(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.on_round(row)

    def _finish_pending(self, ev: dict[str, float] | None) -> None:
        """Complete the waiting row with its evaluation (None: none came) and record it."""
        row, self.pending = self.pending, None
        assert row is not None
        self._record(row | (ev or {}))

    def _evaluate_pending(self, grid: Grid, w: Params, timeout: float) -> None:
        """The waiting row's evaluation of ``w`` in an exchange of its own, then the row."""
        assert self.pending is not None
        self._finish_pending(self.evaluate(grid, int(self.pending["round"]), w, timeout))

    def open_round(self, grid: Grid, rnd: int) -> RoundContext:
        """Round ``rnd``'s sampled silos, sketch and reply reader."""
        nodes = self.nodes.sample_nodes(grid, rnd)
        spec = round_sketch(self.s.sketch.kind, self.s.sketch.ratio, self.s.sketch.epsilon, self.s.sketch.layerwise,
                            self.s.seed, rnd, self.s.sketch.error_feedback)
        reader = ReplyReader(self.layout, build_sketch(spec, list(self.layout.values())), self.nodes.client_error,
                             self.decode, device=self.device)
        return RoundContext(rnd, nodes, spec, reader)

    def train_messages(self, ctx: RoundContext, ex: Exchange, ticket: Any = None,
                       evaluate_round: int | None = None) -> list[Message]:
        """The instruction of exchange ``ex`` to each sampled silo."""
        local = ex.phase == Phase.LOCAL
        content = wire.Instruction(ctx.rnd, ex.phase, ex.at, ex.prev, ctx.spec, self.s.local_steps if local else None,
                                   self.s.lr if local else None,
                                   ticket if isinstance(ticket, wire.ShuffleTicket) else None,
                                   evaluate_round=evaluate_round,
                                   train_gradient=evaluate_round is not None).encode()
        messages = [Message(content, dst_node_id=n, message_type=MessageType.TRAIN) for n in ctx.nodes]
        ctx.sent += len(messages)
        return messages

    def received(self, ctx: RoundContext, updates: Updates) -> Updates:
        """Count an exchange's uplink (floats, uploads G) and keep its updates for the row."""
        floats = updates.uplink_floats if updates.uplink_floats is not None else \
            len(updates.updates) * (ctx.reader.sketch.payload_size if ctx.reader.sketch is not None else self.n_params)
        ctx.floats += floats
        self.uploads += floats / self.n_params
        ctx.exchanges.append(updates)
        return updates

    def round(self, grid: Grid, rnd: int, w: Params, timeout: float) -> tuple[Params, dict[str, Any]]:
        """One round: the optimiser's step through the round's exchanges, the model guard, the row.
        A row waiting for the evaluation of ``w`` gets it from this round's first exchange."""
        ctx = self.open_round(grid, rnd)
        nodes = ctx.nodes

        def ask(phase: Phase, at: Params, prev: Params | None = None) -> Updates:
            ticket = self.mechanism.open_exchange(grid, rnd, phase, nodes, timeout, self.run_id)
            tally = None
            if self.pending is not None:  # the evaluation of w waits for this exchange
                if same_point(at, w):
                    tally = EvaluationTally(int(self.pending["round"]), w, self.layout, self.nodes.client_error)
                else:
                    self._evaluate_pending(grid, w, timeout)
            messages = self.mechanism.address(self.train_messages(ctx, Exchange(phase, at, prev), ticket,
                                                                  None if tally is None else tally.rnd), ticket)
            if tally is None:
                replies = grid.send_and_receive(messages, timeout=timeout)
            else:  # the silos not sampled get the evaluation request alone, in the same send
                sampled = set(nodes)
                others = [n for n in self.nodes.silo_nodes(grid) if n not in sampled]
                replies = grid.send_and_receive(messages + evaluation_messages(tally.rnd, w, others), timeout=timeout)
                replies = self._fold_evaluation(tally, replies, sampled, self.nodes.order.key)
                self._finish_pending(tally.result(self.prox, self.s.lr))
            updates = self.mechanism.collect(grid, rnd, phase, ticket, replies, nodes, ctx.reader, timeout, self.run_id)
            return self.received(ctx, updates)

        result = self.step(rnd, w, ask)
        if self.pending is not None:  # the step asked nothing: w's evaluation gets its own exchange
            self._evaluate_pending(grid, w, timeout)
        return self.close_round(ctx, w, result)

    def close_round(self, ctx: RoundContext, w: Params, result: StepResult) -> tuple[Params, dict[str, Any]]:
        """The model guard and the round's row, after the step returned ``result``."""
        rnd = ctx.rnd
        exchanges = ctx.exchanges
        tally = exchanges[0] if exchanges else Updates()
        for more in exchanges[1:]:
            tally = tally.merge(more)
        if len(self.refusal_reasons) < 20:
            self.refusal_reasons.update(tally.refused.values())
        skipped = False
        if result.model is None:
            if not tally:
                log(WARNING, "round %d: no silo answered with a valid update; the model is unchanged", rnd)
        elif self.accept_model(rnd, result.model):
            w = {k: np.asarray(v, dtype=np.float32) for k, v in result.model.items()}
        else:
            skipped = True
        extra_row = self.mechanism.row(tally)  # e.g. the shuffler's drops and refusal
        # signs of divergence (app/run_health.py), in the row only when they happened
        non_finite = sum(reason.startswith(f"{wire.REFUSED_NON_FINITE}:") for reason in tally.refused.values())
        if non_finite:
            extra_row["non_finite_updates"] = non_finite
        if skipped:
            extra_row["step_skipped"] = True
        row: dict[str, Any] = {
            "round": rnd, "sampled": ctx.sent, "answered": tally.answered, "refused": len(tally.refused),
            "malformed": len(tally.malformed), "failed": len(tally.errors), "missing": tally.missing,
            "eps_max": tally.eps_max(),
            "train_loss_private_batch": nan_mean([r.loss if r.loss is not None else math.nan for r in tally.metrics]),
            "uplink_floats": ctx.floats, "uploads_G": self.uploads,
        }
        return w, row | extra_row | result.row

    @staticmethod
    def _fold_evaluation(tally: EvaluationTally, replies: Any, trained: set[int],
                         order: Callable[[int], Any] = int) -> list[Message]:
        """Give ``tally`` the evaluations of one exchange: those attached to the training replies
        of the ``trained`` nodes and the evaluation replies of the others, in the server's node
        ``order`` (a sort key of a node id; strategies/node_order.py). Returns the training
        replies (the others are evaluation-only: they are not the optimiser's)."""
        training: list[Message] = []
        for msg in sorted(replies, key=lambda m: order(m.metadata.src_node_id)):
            node = msg.metadata.src_node_id
            if node not in trained:
                tally.add_message(msg)
                continue
            training.append(msg)
            if msg.has_error() or node in tally.answered:  # an error is the training reply's (counted there)
                continue
            part = wire.evaluation_of(msg.content)
            if part is not None:
                tally.add(node, part)
        return training

    def accept_model(self, rnd: int, new_w: Params) -> bool:
        """Whether ``new_w`` may become the model: finite and within float32's range (else the
        step is skipped and logged)."""
        if not model_in_range(new_w):
            log(WARNING, "round %d: the server step would leave a non-finite model (or one outside float32's "
                "range); the step is skipped and the model is unchanged", rnd)
            return False
        return True

    def evaluate(self, grid: Grid, rnd: int, w: Params, timeout: float) -> dict[str, float] | None:
        return evaluate_point(grid, rnd, w, self.layout, self.prox, self.s.lr, timeout, self.nodes.client_error,
                              nodes=self.nodes.silo_nodes(grid))

    def summary(self) -> None:
        log(INFO, "%s: %d rounds, %d of %d silos per round, lr=%g, privacy=%s eps=%g clip=%g",
            type(self).__name__, self.s.num_rounds, self.s.silos_per_round, self.s.num_silos, self.s.lr,
            self.s.privacy.mode, self.s.privacy.epsilon, self.s.privacy.clip)
