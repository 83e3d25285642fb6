"""ISRL-DP FedProx-SVRG (the paper's Algorithm 1) and FedProx-PL-SVRG (Algorithm 2).

SVRG: epochs of Q + 1 rounds. The first round of an epoch takes the snapshot w_bar = w_r: the
silos send noisy full local gradients at w_bar (K = n), the server keeps their mean g~ and steps
w <- prox_{eta f1}(w_bar - eta g~) (the paper's first inner step, whose correction term
grad f0(w_bar) - grad f0(w_bar) is zero). Each of the Q following rounds is an inner step: the silos
send the noisy difference (1/K) sum [grad f0(w_t, x) - grad f0(w_bar, x)] on K records, and
the server steps w_{t+1} = prox_{eta f1}(w_t - eta (g~ + mean difference)).

PL-SVRG: S restarts of SVRG. The R rounds split into S stages of ceil(R/S) rounds; stage s runs
SVRG from stage s-1's output (its last iterate, or with ``output`` = random an iterate drawn
uniformly from the stage's), starting with a fresh snapshot. The run's output is the last
stage's output.

Dropout: until a snapshot gradient has been received the server keeps asking for one; a round
in which no silo answers changes nothing.
"""

from __future__ import annotations

from logging import INFO

from flwr.common import log

from app.algorithms import Phase
from app.algorithms.plsvrg import stage_length
from app.seeding import np_rng
from strategies.exchange import Exchange, Round, StepResult
from strategies.steps import IterateSampler, prox_step
from strategies.replies import Params
from strategies.spider import FedProxSPIDER


class FedProxSVRG(FedProxSPIDER):
    """SPIDER's bookkeeping with a fixed reference point: h = g~(w_bar) + difference to w_bar."""

    algorithms = ("svrg",)
    knob_group = "svrg"

    def exchanges(self, rnd: int, w: Params) -> Round:
        phase = self.phase_for(rnd)
        ex = Exchange(phase, w, self.h_at if phase == Phase.DIFF else None)  # diff: against the snapshot
        updates = yield ex
        mean = self.combine(rnd, ex, updates) if updates else None  # the mean, or the run's rule
        if mean is None:
            return StepResult(None)
        if phase == Phase.ANCHOR or self.h is None:
            self.h, self.h_at = mean, w  # snapshot gradient g~ at w_bar = w
            v = mean
        else:
            v = {k: self.h[k] + mean[k] for k in mean}
        return StepResult(prox_step(self.prox, w, v, self.s.lr))


class FedProxPLSVRG(FedProxSVRG):
    algorithms = ("plsvrg",)
    knob_group = "plsvrg"

    def exchanges(self, rnd: int, w: Params) -> Round:
        length = stage_length(self.s.num_rounds, self.s.plsvrg.restarts)
        if rnd == 1 or (rnd - 1) % length:
            return (yield from super().exchanges(rnd, w))
        stage = (rnd - 1) // length + 1
        start = w
        if self.s.output == "random" and self.sampler.value is not None:
            start = self.sampler.value
            log(INFO, "PL-SVRG stage %d restarts from round %d's iterate", stage, self.sampler.round)
        self.sampler = IterateSampler(np_rng(self.s.seed, "output-iterate", "stage", stage))
        self.h = self.h_at = None  # a restart takes a new snapshot
        result = yield from super().exchanges(rnd, start)
        return result if result.model is not None else StepResult(start, result.row)
