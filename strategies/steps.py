"""Small pieces of the round loop: the proximal step, the output iterate's reservoir sample, the
run's result, point equality."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from app.algorithms.options import ProxSettings
from app.prox import Prox, make_prox
from strategies.replies import Params


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


@dataclass
class RunResult:
    """The run's output iterate, the round it comes from, and its evaluation (output = random)."""

    model: Params
    round: int
    metrics: dict[str, float] = field(default_factory=dict)


def same_point(a: Params, b: Params) -> bool:
    """Whether two models are the same point (the same arrays, or equal ones)."""
    if a is b:
        return True
    return a.keys() == b.keys() and all(a[k] is b[k] or np.array_equal(a[k], b[k]) for k in a)


def nan_mean(values: list[float]) -> float:
    """The mean of the values that are not NaN; NaN when there are none."""
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def composite_prox(prox: ProxSettings) -> Prox:
    """prox_{eta f1} for the run's composite loss (``prox.kind``, ``prox.strength``, ``prox.l2``)."""
    extra = {"l2": prox.l2} if prox.kind == "elastic-net" else {}
    return make_prox(prox.kind, prox.strength, **extra)


def prox_step(prox: Prox, w: Params, direction: Params, lr: float) -> Params:
    """prox_{eta f1}(w - eta * direction). A step out of float32's range comes out non-finite
    without a warning: the loop's guard skips it and logs it."""
    with np.errstate(over="ignore", invalid="ignore"):
        return prox({k: w[k] - lr * direction[k] for k in w}, lr)
