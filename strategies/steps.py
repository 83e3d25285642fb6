"""Small pieces of the round loop: the proximal step, the output iterate's reservoir sample, the
run's result, the knobs over the run config, point equality."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.algorithms.options import ProxSettings
from app.config import Settings
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


def knob_keys(knobs: dict[str, Any], group: str = "") -> dict[str, Any]:
    """``knobs`` as run-config keys: a name is a key with ``.`` and ``-`` written ``_``
    (``spider_q`` -> ``spider.q``) or, for an optimiser with an option group, a key of that group
    without its prefix (``FedProxSPIDER(q=5)``: ``spider.q``); ConfigError (one line) otherwise."""
    from app.config import SCHEMA, ConfigError

    names = {key.replace(".", "_").replace("-", "_"): key for key in SCHEMA}
    keys: dict[str, Any] = {}
    for name, value in knobs.items():
        key = names.get(name) or (names.get(f"{group}_{name}") if group else None)
        if key is None:
            own = f" (or a {group}.* key without its prefix, e.g. q)" if group else ""
            raise ConfigError(f"unknown knob {name!r}: a run-config key with '.' and '-' written '_' (e.g. spider_q){own}")
        keys[key] = value
    return keys


def with_knobs(s: Settings, knobs: dict[str, Any], group: str = "") -> Settings:
    """``s`` with run-config keys (:func:`knob_keys`) set to ``knobs``' values, each parsed and
    the whole checked as parse_settings does (ConfigError, one line)."""
    from dataclasses import replace

    from app.config import SCHEMA, _check_relations

    for key, value in knob_keys(knobs, group).items():
        attr, parser = SCHEMA[key]
        parsed = parser(key, value)
        group_name, _, field_name = attr.rpartition(".")
        s = replace(s, **({group_name: replace(getattr(s, group_name), **{field_name: parsed})} if group_name
                          else {field_name: parsed}))
    _check_relations(s)
    return s


def same_point(a: Params, b: Params) -> bool:
    """Whether two models are the same point (the same arrays, or equal ones)."""
    if a is b:
        return True
    return a.keys() == b.keys() and all(a[k] is b[k] or np.array_equal(a[k], b[k]) for k in a)


def _mean(values: list[float]) -> float:
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
