"""Own records, as the federation uses them (docs/your-data.md).

* a deployed silo's own file (node config ``data-file``): :func:`own_silo_data`, its own split
  and its own pre-processing; nothing is pooled and nothing leaves the node; n is its own count;
* the server's own trust and test files (``server.trust-file``, ``server.test-file``):
  :func:`server_records`;
* a simulation's stand-in (``data.simulation-file``): :func:`simulation_source`, one file that
  the run's partitioner splits across virtual silos like a built-in data set.

Every file is read by :func:`app.data.own_files.read_records` and checked against the run's
``data.schema`` first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from app.data.own_files import F32_MAX, DataLimits, read_records
from app.data.preprocess import Standardizer, fit_standardizer, standardize_silos
from app.data.scaling import DPStatsStep, clip_records, range_scaler
from app.data.schema import DataSchema, SchemaError, load_schema
from app.data.sources import Dataset
from app.data.split import train_test_split_indices
from app.seeding import np_rng

if TYPE_CHECKING:
    from app.data.federated import SiloData
    from app.data.options import DataOptions


def run_schema(data: DataOptions) -> DataSchema:
    """The run's ``data.schema`` (SchemaError, one line, when it is missing or malformed)."""
    if not data.data_schema:
        raise SchemaError("a silo's own data-file needs the run's data.schema (the schema it must match)")
    return load_schema(data.data_schema)


def simulation_source(schema_value: str, path: str) -> Dataset:
    """``data.simulation-file`` (``path``) read against ``data.schema`` (``schema_value``) as one
    pooled data set, for the partitioner to split."""
    schema = load_schema(schema_value)
    x, y = read_records(path, schema)
    return Dataset(x=x, y=y, num_classes=schema.num_classes, name="own", feature_shape=schema.feature_shape)


def public_scaler(schema: DataSchema, shape: tuple[int, ...]) -> Standardizer | None:
    """The schema's public scaling: its declared statistics (x - mean) / std, else its declared
    ranges (x - low) / (high - low); None when it declares neither. Reads no record."""
    stats = schema.statistics_arrays()
    if stats is not None:
        return Standardizer(*stats)
    ranges = schema.range_arrays()
    return None if ranges is None else range_scaler(*ranges, shape)


def own_mode(data: DataOptions, schema: DataSchema | None) -> str:
    """``standardize`` for own records: ``auto`` is ``public`` when the schema declares public
    statistics or ranges, else ``dp`` (no server sample on a silo; app/data/scaling.py); any
    other mode as given. ``schema`` None: one that could not be read (nothing declared)."""
    if data.standardize != "auto":
        return data.standardize
    declared = schema is not None and (schema.statistics is not None or schema.ranges is not None)
    return "public" if declared else "dp"


def own_scaler(data: DataOptions, schema: DataSchema, train_x: np.ndarray) -> tuple[Standardizer, DPStatsStep | None]:
    """The silo's pre-processing of its own records: ``public`` from the schema alone
    (:func:`public_scaler`); ``dp`` (noisy statistics of the silo's own records, charged to its
    ledger by the silo before anything else, after the public ranges if declared); ``local`` and
    ``none`` from its own records alone (``local`` is outside epsilon). ``pooled`` and ``server``
    need records the silo does not hold: refused with one line. Returns the scaler applied now
    and, for ``dp``, the step the silo still does itself."""
    mode = own_mode(data, schema)
    if mode in ("pooled", "server"):
        raise SchemaError(f"standardize = {mode!r} needs records a silo with its own data-file does not hold "
                          "(every silo's, or the server's public sample); set standardize = 'auto' (public "
                          "statistics or ranges in data.schema, else DP statistics), 'dp', 'public', 'local' or "
                          "'none' in the run config")
    shape = tuple(train_x.shape[1:])
    if mode == "public":
        scaler = public_scaler(schema, shape)
        if scaler is None:
            raise SchemaError("standardize = 'public' needs public statistics or ranges in data.schema "
                              "(python -m app.data.public_statistics), or set standardize = 'dp'")
        return scaler, None
    if mode == "dp":
        ranges = schema.range_arrays()
        pre = Standardizer.identity(shape) if ranges is None else range_scaler(*ranges, shape)
        return pre, DPStatsStep(data.preprocess_clip, data.preprocess_share, pre)
    return standardize_silos(None, [train_x], mode)[0], None


def own_silo_data(data: DataOptions, seed: int, path: str, fmt: str, index: int, limits: DataLimits | None = None,
                  schema: DataSchema | None = None) -> "SiloData":
    """Silo ``index``'s records from its own file: checked against the schema and the node's
    ``limits`` (:class:`app.data.own_files.DataLimits`, defaults when None), split into train /
    test (``test-fraction``) and validation (``validation-fraction``) with the run ``seed``, and
    pre-processed with its own training records. SchemaError (one line), and never another
    exception type, for a file that does not fit, fewer training records than
    ``data-min-records``, or a run whose pre-processing needs records the silo does not have or
    fails on these (e.g. overflows float32)."""
    import torch

    from app.data.federated import SiloData

    if data.pca:
        raise SchemaError(f"pca = {data.pca} is fitted on every silo's pooled records, which a silo with its own "
                          "data-file does not hold; set pca = 0")
    limits = limits or DataLimits()
    schema = run_schema(data) if schema is None else schema
    x, y = read_records(path, schema, fmt, limits)
    mode = own_mode(data, schema)
    try:
        tr, te = train_test_split_indices(np.arange(len(y)), data.test_fraction, np_rng(seed, "split", index))
        tr, va = train_test_split_indices(tr, data.validation_fraction, np_rng(seed, "validation", index))
        check_min_records(path, len(y), len(tr), limits.min_records, data)
        scaler, dp_step = own_scaler(data, schema, x[tr])
    except SchemaError:
        raise
    except Exception as exc:  # e.g. ValueError: mean/std contain non-finite values; never a ClientApp failure
        raise preprocessing_error(path, mode, exc) from None

    def tensors(idx: np.ndarray) -> tuple["torch.Tensor", "torch.Tensor"]:
        return torch.from_numpy(scaled(path, mode, scaler, x[idx])), torch.from_numpy(y[idx])

    (train_x, train_y), (test_x, test_y), (val_x, val_y) = tensors(tr), tensors(te), tensors(va)
    return SiloData(index, train_x, train_y, test_x, test_y, val_x, val_y, dp_step)


def check_min_records(path: str, records: int, n: int, minimum: int, data: DataOptions) -> None:
    """SchemaError when the silo would train on ``n`` < ``minimum`` records (node config
    ``data-min-records``): δ = 1/n² is 1 at n = 1 (a guarantee of nothing) and a batch K <= n of a
    handful of records says more about each record than the plan assumes."""
    if n >= minimum:
        return
    delta = "δ = 1/n^2" + (f" = {1.0 / (n * n):.3g}" if n else "")
    if records < minimum:
        raise SchemaError(f"data-file {path}: holds {records} records ({n} for training, {delta}); this node trains "
                          f"on at least data-min-records = {minimum} (node config)")
    raise SchemaError(f"data-file {path}: the run keeps {n} of its {records} records for training (test-fraction "
                      f"{data.test_fraction:g}, validation-fraction {data.validation_fraction:g}; {delta}); this node trains "
                      f"on at least data-min-records = {minimum} (node config)")


def scaled(path: str, mode: str, scaler: Standardizer, x: np.ndarray) -> np.ndarray:
    """``scaler`` applied to ``x``, float32; SchemaError when a value comes out not finite in
    float32 (e.g. public statistics with a std far below the records' spread) or the scaling fails."""
    try:
        with np.errstate(all="ignore"):  # an overflow is found below, as inf
            z = np.ascontiguousarray(scaler.apply(x), dtype=np.float32)
        bad = int(z.size - np.count_nonzero(np.isfinite(z)))
        if bad:
            raise SchemaError(f"{bad} value(s) are not finite as float32 after it (the training dtype: |v| <= "
                              f"{F32_MAX:.4g})")
        return z
    except Exception as exc:
        raise preprocessing_error(path, mode, exc) from None


def preprocessing_error(path: str, mode: str, exc: Exception) -> SchemaError:
    """The one-line refusal of a pre-processing failure on the silo's own records (any exception:
    a ValueError of non-finite statistics, a MemoryError, ...): the node refuses, the federation
    goes on."""
    first = (str(exc).strip().splitlines() or [""])[0]
    what = first if isinstance(exc, SchemaError) else f"{type(exc).__name__}" + (f": {first}" if first else "")
    return SchemaError(f"data-file {path}: pre-processing (standardize = {mode!r}) failed: {what}")


def server_records(data: DataOptions, path: str) -> tuple[np.ndarray, np.ndarray]:
    """The server's own file (trust or test set) as (x float32, y int64), checked against the
    schema and scaled as the silos scale theirs (:func:`own_scaler`): the schema's public
    scaling for ``public``; for ``dp`` the ranges (if any), the silos' clipping, then the
    server's own statistics of its own records (its data are public to it); ``none`` leaves them;
    otherwise (``local``) its own statistics."""
    schema = run_schema(data)
    x, y = read_records(path, schema)
    mode = own_mode(data, schema)
    shape = tuple(x.shape[1:])
    try:
        if mode == "none":
            scaler = Standardizer.identity(shape)
        elif mode == "public" and (public := public_scaler(schema, shape)) is not None:
            scaler = public
        else:
            if mode == "dp":
                ranges = schema.range_arrays()
                if ranges is not None:
                    x = range_scaler(*ranges, shape).apply(x)
                x = clip_records(x, data.preprocess_clip)
            scaler = fit_standardizer(x)
    except Exception as exc:  # one line, like a file that does not match
        raise preprocessing_error(path, mode, exc) from None
    return scaled(path, mode, scaler, x), y
