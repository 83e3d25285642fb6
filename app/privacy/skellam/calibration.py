"""Calibration of the distributed Skellam mechanism for a whole plan at a scale chosen from the
bits (the research helper behind tests/test_skellam.py's calibration and the closing tables; the
silo itself calibrates at its floor scale, clients/silo_secagg.py): :func:`calibrate` bisects the
noise multiplier z, picking gamma for each z (encoding.choose_gamma), with the accountant of
app/privacy/skellam/accounting.py."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from dataclasses import dataclass

from app.privacy.accounting import PlannedRelease, bisect_scale, parallel_view
from app.privacy.skellam.accounting import ORDERS, epsilon, skellam_curve
from app.privacy.skellam.encoding import BETA, WRAP_TARGET, SkellamCode, choose_gamma, padded_dim, sensitivity


@dataclass(frozen=True)
class SkellamCalibration:
    """:func:`calibrate`'s answer. z: the noise multiplier (module docstring); gamma: the scale;
    mu_total: the Skellam variance the accountant assumes summed over the silos (a kind of weight
    w gets mu_total * w^2); mu_add: each of ``count_on`` silos' share, mu_total (1 + headroom) /
    count_on; l1, l2: the replace-one sensitivities at gamma; epsilon: what the plan spends;
    wrap_probability / vector_wrap_probability: per coordinate / per release bound, with every
    silo's share present; rounding_bias: L2 bound of the decoded mean's bias (signal units)."""

    z: float
    gamma: float
    mu_total: float
    mu_add: float
    l1: float
    l2: float
    epsilon: float
    delta: float
    wrap_probability: float
    vector_wrap_probability: float
    rounding_bias: float
    bits: int
    clip: float
    dim: int
    beta: float
    count_on: int
    records_total: int
    headroom: float
    amplification: str = "wbk9"

    @property
    def padded(self) -> int:
        return padded_dim(self.dim)

    def code(self, rotation_seed: bytes | int) -> SkellamCode:
        """The SkellamCode every silo and the server use for this calibration."""
        return SkellamCode(self.bits, self.gamma, self.dim, rotation_seed, self.clip, self.beta)

    def mu_total_of(self, weight: float) -> float:
        return self.mu_total * weight * weight

    def mu_add_of(self, weight: float) -> float:
        return self.mu_add * weight * weight

    def summary(self) -> dict:
        """The numbers a summary.json reports, so the epsilon can be recomputed from them."""
        return {"mechanism": "skellam", "z": self.z, "gamma": self.gamma, "mu_total": self.mu_total,
                "mu_add": self.mu_add, "l1": self.l1, "l2": self.l2, "epsilon": self.epsilon, "delta": self.delta,
                "bits": self.bits, "clip": self.clip, "dim": self.dim, "padded": self.padded, "beta": self.beta,
                "count_on": self.count_on, "records_total": self.records_total, "headroom": self.headroom,
                "wrap_probability": self.wrap_probability, "vector_wrap_probability": self.vector_wrap_probability,
                "rounding_bias": self.rounding_bias, "amplification": self.amplification}


def plan_epsilon(plan: Sequence[PlannedRelease], delta: float, *, l1: float, l2: float, mu_total: float,
                 orders: Sequence[float] = ORDERS, amplification: str = "wbk9") -> float:
    """epsilon of a plan whose kind of weight w carries Sk(mu_total w^2) with sensitivities l1, l2:
    sampled kinds amplified at K/n, disjoint kinds as one unsampled release."""
    parts = []
    for p in plan:
        if p.count == 0:
            continue
        r = parallel_view(p.at(1.0))
        rate = r.batch / r.n if r.sampled else 1.0
        parts.append((skellam_curve(orders, l1, l2, mu_total * p.weight * p.weight, rate, amplification), r.count))
    return epsilon(parts, delta, orders)


def calibrate(plan: Sequence[PlannedRelease], epsilon: float, delta: float, *, bits: int, clip: float, dim: int,
              count_on: int, records_total: int, beta: float = BETA, wrap_target: float = WRAP_TARGET,
              headroom: float = 0.0, orders: Sequence[float] = ORDERS, rtol: float = 1e-3,
              amplification: str = "wbk9") -> SkellamCalibration:
    """The smallest noise multiplier z (relative ``rtol``, rounded up: within budget) at which
    ``plan`` spends at most ``epsilon`` at ``delta``, and the code around it. Each step of the
    bisection (app.privacy.accounting.bisect_scale) picks gamma for z (encoding.choose_gamma with the
    noise every silo adds: std 2 C z max(w) sqrt(1 + headroom) in signal units), computes the
    sensitivities at that gamma and the plan's epsilon with mu_total = (2 gamma C z)^2.

    ``records_total``: the most records one secure-aggregation sum adds up (e.g. count_on * max K);
    it sets gamma (wrap-around), not privacy. ``headroom`` >= 0: each silo adds (1 + headroom) /
    count_on of mu_total, so the accountant's mu_total is reached while at least
    count_on / (1 + headroom) silos' shares are in the sum. ``amplification``: see :func:`skellam_curve`.
    ValueError if no z reaches epsilon (too
    few bits: the rounding's inflation of the sensitivity does not vanish with more noise)."""
    if not epsilon > 0 or math.isinf(epsilon):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not plan or all(p.count == 0 for p in plan):
        raise ValueError("cannot calibrate an empty release plan")
    if not (isinstance(count_on, (int, np.integer)) and count_on >= 1):
        raise ValueError(f"count_on must be an integer >= 1, got {count_on!r}")
    if not headroom >= 0:
        raise ValueError(f"headroom must be >= 0, got {headroom!r}")
    w_max = max(p.weight for p in plan if p.count)
    cache: dict[float, tuple] = {}

    def at(z: float) -> tuple:
        if z not in cache:
            noise_std = 2.0 * clip * z * w_max * math.sqrt(1.0 + headroom)
            g = choose_gamma(bits, clip, dim, records_total, noise_std, beta=beta, wrap_target=wrap_target)
            l1, l2 = sensitivity(g.gamma, clip, dim, beta)
            mu = (2.0 * g.gamma * clip * z) ** 2
            cache[z] = (g, l1, l2, mu, plan_epsilon(plan, delta, l1=l1, l2=l2, mu_total=mu, orders=orders,
                                                    amplification=amplification))
        return cache[z]

    z = bisect_scale(lambda s: at(s)[4], float(epsilon), float(delta), float(rtol))
    g, l1, l2, mu, eps = at(z)
    return SkellamCalibration(z=z, gamma=g.gamma, mu_total=mu, mu_add=mu * (1.0 + headroom) / count_on, l1=l1, l2=l2,
                              epsilon=eps, delta=float(delta), wrap_probability=g.wrap_probability,
                              vector_wrap_probability=g.vector_wrap_probability, rounding_bias=g.rounding_bias,
                              bits=int(bits), clip=float(clip), dim=int(dim), beta=float(beta), count_on=int(count_on),
                              records_total=int(records_total), headroom=float(headroom), amplification=amplification)


__all__ = ["SkellamCalibration", "calibrate", "plan_epsilon"]
