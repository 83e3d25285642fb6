"""The data schema every silo's own file (and the server's own files) must match.

The run config names it (``data.schema``): a JSON or YAML file, or the JSON text itself
(``'{"features": [...], ...}'``). Keys:

* ``classes`` (required): the label values in class-index order (class k is ``classes[k]``);
* ``features``: the feature columns of a table (CSV / Parquet), in order; the records are then
  vectors of ``len(features)`` numbers; or ``shape``: each record's shape (NumPy ``x``, images
  as ``[channels, height, width]``);
* ``label``: the label column of a table (default ``"label"``);
* ``ignore``: further columns a table may hold and the run never reads (e.g. a record id);
* ``ranges``: optional public per-feature bounds ``{"column": [low, high]}`` (tables) or one
  ``[low, high]`` for every feature, facts about the domain (not statistics of the records),
  exposed as :attr:`DataSchema.ranges` for public feature scaling;
* ``statistics``: optional public per-feature ``{"mean": ..., "std": ...}`` (each
  ``{"column": value}``, a list of one value per flattened feature, or one value for all): statistics of *public* data (e.g. the
  server's own file, ``python -m app.data.public_statistics``; never of a silo's records), used
  for public standardisation (x - mean) / std in preference to ``ranges``.

Pure data and plain functions: no torch, no Flower.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA_KEYS = ("classes", "features", "shape", "label", "ignore", "ranges", "statistics")
#: where a relative ``data.schema`` path is looked for after the working directory: the app's root
APP_ROOT = Path(__file__).resolve().parents[2]


class SchemaError(ValueError):
    """The schema itself is malformed, or a file does not match it (one line)."""


@dataclass(frozen=True)
class DataSchema:
    """What every silo's records must look like (see the module docstring)."""

    classes: tuple[str, ...]
    features: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    label: str = "label"
    ignore: tuple[str, ...] = ()
    #: per-feature (low, high), aligned with the flattened features; None: not declared
    ranges: tuple[tuple[float, float], ...] | None = None
    #: per-feature public (mean, std), aligned with the flattened features; None: not declared
    statistics: tuple[tuple[float, float], ...] | None = None

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return (len(self.features),) if self.features else self.shape

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def tabular(self) -> bool:
        return bool(self.features)

    def range_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(low, high) arrays of :attr:`feature_shape`, or None when no ranges are declared."""
        if self.ranges is None:
            return None
        lo, hi = np.array(self.ranges, dtype=np.float64).T
        return lo.reshape(self.feature_shape), hi.reshape(self.feature_shape)

    def statistics_arrays(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(mean, std) arrays of :attr:`feature_shape`, or None when no statistics are declared."""
        if self.statistics is None:
            return None
        mean, std = np.array(self.statistics, dtype=np.float64).T
        return mean.reshape(self.feature_shape), std.reshape(self.feature_shape)

    def class_indices(self, values: Any, where: str) -> np.ndarray:
        """The class index of each label value (compared as text: 1, 1.0 and "1" are the same
        label); SchemaError naming the first value that is not one of :attr:`classes`."""
        arr = np.asarray(values)
        if arr.dtype.kind == "f" and arr.size and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)  # a float column of whole numbers: 1.0 is the label "1"
        text = arr.astype(str)
        index = {c: i for i, c in enumerate(self.classes)}
        extra = sorted(set(text.tolist()) - set(index))
        if extra:
            raise SchemaError(f"{where}: class {extra[0]!r} is not in the schema's classes "
                              f"{list(self.classes)}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
        return np.array([index[t] for t in text.tolist()], dtype=np.int64)


def _strings(key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
        raise SchemaError(f"data.schema: {key} must be a list of names, got {value!r}")
    out = tuple(str(v) for v in value)
    dupes = sorted({v for v in out if out.count(v) > 1})
    if dupes:
        raise SchemaError(f"data.schema: {key} lists {dupes[0]!r} twice")
    return out


def _ranges(value: Any, features: tuple[str, ...], size: int) -> tuple[tuple[float, float], ...]:
    def pair(name: str, v: Any) -> tuple[float, float]:
        ok = isinstance(v, list) and len(v) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                                        for b in v)
        if not ok or not all(math.isfinite(b) for b in v) or not v[0] < v[1]:
            raise SchemaError(f"data.schema: ranges of {name} must be [low, high] with low < high, got {v!r}")
        return float(v[0]), float(v[1])

    if isinstance(value, list):  # one [low, high] for every feature
        return (pair("every feature", value),) * size
    if not isinstance(value, dict):
        raise SchemaError(f"data.schema: ranges must be {{column: [low, high]}} or [low, high], got {value!r}")
    _check_columns(value, features, "ranges", "[low, high]", "; use one [low, high]")
    return tuple(pair(f, value[f]) for f in features)


def _check_columns(value: dict, features: tuple[str, ...], what: str, item: str, hint: str = "") -> None:
    """A per-column mapping names every feature and nothing else (SchemaError, one line)."""
    if not features:
        raise SchemaError(f"data.schema: {what} per column need features (column names){hint}")
    unknown = sorted(set(value) - set(features))
    if unknown:
        raise SchemaError(f"data.schema: {what} name {unknown[0]!r}, which is not a feature")
    missing = [f for f in features if f not in value]
    if missing:
        raise SchemaError(f"data.schema: {what} give no {item} for feature {missing[0]!r}")


def _statistics(value: Any, features: tuple[str, ...], size: int) -> tuple[tuple[float, float], ...]:
    """``{"mean": ..., "std": ...}``, each per column or one number: per-feature (mean, std > 0)."""
    if not isinstance(value, dict) or set(value) != {"mean", "std"}:
        raise SchemaError(f"data.schema: statistics must be {{\"mean\": ..., \"std\": ...}}, got {value!r}")

    def column(what: str, v: Any) -> list[float]:
        def number(name: str, b: Any) -> float:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or (what == "std"
                                                                                               and b <= 0):
                raise SchemaError(f"data.schema: statistics {what} of {name} must be a finite number"
                                  f"{' > 0' if what == 'std' else ''}, got {b!r}")
            return float(b)

        if isinstance(v, list):  # one value per (flattened) feature
            if len(v) != size:
                raise SchemaError(f"data.schema: statistics {what} lists {len(v)} values for {size} features")
            return [number(f"feature {i}", b) for i, b in enumerate(v)]
        if not isinstance(v, dict):
            return [number("every feature", v)] * size
        _check_columns(v, features, f"statistics {what}", "value")
        return [number(f, v[f]) for f in features]

    return tuple(zip(column("mean", value["mean"]), column("std", value["std"]), strict=True))


def parse_schema(doc: Any) -> DataSchema:
    """A :class:`DataSchema` from its dict form; SchemaError (one line) for a malformed one."""
    if not isinstance(doc, dict):
        raise SchemaError(f"data.schema must be a mapping with keys {', '.join(SCHEMA_KEYS)}, got {type(doc).__name__}")
    unknown = sorted(set(doc) - set(SCHEMA_KEYS))
    if unknown:
        raise SchemaError(f"data.schema: unknown key {unknown[0]!r}; allowed: {', '.join(SCHEMA_KEYS)}")
    if "classes" not in doc:
        raise SchemaError("data.schema: classes (the label values, in class-index order) is required")
    classes = _strings("classes", doc["classes"])
    if len(classes) < 2:
        raise SchemaError(f"data.schema: classes must name at least 2 classes, got {list(classes)}")
    features = _strings("features", doc["features"]) if "features" in doc else ()
    shape: tuple[int, ...] = ()
    if "shape" in doc:
        raw = doc["shape"]
        if (not isinstance(raw, list) or not raw
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in raw)):
            raise SchemaError(f"data.schema: shape must be a list of positive integers, got {raw!r}")
        shape = tuple(raw)
    if bool(features) == bool(shape):
        raise SchemaError("data.schema: give exactly one of features (table columns) or shape (arrays, images)")
    label = doc.get("label", "label")
    if not isinstance(label, str) or not label:
        raise SchemaError(f"data.schema: label must be a column name, got {label!r}")
    if label in features:
        raise SchemaError(f"data.schema: the label column {label!r} is also listed as a feature")
    ignore = _strings("ignore", doc["ignore"]) if "ignore" in doc else ()
    size = len(features) if features else int(np.prod(shape))
    ranges = _ranges(doc["ranges"], features, size) if doc.get("ranges") is not None else None
    stats = _statistics(doc["statistics"], features, size) if doc.get("statistics") is not None else None
    return DataSchema(classes, features, shape, label, ignore, ranges, stats)


def schema_path(value: str) -> Path:
    """Where ``data.schema``'s file is: as given (absolute, or relative to the working
    directory), else relative to the app's root."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path
    return APP_ROOT / path


def load_schema(value: str) -> DataSchema:
    """The run config's ``data.schema``: inline JSON (it starts with ``{``) or a .json / .yaml
    file; SchemaError (one line) when it cannot be read or is malformed. Cached by the text, and
    for a file by its modification time and size (an edited file is read again)."""
    text = value.strip()
    if not text:
        raise SchemaError("data.schema is empty")
    stamp: tuple[int, int] | None = None
    if not text.startswith("{"):
        try:
            st = schema_path(text).stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
    return _load_schema(text, stamp)


def is_inline(value: str) -> bool:
    """Whether ``data.schema``'s value is the JSON text itself (not a path)."""
    return value.strip().startswith("{")


def inline_schema(value: str) -> DataSchema:
    """``data.schema`` as a silo reads it: inline JSON only. A silo never opens a path the run
    config names (whether it exists, or parses, would answer the server); the launcher sends a
    schema file's text (:func:`inlined`). SchemaError for a path or malformed JSON."""
    if not is_inline(value):
        raise SchemaError("data.schema reaches this silo as a path; a silo reads the schema only as inline JSON "
                          "(python -m app.launch inlines a schema file before the run starts)")
    return load_schema(value)


def inlined(value: str) -> str:
    """``data.schema``'s value as the inline JSON a silo reads (:func:`inline_schema`): a file
    (read here, on the side that submits the run) becomes its document as compact JSON with
    sorted keys; inline JSON is kept as it is. SchemaError when it cannot be read or is malformed."""
    if not value.strip() or is_inline(value):
        return value
    doc = _file_document(schema_path(value.strip()))
    parse_schema(doc)  # malformed: one line
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def with_inline_schema(run_config: dict[str, Any]) -> dict[str, Any]:
    """``run_config`` with its ``data.schema`` :func:`inlined` (a copy; unchanged without one)."""
    value = run_config.get("data.schema")
    if not isinstance(value, str) or not value.strip() or is_inline(value):
        return run_config
    return run_config | {"data.schema": inlined(value)}


def _file_document(path: Path) -> Any:
    """The JSON or YAML document of the schema file at ``path``; SchemaError (one line naming
    the file) when it cannot be read or does not parse."""
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SchemaError(f"data.schema: cannot read {path}: {exc.strerror or exc}") from None
    try:
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            return yaml.safe_load(raw)
        return json.loads(raw)
    except Exception as exc:  # json's or yaml's parse error
        raise SchemaError(f"data.schema: {path} does not parse: {str(exc).splitlines()[0]}") from None


@functools.lru_cache(maxsize=8)
def _load_schema(text: str, _stamp: tuple[int, int] | None) -> DataSchema:
    if text.startswith("{"):
        try:
            return parse_schema(json.loads(text))
        except json.JSONDecodeError as exc:
            raise SchemaError(f"data.schema: inline JSON does not parse: {exc}") from None
    return parse_schema(_file_document(schema_path(text)))
