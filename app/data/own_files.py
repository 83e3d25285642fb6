"""Read one party's own records from a file, checked against the run's schema.

Formats (``data-format``, or from the name): ``csv`` and ``parquet`` (pandas; Parquet through
pyarrow): the schema's feature columns and its label column; ``npz`` (NumPy): arrays ``x``
[N, *shape] and ``y`` [N]; ``images``: a folder of class folders (``<class>/<name>.png``), read by
torchvision's ``ImageFolder`` (pixels / 255, a public scaling). A file that does not match the
schema raises :class:`app.data.schema.SchemaError` with one line naming the column, the class or
the shape, before anything else is done with the records.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.data.schema import DataSchema, SchemaError

FORMATS = ("csv", "parquet", "npz", "images")
_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet", ".pq": "parquet", ".npz": "npz"}


def detect_format(path: str | Path, fmt: str = "") -> str:
    """``fmt`` if given (one of :data:`FORMATS`), else from the path: a folder is ``images``,
    else the extension (.csv, .csv.gz, .parquet, .pq, .npz)."""
    if fmt:
        if fmt not in FORMATS:
            raise SchemaError(f"data-format = {fmt!r} is not allowed; allowed: {', '.join(FORMATS)}")
        return fmt
    p = Path(path)
    if p.is_dir():
        return "images"
    suffixes = [s.lower() for s in p.suffixes]
    if suffixes and suffixes[-1] in (".gz", ".bz2", ".zip", ".xz") and len(suffixes) > 1:
        suffixes = suffixes[:-1]  # pandas reads compressed CSV
    found = _SUFFIXES.get(suffixes[-1] if suffixes else "")
    if found is None:
        raise SchemaError(f"data-file {p}: cannot tell its format from the name; set data-format to one of "
                          f"{', '.join(FORMATS)}")
    return found


def read_records(path: str | Path, schema: DataSchema, fmt: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(x float32 [N, *schema.feature_shape], y int64 class indices) of the file at ``path``;
    SchemaError (one line, naming the file) when it is missing, unreadable or does not match."""
    p = Path(path).expanduser()
    fmt = detect_format(p, fmt)
    if not p.exists():
        raise SchemaError(f"data-file {p}: no such file or folder")
    try:
        if fmt in ("csv", "parquet"):
            x, y = _read_table(p, fmt, schema)
        elif fmt == "npz":
            x, y = _read_npz(p, schema)
        else:
            x, y = _read_images(p, schema)
    except SchemaError as exc:
        raise SchemaError(f"data-file {p}: {exc}") from None
    except Exception as exc:  # the library's own error (a corrupt file, a wrong format): one line
        first = (str(exc).strip().splitlines() or [""])[0]
        raise SchemaError(f"data-file {p}: cannot read it as {fmt} ({type(exc).__name__}: {first})") from None
    if len(y) == 0:
        raise SchemaError(f"data-file {p}: holds no records")
    return np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64)


def _read_table(path: Path, fmt: str, schema: DataSchema) -> tuple[np.ndarray, np.ndarray]:
    import pandas as pd

    if not schema.tabular:
        raise SchemaError(f"a {fmt} table needs a schema with features (column names); this schema gives a shape "
                          f"{list(schema.shape)}")
    df = pd.read_csv(path, sep="\t" if path.suffix.lower() == ".tsv" else ",") if fmt == "csv" else \
        pd.read_parquet(path, engine="pyarrow")
    columns = [str(c) for c in df.columns]
    df.columns = columns
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
    for name in schema.features:
        col = df[name]
        if not pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
            raise SchemaError(f"column {name!r} holds values that are not numbers (e.g. {col.iloc[0]!r})")
        if col.isna().any() or not np.all(np.isfinite(col.to_numpy(dtype=np.float64))):
            raise SchemaError(f"column {name!r} has {int((~np.isfinite(col.to_numpy(dtype=np.float64))).sum())} "
                              "empty or non-finite value(s)")
    if df[schema.label].isna().any():
        raise SchemaError(f"the label column {schema.label!r} has {int(df[schema.label].isna().sum())} empty value(s)")
    x = df[list(schema.features)].to_numpy(dtype=np.float64)
    return x, schema.class_indices(df[schema.label].to_numpy(), f"column {schema.label!r}")


def _read_npz(path: Path, schema: DataSchema) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        for key in ("x", "y"):
            if key not in npz.files:
                raise SchemaError(f"array {key!r} is missing (it holds {sorted(npz.files)}; needs x and y)")
        x, y = np.asarray(npz["x"]), np.asarray(npz["y"])
    if x.ndim < 1 or tuple(x.shape[1:]) != schema.feature_shape:
        raise SchemaError(f"x has shape {tuple(x.shape)}: records of shape {tuple(x.shape[1:])}, but the schema says "
                          f"{schema.feature_shape}")
    if y.ndim != 1 or len(y) != len(x):
        raise SchemaError(f"y has shape {tuple(y.shape)}; it must be [{len(x)}] (one label per record of x)")
    if x.dtype.kind not in "iuf" or not np.all(np.isfinite(x)):
        raise SchemaError(f"x must hold finite numbers (dtype {x.dtype})")
    return x, schema.class_indices(y, "y")


def _read_images(root: Path, schema: DataSchema) -> tuple[np.ndarray, np.ndarray]:
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import ToTensor

    shape = schema.feature_shape
    if len(shape) != 3 or shape[0] not in (1, 3):
        raise SchemaError(f"an image folder needs a schema shape [1 or 3 channels, height, width], got {list(shape)}")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir())
    extra = [c for c in folders if c not in schema.classes]
    if extra:
        raise SchemaError(f"class {extra[0]!r} (a folder) is not in the schema's classes {list(schema.classes)}")
    to_tensor = ToTensor()
    ds = ImageFolder(str(root), loader=_open_image, allow_empty=True)
    xs, ys = [], []
    for (file, target), (img, _) in zip(ds.samples, ds, strict=True):
        arr = to_tensor(img).numpy()
        if tuple(arr.shape) != shape:
            raise SchemaError(f"image {Path(file).relative_to(root)} has shape {tuple(arr.shape)}, but the schema says "
                              f"{shape}")
        xs.append(arr)
        ys.append(ds.classes[target])
    if not xs:
        return np.zeros((0, *shape), np.float32), np.zeros(0, np.int64)
    return np.stack(xs), schema.class_indices(np.array(ys), "class folders")


def _open_image(path: str):  # noqa: ANN202 - a PIL image
    """The image as grey levels (one channel) if it has one band, else as RGB (three): its
    channel count is its own, so a colour image under a one-channel schema is a wrong shape."""
    from PIL import Image

    with Image.open(path) as img:
        return img.convert("L" if img.mode in ("1", "L", "I", "I;16", "F") else "RGB")
