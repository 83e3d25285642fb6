"""The optimiser's options (``algorithm``, the model, rounds, step size, batch, ``prox.*``),
declared once (app/options.py). An algorithm's own knobs are declared in its module (``spider.*``
in spider.py). Light: no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.options import ConfigError, choice, int_list, number, option
from app.prox import PROX_KINDS

#: old algorithm names still accepted: "gradbant" ran the robust line with any ``aggregator``
#: (Grad-BANT is the default rule), so ``algorithm=gradbant aggregator=krum`` ran Krum
ALGORITHM_ALIASES = {"gradbant": "robust"}
#: = app.models.MODELS (a copy: that package imports torch; tests/test_registries.py)
MODELS = ("logistic", "mlp", "lenet5", "resnet18")
#: which iterate the run returns: the last one, or one drawn uniformly from w_1..w_R (the paper's w_priv).
OUTPUTS = ("last", "random")


def parse_algorithm(key: str, value: Any) -> str:
    """A registered algorithm (app/algorithms/), or an old name of one (:data:`ALGORITHM_ALIASES`)."""
    from app.algorithms import ALGORITHMS

    if isinstance(value, str) and value in ALGORITHM_ALIASES:
        return ALGORITHM_ALIASES[value]
    return choice(tuple(ALGORITHMS))(key, value)


def parse_model(key: str, value: Any) -> str:
    """A zoo model, or your own (app/models/custom.py): an import path or an entry-point name."""
    from app.model_spec import check_model_spec  # no torch: the spec's form only

    choice()(key, value)
    if value in MODELS:
        return value
    return check_model_spec(key, value, MODELS, ConfigError)


def parse_model_kwargs(key: str, value: Any) -> str:
    """Your own model's keyword arguments: a JSON object, stored as canonical JSON ("" = none)."""
    from app.model_spec import parse_model_kwargs as parse

    return parse(key, choice()(key, value), ConfigError)


@dataclass(frozen=True)
class TrainingOptions:
    """The top-level training options of app.config.Settings."""

    algorithm: str = option("algorithm", parse_algorithm, "mbsgd", "the optimiser (app/algorithms/)")
    model: str = option("model", parse_model, "preset", "the model")
    model_hidden: tuple[int, ...] = option("mlp-hidden", int_list(1, '"64" or "128,64"',
                                                                  "positive integers (layer widths)"),
                                           "preset", "the MLP's hidden widths")
    #: your own model's keyword arguments, as canonical JSON ("" = none; app/models/custom.py)
    model_kwargs: str = option("model-kwargs", parse_model_kwargs, "", "your own model's keyword arguments (JSON)")
    num_rounds: int = option("num-rounds", number(1, 1_000_000, integer=True), "preset", "R, the rounds")
    lr: float = option("lr", number(0, None, lo_open=True), "preset", "the step size")
    batch_size: int = option("batch-size", number(0, None, integer=True), "preset",
                             "K, the records of each release (0: the algorithm's default)")
    local_steps: int = option("local-steps", number(1, 100_000, integer=True), "preset", "Q, local steps per round")
    seed: int = option("seed", number(0, 2**62, integer=True), 0, "the run seed")
    eval_every: int = option("eval-every", number(0, None, integer=True), 1, "evaluate every this many rounds")
    diff_clip: float = option("diff-clip", number(0, None), "preset",
                              "C_diff > 0 clips each per-record gradient difference at C_diff")
    output: str = option("output", choice(OUTPUTS), "last", "the run's output: the last or a random iterate")
    #: app/algorithms/momentum.py: each silo sends m_t = beta m_{t-1} + (1 - beta) g_t of its own releases
    client_momentum: float = option("client-momentum", number(0, 1, hi_open=True), 0.0,
                                    "beta of each silo's momentum over its own privatised releases (0: none)")


@dataclass(frozen=True)
class ProxSettings:
    """The composite loss's f1 (app/prox.py): ``prox.kind``, its ``strength`` and elastic net's ``l2``."""

    kind: str = option("prox.kind", choice(PROX_KINDS), "none", "f1 of the composite loss, the server's prox step")
    strength: float = option("prox.strength", number(0, None), 0.0, "the weight (radius, bound) of f1")
    l2: float = option("prox.l2", number(0, None), 0.0, "the L2 weight of elastic-net")
