"""The Byzantine-robust line (Grad-BANT and the baseline rules, ``aggregator``): a ``grad`` each
round, or with ``local-steps`` Q > 1 a ``local`` release of Q steps whose model change the server
turns into a pseudo-gradient. The server aggregates with its rule, not a prox step."""

from __future__ import annotations

from app.algorithms.base import Algorithm, AlgorithmOptions, Phase, ReleaseSpec, check_round
from app.algorithms.localsgd import local_release


class ByzantineRobust(Algorithm):
    name = "robust"
    prox_step = False
    rule_step = True

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.LOCAL,) if o.local_steps > 1 else (Phase.GRAD,)

    def release(self, phase: Phase, o: AlgorithmOptions, n: int, clip: float, count: int) -> ReleaseSpec:
        if phase == Phase.LOCAL:
            return local_release(self.batch(o, n), o.local_steps, clip, count)
        return super().release(phase, o, n, clip, count)


ALGORITHM = ByzantineRobust()
