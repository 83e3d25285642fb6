"""Noisy Prox-SGD (the paper's Algorithm 6): ``disjoint`` every round, the gradient on the
round's own block of K = floor(n / R) records of a secret permutation (parallel composition)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.algorithms.base import Algorithm, Phase, ReleaseSpec, check_round
from app.privacy.sensitivity import mean_sensitivity

if TYPE_CHECKING:
    from app.config import Settings


class NoisyProxSGD(Algorithm):
    name = "proxsgd"

    def round_phases(self, s: Settings, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.DISJOINT,)

    def default_batch(self, s: Settings, n: int) -> int:
        """batch-size 0 means K = floor(n / R): the R rounds use disjoint blocks."""
        return n // s.planned_rounds()

    def release(self, phase: Phase, s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
        batch = s.batch_for(n)
        return ReleaseSpec(Phase.DISJOINT, batch, count, mean_sensitivity(clip, batch), disjoint=True)


ALGORITHM = NoisyProxSGD()
