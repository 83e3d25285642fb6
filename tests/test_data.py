"""Tests for app.data: sources, partitioners, splits, standardisation (fixed seeds, fast)."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
import torch

from app.data import (
    EVEN_ODD_PAIRS,
    PARTITIONS,
    SOURCES,
    DataUnavailableError,
    Dataset,
    Standardizer,
    by_label,
    dirichlet,
    even_odd_labels,
    even_odd_pairs,
    fit_standardizer,
    fixed_size_batch,
    iid,
    load_source,
    make_partition,
    mixing,
    read_idx,
    standardize_silos,
    train_test_split_indices,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="module")
def wbcd() -> Dataset:
    return load_source("wbcd")


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_source("digits")


@pytest.fixture(scope="module")
def fashion() -> Dataset:
    return load_source("fashion-mnist")


def assert_disjoint_cover(parts: list[np.ndarray], expected: np.ndarray) -> None:
    """Silos are sorted int64, pairwise disjoint, and together exactly ``expected``."""
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1 and p.size > 0
        assert np.all(np.diff(p) > 0)  # sorted, no duplicates within a silo
    allidx = np.concatenate(parts)
    assert allidx.size == np.unique(allidx).size  # disjoint
    np.testing.assert_array_equal(np.sort(allidx), np.sort(expected))


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


# --------------------------------------------------------------------------- sources


def test_package_imports_no_flwr_and_is_light() -> None:
    """app.data never imports flwr; torch/torchvision/sklearn are only imported inside loaders."""
    code = (
        "import sys, app.data; "
        "bad = [m for m in ('flwr', 'torch', 'torchvision', 'sklearn') if m in sys.modules]; "
        "assert not bad, bad"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_wbcd_shape_and_class_counts(wbcd: Dataset) -> None:
    assert wbcd.x.shape == (569, 30) and wbcd.x.dtype == np.float32
    assert wbcd.y.dtype == np.int64 and wbcd.num_classes == 2 and wbcd.feature_shape == (30,)
    # UCI WDBC: 212 malignant (sklearn target 0), 357 benign (target 1)
    assert np.bincount(wbcd.y).tolist() == [212, 357]


def test_digits_shape(digits: Dataset) -> None:
    assert digits.x.shape == (1797, 64) and digits.x.dtype == np.float32
    assert digits.num_classes == 10 and set(np.unique(digits.y)) == set(range(10))
    assert digits.x.min() == 0.0 and digits.x.max() == 16.0


def test_unknown_source_lists_known_names() -> None:
    with pytest.raises(ValueError, match="known: .*wbcd.*cifar10"):
        load_source("imagenet")
    assert set(SOURCES) == {"wbcd", "digits", "fashion-mnist", "mnist", "tv-fashion-mnist", "cifar10", "synthetic",
                            "synthetic-image"}


def test_synthetic_reproducible_and_validated() -> None:
    a = load_source("synthetic", rng=rng(1))
    b = load_source("synthetic", rng=rng(1))
    c = load_source("synthetic", rng=rng(2))
    assert a.x.shape == (1000, 20) and a.num_classes == 2 and a.x.dtype == np.float32
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.x, c.x)
    assert np.bincount(a.y).tolist() == [500, 500]
    m = load_source("synthetic", rng=rng(0), synthetic_params={"n": 300, "d": 5, "num_classes": 3, "separation": 4.0})
    assert m.x.shape == (300, 5) and np.bincount(m.y).tolist() == [100, 100, 100]
    with pytest.raises(ValueError, match="rng"):
        load_source("synthetic")
    with pytest.raises(ValueError, match="synthetic_params"):
        load_source("synthetic", rng=rng(0), synthetic_params={"bogus": 1})
    with pytest.raises(ValueError, match="num_classes"):
        load_source("synthetic", rng=rng(0), synthetic_params={"num_classes": 1})
    with pytest.raises(ValueError, match="separation"):
        load_source("synthetic", rng=rng(0), synthetic_params={"separation": -1.0})


def test_synthetic_is_learnable() -> None:
    """With a large separation, a nearest-class-mean rule is far above chance."""
    ds = load_source("synthetic", rng=rng(3), synthetic_params={"separation": 6.0})
    means = np.stack([ds.x[ds.y == c].mean(0) for c in range(2)])
    pred = np.argmin(((ds.x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (pred == ds.y).mean() > 0.95


@pytest.mark.needs_data("fashion-mnist")
def test_fashion_mnist_idx(fashion: Dataset) -> None:
    assert fashion.x.shape == (70000, 1, 28, 28) and fashion.x.dtype == np.float32
    assert fashion.num_classes == 10 and fashion.feature_shape == (1, 28, 28)
    assert np.bincount(fashion.y).tolist() == [7000] * 10
    assert 0.0 <= fashion.x.min() and fashion.x.max() <= 1.0 and fashion.x.max() == 1.0


def _idx_bytes(arr: np.ndarray) -> bytes:
    magic = 2051 if arr.ndim == 3 else 2049
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in arr.shape) + arr.astype(np.uint8).tobytes()


def _write_fake_fashion(folder: Path, gz: bool, n_train: int = 6, n_test: int = 4) -> tuple[np.ndarray, np.ndarray]:
    g = rng(5)
    imgs = g.integers(0, 256, size=(n_train + n_test, 28, 28), dtype=np.uint8)
    labs = g.integers(0, 10, size=n_train + n_test).astype(np.uint8)
    files = {
        "train-images-idx3-ubyte": imgs[:n_train],
        "train-labels-idx1-ubyte": labs[:n_train],
        "t10k-images-idx3-ubyte": imgs[n_train:],
        "t10k-labels-idx1-ubyte": labs[n_train:],
    }
    for stem, arr in files.items():
        data = _idx_bytes(arr)
        if gz:
            with gzip.open(folder / f"{stem}.gz", "wb") as fh:
                fh.write(data)
        else:
            (folder / stem).write_bytes(data)
    return imgs, labs


@pytest.mark.parametrize("gz", [True, False])
def test_idx_loader_on_small_files(tmp_path: Path, gz: bool) -> None:
    imgs, labs = _write_fake_fashion(tmp_path, gz)
    ds = load_source("fashion-mnist", str(tmp_path))
    assert ds.x.shape == (10, 1, 28, 28)
    np.testing.assert_allclose(ds.x[:, 0], imgs / 255.0, rtol=0, atol=1e-7)
    np.testing.assert_array_equal(ds.y, labs)


@pytest.mark.parametrize("gz", [True, False])
def test_truncated_idx_raises_value_error_naming_file(tmp_path: Path, gz: bool) -> None:
    _write_fake_fashion(tmp_path, gz)
    name = "train-images-idx3-ubyte" + (".gz" if gz else "")
    path = tmp_path / name
    if gz:
        data = gzip.decompress(path.read_bytes())
        path.write_bytes(gzip.compress(data[:-100]))  # valid gzip, truncated payload
    else:
        path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match=name):
        load_source("fashion-mnist", str(tmp_path))
    with pytest.raises(ValueError, match=name):
        read_idx(path)


def test_truncated_gzip_stream_and_bad_magic(tmp_path: Path) -> None:
    good = gzip.compress(_idx_bytes(np.zeros((3, 28, 28), np.uint8)))
    cut = tmp_path / "cut.gz"
    cut.write_bytes(good[: len(good) // 2])  # the gzip stream itself is truncated
    with pytest.raises(ValueError, match="cut.gz"):
        read_idx(cut)
    bad = tmp_path / "bad"
    bad.write_bytes(struct.pack(">II", 1234, 0))
    with pytest.raises(ValueError, match="magic"):
        read_idx(bad)


def test_fashion_missing_files_is_data_unavailable(tmp_path: Path) -> None:
    with pytest.raises(DataUnavailableError, match="train-images-idx3-ubyte"):
        load_source("fashion-mnist", str(tmp_path))


@pytest.mark.parametrize("name", ["mnist", "tv-fashion-mnist", "cifar10"])
def test_torchvision_absent_raises_data_unavailable(tmp_path: Path, name: str) -> None:
    with pytest.raises(DataUnavailableError, match="data-dir") as info:
        load_source(name, str(tmp_path), download=False)
    assert str(tmp_path) in str(info.value)


# --------------------------------------------------------------------------- partitions


def test_by_label_wbcd_two_silos(wbcd: Dataset) -> None:
    parts = by_label(wbcd.y, 2, rng(0))
    assert_disjoint_cover(parts, np.arange(569))
    assert parts[0].size == 212 and set(wbcd.y[parts[0]]) == {0}  # malignant silo
    assert parts[1].size == 357 and set(wbcd.y[parts[1]]) == {1}  # benign silo


def test_by_label_groups_and_limits(digits: Dataset) -> None:
    parts = by_label(digits.y, 3, rng(0))
    assert_disjoint_cover(parts, np.arange(digits.y.size))
    # class c -> silo c * 3 // 10: {0,1,2,3}, {4,5,6}, {7,8,9}
    assert [sorted(set(digits.y[p].tolist())) for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(ValueError, match="num_silos=11"):
        by_label(digits.y, 11, rng(0))


def test_iid_sizes_and_reproducibility(digits: Dataset) -> None:
    n = digits.y.size
    parts = iid(digits.y, 7, rng(0))
    assert_disjoint_cover(parts, np.arange(n))
    sizes = [p.size for p in parts]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n
    assert same(parts, iid(digits.y, 7, rng(0)))
    assert not same(parts, iid(digits.y, 7, rng(1)))


def test_even_odd_pairs_25_silos(digits: Dataset) -> None:
    y = digits.y
    parts = even_odd_pairs(y, 25, rng(0))
    assert_disjoint_cover(parts, np.arange(y.size))
    for s, p in enumerate(parts):
        classes = set(y[p].tolist())
        assert classes == {2 * (s // 5), 2 * (s % 5) + 1}  # pair s in lexicographic order
        assert len(classes) == 2 and sorted(c % 2 for c in classes) == [0, 1]  # one even, one odd
    assert EVEN_ODD_PAIRS[7] == (2, 5)
    for c in range(10):  # each class split evenly (+-1) among its 5 silos
        counts = [int((y[p] == c).sum()) for p in parts if (y[p] == c).any()]
        assert len(counts) == 5 and max(counts) - min(counts) <= 1 and sum(counts) == (y == c).sum()
    assert same(parts, even_odd_pairs(y, 25, rng(0)))
    assert not same(parts, even_odd_pairs(y, 25, rng(1)))


@pytest.mark.needs_data("fashion-mnist")
def test_even_odd_pairs_fashion_exact(fashion: Dataset) -> None:
    parts = even_odd_pairs(fashion.y, 25, rng(0))
    assert [p.size for p in parts] == [2800] * 25  # 7000 / 5 = 1400 per class per silo


def test_even_odd_pairs_fewer_silos_drop_unused_classes(digits: Dataset) -> None:
    y = digits.y
    parts = even_odd_pairs(y, 1, rng(0))
    assert sorted(set(y[parts[0]].tolist())) == [0, 1]
    assert parts[0].size == int(((y == 0) | (y == 1)).sum())
    parts = even_odd_pairs(y, 6, rng(0))  # pairs (0,1),(0,3),(0,5),(0,7),(0,9),(2,1)
    used = np.flatnonzero(np.isin(y, [0, 1, 2, 3, 5, 7, 9]))
    assert_disjoint_cover(parts, used)
    with pytest.raises(ValueError, match="num_silos=26"):
        even_odd_pairs(y, 26, rng(0))
    with pytest.raises(ValueError, match="0..9"):
        even_odd_pairs(np.array([0, 1, 12]), 1, rng(0))


def test_even_odd_labels() -> None:
    np.testing.assert_array_equal(even_odd_labels(np.arange(10)), [0, 1] * 5)
    assert even_odd_labels(np.arange(10)).dtype == np.int64
    with pytest.raises(ValueError):
        even_odd_labels(np.array([10]))


def test_dirichlet_min_size_and_reproducibility(digits: Dataset) -> None:
    y = digits.y
    parts = dirichlet(y, 10, 0.1, rng(0), min_size=20)
    assert_disjoint_cover(parts, np.arange(y.size))
    assert min(p.size for p in parts) >= 20
    assert same(parts, dirichlet(y, 10, 0.1, rng(0), min_size=20))
    assert not same(parts, dirichlet(y, 10, 0.1, rng(1), min_size=20))
    # small alpha is label-skewed: most silos are dominated by few classes
    top_share = [np.bincount(y[p], minlength=10).max() / p.size for p in parts]
    assert np.median(top_share) > 0.4


def test_dirichlet_bounded_attempts_and_validation(digits: Dataset) -> None:
    with pytest.raises(ValueError, match="attempts"):
        dirichlet(digits.y, 50, 0.01, rng(0), min_size=30, max_attempts=3)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet(digits.y, 5, 0.0, rng(0))
    with pytest.raises(ValueError, match="min_size"):
        dirichlet(digits.y, 10, 1.0, rng(0), min_size=200)  # 10 * 200 > 1797


def test_mixing_extremes(digits: Dataset) -> None:
    y = digits.y
    p0 = mixing(y, 5, 0.0, rng(0))
    assert same(p0, by_label(y, 5, rng(0)))
    p1 = mixing(y, 5, 1.0, rng(0))
    assert_disjoint_cover(p1, np.arange(y.size))
    assert all(set(y[p].tolist()) == set(range(10)) for p in p1)
    assert same(p1, iid(y, 5, rng(0)))
    assert same(p1, mixing(y, 5, 1.0, rng(0))) and not same(p1, mixing(y, 5, 1.0, rng(1)))


def test_mixing_intermediate(digits: Dataset) -> None:
    y = digits.y
    parts = mixing(y, 5, 0.3, rng(0))
    assert_disjoint_cover(parts, np.arange(y.size))
    home = np.arange(10) * 5 // 10  # by_label class -> silo map
    foreign = sum(int((home[y[p]] != s).sum()) for s, p in enumerate(parts))
    pool = round(0.3 * y.size)
    # pooled records land on a random silo: about 4/5 of them are foreign to it
    assert foreign <= pool and abs(foreign - 0.8 * pool) < 0.1 * pool


def test_make_partition_dispatch_and_validation(digits: Dataset) -> None:
    y = digits.y
    assert set(PARTITIONS) == {"label", "even-odd-pairs", "dirichlet", "iid", "mixing"}
    for kind in PARTITIONS:
        parts = make_partition(kind, y, 5, rng(0), alpha=1.0, p=0.5)
        assert len(parts) == 5
    assert same(make_partition("iid", y, 4, rng(2)), iid(y, 4, rng(2)))
    with pytest.raises(ValueError, match="known"):
        make_partition("bogus", y, 2, rng(0))
    with pytest.raises(ValueError, match="num_silos=0"):
        make_partition("iid", y, 0, rng(0))
    with pytest.raises(ValueError, match="num_silos=4"):
        make_partition("iid", np.array([0, 1, 0]), 4, rng(0))
    with pytest.raises(ValueError, match="alpha"):
        make_partition("dirichlet", y, 2, rng(0), alpha=-1.0)
    with pytest.raises(ValueError, match="p=1.5"):
        make_partition("mixing", y, 2, rng(0), p=1.5)
    with pytest.raises(ValueError, match="rng"):
        make_partition("iid", y, 2, 0)  # type: ignore[arg-type]


def test_empty_silo_is_named() -> None:
    # class 0 has one record, class 1 none used: even-odd-pairs silo 1 (pair (0, 3)) would be empty
    y = np.array([0, 1, 1])
    with pytest.raises(ValueError, match="silo 1 is empty"):
        even_odd_pairs(y, 2, rng(0))


# --------------------------------------------------------------------------- split


def test_train_test_split_sizes_and_disjoint() -> None:
    idx = np.arange(1000, 1212)
    train, test = train_test_split_indices(idx, 0.2, rng(0))
    assert (train.size, test.size) == (170, 42)  # 212 * 0.2 = 42.4 -> 42 (rounded half up)
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), idx)
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    tr2, te2 = train_test_split_indices(idx, 0.2, rng(0))
    assert np.array_equal(test, te2) and not np.array_equal(test, train_test_split_indices(idx, 0.2, rng(1))[1])
    assert [a.size for a in train_test_split_indices(np.arange(10), 0.25, rng(0))] == [7, 3]  # 2.5 -> 3


def test_train_test_split_edge_cases() -> None:
    assert [a.size for a in train_test_split_indices(np.arange(2), 0.2, rng(0))] == [1, 1]
    assert [a.size for a in train_test_split_indices(np.arange(2), 0.9, rng(0))] == [1, 1]
    assert [a.size for a in train_test_split_indices(np.arange(1), 0.2, rng(0))] == [1, 0]
    assert [a.size for a in train_test_split_indices(np.arange(5), 0.0, rng(0))] == [5, 0]
    with pytest.raises(ValueError, match="test_fraction=1.0"):
        train_test_split_indices(np.arange(5), 1.0, rng(0))
    with pytest.raises(ValueError, match="test_fraction"):
        train_test_split_indices(np.arange(5), -0.1, rng(0))


def test_fixed_size_batch_distinct_and_validated() -> None:
    b = fixed_size_batch(100, 10, rng(0))
    assert b.size == 10 and np.unique(b).size == 10 and b.min() >= 0 and b.max() < 100
    assert fixed_size_batch(5, 5, rng(0)).size == 5
    for k in (0, 6):
        with pytest.raises(ValueError, match=f"k={k}"):
            fixed_size_batch(5, k, rng(0))
    with pytest.raises(ValueError, match="n=0"):
        fixed_size_batch(0, 1, rng(0))


def test_fixed_size_batch_inclusion_probability_is_k_over_n() -> None:
    """Each index is chosen with probability k/n = 0.25 (seed 123, 20000 draws).

    Tolerances: every empirical frequency within 0.02 of 0.25 (the standard error is
    sqrt(0.25 * 0.75 / 20000) ~ 0.003, so > 6 sigma), and a chi-square goodness-of-fit
    statistic below the 0.999 quantile of chi2(n - 1) (conservative: without replacement the
    per-index variance is (1 - k/n) times the multinomial one).
    """
    n, k, trials = 20, 5, 20000
    g = rng(123)
    counts = np.zeros(n)
    for _ in range(trials):
        counts[fixed_size_batch(n, k, g)] += 1
    freq = counts / trials
    assert np.all(np.abs(freq - k / n) < 0.02)
    expected = trials * k / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < stats.chi2.ppf(0.999, df=n - 1)


# --------------------------------------------------------------------------- preprocess


def test_pooled_standardizer_zero_mean_unit_std(wbcd: Dataset) -> None:
    parts = by_label(wbcd.y, 2, rng(0))
    splits = [train_test_split_indices(p, 0.2, rng(s)) for s, p in enumerate(parts)]
    train_x = [wbcd.x[tr] for tr, _ in splits]
    stds = standardize_silos(wbcd.x, train_x, "pooled")
    assert len(stds) == 2 and stds[0] is stds[1]
    pooled = np.concatenate([s.apply(x) for s, x in zip(stds, train_x)])
    assert pooled.dtype == np.float32
    np.testing.assert_allclose(pooled.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(pooled.std(0), 1.0, atol=1e-4)
    # fitted on train only: statistics differ from those of the full data (incl. test records)
    assert not np.allclose(stds[0].mean, wbcd.x.astype(np.float64).mean(0))


def test_local_standardizer_removes_class_signal(wbcd: Dataset) -> None:
    parts = by_label(wbcd.y, 2, rng(0))
    train_x = [wbcd.x[p] for p in parts]
    stds = standardize_silos(None, train_x, "local")
    for s, x in zip(stds, train_x):
        z = s.apply(x)
        np.testing.assert_allclose(z.mean(0), 0.0, atol=1e-4)
        np.testing.assert_allclose(z.std(0), 1.0, atol=1e-4)
    # the two classes' means, far apart in raw space, coincide after local standardisation
    raw_gap = np.abs(train_x[0].mean(0) - train_x[1].mean(0)) / wbcd.x.std(0)
    assert raw_gap.max() > 1.0


def test_none_mode_and_validation(wbcd: Dataset) -> None:
    stds = standardize_silos(wbcd.x, [wbcd.x[:10], wbcd.x[10:20]], "none")
    np.testing.assert_array_equal(stds[0].apply(wbcd.x[:10]), wbcd.x[:10])
    with pytest.raises(ValueError, match="mode='global'"):
        standardize_silos(wbcd.x, [wbcd.x], "global")
    with pytest.raises(ValueError, match="silo_train_x\\[1\\]"):
        standardize_silos(wbcd.x, [wbcd.x, wbcd.x[:, :5]], "pooled")


def test_standardizer_constant_feature_and_image_shape() -> None:
    x = np.ones((50, 3), dtype=np.float32)
    x[:, 1] = np.arange(50)
    st = fit_standardizer(x)
    assert st.std[0] == pytest.approx(1e-8) and np.all(np.isfinite(st.apply(x)))
    np.testing.assert_array_equal(st.apply(x)[:, 0], 0.0)
    img = rng(0).random((40, 1, 4, 4)).astype(np.float32)
    st = fit_standardizer(img)
    assert st.mean.shape == (1, 4, 4)
    np.testing.assert_allclose(st.apply(img).mean(0), 0.0, atol=1e-5)
    with pytest.raises(ValueError, match="x.shape"):
        st.apply(np.zeros((3, 16), np.float32))
    assert isinstance(Standardizer.identity((2,)), Standardizer)


def test_pca_matches_scikit_learn_up_to_sign() -> None:
    from sklearn.decomposition import PCA

    from app.data.preprocess import fit_pca

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 12)) @ rng.normal(size=(12, 12)) + 3.0
    ours = fit_pca(x, 5).apply(x)
    ref = PCA(n_components=5, svd_solver="full").fit_transform(x)
    for j in range(5):
        sign = np.sign(ours[:, j] @ ref[:, j])
        np.testing.assert_allclose(ours[:, j], sign * ref[:, j], atol=1e-4)
    variances = ours.var(axis=0)
    assert np.all(np.diff(variances) <= 1e-9)  # largest component first
    with pytest.raises(ValueError, match="pca = 13 must be in"):
        fit_pca(x, 13)


def test_validation_records_come_out_of_the_training_split() -> None:
    from app.config import parse_settings
    from app.data.federated import build_federated_data

    plain_s, held_s = parse_settings({}), parse_settings({"validation-fraction": 0.25})
    plain = build_federated_data(plain_s, plain_s.seed, plain_s.robust.trust_size)
    held = build_federated_data(held_s, held_s.seed, held_s.robust.trust_size)
    for a, b in zip(plain.silos, held.silos, strict=True):
        assert b.n + len(b.val_y) == a.n  # training records = train + validation of the plain split
        assert torch.equal(a.test_y, b.test_y)  # the test split is untouched
        rows = {tuple(r) for r in b.train_x.tolist()}
        assert not rows & {tuple(r) for r in b.val_x.tolist()}  # disjoint
        assert len(b.val_y) == int(np.floor(a.n * 0.25 + 0.5))


def test_pca_setting_changes_the_feature_shape() -> None:
    from app.config import parse_settings
    from app.data.federated import build_federated_data, dataset_meta

    s = parse_settings({"pca": 7})
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    assert fed.feature_shape == (7,) == dataset_meta(s)[0]
    assert fed.silos[0].train_x.shape[1] == 7


def test_wbcd_is_read_without_sklearn_and_equals_sklearns_copy() -> None:
    """The WBCD loader reads sklearn's bundled CSV itself (no sklearn import: seconds of start-up
    in every process that builds a silo); the records are exactly load_breast_cancer's."""
    code = ("import sys; from app.data.sources import load_source; load_source('wbcd'); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    from sklearn.datasets import load_breast_cancer

    ours = load_source("wbcd")
    bunch = load_breast_cancer()
    assert ours.x.dtype == np.float32 and np.array_equal(ours.x, bunch.data.astype(np.float32))
    assert np.array_equal(ours.y, bunch.target)


def test_a_feature_constant_in_training_maps_to_zero_for_any_input() -> None:
    """Issue 23 section 8: a feature constant in the fitted data has no scale to divide by; it
    must map to 0 whatever a later record holds there (the 1e-8 floor made it 1e8 times larger),
    while every other feature is (x - mean) / std, computed here independently."""
    train = np.stack([np.full(40, 3.0), np.arange(40.0), np.zeros(40)], axis=1).astype(np.float32)
    st = fit_standardizer(train)
    new = np.array([[3.0, 5.0, 0.0], [4.0, -7.0, 16.0], [-1e6, 100.0, 1e30], [16.0, 0.0, -2.5]], dtype=np.float32)
    z = st.apply(new)
    np.testing.assert_array_equal(z[:, [0, 2]], 0.0)
    col = np.arange(40.0)
    np.testing.assert_allclose(z[:, 1], (new[:, 1] - col.mean()) / col.std(), rtol=1e-6)
    np.testing.assert_array_equal(st.apply(train)[:, [0, 2]], 0.0)


def test_digits_records_after_standardising_stay_within_what_integer_pixels_allow() -> None:
    """Digits with 10 IID silos, seed 0: feature 24 is 0 in every silo's training record but not in
    one test record and one trust-set record (before: both 1e8). Pixels are integers in [0, 16],
    so a feature that varies over the N pooled training records has population variance at least
    (N - 1)/N^2 (one record off by 1) and |x - mean| <= 16: every standardised value of any
    record (silo train and test, trust set) is at most 16 N / sqrt(N - 1) in magnitude."""
    from sklearn.datasets import load_digits

    from app.config import parse_settings
    from app.data.federated import build_federated_data, build_trust_set

    s = parse_settings({"algorithm": "robust", "dataset": "digits", "partition": "iid", "num-silos": 10,
                        "silos-per-round": 10, "aggregator": "fltrust", "trust.size": 100, "seed": 0})
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    train = np.concatenate([d.train_x.numpy() for d in fed.silos])
    n = len(train)
    raw = load_digits().data
    assert np.all(raw == np.round(raw)) and raw.min() == 0 and raw.max() == 16
    bound = 16 * n / np.sqrt(n - 1)
    for name, x in [("train", train), ("test", np.concatenate([d.test_x.numpy() for d in fed.silos])),
                    ("trust", build_trust_set(s, s.seed, s.robust.trust_size, s.robust.trust_classes,
                                              s.robust.trust_shift).x.numpy())]:
        assert np.abs(x).max() <= bound, (name, float(np.abs(x).max()), bound)
    assert np.all(train[:, 24] == 0)  # the constant-in-training feature of this split
