"""Read one party's own records from a file, checked against the run's schema.

Formats (``data-format``, or from the name): ``csv`` and ``parquet`` (pandas; Parquet through
pyarrow): the schema's feature columns and its label column; ``npz`` (NumPy): arrays ``x``
[N, *shape] and ``y`` [N]; ``images``: a folder of class folders (``<class>/<name>.png``), read by
torchvision's ``ImageFolder`` (pixels / 255, a public scaling). A file that does not match the
schema raises :class:`app.data.schema.SchemaError` with one line naming the column, the class or
the shape, before anything else is done with the records; so does a value that is not a finite
float32 (the training dtype), and a file larger than the node's :class:`DataLimits`, checked
before its records are allocated. The reader raises no other exception type.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.data.schema import DataSchema, SchemaError

FORMATS = ("csv", "parquet", "npz", "images")
_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}
#: compression suffixes of a CSV / TSV (decompressed as a stream, under data-max-bytes)
COMPRESSIONS = (".gz", ".bz2", ".zip", ".xz")
#: the largest float32: a value beyond it (or inf, nan) is not a number the silo can train on
F32_MAX = float(np.finfo(np.float32).max)
_GIB = 2 ** 30
#: rows of a CSV parsed at a time
CSV_CHUNK = 65_536
_UNITS = {"": 1, "b": 1, "kib": 2 ** 10, "mib": 2 ** 20, "gib": _GIB, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9}


@dataclass(frozen=True)
class DataLimits:
    """How much of its own file a node reads (node config, docs/your-data.md "Limits"):

    * ``max_records`` (``data-max-records``): the most records (rows, array entries, images);
    * ``max_bytes`` (``data-max-bytes``): the most decompressed bytes: a table's text (CSV / TSV,
      after gzip etc.), a Parquet table's columns as stored uncompressed, an npz's ``x`` and
      ``y`` as their headers declare them, and the records as float32 (records x features x 4);
    * ``min_records`` (``data-min-records``): the fewest records a silo trains on (its n, after
      the test and validation splits): below it δ = 1/n² means little (1 at n = 1) and a batch of
      K <= n records is a handful.

    Both maxima are checked before the records are allocated (from an npz's array headers, a
    Parquet file's metadata, the count of image files, a bounded read of a CSV's rows)."""

    max_records: int = 1_000_000
    #: 512 MiB: the float32 array of 1,000,000 records of 134 features, or of 43,690 images of
    #: 3x32x32; reading, splitting and scaling take about 5 times it at the peak (measured: 3.2 GB
    #: peak RSS, torch included, for an npz of 1,000,000 x 128 float32 records)
    max_bytes: int = 512 * 2 ** 20
    min_records: int = 20

    @classmethod
    def from_node(cls, min_records: Any = None, max_records: Any = None, max_bytes: Any = None) -> "DataLimits":
        """The limits from the node config's values (absent or "" -> the default); SchemaError
        (one line, naming the key) for a value that is not a whole number >= 1 (``max_bytes``
        also takes a unit: ``"512MiB"``, ``"2GiB"``, ``"1GB"``)."""
        d = cls()
        return cls(max_records=_whole("data-max-records", max_records, d.max_records),
                   max_bytes=_whole("data-max-bytes", max_bytes, d.max_bytes, units=True),
                   min_records=_whole("data-min-records", min_records, d.min_records))


def _whole(key: str, value: Any, default: int, units: bool = False) -> int:
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    out: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        out = value
    elif isinstance(value, float) and value.is_integer():
        out = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
        if m and (units or not m.group(2)) and m.group(2).lower() in _UNITS:
            out = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if out is None or out < 1:
        unit = ' (or with a unit: "512MiB", "2GiB")' if units else ""
        raise SchemaError(f"node config {key} = {value!r} is not allowed; allowed: a whole number >= 1{unit}")
    return out


def detect_format(path: str | Path, fmt: str = "") -> str:
    """``fmt`` if given (one of :data:`FORMATS`), else from the path: a folder is ``images``,
    else the extension (.csv, .tsv, .csv.gz, .tsv.gz, .parquet, .pq, .npz)."""
    if fmt:
        if fmt not in FORMATS:
            raise SchemaError(f"data-format = {fmt!r} is not allowed; allowed: {', '.join(FORMATS)}")
        return fmt
    p = Path(path)
    if p.is_dir():
        return "images"
    found = _SUFFIXES.get(_base_suffix(p))
    if found is None:
        raise SchemaError(f"data-file {p}: cannot tell its format from the name; set data-format to one of "
                          f"{', '.join(FORMATS)}")
    return found


def _base_suffix(path: Path) -> str:
    """The suffix before a compression suffix (``.tsv`` of ``a.tsv.gz``), lower case."""
    suffixes = [s.lower() for s in path.suffixes]
    if len(suffixes) > 1 and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def read_records(path: str | Path, schema: DataSchema, fmt: str = "",
                 limits: DataLimits | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(x float32 [N, *schema.feature_shape], y int64 class indices) of the file at ``path``;
    SchemaError (one line, naming the file) when it is missing, unreadable, does not match, holds
    a value that is not a finite float32, or is larger than ``limits`` (default
    :class:`DataLimits`): never another exception type."""
    p = Path(path).expanduser()
    fmt = detect_format(p, fmt)
    limits = limits or DataLimits()
    if not p.exists():
        raise SchemaError(f"data-file {p}: no such file or folder")
    try:
        if fmt in ("csv", "parquet"):
            x, y = _read_table(p, fmt, schema, limits)
        elif fmt == "npz":
            x, y = _read_npz(p, schema, limits)
        else:
            x, y = _read_images(p, schema, limits)
        if len(y) == 0:
            raise SchemaError("holds no records")
        return np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64)
    except SchemaError as exc:
        raise SchemaError(f"data-file {p}: {exc}") from None
    except Exception as exc:  # the library's own error (a corrupt file, a wrong format, MemoryError): one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise SchemaError(f"data-file {p}: cannot read it as {fmt} ({type(exc).__name__}: {first})") from None


def check_size(limits: DataLimits, records: int, features: int, stored: int = 0, more: bool = False) -> None:
    """SchemaError when ``records`` (of ``features`` numbers each; ``more``: at least that many)
    or their bytes (``stored`` as the file declares them, and as float32) exceed ``limits``."""
    held = f"holds {'more than ' if more else ''}{records - 1 if more else records} records"
    if records > limits.max_records:
        raise SchemaError(f"{held}; this node reads at most data-max-records = {limits.max_records} (node config)")
    nbytes = max(stored, records * features * 4)
    if nbytes > limits.max_bytes:
        raise SchemaError(f"{held} of {features} feature(s), {nbytes} bytes decompressed (as stored or as float32); "
                          f"this node reads at most data-max-bytes = {limits.max_bytes} (node config)")


def _non_finite(values: np.ndarray) -> np.ndarray:
    """Where ``values`` (numbers) are not finite as float32: nan, inf or |v| > the largest float32."""
    if values.dtype.kind not in "fc":
        return np.zeros(values.shape, bool)  # integers: every int64 / uint64 is a finite float32
    with np.errstate(invalid="ignore"):
        return ~(np.abs(values) <= F32_MAX)


class _Capped(io.RawIOBase):
    """A stream that raises SchemaError once more than ``cap`` bytes have been read from it."""

    def __init__(self, raw: Any, cap: int) -> None:
        super().__init__()
        self.raw, self.cap, self.total = raw, cap, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.raw.readinto(buffer)
        self.total += n or 0
        if self.total > self.cap:
            raise SchemaError(f"its text is more than data-max-bytes = {self.cap} bytes decompressed (node config)")
        return n


@contextlib.contextmanager
def _text_stream(path: Path, cap: int) -> Iterator[io.BufferedReader]:
    """The file's bytes, decompressed by its suffix (.gz, .bz2, .xz, a .zip of one file), raising
    SchemaError past ``cap`` bytes: memory stays bounded whatever the compression ratio."""
    import bz2
    import gzip
    import lzma
    import zipfile

    suffix = path.suffix.lower()
    with contextlib.ExitStack() as stack:
        if suffix == ".gz":
            raw = stack.enter_context(gzip.open(path, "rb"))
        elif suffix == ".bz2":
            raw = stack.enter_context(bz2.open(path, "rb"))
        elif suffix == ".xz":
            raw = stack.enter_context(lzma.open(path, "rb"))
        elif suffix == ".zip":
            zf = stack.enter_context(zipfile.ZipFile(path))
            members = [n for n in zf.namelist() if not n.endswith("/") and not n.startswith("__MACOSX/")]
            if len(members) != 1:
                raise SchemaError(f"a .zip table must hold exactly one file; it holds {len(members)}")
            raw = stack.enter_context(zf.open(members[0]))
        else:
            raw = stack.enter_context(open(path, "rb"))  # noqa: SIM115 - closed by the stack
        yield io.BufferedReader(_Capped(raw, cap), buffer_size=1 << 20)


def _check_columns(columns: list[str], schema: DataSchema) -> list[str]:
    """The columns to read (the features, then the label), after the schema's column checks."""
    if schema.label not in columns:
        raise SchemaError(f"the label column {schema.label!r} of the schema is missing")
    missing = [f for f in schema.features if f not in columns]
    if missing:
        raise SchemaError(f"column {missing[0]!r} of the schema is missing" +
                          (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    known = set(schema.features) | {schema.label} | set(schema.ignore)
    extra = [c for c in columns if c not in known]
    if extra:
        raise SchemaError(f"column {extra[0]!r} is not in the schema (drop it, or list it in the schema's ignore)")
    return [*schema.features, schema.label]


def _read_table(path: Path, fmt: str, schema: DataSchema, limits: DataLimits) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    if not schema.tabular:
        raise SchemaError(f"a {fmt} table needs a schema with features (column names); this schema gives a shape "
                          f"{list(schema.shape)}")
    features = len(schema.features)
    if fmt == "csv":  # the header first: the schema's columns before any row is parsed
        sep = "\t" if _base_suffix(path) == ".tsv" else ","
        with _text_stream(path, limits.max_bytes) as header:
            wanted = _check_columns([str(c) for c in pd.read_csv(header, sep=sep, nrows=0).columns], schema)
        # parsed in chunks of float32, at most one row past the limits: memory is bounded by the
        # limits (about the float32 array), however many rows the (compressed) file holds
        cap = min(limits.max_records, limits.max_bytes // (4 * features))
        xs, ys, rows, empty_labels = [], [], 0, 0
        with _text_stream(path, limits.max_bytes) as text:
            for chunk in pd.read_csv(text, sep=sep, usecols=lambda c: str(c) in wanted, nrows=cap + 1,
                                     chunksize=CSV_CHUNK):
                chunk.columns = [str(c) for c in chunk.columns]
                empty_labels += int(chunk[schema.label].isna().sum())
                if not empty_labels:  # else only counted: the refusal says how many
                    x, y = _table_part(chunk, schema, rows)
                    xs.append(x)
                    ys.append(y)
                rows += len(chunk)
        if rows > cap:
            check_size(limits, cap + 1, features, more=True)
        if empty_labels:
            raise SchemaError(f"the label column {schema.label!r} has {empty_labels} empty value(s)")
        if not xs:
            return np.zeros((0, features), np.float32), np.zeros(0, np.int64)
        return (xs[0], ys[0]) if len(xs) == 1 else (np.concatenate(xs), np.concatenate(ys))
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as pf:
        arrow = pf.schema_arrow
        index = {c for c in (arrow.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)}
        wanted = _check_columns([n for n in arrow.names if n not in index], schema)
        meta = pf.metadata
        stored = sum(rg.column(j).total_uncompressed_size for rg in (meta.row_group(i) for i in range(
            meta.num_row_groups)) for j in range(rg.num_columns) if rg.column(j).path_in_schema in wanted)
        check_size(limits, meta.num_rows, features, stored)
        df = pf.read(columns=wanted).to_pandas()
    df.columns = [str(c) for c in df.columns]
    if df[schema.label].isna().any():
        raise SchemaError(f"the label column {schema.label!r} has {int(df[schema.label].isna().sum())} empty value(s)")
    return _table_part(df, schema, 0)


def _table_part(df: Any, schema: DataSchema, start: int) -> tuple[np.ndarray, np.ndarray]:
    """(x float32, y class indices) of the rows of ``df`` (the file's rows from ``start``), after
    the checks of every feature column: numbers, each finite as a float32."""
    import pandas as pd

    if len(df) == 0:  # a header without rows: the caller says it holds no records
        return np.zeros((0, len(schema.features)), np.float32), np.zeros(0, np.int64)
    for name in schema.features:
        col = df[name]
        if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            raise SchemaError(f"column {name!r} holds values that are not numbers (e.g. {col.iloc[0]!r})")
        values = col.to_numpy(dtype=np.float64)
        bad = _non_finite(values)
        if bad.any():
            row = int(np.argmax(bad))
            raise SchemaError(f"column {name!r} has {int(bad.sum())} empty or non-finite value(s) as float32 (the "
                              f"training dtype: |v| <= {F32_MAX:.4g}), e.g. {float(values[row])!r} in row "
                              f"{start + row} (from 0)")
    x = df[list(schema.features)].to_numpy(dtype=np.float32)
    return x, schema.class_indices(df[schema.label].to_numpy(), f"column {schema.label!r}")


def _npy_header(zf: Any, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of array ``key`` of an npz, from its .npy header alone (nothing allocated)."""
    names = zf.namelist()
    member = f"{key}.npy" if f"{key}.npy" in names else key
    with zf.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise SchemaError(f"array {key!r} is a .npy of version {version}; allowed: 1.0, 2.0")
    if dtype.hasobject:
        raise SchemaError(f"array {key!r} holds Python objects (dtype {dtype}); it must hold numbers")
    return tuple(int(d) for d in shape), dtype


def _read_npz(path: Path, schema: DataSchema, limits: DataLimits) -> tuple[np.ndarray, np.ndarray]:
    import zipfile

    with zipfile.ZipFile(path) as zf:  # the headers first: shapes, dtypes and sizes before any allocation
        files = sorted(n[:-4] if n.endswith(".npy") else n for n in zf.namelist())
        for key in ("x", "y"):
            if key not in files:
                raise SchemaError(f"array {key!r} is missing (it holds {files}; needs x and y)")
        (xs, xd), (ys, yd) = _npy_header(zf, "x"), _npy_header(zf, "y")
    if len(xs) < 1 or xs[1:] != schema.feature_shape:
        raise SchemaError(f"x has shape {xs}: records of shape {xs[1:]}, but the schema says {schema.feature_shape}")
    if len(ys) != 1 or ys[0] != xs[0]:
        raise SchemaError(f"y has shape {ys}; it must be [{xs[0]}] (one label per record of x)")
    if xd.kind not in "iuf":
        raise SchemaError(f"x must hold finite numbers (dtype {xd})")
    features = math.prod(schema.feature_shape)
    check_size(limits, xs[0], features, xs[0] * features * xd.itemsize + ys[0] * yd.itemsize)
    with np.load(path, allow_pickle=False) as npz:
        x, y = np.asarray(npz["x"]), np.asarray(npz["y"])
    bad = _non_finite(x)
    if bad.any():
        record = int(np.argmax(bad.reshape(len(x), -1).any(axis=1)))
        raise SchemaError(f"x has {int(bad.sum())} value(s) that are not finite as float32 (the training dtype: "
                          f"|v| <= {F32_MAX:.4g}; nan, inf), e.g. in record {record} (from 0)")
    return x, schema.class_indices(y, "y")


def _read_images(root: Path, schema: DataSchema, limits: DataLimits) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image
    from torchvision.datasets import ImageFolder
    from torchvision.transforms.functional import pil_to_tensor

    shape = schema.feature_shape
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise SchemaError(f"an image folder needs a schema shape [1 or 3 channels, height, width], got {list(shape)}")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    extra = [c for c in folders if c not in schema.classes]
    if extra:
        raise SchemaError(f"class {extra[0]!r} (a folder) is not in the schema's classes {list(schema.classes)}")
    ds = ImageFolder(str(root), allow_empty=True)  # lists the files, decodes none
    check_size(limits, len(ds.samples), math.prod(shape))
    x = np.empty((len(ds.samples), *shape), np.float32)
    for i, (file, _target) in enumerate(ds.samples):
        with Image.open(file) as img:  # the size from the header, before the pixels are decoded
            found = (1 if img.mode in _GREY else 3, img.height, img.width)
            if found != shape:
                raise SchemaError(f"image {Path(file).relative_to(root)} has shape {found}, but the schema says "
                                  f"{shape}")
            x[i] = pil_to_tensor(img.convert("L" if img.mode in _GREY else "RGB")).numpy() / np.float32(255.0)
    y = np.array([ds.classes[t] for _, t in ds.samples])
    return x, (schema.class_indices(y, "class folders") if len(y) else np.zeros(0, np.int64))


#: PIL modes read as one grey channel; every other mode is read as RGB (three)
_GREY = ("1", "L", "I", "I;16", "F")
