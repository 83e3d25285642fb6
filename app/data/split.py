"""Per-silo train/test split and fixed-size minibatch sampling."""

from __future__ import annotations

import math
import numbers

import numpy as np


def _check_rng(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng={rng!r}; must be a numpy.random.Generator")


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def train_test_split_indices(
    indices: np.ndarray, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Shuffle ``indices`` with ``rng`` and split them into sorted (train, test) int64 arrays.

    The test size is ``floor(n * test_fraction + 0.5)`` (rounded half up, e.g. 212 * 0.2 -> 42,
    leaving 170 for training). When ``test_fraction > 0`` and n >= 2 it is clamped to [1, n - 1],
    so both parts are non-empty; ``test_fraction == 0`` gives an empty test part.
    """
    indices = np.asarray(indices)
    if indices.ndim != 1 or (indices.size and not np.issubdtype(indices.dtype, np.integer)):
        raise ValueError(f"indices (shape={indices.shape}, dtype={indices.dtype}) must be a 1-D integer array")
    if not isinstance(test_fraction, numbers.Real) or not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction!r}; must be a number in [0, 1)")
    _check_rng(rng)
    n = indices.size
    n_test = math.floor(n * float(test_fraction) + 0.5)
    if test_fraction > 0 and n >= 2:
        n_test = min(max(n_test, 1), n - 1)
    n_test = min(n_test, max(n - 1, 0))  # n == 1: the single record stays in train
    shuffled = indices[rng.permutation(n)].astype(np.int64)
    return np.sort(shuffled[n_test:]), np.sort(shuffled[:n_test])


def fixed_size_batch(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """K of n indices uniformly without replacement (each index has probability k / n), int64."""
    if not _is_int(n) or n < 1:
        raise ValueError(f"n={n!r}; must be an integer >= 1")
    if not _is_int(k) or not 1 <= k <= n:
        raise ValueError(f"k={k!r}; must be an integer in [1, {n}] (n)")
    _check_rng(rng)
    return rng.choice(int(n), int(k), replace=False).astype(np.int64)


def stratified_sample(labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` indices drawn without replacement with each label's share as in ``labels``
    (largest-remainder rounding), sorted int64."""
    labels = np.asarray(labels)
    if not 1 <= size < len(labels):
        raise ValueError(f"trust set size {size} must be in [1, {len(labels) - 1}] (the data has {len(labels)} records)")
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * size / len(labels)
    take = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - take))[: size - take.sum()]:
        take[i] += 1
    chosen = [rng.choice(np.flatnonzero(labels == c), size=t, replace=False) for c, t in zip(classes, take) if t]
    return np.sort(np.concatenate(chosen)).astype(np.int64)
