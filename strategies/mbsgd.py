"""(ISRL-DP) minibatch SGD: silos send noisy clipped minibatch gradients, the server steps.

Server step: w_{r+1} = prox_{eta f1}(w_r - eta * (1/M_r) sum_{i in S_r} g~_i), where g~_i is
silo i's noisy clipped mean gradient on K of its n records, M_r the number of silos that
answered, and f1 the composite loss's regulariser or constraint (``prox.kind``; the identity
for ``none``), i.e. noisy proximal SGD on f = f0 + f1.
"""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedOptimizer, mean_update


class MinibatchSGD(FederatedOptimizer):
    phase = "grad"

    def server_step(self, w: dict[str, np.ndarray], updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        g = mean_update(updates)
        return self.prox({k: w[k] - self.s.lr * g[k] for k in w}, self.s.lr)
