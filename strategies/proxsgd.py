"""Noisy Prox-SGD (the paper's Algorithm 6): one pass over disjoint batches.

Each silo splits its n records, by a secret permutation drawn once, into blocks of
K = floor(n / R) records; in round r it sends the noisy clipped mean gradient on block r, so every
record is used in one round only. The server steps

    w_{r+1} = prox_{f1 / (2 beta)}(w_r - g_r / (2 beta)),   g_r = (1/M_r) sum_i g~_i,

i.e. ``lr`` = 1/(2 beta). Privacy: by parallel composition the R releases of a silo cost what one
Gaussian mechanism with multiplier z costs (app/privacy/accounting.py), so for the same epsilon
the noise multiplier is about sqrt(R) times smaller than MB-SGD's full-batch one, on batches R
times smaller.
"""

from __future__ import annotations

import numpy as np

from strategies.base import FederatedOptimizer, mean_update


class NoisyProxSGD(FederatedOptimizer):
    phase = "disjoint"

    def server_step(self, w: dict[str, np.ndarray], updates: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        g = mean_update(updates)
        return self.prox({k: w[k] - self.s.lr * g[k] for k in w}, self.s.lr)
