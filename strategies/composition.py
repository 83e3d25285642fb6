"""Rule ∘ pre-aggregators in a run: the config check, the server's step and the attacker's copy.

    direction = rule(M u),  weights over silos = w_rule @ M      (M = the chain's mix, preaggregation.py)

* ``refuse_pre`` (strategies/refusals.py): a chain that cannot work is refused with one line.
  Grad-BANT composes with NNM and ARC (row i stays silo i's, so its per-silo trust p still
  follows a silo) but not with Bucketing (a bucket is a random set of silos each round: p would
  follow no one); noise-aware Grad-BANT with none (mixing n - f messages or clipping changes an
  honest row's noise energy c, which the noise-aware score subtracts exactly). FLTrust composes
  with all three. NNM and ARC need f (byzantine.f, or a simulated attack's count).
* :func:`pre_aggregate`: the chain on the round's lifted messages, then the rule
  (gradbant.RobustAggregator.rule_aggregate). Bucketing's permutation comes from its own
  generator, seeded by (seed, "bucketing", round).
* :func:`rule_simulator`: the rule in use as the adaptive attacker evaluates it
  (app/adaptive_attacks.py): the same chain and rule, state copied, never changed; a trust rule's
  reference g0, which the attacker cannot see, replaced by the honest messages' mean. It runs on
  the messages as sent (the sketches y_i when the round is sketched): with
  ``aggregation-space = sketch`` exactly what the server aggregates (the server then lifts the
  result, S_t^T agg, which the attacker's objective ||A(rows) - mean(H)|| in R^k does not need).
* ``refuse_space`` (strategies/refusals.py, the rules' ``space`` argument): ``aggregation-space =
  sketch`` (RobAJoL: rule(y_1..y_m) in R^k, then S_t^T once) needs a linear JL sketch drawn from
  the round's broadcast seed (one S_t for every silo) and a rule that reads only the messages:
  not Grad-BANT or FLTrust (their reference g0 and Grad-BANT's descent-lemma penalty live in the
  model space), not centered clipping (its centre, the last aggregate, is in the last round's S).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from app.seeding import np_rng
from strategies.aggregation import RULES
from strategies.preaggregation import apply_chain


def chain_rng(seed: int, server_round: int) -> np.random.Generator:
    """Bucketing's generator for one round (its own stream: no other draw moves it)."""
    return np_rng(seed, "bucketing", server_round)


def pre_aggregate(agg: Any, lifted: np.ndarray, idx: np.ndarray, w: dict[str, np.ndarray], server_round: int,
                  f: int, ex: Any = None) -> tuple[np.ndarray | None, np.ndarray]:
    """``agg.rule_aggregate`` on the chain's rows; the rule's row weights mapped to silos (w @ M).
    With bucketing the rows are buckets: Grad-BANT is refused there, other rules ignore ``idx``."""
    s = agg.s
    try:
        mixed = apply_chain(lifted, s.robust.pre, max(f, 0), s.robust.bucket_size, chain_rng(s.seed, server_round))
    except ValueError as exc:  # e.g. NNM with f >= the rows left this round: as the rule itself, skip
        from logging import WARNING

        from flwr.common import log

        log(WARNING, "round %d: pre-aggregators %s: %s; the model is unchanged this round", server_round,
            ",".join(s.robust.pre), exc)
        return None, np.zeros(len(lifted))
    rows_idx = idx if len(mixed.rows) == len(idx) else np.arange(len(mixed.rows))
    direction, weights = agg.rule_aggregate(mixed.rows, rows_idx, w, server_round, f, ex)
    return direction, np.asarray(weights, dtype=np.float64) @ mixed.mix


def rule_simulator(agg: Any, server_round: int, f: int, honest_mean: np.ndarray, scale: float = 1.0,
                   lift: Callable[[np.ndarray], np.ndarray] | None = None) -> Callable[[np.ndarray], np.ndarray]:
    """rows (messages, times ``scale`` into the rule's space) -> the rule's direction after the
    chain, back in the messages' space (divided by ``scale``), with ``agg``'s state copied (the
    real round is not touched); zero when the rule keeps nothing. Trust rules score against
    ``honest_mean`` (times scale) in place of the server's g0. ``lift`` (a sketched round whose
    rule runs in the model space, ``aggregation-space = lifted``): each row is read as the server
    reads it, S_t^T y, and the direction (and ``honest_mean``) is in the model space."""
    from strategies.gradbant import gradbant_step

    s = agg.s
    rule, g0 = s.robust.aggregator, np.asarray(honest_mean, dtype=np.float64) * scale
    spec = RULES.get(rule)

    lifted: dict[bytes, np.ndarray] = {}  # the honest rows recur in every evaluation: lift each once

    def read(rows: np.ndarray) -> np.ndarray:
        r = np.asarray(rows, dtype=np.float64)
        if lift is None:
            return r
        out = []
        for row in r:
            key = row.tobytes()
            if key not in lifted:
                lifted[key] = np.asarray(lift(row), dtype=np.float64)
            out.append(lifted[key])
        return np.stack(out)

    def run(rows: np.ndarray) -> np.ndarray:
        u = read(rows) * scale
        if s.robust.pre:
            u = apply_chain(u, s.robust.pre, max(f, 0), s.robust.bucket_size, chain_rng(s.seed, server_round)).rows
        if rule == "gradbant":
            smooth = s.robust.gradbant_smoothness if isinstance(s.robust.gradbant_smoothness, float) else 1.0
            n = len(u)
            out = gradbant_step(g0, u, np.full(n, 1.0 / n), np.arange(n), s.robust.gradbant_beta, smooth, s.lr,
                                agg.dp_energy(agg.phase))[0]
            return np.zeros(u.shape[1]) if out is None else out / scale
        assert spec is not None
        kwargs: dict[str, Any] = {}
        if "trust_update" in spec.inputs:
            kwargs["trust_update"] = g0
        if "f" in spec.inputs:
            kwargs["f"] = f
        if "center" in spec.inputs:
            kwargs["center"] = agg.center.copy() if agg.center is not None else np.zeros(u.shape[1])
        if "tau" in spec.inputs:
            kwargs["tau"] = s.robust.cc_tau
        return spec.fn(u, **kwargs).vector / scale

    return run
