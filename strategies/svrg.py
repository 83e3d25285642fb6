"""ISRL-DP FedProx-SVRG (the paper's Algorithm 1).

Epochs of Q + 1 rounds. The first round of an epoch takes the snapshot w_bar = w_r: the silos
send noisy full local gradients at w_bar (K = n), the server keeps their mean g~ and steps
w <- prox_{eta f1}(w_bar - eta g~) (the paper's first inner step, whose correction term
grad f0(w_bar) - grad f0(w_bar) is zero). Each of the Q following rounds is an inner step: the silos
send the noisy difference (1/K) sum [grad f0(w_t, x) - grad f0(w_bar, x)] on K records, and
the server steps w_{t+1} = prox_{eta f1}(w_t - eta (g~ + mean difference)).

Dropout: until a snapshot gradient has been received the server keeps asking for one; a round
in which no silo answers changes nothing. The output is the last iterate, or with ``output`` =
random the paper's w_priv, drawn uniformly from w_1..w_R.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from logging import INFO

from flwr.common import log

from app import wire
from app.schedule import stage_length
from app.seeding import np_rng
from strategies.base import IterateSampler, mean_update
from strategies.spider import FedProxSPIDER


class FedProxSVRG(FedProxSPIDER):
    """SPIDER's machinery with a fixed reference point: h = g~(w_bar) + difference to w_bar."""

    def prev_arrays(self, server_round: int) -> ArrayRecord | None:
        if self._round_phase == "diff" and self.h_at is not None:
            return wire.params_to_record(self.h_at)  # the snapshot w_bar
        return None

    def server_step(self, w: dict[str, np.ndarray], updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        mean = mean_update(updates)
        if self._round_phase == "anchor" or self.h is None:
            self.h, self.h_at = mean, w  # snapshot gradient g~ at w_bar = w
            v = mean
        else:
            v = {k: self.h[k] + mean[k] for k in mean}
        return self.prox({k: w[k] - self.s.lr * v[k] for k in w}, self.s.lr)


class FedProxPLSVRG(FedProxSVRG):
    """FedProx-PL-SVRG (the paper's Algorithm 2): S restarts of Algorithm 1. The R rounds split
    into S stages of ceil(R/S) rounds; stage s runs FedProx-SVRG from stage s-1's output (its last
    iterate, or with ``output`` = random an iterate drawn uniformly from the stage's), starting
    with a fresh snapshot. The run's output is the last stage's output."""

    def begin_round(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        length = stage_length(self.s)
        if server_round == 1 or (server_round - 1) % length:
            return arrays
        stage = (server_round - 1) // length + 1
        start = arrays
        if self.s.output == "random" and self.sampler.value is not None:
            start = wire.params_to_record(self.sampler.value)
            log(INFO, "PL-SVRG stage %d restarts from round %d's iterate", stage, self.sampler.round)
        self.sampler = IterateSampler(np_rng(self.s.seed, "output-iterate", "stage", stage))
        self.h = self.h_at = None  # a restart takes a new snapshot
        return start
