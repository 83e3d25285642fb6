"""ISRL-DP FedProx-SVRG (the paper's Algorithm 1).

Epochs of Q + 1 rounds. The first round of an epoch takes the snapshot w_bar = w_r: the silos
send noisy full local gradients at w_bar (K = n), the server keeps their mean g~ and steps
w <- prox_{eta f1}(w_bar - eta g~) (the paper's first inner step, whose correction term
grad f0(w_bar) - grad f0(w_bar) is zero). Each of the Q following rounds is an inner step: the silos
send the noisy difference (1/K) sum [grad f0(w_t, x) - grad f0(w_bar, x)] on K records, and
the server steps w_{t+1} = prox_{eta f1}(w_t - eta (g~ + mean difference)).

Dropout: until a snapshot gradient has been received the server keeps asking for one; a round
in which no silo answers changes nothing. The output is the last iterate.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord

from app import wire
from strategies.base import mean_update
from strategies.spider import FedProxSPIDER


class FedProxSVRG(FedProxSPIDER):
    """SPIDER's machinery with a fixed reference point: h = g~(w_bar) + difference to w_bar."""

    def phase_for(self, server_round: int) -> str:
        if self.h is None or (server_round - 1) % (self.s.svrg_inner_steps + 1) == 0:
            return "anchor"
        return "diff"

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
