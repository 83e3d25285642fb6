"""ISRL-DP Fed-SPIDER, the alternate form (the paper's Algorithm 11): round 1 is one fresh
``grad``; every later round has two uploads, a ``diff`` (w^1 vs w^0) then a fresh ``grad`` at w^2,
so R rounds make R gradient and R - 1 difference releases."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from app.algorithms.base import Algorithm, Phase, ReleaseSpec, check_round
from app.algorithms.spider import difference_release

if TYPE_CHECKING:
    from app.config import Settings


class FedSPIDERAlt(Algorithm):
    name = "spider-alt"

    def round_phases(self, s: Settings, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.GRAD,) if rnd == 1 else (Phase.DIFF, Phase.GRAD)

    def release(self, phase: Phase, s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
        if phase == Phase.DIFF:
            return difference_release(s, n, clip, count)
        return replace(super().release(phase, s, n, clip, count), weight=s.privacy.anchor_noise_ratio)


ALGORITHM = FedSPIDERAlt()
