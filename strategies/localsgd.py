"""(ISRL-DP) local SGD / FedAvg: each silo takes Q noisy clipped steps from w_r, the server
averages the resulting models.

Each local step is w <- w - lr * g~ (``lr`` is the silos' step size here). Silos send
Delta_i = w_i^Q - w_r; the server sets w_{r+1} = w_r + (1/M_r) sum_i Delta_i, the average of
the local models of the silos that answered.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strategies.base import FederatedOptimizer, mean_update


class LocalSGD(FederatedOptimizer):
    phase = "local"

    def round_config(self, server_round: int) -> dict[str, Any]:
        return super().round_config(server_round) | {"local-steps": self.s.local_steps, "lr": self.s.lr}

    def server_step(self, w: dict[str, np.ndarray], updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        delta = mean_update(updates)
        return {k: (w[k] + delta[k]).astype(np.float32) for k in w}
