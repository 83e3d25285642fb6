"""(ISRL-DP) local SGD / FedAvg: each silo takes Q noisy clipped steps from w_r, the server
averages the resulting models.

Each local step is w <- w - lr * g~ (``lr`` is the silos' step size here). Silos send
Delta_i = w_i^Q - w_r; the server sets w_{r+1} = w_r + (1/M_r) sum_i Delta_i, the average of
the local models of the silos that answered.
"""

from __future__ import annotations

import numpy as np

from app.algorithms import Phase
from strategies.exchange import Exchange, Round, StepResult
from strategies.loop import FederatedOptimizer
from strategies.replies import Params


class LocalSGD(FederatedOptimizer):
    algorithms = ("localsgd",)

    def exchanges(self, rnd: int, w: Params) -> Round:
        ex = Exchange(Phase.LOCAL, w)
        updates = yield ex
        delta = self.combine(rnd, ex, updates) if updates else None  # the mean, or the run's rule
        if delta is None:
            return StepResult(None)
        return StepResult({k: (w[k] + delta[k]).astype(np.float32) for k in w})
