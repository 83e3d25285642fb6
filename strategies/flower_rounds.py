"""Flower's five ``Strategy`` methods on top of an optimiser's generator of exchanges, so that a
one-exchange optimiser (MB-SGD, Prox-SGD, local SGD, SPIDER, SVRG, PL-SVRG, Byzantine-robust,
with any aggregation rule) runs under Flower's own ``Strategy.start``:

* ``configure_train``: sample the round's silos (the paper's Assumption 3), start the round's
  generator and send its first :class:`~strategies.exchange.Exchange` as a typed instruction;
* ``aggregate_train``: validate and decode the replies (``ReplyReader``: the server's own node
  ids, never a reply's word), send them into the generator, guard the model, keep the row;
* ``configure_evaluate``/``aggregate_evaluate``: in the rounds ``eval-every`` says (and the last,
  ``num-rounds``), evaluate the new model on every silo node in an exchange of its own, which is
  what silofl's driver (strategies/loop.py ``run``) gives with folded evaluation: the same rows.

``train_config``/``evaluate_config`` are not used: silofl's typed instruction carries everything a
silo needs (its phase, points, sketch, local steps), from the strategy's settings; ``num_rounds``
should be the settings' ``num-rounds`` (the last round's evaluation, and each silo's privacy
calibration, are planned for it). Flower's ``start`` returns the last iterate (``output`` = random is silofl's driver's); a round
with a ClientApp failure stops it as it stops silofl's driver (``fail-on-client-error``). What only
silofl's driver does: waiting for nodes with ``node-wait``, checkpoints and resume, evaluation
folded into the next exchange, the shuffler relay (shuffle DP) and rounds of several exchanges
(Fed-SPIDER-alt): those are refused here with one line.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.evaluation import EvaluationTally, evaluation_messages
from strategies.exchange import MultiExchangeRound, Round, RoundContext, StepResult

if TYPE_CHECKING:
    from strategies.nodes import SiloNodes
    from strategies.replies import Params
    from strategies.server_mechanism import ServerMechanism


def params_of(arrays: ArrayRecord) -> Params:
    """An ArrayRecord as the loop's model: name -> float32 array."""
    return {k: np.asarray(a.numpy(), dtype=np.float32) for k, a in arrays.items()}


def record_of(w: Params) -> ArrayRecord:
    """The loop's model as an ArrayRecord (the same names, order and values)."""
    return ArrayRecord({k: Array(np.asarray(v, dtype=np.float32)) for k, v in w.items()})


def metrics_of(row: dict[str, Any]) -> MetricRecord:
    """The row's numbers (ints and floats; not flags, dicts or None) as a MetricRecord."""
    return MetricRecord({k: v for k, v in row.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})


@dataclass
class _OpenRound:
    ctx: RoundContext
    w: Params
    gen: Round
    t0: float
    failures_before: int
    result: StepResult | None = None
    row: dict[str, Any] | None = None
    tally: EvaluationTally | None = None


class FlowerRounds(Strategy):
    """The Flower ``Strategy`` face of :class:`~strategies.loop.FederatedOptimizer`, the one class
    that subclasses it: what it reads of the optimiser is declared here."""

    s: Any  # the run's settings (app.config.Settings)
    layout: dict[str, tuple[int, ...]]
    nodes: SiloNodes
    mechanism: ServerMechanism
    prox: Any
    _flower_open: _OpenRound | None = None
    _flower_ready: bool = False

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Any = None) -> Any:
        """Flower's ``Strategy.start``, once the model's layout is bound (from ``initial_arrays``
        when the constructor had none) and ``num_rounds`` is at most the rounds the optimiser was
        planned for (``num-rounds``: the silos' privacy calibration, the noise-aware allowance
        and the last round's evaluation are planned for it; fewer is stopping early)."""
        if not self.layout:
            self.bind_layout({k: tuple(a.shape) for k, a in initial_arrays.items()})
        if num_rounds > self.s.num_rounds:
            raise ValueError(f"start(num_rounds={num_rounds}) but {type(self).__name__} was planned for num-rounds = "
                             f"{self.s.num_rounds} (the silos' privacy calibration and the last evaluation use it): "
                             f"pass num_rounds={num_rounds} to the constructor as well")
        return super().start(grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Round ``server_round``'s first exchange, to the sampled silos."""
        if not self.mechanism.under_flower_start:
            raise MultiExchangeRound(f"privacy.mode = {self.s.privacy.mode} needs message rounds of its own (the "
                                     "shuffler relay, secure aggregation's keys, shares and unmasking): run the "
                                     "strategy with silofl's driver (FederatedOptimizer.run), not Strategy.start")
        if not self._flower_ready:  # once: the silo nodes, then the optimiser's preparation
            self.nodes.wait_for_nodes(grid, at_start=True)
            self.prepare(grid, self.s.round_timeout)
            self._flower_ready = True
        w = params_of(arrays)
        ctx = self.open_round(grid, server_round)
        gen = self.exchanges(server_round, w)
        self._flower_open = op = _OpenRound(ctx, w, gen, time.perf_counter(), len(self.nodes.client_errors))
        try:
            ex = next(gen)
        except StopIteration as stop:  # a round that asks nothing
            op.result = self.finish_step(stop.value)
            return []
        return self.train_messages(ctx, ex)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The replies into the round's generator; the guarded step; the round's row."""
        op = self._flower_open
        if op is None or op.ctx.rnd != server_round:
            raise RuntimeError(f"aggregate_train({server_round}) without its configure_train")
        if op.result is None:
            updates = self.received(op.ctx, op.ctx.reader.classify(server_round, list(replies), op.ctx.nodes))
            try:
                op.gen.send(updates)
            except StopIteration as stop:
                op.result = self.finish_step(stop.value)
            else:
                op.gen.close()
                raise MultiExchangeRound(f"{type(self).__name__} asks more than one exchange in round {server_round}: "
                                         "run it with silofl's driver (FederatedOptimizer.run), not Strategy.start")
        w, row = self.close_round(op.ctx, op.w, op.result)
        if self.s.output == "random":
            self.sampler.offer(server_round, w)
        op.w, op.row = w, row
        return record_of(w), metrics_of(row)

    def _evaluates(self, server_round: int) -> bool:
        every = self.s.eval_every
        return bool(every) and (server_round % every == 0 or server_round == self.s.num_rounds)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """In an evaluation round: the new model's evaluation request to every silo node."""
        op = self._flower_open
        if op is None or op.row is None:
            return []
        if not self._evaluates(server_round):
            self._close_row(op, None)
            return []
        w = params_of(arrays)
        op.tally = EvaluationTally(server_round, w, self.layout, self.nodes.client_error)
        return evaluation_messages(server_round, w, self.nodes.silo_nodes(grid))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The evaluation's totals (test error and loss, training loss, ||G_eta||), into the row."""
        op = self._flower_open
        if op is None or op.tally is None:
            return None
        for msg in sorted(replies, key=lambda m: self.nodes.order.key(m.metadata.src_node_id)):
            op.tally.add_message(msg)
        ev = op.tally.result(self.prox, self.s.lr)
        self._close_row(op, ev)
        return metrics_of(ev) if ev else None

    def _close_row(self, op: _OpenRound, ev: dict[str, float] | None) -> None:
        assert op.row is not None
        row = op.row | (ev or {})
        row["wall_s"] = time.perf_counter() - op.t0
        self._flower_open = None
        self._record(row)
        self.nodes.stop_on_new_failures(row['round'], op.failures_before)


def initial_model(s: Any, seed_name: str = "init") -> tuple[dict[str, tuple[int, ...]], ArrayRecord]:
    """The run's model at its seeded initialisation: (layout, arrays), as silofl's ServerApp
    starts it (app/server_app.py)."""
    from app.data.federated import dataset_meta
    from app.models import build_model
    from app.seeding import torch_gen

    shape, classes = dataset_meta(s)
    model = build_model(s.model, shape, classes, hidden=s.model_hidden, generator=torch_gen(s.seed, seed_name),
                        kwargs=s.model_kwargs)
    w = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    return {k: tuple(v.shape) for k, v in w.items()}, record_of(w)
