"""(ISRL-DP) local SGD / FedAvg: ``local`` every round, Q = ``local-steps`` noisy clipped steps
(Q releases); the message is the model change, so the server step is an average, not a prox step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.algorithms.base import Algorithm, Phase, ReleaseSpec, check_round
from app.privacy.sensitivity import mean_sensitivity

if TYPE_CHECKING:
    from app.config import Settings


def local_release(s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
    """``count`` rounds of Q local steps: Q * count gradient releases on K records each."""
    batch = s.batch_for(n)
    return ReleaseSpec(Phase.LOCAL, batch, count * s.local_steps, mean_sensitivity(clip, batch))


class LocalSGD(Algorithm):
    name = "localsgd"
    prox_step = False

    def round_phases(self, s: Settings, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.LOCAL,)

    def release(self, phase: Phase, s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
        return local_release(s, n, clip, count)


ALGORITHM = LocalSGD()
