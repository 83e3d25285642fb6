"""What an algorithm is, as both sides read it: its release kinds (phases), its round schedule
and the silo's release plan. Base layer: no Flower, no torch.

An :class:`Algorithm` answers three questions:

* ``round_phases(o, rnd)``: which releases round ``rnd`` asks each sampled silo for, in order
  (no dropout). The server's strategy follows it (apart from the extra anchors it asks for after
  a round in which no silo answered); each silo counts it to plan its noise before round 1.
* ``release(phase, o, n, clip, count)``: the :class:`ReleaseSpec` of ``count`` releases of one
  kind by a silo with n records: its batch K, replace-one sensitivity and budget-split weight.
* ``prox_step``: whether the server step is a prox step (composite losses, ``prox.kind``).
* ``shuffle_form``: whether it has a shuffle-DP form (its server step needs only the mean of the
  silos' releases, all the shuffler gives).
* ``rule_step``: whether the server step is its aggregation rule (the robust line): its default
  rule is Grad-BANT and even the mean weighs each message (strategies/options.py).

``o`` is the run's :class:`AlgorithmOptions`: only what an algorithm reads (R, K, Q, ...), built by
the entrypoint from its settings (``Settings.algorithm_options()``); no algorithm sees the root settings.

Adding an algorithm: a module here with an ``ALGORITHM`` instance (found by the registry in
``app/algorithms/__init__.py``), its server step in ``strategies/`` and ``conf/algorithm/<name>.yaml``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from app.privacy.sensitivity import EVAL_SENSITIVITY, mean_sensitivity

if TYPE_CHECKING:
    from app.algorithms.plsvrg import PLSVRGSettings
    from app.algorithms.spider import SpiderSettings
    from app.algorithms.svrg import SVRGSettings


class Phase(StrEnum):
    """A kind of release a silo makes (the wire's ``phase`` and the ledger's ``kind``)."""

    GRAD = "grad"  # noisy clipped minibatch gradient
    LOCAL = "local"  # Q noisy local SGD steps; the message is the model change
    ANCHOR = "anchor"  # SPIDER's K1-record anchor / SVRG's snapshot gradient
    DIFF = "diff"  # noisy difference of gradients at two points on one batch
    DISJOINT = "disjoint"  # Prox-SGD: the gradient on the round's own block of records
    EVAL = "eval"  # a private evaluation (node config evaluation = private); never a training phase


#: the phases a training instruction may ask for
TRAINING_PHASES: tuple[Phase, ...] = (Phase.GRAD, Phase.LOCAL, Phase.ANCHOR, Phase.DIFF, Phase.DISJOINT)


@dataclass(frozen=True)
class ReleaseSpec:
    """One kind of release the silo plans: K records, how many times, its replace-one L2
    sensitivity, and the calibrated noise multiplier z (sigma = z * sensitivity)."""

    phase: Phase
    batch: int
    count: int
    sensitivity: float
    noise_multiplier: float = 0.0
    weight: float = 1.0
    disjoint: bool = False
    #: shuffle DP: the noise trials of the exchange's total this release is calibrated for
    trials: int = 0

    @property
    def sigma(self) -> float:
        """Noise standard deviation; 0 without privacy (z = 0, and no clipping: infinite sensitivity)."""
        return 0.0 if self.noise_multiplier == 0 else self.noise_multiplier * self.sensitivity


@dataclass(frozen=True, kw_only=True)
class AlgorithmOptions:
    """What an algorithm reads of a run to plan its releases: R, the rounds a silo plans its noise
    for, K (``batch-size``; 0: the algorithm's default), Q (``local-steps``), C_diff
    (``diff-clip``), the anchors' budget split (``privacy.anchor-noise-ratio``) and the algorithms'
    own groups (``spider.*``, ``svrg.*``, ``plsvrg.*``). Every field is required: the entrypoint
    builds it from the run's settings (``Settings.algorithm_options()``), so no default is copied."""

    num_rounds: int
    #: ``privacy.planned-rounds``, or R when it is 0
    planned_rounds: int
    batch_size: int
    local_steps: int
    diff_clip: float
    anchor_noise_ratio: float
    spider: SpiderSettings
    svrg: SVRGSettings
    plsvrg: PLSVRGSettings


class Algorithm:
    """Defaults shared by the gradient-release algorithms; each module overrides what differs."""

    name: str = ""
    #: the server step is prox_{eta f1}(w - eta * estimate) (composite losses allowed)
    prox_step: bool = True
    rule_step: bool = False
    shuffle_form: bool = False

    def weighs_each_message(self, rule: str) -> bool:
        """Whether the server's step weighs each silo's message under aggregation ``rule`` (a rule
        other than the mean, or any rule when the step is the rule), so the rule sees every reply."""
        return rule != "mean" or self.rule_step

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        raise NotImplementedError

    def default_batch(self, o: AlgorithmOptions, n: int) -> int:
        """K when ``batch-size`` is 0: the full batch."""
        return n

    def batch(self, o: AlgorithmOptions, n: int) -> int:
        """K for a silo with n training records: ``batch-size``, or when it is 0 the algorithm's
        default (:meth:`default_batch`)."""
        return o.batch_size or self.default_batch(o, n)

    def release(self, phase: Phase, o: AlgorithmOptions, n: int, clip: float, count: int) -> ReleaseSpec:
        """A gradient release on the silo's batch of K = :meth:`batch` records."""
        batch = self.batch(o, n)
        return ReleaseSpec(phase, batch, count, mean_sensitivity(clip, batch))


def check_round(rnd: int) -> None:
    if rnd < 1:
        raise ValueError(f"rounds are numbered from 1, got {rnd}")


def planned_release_counts(algorithm: Algorithm, o: AlgorithmOptions, rounds: int) -> Counter[Phase]:
    """How many releases of each phase a silo sampled in every one of ``rounds`` rounds makes."""
    counts: Counter[Phase] = Counter()
    for rnd in range(1, rounds + 1):
        counts.update(algorithm.round_phases(o, rnd))
    return counts


def release_plan(algorithm: Algorithm, o: AlgorithmOptions, n: int, clip: float, evaluations: int = 0,
                 evaluation_weight: float = 1.0) -> list[ReleaseSpec]:
    """Every kind of release ``algorithm`` will ask a silo with n records for over
    ``planned_rounds`` rounds (the silo plans for being sampled in every round), plus
    ``evaluations`` private evaluations, ordered by kind. z is filled in by calibration;
    ``weight`` is each kind's relative noise multiplier (the budget split)."""
    counts: Counter[Phase] = planned_release_counts(algorithm, o, o.planned_rounds)
    if evaluations:
        counts[Phase.EVAL] = evaluations
    return [ReleaseSpec(Phase.EVAL, n, count, EVAL_SENSITIVITY, weight=evaluation_weight) if phase == Phase.EVAL
            else algorithm.release(phase, o, n, clip, count) for phase, count in sorted(counts.items())]


def evaluation_rounds(eval_every: int, num_rounds: int) -> list[int]:
    """The rounds after which the server evaluates the model: every ``eval-every``-th of the R =
    ``num_rounds`` rounds, and always the last (none when ``eval_every`` is 0)."""
    if not eval_every:
        return []
    return [r for r in range(1, num_rounds + 1) if r % eval_every == 0 or r == num_rounds]


def planned_evaluations(eval_every: int, num_rounds: int, output: str) -> int:
    """How many evaluation requests a silo plans for: one per evaluation round, plus one of the
    output iterate when ``output`` = random. A silo answering privately calibrates for these."""
    rounds = len(evaluation_rounds(eval_every, num_rounds))
    return rounds + (1 if rounds and output == "random" else 0)
