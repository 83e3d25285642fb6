"""Byzantine-robust training (``algorithm = robust``): MB-SGD's step with the run's robust rule,

    x_{t+1} = x_t - gamma * rule(u_1..u_m)

(Grad-BANT by default; strategies/gradbant.py), each message a gradient, or with Q > 1 local
steps a model change d read as the pseudo-gradient -d / gamma. The same rule composes with every
other optimiser through ``aggregator`` (strategies/aggregators.py); this is MB-SGD with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app import wire
from strategies.aggregators import Rule
from strategies.exchange import Exchange, Round, StepResult
from strategies.loop import FederatedOptimizer
from strategies.replies import Params, flatten


class ByzantineRobust(FederatedOptimizer):
    """Grad-BANT or a baseline rule over (possibly sketched, possibly attacked) silo messages."""

    algorithms = ("robust",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(getattr(self.aggregator, "inner", self.aggregator), Rule):
            raise ValueError("algorithm robust needs a robust rule (aggregators.Rule or GradBANT), not the mean")
        self.phase = self.scheduled_phase(1)  # the same every round: grad, or local with Q > 1

    def exchanges(self, rnd: int, w: Params) -> Round:
        ex = Exchange(self.phase, w)
        updates = yield ex
        if not updates:
            return StepResult(None)
        direction, row = self.aggregator.combine_flat(rnd, ex, updates)  # type: ignore[attr-defined]
        if direction is None:
            return StepResult(None, row)
        flat = flatten(w).astype(np.float64) - self.s.lr * direction
        return StepResult(wire.unflatten(flat, self.layout, dtype=np.float64), row)
