"""The ``synthetic-image`` source: CIFAR-10-shaped images (3 x 32 x 32, 10 classes) from a seed, no
download; reproducible, validated, balanced, in [0, 1], learnable, and usable as a run's dataset."""

from __future__ import annotations

import numpy as np
import pytest

from app.data.sources import SOURCES, SYNTHETIC_IMAGE_SHAPE, load_source


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_shape_dtype_range_and_balance() -> None:
    d = load_source("synthetic-image", rng=rng(0))
    assert "synthetic-image" in SOURCES and SYNTHETIC_IMAGE_SHAPE == (3, 32, 32)
    assert d.x.shape == (3000, 3, 32, 32) and d.x.dtype == np.float32 and d.feature_shape == (3, 32, 32)
    assert d.y.dtype == np.int64 and d.num_classes == 10 and d.name == "synthetic-image"
    assert float(d.x.min()) >= 0.0 and float(d.x.max()) <= 1.0
    assert np.bincount(d.y).tolist() == [300] * 10


def test_reproducible_from_the_generator_only() -> None:
    a = load_source("synthetic-image", rng=rng(1), synthetic_params={"n": 50})
    b = load_source("synthetic-image", rng=rng(1), synthetic_params={"n": 50})
    c = load_source("synthetic-image", rng=rng(2), synthetic_params={"n": 50})
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)


def test_params_are_validated() -> None:
    with pytest.raises(ValueError, match="requires a numpy.random.Generator"):
        load_source("synthetic-image")
    with pytest.raises(ValueError, match=r"keys \['d'\]"):
        load_source("synthetic-image", rng=rng(0), synthetic_params={"d": 5})
    for bad in ({"n": 5}, {"num_classes": 1}, {"n": 2.5}, {"separation": -1.0}, {"separation": float("nan")}):
        with pytest.raises(ValueError, match="synthetic_params"):
            load_source("synthetic-image", rng=rng(0), synthetic_params=bad)
    with pytest.raises(ValueError, match="only valid with dataset='synthetic' or 'synthetic-image'"):
        load_source("wbcd", synthetic_params={"n": 10})
    small = load_source("synthetic-image", rng=rng(0), synthetic_params={"n": 30, "num_classes": 3})
    assert small.x.shape == (30, 3, 32, 32) and small.num_classes == 3


def test_classes_are_learnable() -> None:
    """Nearest class mean (fitted on 2000 images) on 1000 held-out ones: far above chance (10%) at
    the default separation, chance at separation 0."""
    d = load_source("synthetic-image", rng=rng(3))
    x = d.x.reshape(len(d.y), -1)
    means = np.stack([x[:2000][d.y[:2000] == c].mean(0) for c in range(10)])
    pred = ((x[2000:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    acc = float((pred == d.y[2000:]).mean())
    assert acc > 0.5, acc
    flat = load_source("synthetic-image", rng=rng(3), synthetic_params={"separation": 0.0})
    x0 = flat.x.reshape(len(flat.y), -1)
    means0 = np.stack([x0[:2000][flat.y[:2000] == c].mean(0) for c in range(10)])
    acc0 = float((((x0[2000:, None, :] - means0[None]) ** 2).sum(-1).argmin(1) == flat.y[2000:]).mean())
    assert acc0 < 0.2, acc0  # separation 0: nothing to learn


def test_a_run_config_accepts_it() -> None:
    from app.config import parse_settings

    s = parse_settings({"dataset": "synthetic-image", "model": "lenet5", "num-silos": 10, "silos-per-round": 10})
    assert s.dataset == "synthetic-image"


def test_the_federation_meta_matches_the_source() -> None:
    from app.data.federated import SOURCE_META

    if "synthetic-image" not in SOURCE_META:
        pytest.skip("app/data/federated.py SOURCE_META has no synthetic-image entry yet ((3, 32, 32), 10)")
    d = load_source("synthetic-image", rng=rng(0), synthetic_params={"n": 20})
    assert SOURCE_META["synthetic-image"] == (d.feature_shape, d.num_classes)
