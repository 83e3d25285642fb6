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

from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from app import wire
from app.schedule import round_phases
from strategies.base import FederatedOptimizer, mean_update


class FedProxSPIDER(FederatedOptimizer):
    phase = "anchor"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h: dict[str, np.ndarray] | None = None
        self.h_at: dict[str, np.ndarray] | None = None
        self._round_phase = "anchor"

    def phase_for(self, server_round: int) -> str:
        """The schedule's phase (app/schedule.py), or an anchor while h is unknown."""
        return "anchor" if self.h is None else round_phases(self.s, server_round)[0]

    def round_config(self, server_round: int) -> dict[str, Any]:
        self._round_phase = self.phase_for(server_round)
        return super().round_config(server_round) | {"phase": self._round_phase}

    def prev_arrays(self, server_round: int) -> ArrayRecord | None:
        if self._round_phase == "diff" and self.h_at is not None:
            return wire.params_to_record(self.h_at)
        return None

    def server_step(self, w: dict[str, np.ndarray], updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        mean = mean_update(updates)
        if self._round_phase == "anchor" or self.h is None:
            self.h = mean
        else:
            self.h = {k: (self.h[k] + mean[k]).astype(np.float32) for k in mean}
        self.h_at = w
        return self.prox({k: w[k] - self.s.lr * self.h[k] for k in w}, self.s.lr)
