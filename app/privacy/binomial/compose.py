"""Composition of binomial releases (the method in app/privacy/binomial/__init__.py, step 4): Renyi curves
add over releases, tails add and are taken off delta, then dp-accounting's conversion."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from app.privacy.binomial.divergence import release_curve
from app.privacy.binomial.truncation import ORDERS, BinomialCurve, check_delta, check_extra_rdp, check_int


def epsilon_from_curves(parts: Sequence[tuple[BinomialCurve, int]], delta: float,
                        extra_rdp: Sequence[float] | None = None) -> float:
    """epsilon at ``delta`` of the composition of ``count`` releases of each curve in ``parts``
    (plus ``extra_rdp``, e.g. Gaussian releases' RDP at ORDERS): RDP curves add, tails add and are
    subtracted from delta before the RDP conversion; inf if the tails use up delta."""
    delta = check_delta(delta)
    rdp = check_extra_rdp(extra_rdp).copy()
    tail = 0.0
    for curve, count in parts:
        count = check_int("count", count, 0)
        if count == 0:
            continue
        rdp += count * np.asarray(curve.rdp, dtype=float)
        tail += count * curve.tail
    if tail >= delta:
        return math.inf
    if not np.any(rdp > 0):
        return 0.0
    eps, _ = compute_epsilon(ORDERS, rdp.tolist(), delta - tail)
    return float(eps)


def binomial_epsilon(trials: int, p: float, levels: int, dim: int, count: int, delta: float) -> float:
    """epsilon at ``delta`` of ``count`` identical binomial releases."""
    count = check_int("count", count, 0)
    return epsilon_from_curves([(release_curve(trials, p, levels, dim), count)], delta)


def gaussian_rdp(noise_multiplier: float) -> tuple[float, ...]:
    """RDP of one unsampled Gaussian release with multiplier z (std / L2 sensitivity) at ORDERS:
    alpha / (2 z^2)."""
    z = float(noise_multiplier)
    if not z > 0:
        raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier!r}")
    return tuple(a / (2 * z * z) for a in ORDERS)


def order_epsilon(alpha: float, r: float, delta: float) -> float:
    """dp_accounting's compute_epsilon at one order (the same cases and operations)."""
    if r < 0:
        return 0.0
    if delta ** 2 + math.expm1(-r) > 0:
        return 0.0
    if alpha > 1.01:
        return r + math.log1p(-1 / alpha) - math.log(delta * alpha) / (alpha - 1)
    return math.inf

