"""(ISRL-DP) minibatch SGD: a noisy clipped minibatch gradient every round (``grad``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.algorithms.base import Algorithm, Phase, check_round

if TYPE_CHECKING:
    from app.config import Settings


class MinibatchSGD(Algorithm):
    name = "mbsgd"

    def round_phases(self, s: Settings, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.GRAD,)


ALGORITHM = MinibatchSGD()
