"""ISRL-DP FedProx-SPIDER (the paper's Algorithm 3): ``anchor`` (K1 records) in rounds
1, q + 1, 2q + 1, ...; ``diff`` (K2 records, the gradient difference between w_r and w_{r-1})
otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from app.algorithms.base import Algorithm, AlgorithmOptions, Phase, ReleaseSpec, check_round
from app.options import number, option
from app.privacy.sensitivity import difference_sensitivity, mean_sensitivity


@dataclass(frozen=True)
class SpiderSettings:
    """``spider.*`` (app/options.py): an anchor every q rounds, of K1 records."""

    q: int = option("spider.q", number(1, 1_000_000, integer=True), 5, "an anchor round every q rounds",
                    only=("algorithm", ("spider",)))
    #: K1 of the anchors (0: the full batch n)
    anchor_batch: int = option("spider.anchor-batch", number(0, None, integer=True), 0,
                               "K1, the anchor's records (0: K1 = n)", only=("algorithm", ("spider",)))


def difference_release(batch: int, diff_clip: float, clip: float, count: int) -> ReleaseSpec:
    """``count`` difference releases on K2 = ``batch`` records (sensitivity 4L/K2, or 2C/K2 with
    ``diff-clip`` C = ``diff_clip`` > 0)."""
    return ReleaseSpec(Phase.DIFF, batch, count, difference_sensitivity(clip, diff_clip, batch))


def anchor_release(batch: int, anchor_noise_ratio: float, clip: float, count: int) -> ReleaseSpec:
    """``count`` full-gradient releases on ``batch`` records, noise ``privacy.anchor-noise-ratio``
    times the differences' multiplier (the budget split)."""
    return ReleaseSpec(Phase.ANCHOR, batch, count, mean_sensitivity(clip, batch), weight=anchor_noise_ratio)


class FedProxSPIDER(Algorithm):
    name = "spider"
    shuffle_form = True

    def round_phases(self, o: AlgorithmOptions, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.ANCHOR,) if (rnd - 1) % o.spider.q == 0 else (Phase.DIFF,)

    def release(self, phase: Phase, o: AlgorithmOptions, n: int, clip: float, count: int) -> ReleaseSpec:
        if phase == Phase.ANCHOR:
            return anchor_release(min(o.spider.anchor_batch or n, n), o.anchor_noise_ratio, clip, count)
        return difference_release(self.batch(o, n), o.diff_clip, clip, count)


ALGORITHM = FedProxSPIDER()
