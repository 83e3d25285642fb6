"""Feature standardisation per silo: pooled, local, or none."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

STD_FLOOR = 1e-8
STANDARDIZE_MODES: tuple[str, ...] = ("pooled", "local", "none")


@dataclass(frozen=True)
class Standardizer:
    """x -> (x - mean) / std, per feature (mean and std have shape x.shape[1:]); a feature whose
    std is below 1e-8 (constant in the data it was fitted on) maps to 0 for every input: its
    training data say nothing about it, and dividing by the floor made a record that differs
    there (a test or trust-set record) 1e8 times larger (``std`` keeps the floored value)."""

    mean: np.ndarray
    std: np.ndarray
    #: features constant in the fitted data, mapped to 0 by :meth:`apply`
    constant: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        mean = np.array(self.mean, dtype=np.float64)
        raw = np.array(self.std, dtype=np.float64)
        std = np.maximum(raw, STD_FLOOR)
        if mean.shape != std.shape:
            raise ValueError(f"std.shape={std.shape}; must equal mean.shape={mean.shape}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise ValueError("mean/std contain non-finite values; must be finite")
        constant = raw < STD_FLOOR
        for a in (mean, std, constant):
            a.setflags(write=False)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "constant", constant)

    @classmethod
    def identity(cls, feature_shape: tuple[int, ...]) -> "Standardizer":
        """The no-op standardizer (mean 0, std 1) for features of ``feature_shape``."""
        return cls(np.zeros(feature_shape), np.ones(feature_shape))

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Standardize ``x`` [N, ...features]; returns x's float dtype (float32 for integer input).
        Constant features (:attr:`constant`) are 0 whatever ``x`` holds there."""
        x = np.asarray(x)
        if x.shape[1:] != self.mean.shape:
            raise ValueError(f"x.shape={x.shape}; features must have shape {self.mean.shape}")
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float32
        z = (x - self.mean) / self.std
        if self.constant.any():
            z = np.where(self.constant, 0.0, z)
        return z.astype(dtype, copy=False)


def fit_standardizer(x: np.ndarray) -> Standardizer:
    """Per-feature mean and (population) std over axis 0 of ``x`` as given, accumulated in float64."""
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[0] == 0:
        raise ValueError(f"x.shape={x.shape}; must be [N, ...features] with N >= 1")
    return Standardizer(np.mean(x, axis=0, dtype=np.float64), np.std(x, axis=0, dtype=np.float64))


def standardize_silos(
    pooled_x: np.ndarray | None, silo_train_x: list[np.ndarray], mode: str
) -> list[Standardizer]:
    """One standardizer per silo.

    - ``pooled``: one standardizer fitted on all silos' TRAIN data concatenated (non-private:
      it pools statistics across silos, as Lowy et al.'s Appendix I admits), shared by every silo.
    - ``local``: each silo fits on its own train data (the authors' code). With label-split silos
      this centres each class separately and so removes the class signal.
    - ``none``: identity.

    ``pooled_x`` (the source's features, may include test records, or None) is only used to check
    the feature shape; statistics always come from ``silo_train_x`` so test data never leaks in.
    """
    if mode not in STANDARDIZE_MODES:
        raise ValueError(f"mode={mode!r}; known: {', '.join(STANDARDIZE_MODES)}")
    if len(silo_train_x) == 0:
        raise ValueError("silo_train_x has 0 silos; must have at least 1")
    arrays = [np.asarray(a) for a in silo_train_x]
    shape = arrays[0].shape[1:] if pooled_x is None else np.asarray(pooled_x).shape[1:]
    for s, a in enumerate(arrays):
        if a.ndim < 2 or a.shape[1:] != shape or a.shape[0] == 0:
            raise ValueError(f"silo_train_x[{s}].shape={a.shape}; must be [N >= 1, *{shape}]")
    if mode == "none":
        return [Standardizer.identity(shape) for _ in arrays]
    if mode == "pooled":
        shared = fit_standardizer(np.concatenate(arrays))
        return [shared for _ in arrays]
    return [fit_standardizer(a) for a in arrays]


@dataclass(frozen=True)
class PCAProjection:
    """x -> (flatten(x) - mean) @ components.T: the top-d principal components."""

    mean: np.ndarray
    components: np.ndarray  # [d, features]

    def apply(self, x: np.ndarray) -> np.ndarray:
        flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        if flat.shape[1] != self.components.shape[1]:
            raise ValueError(f"x has {flat.shape[1]} features; the projection was fitted on {self.components.shape[1]}")
        return ((flat - self.mean) @ self.components.T).astype(np.float32)


def fit_pca(x: np.ndarray, d: int) -> PCAProjection:
    """The top-``d`` principal directions of ``x`` [N, ...] (eigenvectors of the feature
    covariance, largest eigenvalue first; each sign fixed so its largest entry is positive, so
    the projection is deterministic)."""
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    if not 1 <= d <= flat.shape[1]:
        raise ValueError(f"pca = {d} must be in [1, {flat.shape[1]}] (the number of features)")
    mean = flat.mean(axis=0)
    cov = np.cov(flat - mean, rowvar=False, bias=True)
    vals, vecs = np.linalg.eigh(cov)
    comps = vecs[:, np.argsort(vals)[::-1][:d]].T
    signs = np.sign(comps[np.arange(d), np.abs(comps).argmax(axis=1)])
    return PCAProjection(mean, comps * signs[:, None])
