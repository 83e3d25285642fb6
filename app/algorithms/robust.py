"""The Byzantine-robust line (Grad-BANT and the baseline rules, ``aggregator``): a ``grad`` each
round, or with ``local-steps`` Q > 1 a ``local`` release of Q steps whose model change the server
turns into a pseudo-gradient. The server aggregates with its rule, not a prox step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.algorithms.base import Algorithm, Phase, ReleaseSpec, check_round
from app.algorithms.localsgd import local_release

if TYPE_CHECKING:
    from app.config import Settings


class ByzantineRobust(Algorithm):
    name = "robust"
    prox_step = False

    def round_phases(self, s: Settings, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.LOCAL,) if s.local_steps > 1 else (Phase.GRAD,)

    def release(self, phase: Phase, s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
        if phase == Phase.LOCAL:
            return local_release(s, n, clip, count)
        return super().release(phase, s, n, clip, count)


ALGORITHM = ByzantineRobust()
