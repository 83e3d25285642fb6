"""ISRL-DP FedProx-SPIDER (the paper's Algorithm 3): ``anchor`` (K1 records) in rounds
1, q + 1, 2q + 1, ...; ``diff`` (K2 records, the gradient difference between w_r and w_{r-1})
otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.algorithms.base import Algorithm, Phase, ReleaseSpec, check_round
from app.options import number, option
from app.privacy.sensitivity import difference_sensitivity, mean_sensitivity

if TYPE_CHECKING:
    from app.config import Settings


@dataclass(frozen=True)
class SpiderSettings:
    """``spider.*`` (app/options.py): an anchor every q rounds, of K1 records."""

    q: int = option("spider.q", number(1, 1_000_000, integer=True), 5, "an anchor round every q rounds",
                    only=("algorithm", ("spider",)))
    #: K1 of the anchors (0: the full batch n)
    anchor_batch: int = option("spider.anchor-batch", number(0, None, integer=True), 0,
                               "K1, the anchor's records (0: K1 = n)", only=("algorithm", ("spider",)))


def difference_release(s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
    """``count`` difference releases on K2 = ``s.batch_for(n)`` records (sensitivity 4L/K2, or
    2C/K2 with ``diff-clip`` C > 0)."""
    batch = s.batch_for(n)
    return ReleaseSpec(Phase.DIFF, batch, count, difference_sensitivity(clip, s.diff_clip, batch))


def anchor_release(s: Settings, n: int, clip: float, count: int, batch: int) -> ReleaseSpec:
    """``count`` full-gradient releases on ``batch`` records, noise ``privacy.anchor-noise-ratio``
    times the differences' multiplier (the budget split)."""
    return ReleaseSpec(Phase.ANCHOR, batch, count, mean_sensitivity(clip, batch), weight=s.privacy.anchor_noise_ratio)


class FedProxSPIDER(Algorithm):
    name = "spider"

    def round_phases(self, s: Settings, rnd: int) -> tuple[Phase, ...]:
        check_round(rnd)
        return (Phase.ANCHOR,) if (rnd - 1) % s.spider.q == 0 else (Phase.DIFF,)

    def release(self, phase: Phase, s: Settings, n: int, clip: float, count: int) -> ReleaseSpec:
        if phase == Phase.ANCHOR:
            return anchor_release(s, n, clip, count, min(s.spider.anchor_batch or n, n))
        return difference_release(s, n, clip, count)


ALGORITHM = FedProxSPIDER()
