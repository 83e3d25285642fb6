"""ISRL-DP Fed-SPIDER, the alternate implementation (the paper's Algorithm 11, which is what
its experiments ran). Every round after the first has two uploads from each sampled silo:

    round 1:  g = (1/M) sum_i g~_i(w_1)                    (fresh noisy gradients, sigma_2)
    round r:  w^0 = w_r,  w^1 = prox_{eta f1}(w^0 - eta g)
              D = (1/M) sum_i [grad f0(w^1, x) - grad f0(w^0, x)]~ on one batch   (sigma_1)
              v = g + D,  w^2 = prox_{eta f1}(w^1 - eta v)
              g = (1/M) sum_i g~_i(w^2)                    (fresh noisy gradients, sigma_2)
              w_{r+1} = w^2

so R rounds make R fresh-gradient releases and R - 1 difference releases per silo, and the
silo's calibration counts both (app/schedule.py). Noise split: ``privacy.anchor-noise-ratio``.

Dropout: if no silo answers the difference upload, the server does not take the second step
(w^2 = w^1); if none answers the fresh-gradient upload, g becomes the estimate v (a SPIDER step
without a refresh). While no gradient has ever been received, each round asks for a fresh one.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord
from flwr.common import log
from flwr.serverapp import Grid
from logging import WARNING
from typing import Any

from app import wire
from strategies.base import FederatedOptimizer, ReplyTally, mean_update, model_in_range


class FedSPIDERAlt(FederatedOptimizer):
    phase = "grad"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.g: dict[str, np.ndarray] | None = None
        self._phase = "grad"
        self._prev: dict[str, np.ndarray] | None = None

    def round_config(self, server_round: int) -> dict[str, Any]:
        return super().round_config(server_round) | {"phase": self._phase}

    def prev_arrays(self, server_round: int) -> ArrayRecord | None:
        return wire.params_to_record(self._prev) if self._phase == "diff" and self._prev is not None else None

    def _ask(self, phase: str, server_round: int, w: dict[str, np.ndarray], prev: dict[str, np.ndarray] | None,
             grid: Grid, config: ConfigRecord, timeout: float) -> tuple[ReplyTally, dict[str, np.ndarray] | None]:
        self._phase, self._prev = phase, prev
        tally = self.exchange(server_round, wire.params_to_record(w), config, grid, timeout)
        return tally, (mean_update([u for _, u, _ in tally.valid]) if tally.valid else None)

    def train_round(self, server_round: int, arrays: ArrayRecord, grid: Grid, config: ConfigRecord,
                    timeout: float) -> ArrayRecord:
        w0 = wire.record_to_params(arrays, self.layout, what="global arrays")
        eta = self.s.lr
        if self.g is None:  # round 1 (or every silo dropped so far): fresh gradients only
            self._last_tally, self.g = self._ask("grad", server_round, w0, None, grid, config, timeout)
            return arrays
        w1 = self.prox({k: w0[k] - eta * self.g[k] for k in w0}, eta)
        if not model_in_range(w1):
            self.accept_model(server_round, w1)  # logs the skipped step; the model stays at w0
            return arrays
        diff_tally, d = self._ask("diff", server_round, w1, w0, grid, config, timeout)
        if d is None:
            log(WARNING, "round %d: no silo answered the difference upload; no second step", server_round)
            v, w2 = self.g, w1
        else:
            v = {k: (self.g[k] + d[k]).astype(np.float32) for k in d}
            w2 = self.prox({k: w1[k] - eta * v[k] for k in w1}, eta)
            if not model_in_range(w2):
                log(WARNING, "round %d: the second step would leave float32's range; it is skipped", server_round)
                v, w2 = self.g, w1
        grad_tally, g = self._ask("grad", server_round, w2, None, grid, config, timeout)
        self.g = g if g is not None else v
        self._last_tally = diff_tally.merge(grad_tally)
        self._w = w2
        return wire.params_to_record(w2)

    def server_step(self, w: dict[str, np.ndarray], updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        raise NotImplementedError("Fed-SPIDER (alternate) runs its two uploads per round in train_round")
