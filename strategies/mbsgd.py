"""The proximal gradient step of (ISRL-DP) minibatch SGD and noisy Prox-SGD.

    w_{r+1} = prox_{eta f1}(w_r - eta * (1/M_r) sum_{i in S_r} g~_i),

where g~_i is silo i's noisy clipped mean gradient, M_r the number of silos that answered and
f1 the composite loss's regulariser or constraint (``prox.kind``; the identity for ``none``):

* ``mbsgd``: g~_i on K of its n records drawn without replacement (phase ``grad``);
* ``proxsgd`` (the paper's Algorithm 6): g~_i on block r of K = floor(n / R) records of the
  silo's secret permutation (phase ``disjoint``), so every record is used in one round only; with
  ``lr`` = 1/(2 beta) this is the paper's w_{r+1} = prox_{f1/(2 beta)}(w_r - g_r/(2 beta)). By
  parallel composition the R releases cost what one Gaussian mechanism costs, so for the same
  epsilon the noise multiplier is about sqrt(R) times smaller than MB-SGD's full-batch one.
"""

from __future__ import annotations

from strategies.exchange import Exchange, Round, StepResult
from strategies.loop import FederatedOptimizer
from strategies.steps import prox_step
from strategies.replies import Params


class ProxGradient(FederatedOptimizer):
    algorithms = ("mbsgd", "proxsgd")

    def exchanges(self, rnd: int, w: Params) -> Round:
        ex = Exchange(self.scheduled_phase(rnd), w)
        updates = yield ex
        g = self.combine(rnd, ex, updates) if updates else None  # the mean, or the run's rule
        if g is None:
            return StepResult(None)
        return StepResult(prox_step(self.prox, w, g, self.s.lr))
