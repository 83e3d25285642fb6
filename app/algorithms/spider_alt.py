"""ISRL-DP Fed-SPIDER, the alternate form (the paper's Algorithm 11): round 1 is one fresh
``grad``; every later round has two uploads, a ``diff`` (w^1 vs w^0) then a fresh ``grad`` at w^2,
so R rounds make R gradient and R - 1 difference releases."""

from __future__ import annotations

from dataclasses import replace
from app.algorithms.base import Algorithm, AlgorithmOptions, Phase, ReleaseSpec, check_round
from app.algorithms.spider import difference_release


class FedSPIDERAlt(Algorithm):
    name = "spider-alt"

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.GRAD,) if rnd == 1 else (Phase.DIFF, Phase.GRAD)

    def release(self, phase: Phase, o: AlgorithmOptions, n: int, clip: float, count: int) -> ReleaseSpec:
        if phase == Phase.DIFF:
            return difference_release(self.batch(o, n), o.diff_clip, clip, count)
        return replace(super().release(phase, o, n, clip, count), weight=o.anchor_noise_ratio)


ALGORITHM = FedSPIDERAlt()
