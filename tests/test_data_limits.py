"""A silo's own file never stops the federation or burns its budget on nothing (issue 35, section 1):
values that are not finite in the training dtype (float32) and pre-processing that overflows are
one-line refusals (SchemaError) before anything is charged; node-config limits on records and
bytes (``data-max-records``, ``data-max-bytes``) are checked from headers / bounded reads before
the records are allocated; a silo with fewer training records than ``data-min-records`` refuses;
``.tsv.gz`` is read with tabs. Every check runs the real reader (app/data/own_files.py) or the
node runtime's ``silo_records``."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.config import parse_settings
from app.data.own_files import DataLimits, read_records
from app.data.schema import SchemaError, load_schema
from app.node_runtime import silo_records


def inline_settings(cfg: dict):
    """The run's settings as a silo gets them: data.schema inlined by the launcher."""
    from app.data.schema import with_inline_schema

    return parse_settings(with_inline_schema(cfg))

ROOT = Path(__file__).resolve().parents[1]
CLASSES = ["malignant", "benign"]


def wbcd() -> tuple[pd.DataFrame, list[str]]:
    from sklearn.datasets import load_breast_cancer

    b = load_breast_cancer()
    names = [str(n) for n in b.feature_names]
    df = pd.DataFrame(b.data, columns=names)
    df["diagnosis"] = np.array(CLASSES)[b.target]
    return df, names


def table_schema(tmp_path: Path, names: list[str], **extra) -> str:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"features": names, "label": "diagnosis", "classes": CLASSES} | extra))
    return str(path)


def refused(path: Path, schema: str, limits: DataLimits | None = None) -> str:
    with pytest.raises(SchemaError) as info:
        read_records(path, load_schema(schema), limits=limits)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"data-file {path}: ")
    return msg


def silo_refusal(settings: dict, node: dict) -> str:
    """silo_records as the node runtime calls it: a SchemaError (never another type), one line."""
    with pytest.raises(SchemaError) as info:
        silo_records(inline_settings(settings), node, 0, deployed=True)
    assert type(info.value) is SchemaError and "\n" not in str(info.value)
    return str(info.value)


def header_only_npz(path: Path, shape: tuple[int, ...], descr: str = "<f8", n_y: int | None = None) -> None:
    """An npz whose x header declares ``shape`` but holds no data: a reader that trusts the
    header allocates it; the limits must refuse from the header alone."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("x.npy", "w") as m:
            np.lib.format.write_array_header_1_0(m, {"descr": descr, "fortran_order": False, "shape": shape})
        with zf.open("y.npy", "w") as m:
            np.lib.format.write_array_header_1_0(m, {"descr": "<i8", "fortran_order": False,
                                                     "shape": (shape[0] if n_y is None else n_y,)})


# ------------------------------------------------------------------ 1. finite in float32, pre-processing

def test_values_not_finite_in_float32_are_refused_when_read(tmp_path: Path) -> None:
    df, names = wbcd()
    schema = table_schema(tmp_path, names)
    big = df.copy()
    big.loc[3, "mean area"] = 1e39  # finite in float64, inf in float32
    big.to_csv(tmp_path / "big.csv", index=False)
    msg = refused(tmp_path / "big.csv", schema)
    assert "column 'mean area' has 1 empty or non-finite value(s)" in msg and "float32" in msg and "row 3" in msg
    x = np.zeros((30, 64))
    x[5, 7] = 1e300
    np.savez(tmp_path / "big.npz", x=x, y=np.arange(30) % 2)
    msg = refused(tmp_path / "big.npz", '{"shape": [64], "classes": [0, 1]}')
    assert "x has 1 value(s) that are not finite as float32" in msg and "record 5" in msg
    # the largest float32 is still a number
    x[5, 7] = float(np.finfo(np.float32).max)
    np.savez(tmp_path / "max.npz", x=x, y=np.arange(30) % 2)
    xr, _ = read_records(tmp_path / "max.npz", load_schema('{"shape": [64], "classes": [0, 1]}'))
    assert np.isfinite(xr).all()


@pytest.mark.parametrize("standardize", ["none", "local", "dp"])
def test_a_silo_refuses_1e39_and_1e300_before_anything_is_charged(tmp_path: Path, standardize: str) -> None:
    df, names = wbcd()
    schema = table_schema(tmp_path, names)
    for value in (1e39, 1e300):
        bad = df.iloc[:100].copy()
        bad.loc[10, "worst area"] = value
        bad.to_csv(tmp_path / "mine.csv", index=False)
        msg = silo_refusal({"data.schema": schema, "standardize": standardize},
                           {"data-file": str(tmp_path / "mine.csv")})
        assert "column 'worst area' has 1 empty or non-finite value(s)" in msg


def test_pre_processing_that_overflows_float32_is_a_refusal(tmp_path: Path) -> None:
    """Public statistics (mean -1e35, std 1e-5) put a mean area of 500 at 1e40: not a float32; the
    silo refuses (SchemaError), it does not train on inf."""
    df, names = wbcd()
    stats = {"mean": {n: -1e35 if n == "mean area" else 0.0 for n in names},
             "std": {n: 1e-5 if n == "mean area" else 1.0 for n in names}}
    schema = table_schema(tmp_path, names, statistics=stats)
    df.iloc[:100].to_csv(tmp_path / "mine.csv", index=False)
    msg = silo_refusal({"data.schema": schema, "standardize": "public"}, {"data-file": str(tmp_path / "mine.csv")})
    assert "pre-processing (standardize = 'public') failed" in msg and "not finite as float32" in msg


@pytest.mark.parametrize("error", [ValueError("mean/std contain non-finite values; must be finite"),
                                   MemoryError(), FloatingPointError("overflow"), ZeroDivisionError("x")])
def test_every_pre_processing_failure_is_a_schema_refusal(tmp_path: Path, monkeypatch, error: Exception) -> None:
    """Whatever the pre-processing raises, the node runtime gets a SchemaError (its one-line
    refusal), never an exception that would fail the ClientApp and stop the federation."""
    import app.data.own_data as own_data

    def boom(*_a, **_k):
        raise error

    df, names = wbcd()
    df.iloc[:100].to_csv(tmp_path / "mine.csv", index=False)
    monkeypatch.setattr(own_data, "standardize_silos", boom)
    msg = silo_refusal({"data.schema": table_schema(tmp_path, names), "standardize": "local"},
                       {"data-file": str(tmp_path / "mine.csv")})
    assert msg.startswith(f"data-file {tmp_path / 'mine.csv'}: pre-processing (standardize = 'local') failed: "
                          f"{type(error).__name__}")


def test_a_reader_error_of_any_type_is_a_schema_refusal(tmp_path: Path, monkeypatch) -> None:
    import app.data.own_files as own_files

    def boom(*_a, **_k):
        raise MemoryError()

    np.savez(tmp_path / "a.npz", x=np.zeros((30, 64)), y=np.arange(30) % 2)
    monkeypatch.setattr(own_files.np, "ascontiguousarray", boom)
    assert "MemoryError" in refused(tmp_path / "a.npz", '{"shape": [64], "classes": [0, 1]}')


# ------------------------------------------------------------------ 2. limits on records and bytes

def test_npz_limits_are_checked_from_the_headers(tmp_path: Path) -> None:
    """x's header declares 1 GiB (2^21 records of 64 float64) / 50,000 images of 3x32x32 (600 MiB
    as float32): refused from the header, nothing allocated (the file holds no data at all)."""
    header_only_npz(tmp_path / "many.npz", (2 ** 21, 64))
    msg = refused(tmp_path / "many.npz", '{"shape": [64], "classes": [0, 1]}')
    assert "holds 2097152 records" in msg and "data-max-records = 1000000" in msg
    header_only_npz(tmp_path / "big.npz", (50_000, 3, 32, 32), descr="|u1")
    msg = refused(tmp_path / "big.npz", '{"shape": [3, 32, 32], "classes": [0, 1]}')
    assert "614400000 bytes" in msg and "data-max-bytes = 536870912" in msg
    header_only_npz(tmp_path / "y.npz", (40, 64), n_y=39)
    assert "y has shape (39,); it must be [40]" in refused(tmp_path / "y.npz", '{"shape": [64], "classes": [0, 1]}')
    np.savez(tmp_path / "ok.npz", x=np.zeros((40, 64)), y=np.arange(40) % 2)
    limits = DataLimits(max_records=39)
    assert "holds 40 records" in refused(tmp_path / "ok.npz", '{"shape": [64], "classes": [0, 1]}', limits)
    limits = DataLimits(max_bytes=40 * 64 * 4 - 1)
    assert "data-max-bytes = 10239" in refused(tmp_path / "ok.npz", '{"shape": [64], "classes": [0, 1]}', limits)
    assert read_records(tmp_path / "ok.npz", load_schema('{"shape": [64], "classes": [0, 1]}'),
                        limits=DataLimits(max_records=40, max_bytes=40 * 64 * 8 + 40 * 8))[0].shape == (40, 64)


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_table_limits(tmp_path: Path, suffix: str) -> None:
    df, names = wbcd()
    schema = table_schema(tmp_path, names)
    path = tmp_path / f"t{suffix}"
    df.to_parquet(path) if suffix == ".parquet" else df.to_csv(path, index=False)
    held = "holds 569 records" if suffix == ".parquet" else "holds more than 568 records"  # metadata / bounded read
    assert held in refused(path, schema, DataLimits(max_records=568))
    assert "data-max-bytes = 68279" in refused(path, schema, DataLimits(max_bytes=569 * 30 * 4 - 1))
    x, _ = read_records(path, load_schema(schema), limits=DataLimits(max_records=569, max_bytes=10 ** 6))
    assert x.shape == (569, 30)


def test_image_count_is_checked_before_decoding(tmp_path: Path) -> None:
    from PIL import Image

    for cls in ("ant", "bee"):
        (tmp_path / "img" / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((4, 5), 9 * i, np.uint8), mode="L").save(tmp_path / "img" / cls / f"{i}.png")
    schema = '{"shape": [1, 4, 5], "classes": ["ant", "bee"]}'
    assert "holds 6 records" in refused(tmp_path / "img", schema, DataLimits(max_records=5))
    assert "data-max-bytes = 479" in refused(tmp_path / "img", schema, DataLimits(max_bytes=6 * 20 * 4 - 1))
    x, y = read_records(tmp_path / "img", load_schema(schema), limits=DataLimits(max_records=6))
    assert x.shape == (6, 1, 4, 5) and list(y) == [0, 0, 0, 1, 1, 1]
    np.testing.assert_allclose(x[:3, 0, 0, 0], [0, 9 / 255, 18 / 255], rtol=1e-6)


def test_node_config_limits_reach_the_reader(tmp_path: Path) -> None:
    df, names = wbcd()
    schema = table_schema(tmp_path, names)
    df.iloc[:100].to_csv(tmp_path / "mine.csv", index=False)
    node = {"data-file": str(tmp_path / "mine.csv")}
    s = {"data.schema": schema, "standardize": "local"}
    assert "data-max-records = 99" in silo_refusal(s, node | {"data-max-records": 99})
    assert "data-max-bytes = 1000" in silo_refusal(s, node | {"data-max-bytes": "1000"})
    data, *_ = silo_records(inline_settings(s), node | {"data-max-records": 100, "data-max-bytes": "1MiB"}, 0, True)
    assert data.n == 80
    for key, value in (("data-max-records", "lots"), ("data-max-bytes", 0), ("data-min-records", -1),
                       ("data-max-records", 1.5), ("data-max-bytes", True)):
        msg = silo_refusal(s, node | {key: value})
        assert msg.startswith(f"node config {key} = {value!r} is not allowed")


def _peak(path: Path, schema: Path) -> tuple[str, float]:
    """(outcome, peak RSS in MB) of reading ``path`` in a fresh process (VmHWM: the process's own
    high-water mark; ru_maxrss would carry the forking pytest's over the exec)."""
    code = ("import sys\nfrom app.data.own_files import read_records\nfrom app.data.schema import load_schema\n"
            "try:\n    read_records(sys.argv[1], load_schema(sys.argv[2])); out = 'accepted'\n"
            "except BaseException as e:\n    out = type(e).__name__ + ': ' + str(e)\n"
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n"
            "print(out); print(int(hwm) / 1024)\n")
    run = subprocess.run([sys.executable, "-c", code, str(path), str(schema)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300, check=True)
    out, peak = run.stdout.strip().splitlines()[-2:]
    return out, float(peak)


def test_the_two_bombs_are_refused_with_bounded_memory(tmp_path: Path) -> None:
    """Issue 35: a 1 MB npz whose x inflates to 1 GiB (2^21 x 64 float64), and a 0.9 MB gzip CSV
    of 4M rows: before, both were read whole (peak RSS 1.6 GB and 3.6 GB on the project machine);
    now both are refused by data-max-records with peak RSS under 600 MB (imports included)."""
    n, f = 2 ** 21, 64
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as m:
            np.lib.format.write_array_header_1_0(m, {"descr": "<f8", "fortran_order": False, "shape": (n, f)})
            chunk = bytes(8 * f * 8192)
            for _ in range(n // 8192):
                m.write(chunk)
        with zf.open("y.npy", "w") as m:
            np.lib.format.write_array_header_1_0(m, {"descr": "<i8", "fortran_order": False, "shape": (n,)})
            m.write(bytes(8 * n))
    assert (tmp_path / "bomb.npz").stat().st_size < 8 * 2 ** 20
    (tmp_path / "s64.json").write_text('{"shape": [64], "classes": [0, 1]}')
    out, peak = _peak(tmp_path / "bomb.npz", tmp_path / "s64.json")
    assert out.startswith("SchemaError") and "holds 2097152 records" in out and peak < 600, (out, peak)
    names = [f"f{i}" for i in range(30)]
    with gzip.open(tmp_path / "bomb.csv.gz", "wb", compresslevel=6) as g:
        g.write((",".join(names) + ",diagnosis\n").encode())
        block = ("0," * 30 + "benign\n").encode() * 10_000
        for _ in range(400):
            g.write(block)
    assert (tmp_path / "bomb.csv.gz").stat().st_size < 2 * 2 ** 20
    (tmp_path / "s30.json").write_text(json.dumps({"features": names, "label": "diagnosis", "classes": CLASSES}))
    out, peak = _peak(tmp_path / "bomb.csv.gz", tmp_path / "s30.json")
    assert out.startswith("SchemaError") and "holds more than 1000000 records" in out and peak < 600, (out, peak)


# ------------------------------------------------------------------ 3. the fewest records a silo trains on

def test_a_silo_with_too_few_records_refuses(tmp_path: Path) -> None:
    """Two records (n = 1 after the test split: delta = 1/n^2 = 1, a guarantee of nothing) are
    refused; so is a run whose test-fraction leaves fewer than data-min-records to train on."""
    df, names = wbcd()
    schema = table_schema(tmp_path, names)
    df.iloc[[0, 1]].to_csv(tmp_path / "two.csv", index=False)
    msg = silo_refusal({"data.schema": schema, "standardize": "local"}, {"data-file": str(tmp_path / "two.csv")})
    assert "holds 2 records" in msg and "data-min-records = 20" in msg and "1/n^2" in msg
    df.iloc[:100].to_csv(tmp_path / "mine.csv", index=False)
    node = {"data-file": str(tmp_path / "mine.csv")}
    msg = silo_refusal({"data.schema": schema, "standardize": "local", "test-fraction": 0.9}, node)
    assert "10 of its 100 records for training" in msg and "data-min-records = 20" in msg
    data, *_ = silo_records(inline_settings({"data.schema": schema, "standardize": "local", "test-fraction": 0.9}),
                            node | {"data-min-records": 10}, 0, True)
    assert data.n == 10
    df.iloc[:25].to_csv(tmp_path / "25.csv", index=False)  # n = 20: the default minimum, allowed
    data, *_ = silo_records(inline_settings({"data.schema": schema, "standardize": "local"}),
                            {"data-file": str(tmp_path / "25.csv")}, 0, True)
    assert data.n == 20


# ------------------------------------------------------------------ 4. the separator of a compressed TSV

@pytest.mark.parametrize("name", ["a.tsv.gz", "a.TSV.bz2", "a.tsv.xz", "a.tsv.zip", "a.tsv", "a.csv.gz"])
def test_a_compressed_tsv_is_read_with_tabs(tmp_path: Path, name: str) -> None:
    df, names = wbcd()
    sep = "\t" if ".tsv" in name.lower() else ","
    df.to_csv(tmp_path / name, sep=sep, index=False)
    x, y = read_records(tmp_path / name, load_schema(table_schema(tmp_path, names)))
    assert x.shape == (569, 30)
    np.testing.assert_allclose(x, df[names].to_numpy().astype(np.float32))
    np.testing.assert_array_equal(y, (df["diagnosis"] == "benign").astype(int))


def test_the_servers_own_file_refuses_an_overflowing_pre_processing(tmp_path: Path) -> None:
    from app.data.own_data import server_records

    df, names = wbcd()
    stats = {"mean": {n: -1e35 if n == "mean area" else 0.0 for n in names},
             "std": {n: 1e-5 if n == "mean area" else 1.0 for n in names}}
    df.iloc[:60].to_csv(tmp_path / "trust.csv", index=False)
    s = parse_settings({"data.schema": table_schema(tmp_path, names, statistics=stats), "standardize": "public"})
    with pytest.raises(SchemaError, match="pre-processing \\(standardize = 'public'\\) failed: 60 value"):
        server_records(s, str(tmp_path / "trust.csv"))


def test_your_data_md_shows_the_refusals_the_code_prints(tmp_path: Path) -> None:
    df, names = wbcd()
    doc = (ROOT / "docs" / "your-data.md").read_text(encoding="utf-8")
    path = tmp_path / "records.csv"

    def shown(msg: str) -> None:
        line = msg.replace(str(path), "/srv/hospital/records.csv")
        assert line in doc, f"docs/your-data.md does not show the refusal the code prints: {line}"

    big = df.iloc[:100].copy()
    big.loc[10, "worst area"] = 1e39
    big.to_csv(path, index=False)
    shown(silo_refusal({"data.schema": table_schema(tmp_path, names)}, {"data-file": str(path)}))
    df.iloc[:2].to_csv(path, index=False)
    shown(silo_refusal({"data.schema": table_schema(tmp_path, names)}, {"data-file": str(path)}))
    stats = {"mean": {n: -1e35 if n == "mean area" else 0.0 for n in names},
             "std": {n: 1e-5 if n == "mean area" else 1.0 for n in names}}
    df.iloc[:100].to_csv(path, index=False)
    shown(silo_refusal({"data.schema": table_schema(tmp_path, names, statistics=stats)}, {"data-file": str(path)}))


def _png_header(width: int, height: int) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * 10)) + chunk(b"IEND", b""))


def test_every_malformed_file_is_a_one_line_schema_refusal(tmp_path: Path) -> None:
    """A corrupt, truncated or hostile file is a SchemaError naming it, never another exception."""
    tab = '{"features": ["a", "b"], "classes": [0, 1]}'
    arr = '{"shape": [2], "classes": [0, 1]}'
    npy = io.BytesIO()
    np.save(npy, np.zeros((5, 2)))
    labels = io.BytesIO()
    np.save(labels, np.zeros(5, np.int64))
    cases: dict[str, tuple[bytes, str, str]] = {
        "header.csv": (b"a,b,label\n", tab, "holds no records"),
        "cut.csv.gz": (gzip.compress(b"a,b,label\n1,2,1\n" * 100)[:-20], tab, "EOFError"),
        "bad.csv": (b"a,b,label\n\xff\xfe,2,1\n", tab, "UnicodeDecodeError"),
        "garbage.parquet": (b"PAR1garbagePAR1", tab, "cannot read it as parquet"),
        "plain.npz": (npy.getvalue(), arr, "BadZipFile"),
    }
    for name, (content, schema, words) in cases.items():
        (tmp_path / name).write_bytes(content)
        assert words in refused(tmp_path / name, schema), name
    with zipfile.ZipFile(tmp_path / "two.csv.zip", "w") as zf:
        zf.writestr("a.csv", "a,b,label\n1,2,1\n")
        zf.writestr("b.csv", "a,b,label\n")
    assert "must hold exactly one file; it holds 2" in refused(tmp_path / "two.csv.zip", tab)
    with zipfile.ZipFile(tmp_path / "cut.npz", "w") as zf:
        zf.writestr("x.npy", npy.getvalue()[:-16])
        zf.writestr("y.npy", labels.getvalue())
    assert "expected 80 bytes got 64" in refused(tmp_path / "cut.npz", arr)
    (tmp_path / "img" / "c1").mkdir(parents=True)
    (tmp_path / "img" / "c1" / "huge.png").write_bytes(_png_header(100_000, 100_000))
    assert "DecompressionBombError" in refused(tmp_path / "img", '{"shape": [1, 4, 4], "classes": ["c0", "c1"]}')
