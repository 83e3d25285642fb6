"""ISRL-DP Fed-SPIDER, the alternate implementation (the paper's Algorithm 11, which is what
its experiments ran). Every round after the first has two uploads from each sampled silo:

    round 1:  g = (1/M) sum_i g~_i(w_1)                    (fresh noisy gradients, sigma_2)
    round r:  w^0 = w_r,  w^1 = prox_{eta f1}(w^0 - eta g)
              D = (1/M) sum_i [grad f0(w^1, x) - grad f0(w^0, x)]~ on one batch   (sigma_1)
              v = g + D,  w^2 = prox_{eta f1}(w^1 - eta v)
              g = (1/M) sum_i g~_i(w^2)                    (fresh noisy gradients, sigma_2)
              w_{r+1} = w^2

so R rounds make R fresh-gradient releases and R - 1 difference releases per silo, and the
silo's calibration counts both (app/algorithms/spider_alt.py). Noise split:
``privacy.anchor-noise-ratio``.

Dropout: if no silo answers the difference upload, the server does not take the second step
(w^2 = w^1); if none answers the fresh-gradient upload, g becomes the estimate v (a SPIDER step
without a refresh). While no gradient has ever been received, each round asks for a fresh one.
"""

from __future__ import annotations

from logging import WARNING
from typing import Any, TypedDict

import numpy as np
from flwr.common import log

from app.algorithms import Phase
from strategies.exchange import Exchange, Round, StepResult
from strategies.loop import FederatedOptimizer
from strategies.steps import prox_step
from strategies.replies import Params, model_in_range


class SpiderAltState(TypedDict):
    """What SPIDER-alt carries across rounds: the last fresh gradient estimate."""

    g: Params | None


class FedSPIDERAlt(FederatedOptimizer):
    algorithms = ("spider-alt",)
    knob_group = "spider"
    exchanges_per_round = 2  # the difference, then fresh gradients: silofl's driver only
    state_attrs = tuple(SpiderAltState.__annotations__)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.g: Params | None = None  # the last fresh gradient estimate

    def exchanges(self, rnd: int, w: Params) -> Round:
        eta = self.s.lr
        if self.g is None:  # round 1 (or every silo dropped so far): fresh gradients only
            ex = Exchange(Phase.GRAD, w)
            fresh = yield ex
            self.g = self.combine(rnd, ex, fresh) if fresh else None
            return StepResult(None)
        w1 = prox_step(self.prox, w, self.g, eta)
        if not model_in_range(w1):
            return StepResult(w1)  # the loop's guard skips the step and logs it
        ex = Exchange(Phase.DIFF, w1, w)
        diff = yield ex
        d = self.combine(rnd, ex, diff) if diff else None
        if d is None:
            log(WARNING, "round %d: no silo answered the difference upload; no second step", rnd)
            v, w2 = self.g, w1
        else:
            v = {k: (self.g[k] + d[k]).astype(np.float32) for k in d}
            w2 = prox_step(self.prox, w1, v, eta)
            if not model_in_range(w2):
                log(WARNING, "round %d: the second step would leave float32's range; it is skipped", rnd)
                v, w2 = self.g, w1
        ex = Exchange(Phase.GRAD, w2)
        fresh = yield ex
        g = self.combine(rnd, ex, fresh) if fresh else None
        self.g = g if g is not None else v
        return StepResult(w2)
