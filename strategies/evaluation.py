"""Evaluation of a model on every silo: the request, the validation of each reply, the totals.

Test errors, losses and (from silos whose policy is ``open``) the full training gradients, from
which the server logs the paper's utility measure ||G_eta||. The evaluation of a round's result
usually travels in the next round's training exchange (strategies/loop.py folds it in); the
replies are validated and summed the same way either way (:class:`EvaluationTally`). The replies are the silos'
self-reported statistics: each is checked to be possible (0 <= errors <= count <= 10^12, finite
loss sums >= 0, strategies/replies.py), a refusal (a silo's evaluation policy) is counted, not an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING

import numpy as np
from flwr.app import Message, MessageType, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from app import wire
from app.prox import Prox, gradient_mapping
from strategies.node_order import by_position
from strategies.replies import check_bounded, check_evaluation_reply, flatten, mean_update


#: the EvaluateReply fields summed over silos
TOTALS = ("test_errors", "test_count", "test_loss_sum", "train_loss_sum", "train_count", "val_errors", "val_count")


class EvaluationTally:
    """The replies of one evaluation of model ``w`` (from its own exchange, or folded into a
    training exchange), validated one by one and summed; :meth:`result` gives the totals."""

    def __init__(self, rnd: int, w: Mapping[str, np.ndarray], layout: Mapping[str, tuple[int, ...]],
                 client_error: Callable[[Message, str], str]) -> None:
        self.rnd, self.w, self.layout, self.client_error = rnd, w, layout, client_error
        self.sums: dict[str, float] = {}
        self.grads: list[dict[str, np.ndarray]] = []
        self.refused = 0
        #: replies dropped because a loss or count was NaN or infinite (a diverging model)
        self.non_finite = 0
        self.answered: set[int] = set()
        #: nodes whose further replies were ignored (warned about once each)
        self.ignored: set[int] = set()

    def _ignored(self, node: int) -> None:
        if node not in self.ignored:
            self.ignored.add(node)
            log(WARNING, "round %d: ignored a second evaluation reply of node %d (and any after it)", self.rnd, node)

    def add_message(self, msg: Message) -> None:
        """A reply of the evaluation's own exchange (an error, a refusal or an evaluation reply)."""
        node = msg.metadata.src_node_id
        if node in self.answered:
            self._ignored(node)
            return
        if msg.has_error():
            self.answered.add(node)
            self.client_error(msg, "evaluate")
            return
        self.add(node, msg.content)

    def add(self, node: int, content: RecordDict) -> None:
        """Node ``node``'s evaluation reply ``content`` (or its refusal); a malformed one is dropped."""
        if node in self.answered:
            self._ignored(node)
            return
        self.answered.add(node)
        rnd = self.rnd
        if wire.Refusal.decode(content) is not None:  # the silo's policy (evaluation off, or budget)
            self.refused += 1
            return
        try:
            reply, dropped = wire.EvaluateReply.decode(content, self.layout)
            check_evaluation_reply(reply)
        except wire.ReplyError as exc:
            log(WARNING, "round %d: dropped evaluation reply of node %d: %s", rnd, node, exc)
            self.non_finite += isinstance(exc, wire.NonFiniteReply)
            return
        if dropped:
            log(WARNING, "round %d: dropped training gradient of node %d: %s", rnd, node, dropped)
        elif reply.gradient is not None:
            try:
                check_bounded(wire.TRAIN_GRADIENT, flatten(reply.gradient))
                self.grads.append(dict(reply.gradient))
            except wire.ReplyError as exc:
                log(WARNING, "round %d: dropped training gradient of node %d: %s", rnd, node, exc)
        val = (reply.val_errors or 0.0, reply.val_count or 0.0)
        if not (math.isfinite(val[0]) and math.isfinite(val[1]) and 0 <= val[0] <= val[1]):
            log(WARNING, "round %d: ignored the validation counts of node %d: %s", rnd, node, val)
            val = (0.0, 0.0)
        for name in TOTALS:
            value = {"val_errors": val[0], "val_count": val[1]}.get(name, getattr(reply, name))
            self.sums[name] = self.sums.get(name, 0.0) + value

    def result(self, prox: Prox, lr: float) -> dict[str, float] | None:
        """Test error and loss, training loss, validation error and ||G_eta|| (None when no silo
        answered), and ``non_finite_evaluations`` (only when some silo's reply was dropped for a
        NaN or infinite number: app/run_health.py reads it as a sign of divergence)."""
        sums = self.sums
        if self.refused:
            log(INFO, "round %d: %d silo node(s) declined evaluation by their policy", self.rnd, self.refused)
        flag: dict[str, float] = {"non_finite_evaluations": self.non_finite} if self.non_finite else {}
        if not sums or sums.get("test_count", 0) <= 0:
            return flag or None
        out = {"test_error": sums["test_errors"] / sums["test_count"],
               "test_loss": sums["test_loss_sum"] / sums["test_count"],
               "train_loss": sums["train_loss_sum"] / max(sums["train_count"], 1.0)} | flag
        if self.grads:
            # grad F0 = (1/N) sum_i grad F_i (uniform over silos, the objective the server optimises)
            out["grad_mapping_norm_eval"] = gradient_mapping(dict(self.w), mean_update(self.grads), prox, lr)
        if sums.get("val_count", 0) > 0:
            out["val_error"] = sums["val_errors"] / sums["val_count"]
        return out


def evaluation_messages(rnd: int, w: Mapping[str, np.ndarray], nodes: Iterable[int]) -> list[Message]:
    """The evaluation request of model ``w`` (round ``rnd``'s result) to each of ``nodes``, in
    their order (the server's node order, strategies/node_order.py)."""
    request = wire.EvaluateRequest(rnd, w, train_gradient=True).encode()
    return [Message(request, dst_node_id=n, message_type=MessageType.EVALUATE) for n in nodes]


def evaluate_point(grid: Grid, rnd: int, w: Mapping[str, np.ndarray], layout: Mapping[str, tuple[int, ...]],
                   prox: Prox, lr: float, timeout: float, client_error: Callable[[Message, str], str],
                   nodes: Iterable[int] | None = None) -> dict[str, float] | None:
    """Evaluate ``w`` on every silo node in an exchange of its own: test error and loss,
    training loss, validation error and the gradient mapping ||G_eta|| from the silos' full
    training gradients (None when no silo answered). ``nodes``: the silo nodes (default: every
    node, by node id); the replies are summed in the order of ``nodes``."""
    order = sorted(grid.get_node_ids()) if nodes is None else list(nodes)
    messages = evaluation_messages(rnd, w, order)
    tally = EvaluationTally(rnd, w, layout, client_error)
    for msg in sorted(grid.send_and_receive(messages, timeout=timeout), key=by_position(order)):
        tally.add_message(msg)
    return tally.result(prox, lr)
