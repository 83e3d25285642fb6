"""What an algorithm is, as both sides read it: its release kinds (phases), its round schedule
and the silo's release plan. Base layer: no Flower, no torch.

An :class:`Algorithm` answers three questions:

* ``round_phases(s, rnd)``: which releases round ``rnd`` asks each sampled silo for, in order
  (no dropout). The server's strategy follows it (apart from the extra anchors it asks for after
  a round in which no silo answered); each silo counts it to plan its noise before round 1.
* ``release(phase, s, n, clip, count)``: the :class:`ReleaseSpec` of ``count`` releases of one
  kind by a silo with n records: its batch K, replace-one sensitivity and budget-split weight.
* ``prox_step``: whether the server step is a prox step (composite losses, ``prox.kind``).

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
    from app.config import Settings


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


class Algorithm:
    """Defaults shared by the gradient-release algorithms; each module overrides what differs."""

    name: str = ""
    #: the server step is prox_{eta f1}(w - eta * estimate) (composite losses allowed)
    prox_step: bool = True

    def round_phases(self, s: Settings, rnd: int) -> tuple[Phase, ...]:
        raise NotImplementedError

    def default_batch(self, s: Settings, n: int) -> int:
        """K when ``batch-size`` is 0: the full batch."""
        return n

    def release(self, phase: Phase, s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
        """A gradient release on the silo's batch of K = ``s.batch_for(n)`` records."""
        batch = s.batch_for(n)
        return ReleaseSpec(phase, batch, count, mean_sensitivity(clip, batch))


def check_round(rnd: int) -> None:
    if rnd < 1:
        raise ValueError(f"rounds are numbered from 1, got {rnd}")


def planned_release_counts(algorithm: Algorithm, s: Settings, rounds: int) -> Counter[Phase]:
    """How many releases of each phase a silo sampled in every one of ``rounds`` rounds makes."""
    counts: Counter[Phase] = Counter()
    for rnd in range(1, rounds + 1):
        counts.update(algorithm.round_phases(s, rnd))
    return counts


def release_plan(algorithm: Algorithm, s: Settings, n: int, clip: float, evaluations: int = 0,
                 evaluation_weight: float = 1.0) -> list[ReleaseSpec]:
    """Every kind of release ``algorithm`` will ask a silo with n records for over
    ``planned_rounds`` rounds (the silo plans for being sampled in every round), plus
    ``evaluations`` private evaluations, ordered by kind. z is filled in by calibration;
    ``weight`` is each kind's relative noise multiplier (the budget split)."""
    counts: Counter[Phase] = planned_release_counts(algorithm, s, s.planned_rounds())
    if evaluations:
        counts[Phase.EVAL] = evaluations
    return [ReleaseSpec(Phase.EVAL, n, count, EVAL_SENSITIVITY, weight=evaluation_weight) if phase == Phase.EVAL
            else algorithm.release(phase, s, n, clip, count) for phase, count in sorted(counts.items())]


def evaluation_rounds(s: Settings) -> list[int]:
    """The rounds after which the server evaluates the model (``eval-every``; always the last)."""
    if not s.eval_every:
        return []
    return [r for r in range(1, s.num_rounds + 1) if r % s.eval_every == 0 or r == s.num_rounds]


def planned_evaluations(s: Settings) -> int:
    """How many evaluation requests a silo plans for: one per evaluation round, plus one of the
    output iterate when ``output`` = random. A silo answering privately calibrates for these."""
    rounds = len(evaluation_rounds(s))
    return rounds + (1 if rounds and s.output == "random" else 0)
