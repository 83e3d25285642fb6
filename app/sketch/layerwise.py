"""Per-layer (block-diagonal) sketches: how the k rows are shared among the layers.

With ``layerwise=True`` every linear kind uses ``S = diag(S_1, ..., S_L)``, ``S_l`` of size
``k_l x n_l`` drawn from the seed ``(seed, round, l)``; ``E[S^T S] = I`` holds block by block.

* ``allocate_uniform(sizes, k)``: ``k_l`` proportional to ``n_l``, with ``1 <= k_l <= n_l`` and
  ``sum k_l = k``.
* ``allocate_energy(sizes, k, energy, min_k)``: ``k_l`` proportional to the layer's share of the
  energy profile (e.g. ``||g_l||^2`` of the previous round's aggregate), floored at ``min_k``
  and capped at ``n_l``, ``sum k_l = k``. The profile is an explicit argument so that the server
  (which never sees a silo's private update) computes the same allocation as every silo.

Both solve the same problem: the real allocation ``x_l = clip(t w_l, lo_l, hi_l)`` with
``sum x_l = k`` (water filling, solved exactly on the piecewise-linear sum), then integers by largest remainder
within the bounds. Deterministic: only float arithmetic on the given numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from app.sketch.base import layer_sizes as _layer_sizes


def _water_fill(w: np.ndarray, total: float, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``x = clip(t w, lo, hi)`` with ``sum x = total``; needs ``w > 0``, sum lo <= total <= sum hi.

    ``f(t) = sum clip(t w, lo, hi)`` is piecewise linear and nondecreasing with breakpoints
    ``lo/w`` and ``hi/w``: find the segment that reaches ``total`` and solve on it exactly."""
    lo_f, hi_f = lo.astype(float), hi.astype(float)
    if total <= lo_f.sum():
        return lo_f
    if total >= hi_f.sum():
        return hi_f
    bps = np.unique(np.concatenate([lo_f / w, hi_f / w]))
    f = np.clip(np.outer(bps, w), lo_f, hi_f).sum(axis=1)
    j = int(np.searchsorted(f, total))  # f[j-1] < total <= f[j]; j >= 1 since f[0] = sum lo
    t0, t1, f0, f1 = bps[j - 1], bps[j], f[j - 1], f[j]
    t = t1 if f1 == f0 else t0 + (total - f0) * (t1 - t0) / (f1 - f0)
    return np.clip(t * w, lo_f, hi_f)


def _apportion(weights: Sequence[float], total: int, lo: Sequence[int], hi: Sequence[int]) -> list[int]:
    w = np.asarray(weights, dtype=float)
    lo_a = np.asarray(lo, dtype=np.int64)
    hi_a = np.asarray(hi, dtype=np.int64)
    if not lo_a.sum() <= total <= hi_a.sum():
        raise ValueError(f"cannot share k={total} with per-layer bounds summing to "
                         f"[{lo_a.sum()}, {hi_a.sum()}]")
    pos = w > 0
    x = lo_a.astype(float)
    if not pos.any():
        raise ValueError("all allocation weights are zero")
    cap_pos = hi_a[pos].sum() + lo_a[~pos].sum()
    if total <= cap_pos:
        x[pos] = _water_fill(w[pos], total - lo_a[~pos].sum(), lo_a[pos], hi_a[pos])
    else:  # the weighted layers are full: the rest goes to the others, by size (their hi)
        x[pos] = hi_a[pos]
        x[~pos] = _water_fill(hi_a[~pos].astype(float), total - hi_a[pos].sum(), lo_a[~pos], hi_a[~pos])
    base = np.clip(np.floor(x + 1e-9).astype(np.int64), lo_a, hi_a)
    frac = x - base
    rem = int(total - base.sum())
    while rem != 0:  # |rem| <= number of layers (+1 for float error)
        if rem > 0:
            room = np.flatnonzero(base < hi_a)
            order = room[np.lexsort((room, -w[room], -frac[room]))]
            take = order[:rem]
            base[take] += 1
            frac[take] -= 1.0
        else:
            room = np.flatnonzero(base > lo_a)
            order = room[np.lexsort((room, w[room], frac[room]))]
            take = order[:-rem]
            base[take] -= 1
            frac[take] += 1.0
        rem = int(total - base.sum())
    return [int(v) for v in base]


def allocate_uniform(sizes: Sequence[int], k: int) -> list[int]:
    """``k_l`` proportional to ``n_l``; ``1 <= k_l <= n_l``; ``sum k_l = k`` (needs L <= k <= n)."""
    sizes = [int(s) for s in sizes]
    if not len(sizes) <= k <= sum(sizes):
        raise ValueError(f"k={k} must be between the number of layers ({len(sizes)}) and n={sum(sizes)}")
    return _apportion(sizes, k, [1] * len(sizes), sizes)


def allocate_energy(sizes: Sequence[int], k: int, energy: Sequence[float], *, min_k: int = 1) -> list[int]:
    """``k_l`` proportional to ``energy_l / sum(energy)``, floored at ``min(min_k, n_l)``,
    capped at ``n_l``; ``sum k_l = k``. An all-zero profile falls back to ``allocate_uniform``."""
    sizes = [int(s) for s in sizes]
    e = np.asarray([float(v) for v in energy], dtype=float)
    if e.shape != (len(sizes),):
        raise ValueError(f"energy has {e.size} values for {len(sizes)} layers")
    if not np.all(np.isfinite(e)) or np.any(e < 0):
        raise ValueError("energy values must be finite and >= 0")
    if min_k < 1:
        raise ValueError(f"min_k must be >= 1, got {min_k}")
    lo = [min(int(min_k), s) for s in sizes]
    if not sum(lo) <= k <= sum(sizes):
        raise ValueError(f"k={k} must be between sum of floors ({sum(lo)}) and n={sum(sizes)}")
    if e.sum() == 0:
        return _apportion(sizes, k, lo, sizes)
    return _apportion(e / e.sum(), k, lo, sizes)


def layer_energy(vector: torch.Tensor, layout: Sequence[Sequence[int]]) -> list[float]:
    """``||g_l||^2`` per layer of a flattened vector (e.g. the previous round's aggregate)."""
    sizes = _layer_sizes(layout)
    if vector.dim() != 1 or vector.numel() != sum(sizes):
        raise ValueError(f"expected a 1-D vector of {sum(sizes)} entries, got {tuple(vector.shape)}")
    v = vector.detach().to(torch.float64)
    return [float(p.square().sum()) for p in torch.split(v, sizes)]


__all__ = ["allocate_uniform", "allocate_energy", "layer_energy"]
