"""Feature scaling inside the privacy guarantee: public ranges, public data, or DP statistics.

The modes of ``standardize`` (docs/privacy.md, "Pre-processing"):

* ``public``: x -> (x - lo) / (hi - lo) from ranges that are public facts (pixel/255 for images,
  0..16 for the 8x8 digits, ranges declared in a schema): no record is read, so nothing is spent.
* ``server``: mean and std of the server's own data (in simulation a public sample carved out of
  the source before the partition, disjoint from every silo): public, nothing is spent.
* ``dp``: each silo releases the noisy mean and second moment of its own records, each record
  first clipped to L2 norm C (Gaussian mechanism, replace-one sensitivities 2C/n and sqrt(2) C^2/n; the
  release is planned, charged to the silo's ledger and composed into its epsilon).
* ``auto`` (the default): ``server`` where the server has public data of the same kind (every
  built-in source: its public sample), else ``public`` where the data have public ranges, else
  ``dp`` (measured in docs/results.md: the public sample's statistics match the pooled ones, x/16
  on the digits costs 11 points at the preset's step size).
* ``pooled``, ``local``, ``none``: the old modes (app/data/preprocess.py); ``pooled`` and
  ``local`` read every record of all silos / of the silo without noise: NOT covered by epsilon,
  kept only to reproduce papers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.data.preprocess import Standardizer

#: every value of ``standardize``
SCALING_MODES: tuple[str, ...] = ("auto", "public", "server", "dp", "pooled", "local", "none")
#: the modes that read records without noise, outside the guarantee (reproducing papers only)
UNCOVERED_MODES: tuple[str, ...] = ("pooled", "local")
#: values of ``pca-fit``: on the server's public data, or (not covered) on all silos' pooled records
PCA_FITS: tuple[str, ...] = ("public", "pooled")

#: (lo, hi) of every feature that are public facts of the built-in sources: their loaders give
#: pixels / 255 in [0, 1]; the 8x8 digits count 0..16 ink pixels per cell
PUBLIC_RANGES: dict[str, tuple[float, float]] = {
    "fashion-mnist": (0.0, 1.0), "tv-fashion-mnist": (0.0, 1.0), "mnist": (0.0, 1.0), "cifar10": (0.0, 1.0),
    "digits": (0.0, 16.0),
}


def resolve_scaling(mode: str, dataset: str, declared: tuple[float, float] | None = None,
                    server_data: bool = True) -> str:
    """``auto`` -> ``server`` when the server has public data of the same kind (a built-in source:
    its public sample), else ``public`` when the data have public ranges (``declared`` or the
    source's), else ``dp``; any other mode as given. A shared scaler comes first: per-silo
    statistics (``dp``, like ``local``) give each silo its own transform, which with label-split
    silos encodes the silo (hence the label) in the features (docs/privacy.md, "Pre-processing")."""
    if mode != "auto":
        return mode
    if server_data:
        return "server"
    return "public" if declared is not None or dataset in PUBLIC_RANGES else "dp"


def range_scaler(lo: float | np.ndarray, hi: float | np.ndarray, feature_shape: tuple[int, ...]) -> Standardizer:
    """x -> (x - lo) / (hi - lo), per feature (``lo``/``hi`` scalars or arrays of ``feature_shape``):
    public ranges map onto [0, 1] without reading a record."""
    lo_a = np.broadcast_to(np.asarray(lo, dtype=np.float64), feature_shape)
    hi_a = np.broadcast_to(np.asarray(hi, dtype=np.float64), feature_shape)
    if not np.all(hi_a > lo_a):
        raise ValueError("declared ranges need hi > lo for every feature")
    return Standardizer(lo_a.copy(), (hi_a - lo_a).copy())


@dataclass(frozen=True)
class DPStatsStep:
    """A silo's DP standardisation, still to be done by the silo itself (after its ledger has
    charged the release): records clipped to L2 norm ``clip`` (after ``pre``), ``share`` of the
    run's epsilon."""

    clip: float
    share: float
    #: the public scaling applied before (identity when the data have no public ranges)
    pre: Standardizer


def clip_records(x: np.ndarray, clip: float) -> np.ndarray:
    """Each record (row, flattened) scaled down to L2 norm at most ``clip``, float64."""
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    norms = np.linalg.norm(flat, axis=1, keepdims=True)
    return (flat * np.minimum(1.0, clip / np.maximum(norms, 1e-300))).reshape(np.shape(x))


def dp_stats_sigmas(n: int, clip: float, noise_multiplier: float) -> tuple[float, float]:
    """Noise stds of the release: (z * 2C / n, z * sqrt(2) C^2 / n), the replace-one L2
    sensitivities of the mean of records with ||x|| <= C and of the mean of their squares: a^2 and
    b^2 are non-negative with ||a^2||_2 <= ||a||^2 <= C^2, so ||a^2 - b^2||^2 <= ||a^2||^2 + ||b^2||^2
    <= 2 C^4 (attained by a = C e1, b = C e2)."""
    return noise_multiplier * 2.0 * clip / n, noise_multiplier * math.sqrt(2.0) * clip * clip / n


def dp_moments(x: np.ndarray, clip: float, noise_multiplier: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """The release: (m, q, s2) with m = mean(clip_C(x)) + N(0, s1^2), q = mean(clip_C(x)^2) + N(0, s2^2)
    per feature (:func:`dp_stats_sigmas`)."""
    x = np.asarray(x)
    if x.ndim < 2 or len(x) == 0:
        raise ValueError(f"x.shape={x.shape}; must be [n >= 1, ...features]")
    if not clip > 0:
        raise ValueError(f"preprocess-clip = {clip} must be > 0")
    c = clip_records(x, clip)
    s1, s2 = dp_stats_sigmas(len(x), clip, noise_multiplier)
    mean = c.mean(axis=0) + rng.normal(0.0, 1.0, size=c.shape[1:]) * s1
    second = (c * c).mean(axis=0) + rng.normal(0.0, 1.0, size=c.shape[1:]) * s2
    return mean, second, s2


def dp_standardizer(x: np.ndarray, clip: float, noise_multiplier: float, rng: np.random.Generator) -> Standardizer:
    """The DP standardizer of ``x`` [n, ...] from :func:`dp_moments`: mean m, std = sqrt(max(q - m^2,
    s2)) (the variance floored at the public noise level s2, so noise never zeroes a feature).
    Post-processing of the release. Apply it to clipped records (:func:`clip_records`)."""
    mean, second, s2 = dp_moments(x, clip, noise_multiplier, rng)
    return Standardizer(mean, np.sqrt(np.maximum(second - mean * mean, s2)))


def dp_transform(step: DPStatsStep, train: np.ndarray, others: list[np.ndarray], noise_multiplier: float,
                 rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """A silo's ``dp`` pre-processing of its own (already publicly scaled) records: the DP
    standardizer of its clipped training records (:func:`dp_standardizer`), applied to the clipped
    ``train`` and to each of ``others`` (its test and validation records), float32."""
    scaler = dp_standardizer(train, step.clip, noise_multiplier, rng)

    def tr(a: np.ndarray) -> np.ndarray:
        return scaler.apply(clip_records(a, step.clip)).astype(np.float32) if len(a) else np.asarray(a, np.float32)

    return tr(train), [tr(a) for a in others]
