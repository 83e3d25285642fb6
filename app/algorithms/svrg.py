"""ISRL-DP FedProx-SVRG (the paper's Algorithm 1): epochs of Q + 1 rounds (Q =
``svrg.inner-steps``); the first round of an epoch is the snapshot ``anchor`` (K = n), the Q
others are inner-step ``diff`` releases against the snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from app.algorithms.base import Algorithm, AlgorithmOptions, Phase, ReleaseSpec, check_round
from app.algorithms.spider import anchor_release, difference_release
from app.options import number, option


@dataclass(frozen=True)
class SVRGSettings:
    #: inner steps Q per snapshot
    inner_steps: int = option("svrg.inner-steps", number(1, 1_000_000, integer=True), 5,
                              "Q inner rounds after each full-batch snapshot round",
                              only=("algorithm", ("svrg", "plsvrg")))


class FedProxSVRG(Algorithm):
    name = "svrg"
    shuffle_form = True

    def epoch_position(self, o: AlgorithmOptions, rnd: int) -> int:
        """Rounds since the start of the run (since the stage's start for PL-SVRG)."""
        return rnd - 1

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.ANCHOR,) if self.epoch_position(o, rnd) % (o.svrg.inner_steps + 1) == 0 else (Phase.DIFF,)

    def release(self, phase: Phase, o: AlgorithmOptions, n: int, clip: float, count: int) -> ReleaseSpec:
        if phase == Phase.ANCHOR:  # the snapshot: the full local gradient, K = n
            return anchor_release(n, o.anchor_noise_ratio, clip, count)
        return difference_release(self.batch(o, n), o.diff_clip, clip, count)


ALGORITHM = FedProxSVRG()
