"""(ISRL-DP) minibatch SGD: a noisy clipped minibatch gradient every round (``grad``)."""

from __future__ import annotations

from app.algorithms.base import Algorithm, AlgorithmOptions, Phase, check_round


class MinibatchSGD(Algorithm):
    name = "mbsgd"
    shuffle_form = True

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.GRAD,)


ALGORITHM = MinibatchSGD()
