"""Tests that read optional data (``@pytest.mark.needs_data``, tests/conftest.py) skip with the
reason where the data is absent, so that the README's test command passes on a fresh machine;
tests/helpers.missing_data decides from the files the loaders read (app/data/sources.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.data import sources
from tests.helpers import missing_data


def _idx(path: Path, arr: np.ndarray, magic: int) -> None:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    path.write_bytes(header + arr.astype(np.uint8).tobytes())


def test_fashion_mnist_is_missing_until_its_four_files_are_there(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sources, "FASHION_MNIST_DIR", str(tmp_path))
    reason = missing_data("fashion-mnist")
    assert reason is not None and "dataset-fashion-mnist" in reason and "t10k-labels-idx1-ubyte" in reason
    for images, labels in sources._FASHION_FILES:
        _idx(tmp_path / images, np.zeros((2, 28, 28)), 2051)
        _idx(tmp_path / labels, np.zeros(2), 2049)
    assert missing_data("fashion-mnist") is None
    assert sources.load_source("fashion-mnist").x.shape == (4, 1, 28, 28)  # what the loader reads is there


def test_torchvision_data_is_missing_without_its_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sources, "DEFAULT_TORCHVISION_ROOT", str(tmp_path))
    assert "cifar-10-batches-py" in missing_data("cifar10")
    (tmp_path / "cifar-10-batches-py").mkdir()
    (tmp_path / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"x")
    assert missing_data("cifar10") is None
    with pytest.raises(ValueError, match="not an optional data set"):
        missing_data("wbcd")


def test_every_test_that_loads_fashion_mnist_is_marked() -> None:
    """A test module that runs a federation on fashion-mnist from its default folder carries
    the marker (a new one without it would fail `make test` on a fresh machine)."""
    tests = Path(__file__).parent
    for path in sorted(tests.glob("test_*.py")):
        text = path.read_text()
        uses = '"dataset": "fashion-mnist", "partition"' in text or 'load_source("fashion-mnist")' in text
        if uses:
            assert 'needs_data("fashion-mnist")' in text, path.name
