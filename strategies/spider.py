"""ISRL-DP FedProx-SPIDER (the paper's Algorithm 3).

Every q-th round the sampled silos send a noisy anchor gradient on K1 records; in the other
rounds they send the noisy difference grad f0(w_r, x) - grad f0(w_{r-1}, x) on one batch of K2
records (the server sends both points, so a silo that missed the last round still works). The
server keeps the running estimate h of the gradient and steps

    anchor round:  h_r = (1/M_r) sum_i g~_i
    other rounds:  h_r = h_{r-1} + (1/M_r) sum_i H~_i
    w_{r+1} = prox_{eta f1}(w_r - eta h_r).

Dropout: h always estimates the gradient at a known point ``h_at``; a round in which no silo
answers changes nothing, the next round asks again for the difference between w_r and ``h_at``,
and while no anchor has been received the server keeps asking for anchors. With q = 1 every round
is an anchor round and the method is minibatch SGD with K = K1 (the paper notes this identity).
The output is the last iterate, or with ``output`` = random one drawn uniformly from w_1..w_R.
"""

from __future__ import annotations

from typing import Any, TypedDict

import numpy as np

from app.algorithms import Phase
from strategies.exchange import Exchange, Round, StepResult
from strategies.loop import FederatedOptimizer
from strategies.steps import prox_step
from strategies.replies import Params


class SpiderState(TypedDict):
    """What SPIDER (and SVRG) carry across rounds: the gradient estimate and its point."""

    h: Params | None
    h_at: Params | None


class FedProxSPIDER(FederatedOptimizer):
    algorithms = ("spider",)
    knob_group = "spider"
    state_attrs = tuple(SpiderState.__annotations__)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h: Params | None = None  # the gradient estimate ...
        self.h_at: Params | None = None  # ... and the point it estimates the gradient at

    def phase_for(self, rnd: int) -> Phase:
        """The schedule's phase, or an anchor while h is unknown."""
        return Phase.ANCHOR if self.h is None else self.scheduled_phase(rnd)

    def exchanges(self, rnd: int, w: Params) -> Round:
        phase = self.phase_for(rnd)
        ex = Exchange(phase, w, self.h_at if phase == Phase.DIFF else None)
        updates = yield ex
        mean = self.combine(rnd, ex, updates) if updates else None  # the mean, or the run's rule
        if mean is None:
            return StepResult(None)
        if phase == Phase.ANCHOR or self.h is None:
            self.h = mean
        else:
            self.h = {k: (self.h[k] + mean[k]).astype(np.float32) for k in mean}
        self.h_at = w
        return StepResult(prox_step(self.prox, w, self.h, self.s.lr))
