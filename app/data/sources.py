"""Data sources: load a whole data set (train + test pooled) from local disk.

Every loader returns a :class:`Dataset` with float32 features and int64 labels.
The federated split into silos and per-silo train/test is done elsewhere
(:mod:`app.data.partition`, :mod:`app.data.split`). Heavy libraries (sklearn,
torchvision) are imported lazily inside the loaders.
"""

from __future__ import annotations

import gzip
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SOURCES: tuple[str, ...] = (
    "wbcd",
    "digits",
    "fashion-mnist",
    "mnist",
    "tv-fashion-mnist",
    "cifar10",
    "synthetic",
    "synthetic-image",
)

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
DEFAULT_TORCHVISION_ROOT = "~/.silofl/data"

_IDX_MAGIC_IMAGES = 2051
_IDX_MAGIC_LABELS = 2049
_FASHION_FILES = (
    ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
)
_SYNTHETIC_DEFAULTS: dict[str, Any] = {"n": 1000, "d": 20, "num_classes": 2, "separation": 2.0}
#: CIFAR-10-shaped: 3 x 32 x 32 images, 10 classes (feature shape and classes are public metadata)
_SYNTHETIC_IMAGE_DEFAULTS: dict[str, Any] = {"n": 3000, "num_classes": 10, "separation": 1.0}
SYNTHETIC_IMAGE_SHAPE = (3, 32, 32)


class DataUnavailableError(RuntimeError):
    """The data set is neither on disk nor downloadable (e.g. offline)."""


@dataclass(frozen=True)
class Dataset:
    """A whole data set: features ``x`` [N, ...], labels ``y`` [N] in 0..num_classes-1."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    name: str
    feature_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.x.dtype != np.float32:
            raise ValueError(f"x.dtype={self.x.dtype}; must be float32")
        if self.y.dtype != np.int64 or self.y.ndim != 1:
            raise ValueError(f"y (dtype={self.y.dtype}, ndim={self.y.ndim}) must be 1-D int64")
        if self.x.ndim < 2 or self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"x.shape={self.x.shape} must be [N, ...] with N=len(y)={len(self.y)}")
        if tuple(self.feature_shape) != tuple(self.x.shape[1:]):
            raise ValueError(f"feature_shape={self.feature_shape}; must equal x.shape[1:]={self.x.shape[1:]}")
        if self.num_classes < 1 or (self.y.size and (self.y.min() < 0 or self.y.max() >= self.num_classes)):
            raise ValueError(f"labels must lie in 0..num_classes-1 with num_classes={self.num_classes}")

    def __len__(self) -> int:
        return int(self.y.shape[0])


def _make(x: np.ndarray, y: np.ndarray, num_classes: int, name: str) -> Dataset:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.ascontiguousarray(y, dtype=np.int64)
    return Dataset(x=x, y=y, num_classes=int(num_classes), name=name, feature_shape=tuple(x.shape[1:]))


# --------------------------------------------------------------------------- sklearn


def _sklearn_data_file(name: str) -> Path | None:
    """The path of a data file bundled with scikit-learn (sklearn/datasets/data/<name>), found
    without importing sklearn (its import takes 1-5 s); None when it is not there."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "datasets" / "data" / name
        if path.is_file():
            return path
    return None


def _read_sklearn_csv(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """sklearn's bundled CSV format (``sklearn.datasets.load_csv_data``): a first line
    ``n_samples,n_features,<class names>``, then one record per line, the features then the
    integer class. The same float64 data and int target as sklearn reads; checked against the
    counts in the first line."""
    import csv

    with path.open(newline="") as fh:
        rows = csv.reader(fh)
        head = next(rows)
        n, d = int(head[0]), int(head[1])
        records = [row for row in rows if row]
    if len(records) != n or any(len(r) != d + 1 for r in records):
        raise ValueError(f"{path}: expected {n} records of {d} features and a class")
    data = np.asarray([r[:-1] for r in records], dtype=np.float64)
    target = np.asarray([int(r[-1]) for r in records], dtype=int)
    return data, target


def _load_wbcd() -> Dataset:
    """Wisconsin breast cancer (569 x 30); sklearn's target: 0 = malignant, 1 = benign. Read
    from the CSV file scikit-learn ships (what ``load_breast_cancer`` reads), without importing
    scikit-learn; through sklearn itself where that file is not found."""
    path = _sklearn_data_file("breast_cancer.csv")
    if path is not None:
        data, target = _read_sklearn_csv(path)
        return _make(data, target, 2, "wbcd")
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return _make(bunch.data, bunch.target, 2, "wbcd")


def _load_digits() -> Dataset:
    """sklearn 8x8 digits (1797 x 64, 10 classes), unscaled pixel values 0..16."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return _make(bunch.data, bunch.target, 10, "digits")


# --------------------------------------------------------------------------- idx files


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read one (optionally gzipped) unsigned-byte idx file: images (2051, 3-D) or labels (2049, 1-D).

    A corrupt or truncated file raises ValueError naming the file.
    """
    path = Path(path)
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                raw = fh.read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"idx file {path}: unreadable or truncated ({exc})") from exc
    if len(raw) < 8:
        raise ValueError(f"idx file {path}: {len(raw)} bytes, too short for an idx header")
    magic = int.from_bytes(raw[0:4], "big")
    if magic == _IDX_MAGIC_IMAGES:
        ndim = 3
    elif magic == _IDX_MAGIC_LABELS:
        ndim = 1
    else:
        raise ValueError(f"idx file {path}: magic number {magic}; expected {_IDX_MAGIC_IMAGES} or {_IDX_MAGIC_LABELS}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"idx file {path}: {len(raw)} bytes, too short for a {ndim}-D header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        raise ValueError(f"idx file {path}: {len(raw)} bytes; dims {dims} require exactly {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _find_idx(directory: Path, stem: str) -> Path | None:
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    return None


def _load_fashion_idx(data_dir: str | None) -> Dataset:
    """Fashion-MNIST from idx files (gz or plain); train + test -> 70000 x 1 x 28 x 28 in [0, 1]."""
    directory = Path(data_dir if data_dir is not None else FASHION_MNIST_DIR).expanduser()
    stems = [s for pair in _FASHION_FILES for s in pair]
    found = {s: _find_idx(directory, s) for s in stems}
    missing = [s for s, p in found.items() if p is None]
    if missing:
        raise DataUnavailableError(
            f"fashion-mnist: missing {', '.join(m + '[.gz]' for m in missing)} in {directory}; "
            "install the Debian package dataset-fashion-mnist (files in /usr/share/datasets/fashion-mnist/) "
            "or pass data-dir=<folder with the four idx files>"
        )
    xs, ys = [], []
    for img_stem, lbl_stem in _FASHION_FILES:
        images, labels = read_idx(found[img_stem]), read_idx(found[lbl_stem])  # type: ignore[arg-type]
        if images.ndim != 3:
            raise ValueError(f"idx file {found[img_stem]}: expected an image file (magic 2051), got labels")
        if labels.ndim != 1:
            raise ValueError(f"idx file {found[lbl_stem]}: expected a label file (magic 2049), got images")
        if images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"idx files {found[img_stem]} / {found[lbl_stem]}: {images.shape[0]} images but {labels.shape[0]} labels"
            )
        if labels.size and labels.max() > 9:
            raise ValueError(f"idx file {found[lbl_stem]}: label {int(labels.max())} outside 0..9")
        xs.append(images)
        ys.append(labels)
    if xs[0].shape[1:] != xs[1].shape[1:]:
        raise ValueError(f"fashion-mnist: train images {xs[0].shape[1:]} and test images {xs[1].shape[1:]} differ in size")
    x = np.concatenate(xs).astype(np.float32)[:, None, :, :] / np.float32(255.0)
    return _make(x, np.concatenate(ys), 10, "fashion-mnist")


# --------------------------------------------------------------------------- torchvision

_TV = {
    # name: (torchvision class, folder torchvision looks in under root, num_classes)
    "mnist": ("MNIST", "MNIST/raw", 10),
    "tv-fashion-mnist": ("FashionMNIST", "FashionMNIST/raw", 10),
    "cifar10": ("CIFAR10", "cifar-10-batches-py", 10),
}


def _to_nchw(data: Any) -> np.ndarray:
    arr = data.numpy() if hasattr(data, "numpy") else np.asarray(data)
    if arr.ndim == 3:  # N, H, W (MNIST family)
        arr = arr[:, None, :, :]
    elif arr.ndim == 4:  # N, H, W, C (CIFAR)
        arr = arr.transpose(0, 3, 1, 2)
    return arr.astype(np.float32) / np.float32(255.0)


def _load_torchvision(name: str, data_dir: str | None, download: bool) -> Dataset:
    """MNIST / FashionMNIST / CIFAR10 via torchvision; train + test, [N, C, H, W] float32 in [0, 1]."""
    cls_name, sub, num_classes = _TV[name]
    root = os.path.abspath(os.path.expanduser(data_dir if data_dir is not None else DEFAULT_TORCHVISION_ROOT))
    try:
        import torchvision.datasets as tvd

        cls = getattr(tvd, cls_name)
        parts = [cls(root=root, train=train, download=download) for train in (True, False)]
    except Exception as exc:  # torchvision raises RuntimeError / URLError / OSError; never leak them
        if download:
            how = "could not be loaded or downloaded (offline?)"
            fix = f'pass data-dir="<folder containing {sub}>"'
        else:  # a run never downloads: say how to put the files where it looks
            how = "not found or unreadable (a run never downloads data)"
            fetch = f"import torchvision; torchvision.datasets.{cls_name}({root!r}, download=True)"
            fix = (f"fetch them with: python -c {fetch!r} (needs internet; or copy {sub} from a machine that "
                   f'has it), or pass data-dir="<folder containing {sub}>"')
        raise DataUnavailableError(
            f"{name}: torchvision.datasets.{cls_name} files {how}; looked in {os.path.join(root, sub)}; "
            f"{fix} ({type(exc).__name__}: {exc})"
        ) from exc
    x = np.concatenate([_to_nchw(p.data) for p in parts])
    y = np.concatenate([np.asarray(p.targets, dtype=np.int64) for p in parts])
    return _make(x, y, num_classes, name)


# --------------------------------------------------------------------------- synthetic


def _load_synthetic(rng: np.random.Generator | None, params: dict[str, Any] | None) -> Dataset:
    """Gaussian mixture: balanced labels, class centres at norm ``separation``, unit isotropic noise.

    Centres are standard-normal directions scaled to norm ``separation``; labels are a shuffled
    ``arange(n) % num_classes``; ``x = centre[y] + N(0, I_d)``. Defaults: n=1000, d=20, 2 classes, separation 2.
    """
    p = _synthetic_params("synthetic", rng, params, _SYNTHETIC_DEFAULTS, ("num_classes", "d", "n"))
    n, d, c, sep = p["n"], p["d"], p["num_classes"], p["separation"]
    directions = rng.standard_normal((c, d))
    norms = np.linalg.norm(directions, axis=1, keepdims=True)
    centres = float(sep) * directions / np.maximum(norms, 1e-12)
    y = rng.permutation(np.arange(n) % c)
    x = centres[y] + rng.standard_normal((n, d))
    return _make(x, y, c, "synthetic")


def _load_synthetic_image(rng: np.random.Generator | None, params: dict[str, Any] | None) -> Dataset:
    """CIFAR-10-shaped images without a download: ``n`` records of 3 x 32 x 32 in [0, 1], balanced
    labels 0..num_classes-1 (a shuffled ``arange(n) % num_classes``).

    Each class has a smooth template (a standard-normal 3 x 8 x 8 grid, each cell repeated 4 x 4);
    an image is ``clip(0.5 + 0.15 * (separation * template[y] + N(0, I)), 0, 1)``: an easy task
    (at separation 1 a nearest-class-mean classifier is nearly perfect), for exercising the image
    models (LeNet-5, ResNet-18) end to end, not for measuring accuracy.
    Defaults: n=3000, 10 classes, separation 1 (37 MB of float32).
    """
    p = _synthetic_params("synthetic-image", rng, params, _SYNTHETIC_IMAGE_DEFAULTS, ("num_classes", "n"))
    n, c, sep = p["n"], p["num_classes"], p["separation"]
    ch, h, w = SYNTHETIC_IMAGE_SHAPE
    templates = rng.standard_normal((c, ch, h // 4, w // 4), dtype=np.float32).repeat(4, axis=2).repeat(4, axis=3)
    y = rng.permutation(np.arange(n) % c)
    x = rng.standard_normal((n, ch, h, w), dtype=np.float32)
    x += np.float32(sep) * templates[y]
    x *= np.float32(0.15)
    x += np.float32(0.5)
    np.clip(x, 0.0, 1.0, out=x)
    return _make(x, y, c, "synthetic-image")


def _synthetic_params(name: str, rng: Any, params: dict[str, Any] | None, defaults: dict[str, Any],
                      integers: tuple[str, ...]) -> dict[str, Any]:
    """A synthetic source's parameters: ``defaults`` overridden by ``params`` (unknown keys
    refused), each of ``integers`` an integer >= its floor (num_classes >= 2, d >= 1, n >=
    num_classes, checked in that order) and ``separation`` a finite number >= 0; ``rng`` must be
    a numpy Generator."""
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng={rng!r}; source {name!r} requires a numpy.random.Generator")
    p = dict(defaults)
    unknown = sorted(set(params or {}) - set(p))
    if unknown:
        raise ValueError(f"synthetic_params keys {unknown}; allowed: {sorted(p)}")
    p.update(params or {})
    for key in integers:
        value, low = p[key], {"num_classes": 2, "d": 1}.get(key, p["num_classes"])
        if not _is_int(value) or value < low:  # n is checked after num_classes, so low is an int
            raise ValueError(f"synthetic_params.{key}={value!r}; must be an integer >= {low}")
    sep = p["separation"]
    if not isinstance(sep, numbers.Real) or isinstance(sep, bool) or not np.isfinite(sep) or sep < 0:
        raise ValueError(f"synthetic_params.separation={sep!r}; must be a finite number >= 0")
    return p


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


# --------------------------------------------------------------------------- dispatch


def load_source(
    name: str,
    data_dir: str | None = None,
    *,
    rng: np.random.Generator | None = None,
    download: bool = False,
    synthetic_params: dict[str, Any] | None = None,
) -> Dataset:
    """Load data source ``name`` (one of :data:`SOURCES`) as one pooled :class:`Dataset`.

    ``data_dir`` is used by the file-based sources (ignored by wbcd, digits and the synthetic ones);
    ``rng`` is required by ``synthetic`` and ``synthetic-image`` only; ``download`` only affects the
    torchvision sources; ``synthetic_params`` only applies to ``synthetic`` (keys n, d,
    num_classes, separation) and ``synthetic-image`` (keys n, num_classes, separation).
    Missing data raises :class:`DataUnavailableError`.
    """
    if name not in SOURCES:
        raise ValueError(f"dataset={name!r}; known: {', '.join(SOURCES)}")
    if synthetic_params and name not in ("synthetic", "synthetic-image"):
        raise ValueError(f"synthetic_params={synthetic_params!r}; only valid with dataset='synthetic' or "
                         f"'synthetic-image', got {name!r}")
    if name == "wbcd":
        return _load_wbcd()
    if name == "digits":
        return _load_digits()
    if name == "fashion-mnist":
        return _load_fashion_idx(data_dir)
    if name == "synthetic":
        return _load_synthetic(rng, synthetic_params)
    if name == "synthetic-image":
        return _load_synthetic_image(rng, synthetic_params)
    return _load_torchvision(name, data_dir, download)
