"""FedProx-PL-SVRG (the paper's Algorithm 2): the R rounds split into S = ``plsvrg.restarts``
stages of ceil(R / S) rounds, each an SVRG run restarted at the previous stage's output, so each
stage starts with an ``anchor``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from app.algorithms.base import AlgorithmOptions
from app.algorithms.svrg import FedProxSVRG
from app.options import number, option


@dataclass(frozen=True)
class PLSVRGSettings:
    #: S stages (restarts)
    restarts: int = option("plsvrg.restarts", number(1, 1_000_000, integer=True), 2,
                           "S stages of ceil(R/S) rounds, each restarted from the last",
                           only=("algorithm", ("plsvrg",)))


def stage_length(num_rounds: int, restarts: int) -> int:
    """Rounds per PL-SVRG stage: ceil(R / S), R = ``num_rounds``, S = ``plsvrg.restarts``."""
    return math.ceil(num_rounds / restarts)


class FedProxPLSVRG(FedProxSVRG):
    name = "plsvrg"

    def epoch_position(self, o: AlgorithmOptions, rnd: int) -> int:
        return (rnd - 1) % stage_length(o.num_rounds, o.plsvrg.restarts)


ALGORITHM = FedProxPLSVRG()
