"""Byzantine-robust training (``algorithm = robust``): MB-SGD with a robust rule,

    x_{t+1} = x_t - gamma * rule(u_1..u_m)

(Grad-BANT by default; strategies/gradbant.py), each message a gradient; with Q > 1 local steps
a model change d, which the rule reads as the pseudo-gradient -d / gamma, so the step is
x_{t+1} = x_t + rule's model change. The rule is the optimiser's aggregator
(strategies/aggregators.py), as it can be any other optimiser's.
"""

from __future__ import annotations

from typing import Any

from app.algorithms import Phase
from strategies.aggregators import Rule
from strategies.exchange import Exchange, Round, StepResult
from strategies.mbsgd import ProxGradient
from strategies.replies import Params


class ByzantineRobust(ProxGradient):
    """MB-SGD (or local SGD with Q > 1) with Grad-BANT or a baseline rule as its aggregator."""

    algorithms = ("robust",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(getattr(self.aggregator, "inner", self.aggregator), Rule):
            raise ValueError("algorithm robust needs a robust rule (aggregators.Rule or GradBANT), not the mean")

    def exchanges(self, rnd: int, w: Params) -> Round:
        if self.scheduled_phase(rnd) != Phase.LOCAL:
            return (yield from super().exchanges(rnd, w))
        ex = Exchange(Phase.LOCAL, w)
        updates = yield ex
        delta = self.combine(rnd, ex, updates) if updates else None
        return StepResult(None if delta is None else {k: w[k] + delta[k] for k in w})
