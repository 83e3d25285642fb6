"""Client (worker) momentum: a silo sends the running average of its own privatised releases.

    m_1 = g_1,   m_t = beta m_{t-1} + (1 - beta) g_t      (the silo's t-th release g_t; beta in [0, 1))

as in Karimireddy, He & Jaggi ("Learning from History for Byzantine Robust Optimization", ICML 2021:
worker momentum against time-coupled attacks; their code's ``MomentumWorker`` starts the buffer at the
first gradient), Farhadkhani et al. (RESAM, ICML 2022), DP-BREM and RobAJoL/Fed-DPRoC's client step (3)
("compute momentum updates"). g_t is the release as the mechanism produced it (clipped, noised; a
local phase's model change), before the round's sketch: S_t changes every round, so the average is
kept in R^d and sketched afterwards. m_t is a function of the silo's earlier releases only:
post-processing, no privacy cost, nothing more on the ledger.

The buffer lives in the silo's memory for one run: a restarted silo (a new process, a new run)
starts again at m_1 = g_1 of its next release; a silo not sampled in a round keeps m as it was.
Only single-exchange optimisers take it (app/config.py refuses the others: an average of anchors
and differences means nothing). beta = 0 sends g_t itself (the code path is not taken). Works on
any mapping of arrays or tensors that support ``*`` and ``+``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ReleaseMomentum:
    """The silo's momentum buffer m over its releases (module docstring); ``beta`` in [0, 1)."""

    def __init__(self, beta: float) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = float(beta)
        self.m: dict[str, Any] | None = None

    def __call__(self, release: Mapping[str, Any]) -> dict[str, Any]:
        """m_t after the release g_t (a new mapping; ``release`` is not changed)."""
        if self.m is None or self.m.keys() != release.keys():
            self.m = {k: v * 1.0 for k, v in release.items()}
        else:
            b = self.beta
            self.m = {k: b * self.m[k] + (1.0 - b) * release[k] for k in release}
        return dict(self.m)


__all__ = ["ReleaseMomentum"]
