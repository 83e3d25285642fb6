"""Adaptive update-level attacks: ALIE and IPM with the scale tuned against the rule in use, and Mimic.

Threat model (the harness's, strategies/byzantine_harness.py): f colluding Byzantine silos that
know every honest message of the round and the server's rule (its pre-aggregators, f, state).
Following ByzFL 0.0.11 (byzfl.attacks Optimal_ALittleIsEnough, Optimal_InnerProductManipulation,
Mimic; Allouah et al., AISTATS 2023), with H [h, d] the honest messages and mu their mean:

    tau* = argmax_tau || A(H, b(tau), ..., b(tau)) - mu ||      (f copies of b(tau) after H)
    ALIE:  b(tau) = mu + tau * sigma  (sigma the coordinate-wise sample std, ddof = 1)
    IPM:   b(tau) = -tau * mu
    Mimic: b = H[0] (every Byzantine silo repeats one honest message, ByzFL's epsilon = 0)

A = the rule after its pre-aggregators. tau* comes from ByzFL's line search (:func:`optimal_scale`):
from tau = start, steps of delta doubling while the distance grows, then steps shrinking by
``ratio`` around the best point, ``evals`` evaluations of A in all. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from app.attacks import alie

#: the adaptive attacks this module implements (registered in app/attacks.py ATTACKS)
ADAPTIVE_ATTACKS = ("alie-adaptive", "ipm-adaptive", "mimic")


def optimal_scale(effect: Callable[[float], float], *, start: float = 0.0, delta: float = 10.0,
                  ratio: float = 0.8, evals: int = 20) -> float:
    """ByzFL's line search for the tau maximising ``effect(tau)``: expansion x <- x + delta with
    delta doubled on each gain (stop at the first loss: delta <- ratio * delta), then contraction:
    propose x + delta, keep it if better, delta <- ratio * delta, until ``evals`` evaluations."""
    if not (isinstance(evals, int) and evals >= 1):
        raise ValueError(f"evals must be an integer >= 1, got {evals!r}")
    if not (0.5 < ratio < 1) or delta == 0 or not math.isfinite(delta):
        raise ValueError(f"need ratio in (0.5, 1) and a finite delta != 0, got ratio = {ratio}, delta = {delta}")
    best_x, best_y = start, effect(start)
    left = evals - 1
    while left > 0:  # expansion
        y = effect(best_x + delta)
        left -= 1
        if y > best_y:
            best_x, best_y, delta = best_x + delta, y, delta * 2
        else:
            delta *= ratio
            break
    while left > 0:  # contraction
        y = effect(best_x + delta)
        left -= 1
        if y > best_y:
            best_x, best_y = best_x + delta, y
        delta *= ratio
    return float(best_x)


def attack_effect(honest: np.ndarray, byzantine: np.ndarray, f: int,
                  aggregate: Callable[[np.ndarray], np.ndarray]) -> float:
    """|| aggregate([H; b; ...; b]) - mean(H) || with f copies of ``byzantine`` after the honest rows;
    a rule that raises or returns a non-finite vector counts as no effect (0)."""
    h = np.asarray(honest, dtype=np.float64)
    rows = np.concatenate([h, np.repeat(np.asarray(byzantine, dtype=np.float64)[None, :], f, axis=0)])
    try:
        out = np.asarray(aggregate(rows), dtype=np.float64)
    except ValueError:
        return 0.0
    dist = float(np.linalg.norm(out - h.mean(axis=0)))
    return dist if math.isfinite(dist) else 0.0


def _sigma(h: np.ndarray) -> np.ndarray:
    return h.std(axis=0, ddof=1) if h.shape[0] > 1 else np.zeros(h.shape[1])


def adaptive_alie(honest: np.ndarray, f: int, aggregate: Callable[[np.ndarray], np.ndarray],
                  **search: float) -> tuple[np.ndarray, float]:
    """ALIE mu + tau* sigma with tau* = :func:`optimal_scale` against ``aggregate``; (vector, tau*)."""
    h = np.asarray(honest, dtype=np.float64)
    mu, sd = h.mean(axis=0), _sigma(h)
    tau = optimal_scale(lambda t: attack_effect(h, mu + t * sd, f, aggregate), **search)  # type: ignore[arg-type]
    return alie(h, len(h) + f, f, z=tau) if math.isfinite(tau) else mu, tau


def adaptive_ipm(honest: np.ndarray, f: int, aggregate: Callable[[np.ndarray], np.ndarray],
                 **search: float) -> tuple[np.ndarray, float]:
    """IPM -tau* mu with tau* = :func:`optimal_scale` against ``aggregate``; (vector, tau*).
    tau* = 0 (nothing beats the honest mean's own aggregate) sends the zero vector."""
    h = np.asarray(honest, dtype=np.float64)
    mu = h.mean(axis=0)
    tau = optimal_scale(lambda t: attack_effect(h, -t * mu, f, aggregate), **search)  # type: ignore[arg-type]
    return -tau * mu, tau


def mimic(honest: np.ndarray, target: int = 0) -> np.ndarray:
    """Mimic (Karimireddy, He & Jaggi, ICLR 2022; ByzFL's fixed-target form): the honest message
    number ``target`` (0 <= target < h), repeated by every Byzantine silo."""
    h = np.asarray(honest, dtype=np.float64)
    if not 0 <= target < len(h):
        raise ValueError(f"target must be in [0, {len(h) - 1}] (the honest messages), got {target}")
    return h[target].copy()


__all__ = ["ADAPTIVE_ATTACKS", "adaptive_alie", "adaptive_ipm", "attack_effect", "mimic", "optimal_scale"]
