"""Pre-aggregators: maps of the stacked updates [n, d] applied before any rule (rule ∘ pre).

Each is a pure numpy function returning :class:`Mixed`: the new rows ``rows`` [k, d] and the
matrix ``mix`` [k, n] with ``rows == mix @ updates`` (all three are linear once the data fixed
the neighbours, the permutation or the clip factors), so a rule's per-row weights w give each
silo its share ``w @ mix``. Conventions follow ByzFL 0.0.11 (byzfl.aggregators.preaggregators):

=============  ===============================================================================
nnm            NNM_f: row i = mean of the n - f nearest rows to u_i (u_i included, Euclidean)
               (Allouah et al., AISTATS 2023, "Fixing by mixing")
bucketing      Bucketing_s: rows permuted by pi; bucket j = mean of rows pi(js+1..(j+1)s); the
               last bucket holds the n mod s leftovers (Karimireddy, He & Jaggi, ICLR 2022)
arc            ARC_f: k = floor(2 f (n - f) / n) rows with the largest norms clipped to the
               (n - k)-th smallest norm (Allouah et al. 2024, "adaptive robust clipping")
=============  ===============================================================================

:data:`PRE_AGGREGATORS` declares what each needs (f, a bucket size, a generator) and how many
rows it leaves, for the config check (strategies/preagg_config.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from strategies.aggregation import check_int, check_updates


@dataclass(frozen=True)
class Mixed:
    """A pre-aggregator's output: ``rows`` [k, d] = ``mix`` [k, n] @ updates [n, d]."""

    rows: np.ndarray
    mix: np.ndarray


def nnm(updates: np.ndarray, f: int) -> Mixed:
    """Nearest-neighbour mixing: y_i = (1/(n - f)) sum_{j in N_i} u_j, N_i the n - f rows nearest
    to u_i in Euclidean distance (u_i itself at distance 0 included; ties: lowest index).
    Needs 0 <= f < n. ``mix`` has 1/(n - f) on each N_i."""
    u = check_updates(updates)
    n = u.shape[0]
    fi = check_int("f", f, 0, n - 1)
    diff = u[:, None, :] - u[None, :, :]
    dist = np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))
    k = n - fi
    near = np.argsort(dist, axis=1, kind="stable")[:, :k]
    mix = np.zeros((n, n))
    np.put_along_axis(mix, near, 1.0 / k, axis=1)
    return Mixed(u[near].mean(axis=1), mix)


def bucketing(updates: np.ndarray, s: int, rng: np.random.Generator | None = None, *,
              perm: np.ndarray | None = None) -> Mixed:
    """Bucketing: with pi a uniform permutation of the n rows (from ``rng``, or ``perm`` given),
    z_j = (1/|B_j|) sum_{i in B_j} u_{pi(i)}, B_j = positions js .. min((j+1)s, n) - 1, so
    ceil(n/s) buckets, the last one holding the n mod s leftovers when s does not divide n.
    Needs s >= 1 (s = 1: the rows permuted)."""
    u = check_updates(updates)
    n = u.shape[0]
    size = check_int("s", s, 1)
    if perm is None:
        if rng is None:
            raise ValueError("bucketing needs rng (a numpy Generator) or perm (a permutation of the rows)")
        perm = rng.permutation(n)
    p = np.asarray(perm)
    if sorted(p.tolist()) != list(range(n)):
        raise ValueError(f"perm must be a permutation of 0..{n - 1}, got {p.tolist()}")
    buckets = [p[j:j + size] for j in range(0, n, size)]
    mix = np.zeros((len(buckets), n))
    for j, b in enumerate(buckets):
        mix[j, b] = 1.0 / len(b)
    return Mixed(np.stack([u[b].mean(axis=0) for b in buckets]), mix)


def arc(updates: np.ndarray, f: int) -> Mixed:
    """Adaptive robust clipping: k = floor(2 f (n - f) / n); with ||u_(1)|| <= ... <= ||u_(n)||
    (stable order), the k largest-norm rows become u_i min(1, ||u_(n-k)|| / ||u_i||); the others
    stay. Needs 0 <= f <= n (k = 0: nothing is clipped). ``mix`` = diag(clip factors)."""
    u = check_updates(updates)
    n = u.shape[0]
    fi = check_int("f", f, 0, n)
    k = int((2 * fi / n) * (n - fi))  # ByzFL's float expression: floor for these small integers
    norms = np.linalg.norm(u, axis=1)
    order = np.argsort(norms, kind="stable")
    factor = np.ones(n)
    if k > 0:
        tau = norms[order[n - k - 1]]
        big = order[n - k:]
        factor[big] = np.where(norms[big] > tau, tau / np.where(norms[big] > 0, norms[big], 1.0), 1.0)
    return Mixed(u * factor[:, None], np.diag(factor))


@dataclass(frozen=True)
class PreAggregator:
    """A registered pre-aggregator: whether it needs f, a bucket size, a generator; its summary."""

    needs_f: bool
    needs_rng: bool
    summary: str


PRE_AGGREGATORS: dict[str, PreAggregator] = {
    "nnm": PreAggregator(True, False, "nearest-neighbour mixing: each row the mean of its n - f nearest"),
    "bucketing": PreAggregator(False, True, "means of random buckets of s rows"),
    "arc": PreAggregator(True, False, "adaptive robust clipping of the floor(2f(n-f)/n) largest norms"),
}


def rows_after(names: Sequence[str], n: int, bucket_size: int) -> int:
    """How many rows the chain ``names`` leaves of n: ceil(n/s) after each bucketing."""
    for name in names:
        if name == "bucketing":
            n = math.ceil(n / bucket_size)
    return n


def apply_chain(updates: np.ndarray, names: Sequence[str], f: int, bucket_size: int,
                rng: np.random.Generator | None) -> Mixed:
    """The pre-aggregators ``names`` applied in order: rows = M_k ... M_1 u, ``mix`` their product."""
    u = check_updates(updates)
    rows, mix = u, np.eye(u.shape[0])
    for name in names:
        if name == "nnm":
            out = nnm(rows, f)
        elif name == "arc":
            out = arc(rows, f)
        elif name == "bucketing":
            out = bucketing(rows, bucket_size, rng)
        else:
            raise ValueError(f"unknown pre-aggregator {name!r}; allowed: {', '.join(PRE_AGGREGATORS)}")
        rows, mix = out.rows, out.mix @ mix
    return Mixed(rows, mix)


__all__ = ["PRE_AGGREGATORS", "Mixed", "PreAggregator", "apply_chain", "arc", "bucketing", "nnm", "rows_after"]
