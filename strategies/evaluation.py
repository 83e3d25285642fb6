"""Evaluation of a model on every silo: the request, the validation of each reply, the totals.

Test errors, losses and (from silos whose policy is ``open``) the full training gradients, from
which the server logs the paper's utility measure ||G_eta||. The replies are the silos'
self-reported statistics: each is checked to be possible (0 <= errors <= count <= 10^12, finite
loss sums >= 0, strategies/replies.py), a refusal (a silo's evaluation policy) is counted, not an error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING

import numpy as np
from flwr.app import Message, MessageType
from flwr.common import log
from flwr.serverapp import Grid

from app import wire
from app.prox import Prox, gradient_mapping
from strategies.replies import check_bounded, check_evaluation_reply, flatten, mean_update


#: the EvaluateReply fields summed over silos
TOTALS = ("test_errors", "test_count", "test_loss_sum", "train_loss_sum", "train_count", "val_errors", "val_count")


def evaluate_point(grid: Grid, rnd: int, w: Mapping[str, np.ndarray], layout: Mapping[str, tuple[int, ...]],
                   prox: Prox, lr: float, timeout: float, client_error: Callable[[Message, str], str],
                   nodes: Iterable[int] | None = None) -> dict[str, float] | None:
    """Evaluate ``w`` on every silo node: test error and loss, training loss, validation error
    and the gradient mapping ||G_eta|| from the silos' full training gradients (None when no
    silo answered). ``nodes``: the silo nodes (default: every node)."""
    request = wire.EvaluateRequest(rnd, w, train_gradient=True).encode()
    targets = sorted(grid.get_node_ids() if nodes is None else nodes)
    messages = [Message(request, dst_node_id=n, message_type=MessageType.EVALUATE) for n in targets]
    sums: dict[str, float] = {}
    grads: list[dict[str, np.ndarray]] = []
    refused = 0
    answered: set[int] = set()
    for msg in sorted(grid.send_and_receive(messages, timeout=timeout), key=lambda m: m.metadata.src_node_id):
        node = msg.metadata.src_node_id
        if node in answered:
            log(WARNING, "round %d: ignored a second evaluation reply of node %d", rnd, node)
            continue
        answered.add(node)
        if msg.has_error():
            client_error(msg, "evaluate")
            continue
        if wire.Refusal.decode(msg.content) is not None:  # the silo's policy (evaluation off, or budget)
            refused += 1
            continue
        try:
            reply, dropped = wire.EvaluateReply.decode(msg.content, layout)
            check_evaluation_reply(reply)
        except wire.ReplyError as exc:
            log(WARNING, "round %d: dropped evaluation reply of node %d: %s", rnd, node, exc)
            continue
        if dropped:
            log(WARNING, "round %d: dropped training gradient of node %d: %s", rnd, node, dropped)
        elif reply.gradient is not None:
            try:
                check_bounded(wire.TRAIN_GRADIENT, flatten(reply.gradient))
                grads.append(dict(reply.gradient))
            except wire.ReplyError as exc:
                log(WARNING, "round %d: dropped training gradient of node %d: %s", rnd, node, exc)
        val = (reply.val_errors or 0.0, reply.val_count or 0.0)
        if not (math.isfinite(val[0]) and math.isfinite(val[1]) and 0 <= val[0] <= val[1]):
            log(WARNING, "round %d: ignored the validation counts of node %d: %s", rnd, node, val)
            val = (0.0, 0.0)
        for name in TOTALS:
            value = {"val_errors": val[0], "val_count": val[1]}.get(name, getattr(reply, name))
            sums[name] = sums.get(name, 0.0) + value
    if refused:
        log(INFO, "round %d: %d silo node(s) declined evaluation by their policy", rnd, refused)
    if not sums or sums.get("test_count", 0) <= 0:
        return None
    out = {"test_error": sums["test_errors"] / sums["test_count"],
           "test_loss": sums["test_loss_sum"] / sums["test_count"],
           "train_loss": sums["train_loss_sum"] / max(sums["train_count"], 1.0)}
    if grads:
        # grad F0 = (1/N) sum_i grad F_i (uniform over silos, the objective the server optimises)
        out["grad_mapping_norm_eval"] = gradient_mapping(dict(w), mean_update(grads), prox, lr)
    if sums.get("val_count", 0) > 0:
        out["val_error"] = sums["val_errors"] / sums["val_count"]
    return out
