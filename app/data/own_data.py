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

from app.data.own_files import read_records
from app.data.preprocess import Standardizer, fit_standardizer, standardize_silos
from app.data.schema import DataSchema, SchemaError, load_schema
from app.data.sources import Dataset
from app.data.split import train_test_split_indices
from app.seeding import np_rng

if TYPE_CHECKING:
    from app.config import Settings
    from app.data.federated import SiloData


def run_schema(s: "Settings") -> DataSchema:
    """The run's ``data.schema`` (SchemaError, one line, when it is missing or malformed)."""
    if not s.data_schema:
        raise SchemaError("a silo's own data-file needs the run's data.schema (the schema it must match)")
    return load_schema(s.data_schema)


def simulation_source(schema_value: str, path: str) -> Dataset:
    """``data.simulation-file`` (``path``) read against ``data.schema`` (``schema_value``) as one
    pooled data set, for the partitioner to split."""
    schema = load_schema(schema_value)
    x, y = read_records(path, schema)
    return Dataset(x=x, y=y, num_classes=schema.num_classes, name="own", feature_shape=schema.feature_shape)


def own_scaler(mode: str, train_x: np.ndarray) -> Standardizer:
    """The silo's pre-processing from its own training records alone (``standardize`` local or
    none); ``pooled`` needs every silo's records, which a silo with its own file does not hold."""
    if mode == "pooled":
        raise SchemaError("standardize = 'pooled' needs every silo's records, which a silo with its own data-file "
                          "does not hold; set standardize = 'local' or 'none' in the run config")
    return standardize_silos(None, [train_x], mode)[0]


def own_silo_data(s: "Settings", path: str, fmt: str, index: int) -> "SiloData":
    """Silo ``index``'s records from its own file: checked against the schema, split into train /
    test (``test-fraction``) and validation (``validation-fraction``) with the run seed, and
    pre-processed with its own training records. SchemaError (one line) for a file that does not
    fit, or a run whose pre-processing needs records the silo does not have."""
    import torch

    from app.data.federated import SiloData

    if s.pca:
        raise SchemaError(f"pca = {s.pca} is fitted on every silo's pooled records, which a silo with its own "
                          "data-file does not hold; set pca = 0")
    x, y = read_records(path, run_schema(s), fmt)
    tr, te = train_test_split_indices(np.arange(len(y)), s.test_fraction, np_rng(s.seed, "split", index))
    tr, va = train_test_split_indices(tr, s.validation_fraction, np_rng(s.seed, "validation", index))
    scaler = own_scaler(s.standardize, x[tr])

    def tensors(idx: np.ndarray) -> tuple["torch.Tensor", "torch.Tensor"]:
        return (torch.from_numpy(np.ascontiguousarray(scaler.apply(x[idx]), dtype=np.float32)),
                torch.from_numpy(y[idx]))

    (train_x, train_y), (test_x, test_y), (val_x, val_y) = tensors(tr), tensors(te), tensors(va)
    return SiloData(index, train_x, train_y, test_x, test_y, val_x, val_y)


def server_records(s: "Settings", path: str) -> tuple[np.ndarray, np.ndarray]:
    """The server's own file (trust or test set) as (x float32, y int64), checked against the
    schema and pre-processed like a silo's own records: standardised with its own statistics
    (the server's data, public to the server) unless ``standardize = 'none'``."""
    x, y = read_records(path, run_schema(s))
    scaler = Standardizer.identity(x.shape[1:]) if s.standardize == "none" else fit_standardizer(x)
    return scaler.apply(x).astype(np.float32), y
