"""(ISRL-DP) local SGD / FedAvg: ``local`` every round, Q = ``local-steps`` noisy clipped steps
(Q releases); the message is the model change, so the server step is an average, not a prox step."""

from __future__ import annotations

from app.algorithms.base import Algorithm, AlgorithmOptions, Phase, ReleaseSpec, check_round
from app.privacy.sensitivity import mean_sensitivity


def local_release(batch: int, local_steps: int, clip: float, count: int) -> ReleaseSpec:
    """``count`` rounds of Q = ``local_steps`` local steps: Q * count gradient releases on K =
    ``batch`` records each (sensitivity 2C/K)."""
    return ReleaseSpec(Phase.LOCAL, batch, count * local_steps, mean_sensitivity(clip, batch))


class LocalSGD(Algorithm):
    name = "localsgd"
    prox_step = False

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.LOCAL,)

    def release(self, phase: Phase, o: AlgorithmOptions, n: int, clip: float, count: int) -> ReleaseSpec:
        return local_release(self.batch(o, n), o.local_steps, clip, count)


ALGORITHM = LocalSGD()
