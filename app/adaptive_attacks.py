"""Adaptive update-level attacks: ALIE and IPM with the scale tuned against the rule in use, and Mimic.

Threat model (the harness's, strategies/byzantine_harness.py): f colluding Byzantine silos that
know every honest message of the round and the server's rule (its pre-aggregators, f, state).
Following ByzFL 0.0.11 (byzfl.attacks Optimal_ALittleIsEnough, Optimal_InnerProductManipulation,
Mimic; Allouah et al., AISTATS 2023), with H [h, d] the honest messages and mu their mean:

    tau* = argmax_tau || A(H, b(tau), ..., b(tau)) - mu ||      (f copies of b(tau) after H)
    ALIE:  b(tau) = mu + tau * sigma  (sigma the coordinate-wise sample std, ddof = 1)
    IPM:   b(tau) = -tau * mu
    Mimic: b = H[i*] (every Byzantine silo repeats one honest message; i* learned below)

Mimic learns its target as Karimireddy, He & Jaggi (ICLR 2022, Sec. 4 and their code's
MimicVariantAttacker) do: over a warm-up of T0 exchanges it tracks the honest messages' running mean
mu and, by an averaged power iteration, their direction of largest variance z; each warm-up exchange
it copies i* = argmax_i <h_i, z>, and after the warm-up it keeps copying that silo (heterogeneous
silos: the copied silo's data is over-weighted by f + 1). T0 = 0 is ByzFL's fixed form (H[0]).

A = the rule after its pre-aggregators. tau* comes from ByzFL's line search (:func:`optimal_scale`):
from tau = start, steps of delta doubling while the distance grows, then steps shrinking by
``ratio`` around the best point, ``evals`` evaluations of A in all. Pure numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

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
                  aggregate: Callable[[np.ndarray], np.ndarray], reference: np.ndarray | None = None) -> float:
    """|| aggregate([H; b; ...; b]) - reference || with f copies of ``byzantine`` after the honest rows,
    ``reference`` = mean(H) unless given (a rule that reads the rows through a linear map L, e.g. the
    lift S^T of a sketched round, is compared with L mean(H)); a rule that raises or returns a
    non-finite vector counts as no effect (0)."""
    h = np.asarray(honest, dtype=np.float64)
    rows = np.concatenate([h, np.repeat(np.asarray(byzantine, dtype=np.float64)[None, :], f, axis=0)])
    try:
        out = np.asarray(aggregate(rows), dtype=np.float64)
    except ValueError:
        return 0.0
    ref = h.mean(axis=0) if reference is None else np.asarray(reference, dtype=np.float64)
    if out.shape != ref.shape:
        return 0.0
    dist = float(np.linalg.norm(out - ref))
    return dist if math.isfinite(dist) else 0.0


def _sigma(h: np.ndarray) -> np.ndarray:
    return h.std(axis=0, ddof=1) if h.shape[0] > 1 else np.zeros(h.shape[1])


def adaptive_alie(honest: np.ndarray, f: int, aggregate: Callable[[np.ndarray], np.ndarray],
                  reference: np.ndarray | None = None, **search: float) -> tuple[np.ndarray, float]:
    """ALIE mu + tau* sigma with tau* = :func:`optimal_scale` against ``aggregate`` (compared with
    ``reference``, :func:`attack_effect`); (vector, tau*)."""
    h = np.asarray(honest, dtype=np.float64)
    mu, sd = h.mean(axis=0), _sigma(h)
    tau = optimal_scale(lambda t: attack_effect(h, mu + t * sd, f, aggregate, reference),  # type: ignore[arg-type]
                        **search)
    return alie(h, len(h) + f, f, z=tau) if math.isfinite(tau) else mu, tau


def adaptive_ipm(honest: np.ndarray, f: int, aggregate: Callable[[np.ndarray], np.ndarray],
                 reference: np.ndarray | None = None, **search: float) -> tuple[np.ndarray, float]:
    """IPM -tau* mu with tau* = :func:`optimal_scale` against ``aggregate`` (compared with
    ``reference``); (vector, tau*). tau* = 0 (nothing beats the honest mean's own aggregate) sends
    the zero vector."""
    h = np.asarray(honest, dtype=np.float64)
    mu = h.mean(axis=0)
    tau = optimal_scale(lambda t: attack_effect(h, -t * mu, f, aggregate, reference),  # type: ignore[arg-type]
                        **search)
    return -tau * mu, tau


def mimic(honest: np.ndarray, target: int = 0) -> np.ndarray:
    """Mimic (Karimireddy, He & Jaggi, ICLR 2022; ByzFL's fixed-target form): the honest message
    number ``target`` (0 <= target < h), repeated by every Byzantine silo."""
    h = np.asarray(honest, dtype=np.float64)
    if not 0 <= target < len(h):
        raise ValueError(f"target must be in [0, {len(h) - 1}] (the honest messages), got {target}")
    return h[target].copy()


@dataclass(frozen=True)
class MimicState:
    """What the learning Mimic carries between exchanges: t exchanges seen, the running mean mu and
    direction z (None before the first), and the silo it copies (None before the first)."""

    t: int = 0
    mu: np.ndarray | None = None
    z: np.ndarray | None = None
    target: int | None = None


def _power_step(honest: np.ndarray, mu: np.ndarray, z: np.ndarray) -> np.ndarray | None:
    """sum_i <h_i - mu, z> (h_i - mu), normalised; None when it is 0 (no variance along z)."""
    c = honest - mu
    v = (c @ z) @ c
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 and math.isfinite(norm) else None


def mimic_learning(state: MimicState, honest: np.ndarray, ids: Sequence[int], warmup: int,
                   rng: np.random.Generator) -> tuple[int, MimicState]:
    """One exchange of Karimireddy et al.'s Mimic: the silo id (of ``ids``, the honest rows' silos)
    whose message every Byzantine silo repeats, and the new state.

    t = 0:      mu = mean(H); z0 ~ N(0, I) from ``rng``; z = P(z0) with P(z) = sum_i <h_i - mu, z> (h_i - mu) / ||.||
    0 < t < T0: mu <- t/(t+1) mu + mean(H)/(t+1);  z <- (t/(t+1) z + P(z)/(t+1)) / ||.||
    t < T0:     target = ids[argmax_i <h_i, z>] (first on ties)
    t >= T0:    the last target while it answers; else (it was not sampled) argmax with z as it is.
    T0 = 0 copies ids[0] (ByzFL's Mimic(epsilon = 0) for the first honest row)."""
    h = np.asarray(honest, dtype=np.float64)
    if h.ndim != 2 or len(h) != len(ids) or len(h) == 0:
        raise ValueError(f"honest must be [h, d] with h = len(ids) >= 1, got shape {h.shape} and {len(ids)} ids")
    if not (isinstance(warmup, int) and warmup >= 0):
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    ids = [int(i) for i in ids]
    avg = h.mean(axis=0)
    mu, z, t = state.mu, state.z, state.t
    if t < warmup:
        if t == 0 or mu is None or z is None or mu.shape != avg.shape:
            mu = avg
            z0 = rng.standard_normal(h.shape[1])
            z = _power_step(h, mu, z0)
            if z is None:
                z = z0 / max(float(np.linalg.norm(z0)), 1e-300)
        else:
            mu = t / (t + 1) * mu + avg / (t + 1)
            step = _power_step(h, mu, z)
            if step is not None:
                z = t / (t + 1) * z + step / (t + 1)
                z = z / max(float(np.linalg.norm(z)), 1e-300)
        target = ids[int(np.argmax(h @ z))]
    elif state.target in ids:
        target = state.target
    elif z is not None and z.shape == avg.shape:
        target = ids[int(np.argmax(h @ z))]
    else:
        target = ids[0]
    return target, replace(state, t=t + 1, mu=mu, z=z, target=target)


__all__ = ["ADAPTIVE_ATTACKS", "MimicState", "adaptive_alie", "adaptive_ipm", "attack_effect", "mimic",
           "mimic_learning", "optimal_scale"]
