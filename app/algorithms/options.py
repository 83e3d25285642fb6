"""The optimiser's options (``algorithm``, the model, rounds, step size, batch, ``prox.*``),
declared once (app/options.py). An algorithm's own knobs are declared in its module (``spider.*``
in spider.py). Light: no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.options import choice, int_list, number, option
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


@dataclass(frozen=True)
class TrainingOptions:
    """The top-level training options of app.config.Settings."""

    algorithm: str = option("algorithm", parse_algorithm, "mbsgd", "the optimiser (app/algorithms/)")
    model: str = option("model", choice(MODELS), "preset", "the model")
    model_hidden: tuple[int, ...] = option("mlp-hidden", int_list(1, '"64" or "128,64"',
                                                                  "positive integers (layer widths)"),
                                           "preset", "the MLP's hidden widths")
    num_rounds: int = option("num-rounds", number(1, 1_000_000, integer=True), "preset", "R, the rounds")
    lr: float = option("lr", number(0, None, lo_open=True), "preset", "the step size")
    batch_size: int = option("batch-size", number(0, None, integer=True), "preset",
                             "K, the records of each release (0: the algorithm's default)")
    local_steps: int = option("local-steps", number(1, 100_000, integer=True), "preset", "Q, local steps per round")
    seed: int = option("seed", number(0, 2**62, integer=True), 0, "the run seed")
    eval_every: int = option("eval-every", number(0, None, integer=True), 1, "evaluate every this many rounds")
    diff_clip: float = option("diff-clip", number(0, None), 0.0,
                              "C_diff > 0 clips each per-record gradient difference at C_diff")
    output: str = option("output", choice(OUTPUTS), "last", "the run's output: the last or a random iterate")


@dataclass(frozen=True)
class ProxSettings:
    """The composite loss's f1 (app/prox.py): ``prox.kind``, its ``strength`` and elastic net's ``l2``."""

    kind: str = option("prox.kind", choice(PROX_KINDS), "none", "f1 of the composite loss, the server's prox step")
    strength: float = option("prox.strength", number(0, None), 0.0, "the weight (radius, bound) of f1")
    l2: float = option("prox.l2", number(0, None), 0.0, "the L2 weight of elastic-net")
