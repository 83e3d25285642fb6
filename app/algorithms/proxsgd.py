"""Noisy Prox-SGD (the paper's Algorithm 6): ``disjoint`` every round, the gradient on the
round's own block of K = floor(n / R) records of a secret permutation (parallel composition)."""

from __future__ import annotations

from app.algorithms.base import Algorithm, AlgorithmOptions, Phase, ReleaseSpec, check_round
from app.privacy.sensitivity import mean_sensitivity


class NoisyProxSGD(Algorithm):
    name = "proxsgd"
    shuffle_form = True

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.DISJOINT,)

    def default_batch(self, o: AlgorithmOptions, n: int) -> int:
        """batch-size 0 means K = floor(n / R): the R (planned) rounds use disjoint blocks."""
        return n // o.planned_rounds

    def release(self, phase: Phase, o: AlgorithmOptions, n: int, clip: float, count: int) -> ReleaseSpec:
        batch = self.batch(o, n)
        return ReleaseSpec(Phase.DISJOINT, batch, count, mean_sensitivity(clip, batch), disjoint=True)


ALGORITHM = NoisyProxSGD()
