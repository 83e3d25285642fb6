"""Smoke test of the two sketch benchmarks of issue #4 (scripts/bench/sketch_cost.py and
sketch_distortion.py): their ``--quick`` modes run in-process and give sane rows.

Fixed seeds, tiny layouts: a few seconds in all. Case (b) of the distortion benchmark needs the
Fashion-MNIST idx files (Debian package dataset-fashion-mnist, installed by .ci/run); without them
only case (a) runs.
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import torch

from app.data.sources import FASHION_MNIST_DIR
from app.sketch import SKETCH_KINDS

#: Linear kinds with E[S^T S] = I (JL maps and their relatives), as opposed to RandK / PowerSGD.
JL_KINDS = ("gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch", "kronecker", "adaptive")


@pytest.fixture()
def bench():
    """Import a benchmark script as the module it is (scripts.bench.<name>); threads restored after."""
    threads = torch.get_num_threads()
    yield lambda name: importlib.import_module(f"scripts.bench.{name}")
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_sketch_cost_quick(bench, capsys: pytest.CaptureFixture[str]) -> None:
    out = bench("sketch_cost").main(["--quick"])
    rows = out["rows"]
    assert {r["kind"] for r in rows if r["layerwise"]} == set(SKETCH_KINDS)
    assert sorted(r["kind"] for r in rows if not r["layerwise"]) == ["srft", "srht"]
    for r in rows:
        assert r["compress"] > 0 and r["decompress"] > 0 and r["draw"] >= 0, r
        assert r["peak_compress"] >= 0 and r["peak_decompress"] >= 0, r
        assert 0 < r["payload"] <= r["n"] == out["n"], r
        if r["kind"] not in ("adaptive", "powersgd", "kronecker"):
            assert r["payload"] == round(0.5 * r["n"]), r  # k/n = 0.5 exactly
        # only PowerSGD keeps state between rounds (its warm-start Q and error buffer)
        assert (r["state_bytes"] > 0) == (r["kind"] == "powersgd"), r
    assert [name for name, _, _ in out["checks"]] == [
        "layer-wise SRHT compress+decompress within 3x of RandK's time",
        "no dense kind's peak memory above 3x the gradient's size"]
    printed = capsys.readouterr().out
    assert printed.count("| srht |") == 2 and printed.count("PASS") + printed.count("FAIL") == 2


def test_sketch_distortion_quick(bench) -> None:
    have_data = any((Path(FASHION_MNIST_DIR) / f"train-images-idx3-ubyte{ext}").is_file()
                    for ext in ("", ".gz"))
    out = bench("sketch_distortion").main(["--quick", "--cases", "a,b" if have_data else "a"])
    assert set(out) == ({"a", "b"} if have_data else {"a"})
    for name, case in out.items():
        cells = case["cells"]
        # every kind at every k/n (adaptive once), none skipped at this size, 3 pairs each
        assert sorted({c["kind"] for c in cells}) == sorted(SKETCH_KINDS)
        assert len(cells) == 3 * (len(SKETCH_KINDS) - 1) + 1
        for c in cells:
            assert not c["skip"] and c["pairs"] == 3 == len(c["dip"]) == len(c["dth"]), (name, c)
            assert all(math.isfinite(d) and d >= 0 for d in c["dip"]), (name, c)
            assert all(0 <= d <= 180 for d in c["dth"]), (name, c)
    jl = [c for c in out["a"]["cells"] if c["kind"] in JL_KINDS]
    # unbiased maps with E[S^T S] = I on n = 4096: every pair's distortion is far below 1 ...
    assert all(d < 1 for c in jl for d in c["dip"])
    # ... and at k/n = 0.5 (k = 2048) the mean is of the order 1/sqrt(k) ~ 0.02
    half = [d for c in jl if c["ratio"] == 0.5 for d in c["dip"]]
    assert sum(half) / len(half) < 0.1
    adaptive = next(c for c in out["a"]["cells"] if c["kind"] == "adaptive")
    assert adaptive["k_over_n"] == pytest.approx(205 / 4096)  # k = jl_min_k(0.3, 0.05) = 205


def test_shuffle_throughput_small(bench, capsys: pytest.CaptureFixture[str]) -> None:
    """The shuffle benchmark's whole pipeline at a small d (4 silos' contributions accepted)."""
    bench("shuffle_throughput").main(["--dim", "5000", "--records", "4", "--silos", "3", "--trials", "10000"])
    out = capsys.readouterr().out
    assert "encode" in out and "shuffler: open + check + sum (3)" in out
