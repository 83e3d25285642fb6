"""FedProx-PL-SVRG (the paper's Algorithm 2): the R rounds split into S = ``plsvrg.restarts``
stages of ceil(R / S) rounds, each an SVRG run restarted at the previous stage's output, so each
stage starts with an ``anchor``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.algorithms.svrg import FedProxSVRG
from app.options import number, option

if TYPE_CHECKING:
    from app.config import Settings


@dataclass(frozen=True)
class PLSVRGSettings:
    #: S stages (restarts)
    restarts: int = option("plsvrg.restarts", number(1, 1_000_000, integer=True), 2,
                           "S stages of ceil(R/S) rounds, each restarted from the last",
                           only=("algorithm", ("plsvrg",)))


def stage_length(s: Settings) -> int:
    """Rounds per PL-SVRG stage: ceil(R / S)."""
    return math.ceil(s.num_rounds / s.plsvrg.restarts)


class FedProxPLSVRG(FedProxSVRG):
    name = "plsvrg"

    def epoch_position(self, s: Settings, rnd: int) -> int:
        return (rnd - 1) % stage_length(s)


ALGORITHM = FedProxPLSVRG()
