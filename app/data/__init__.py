"""Data layer: sources, partitioners, per-silo splits and standardisation (no Flower imports)."""

from app.data.partition import (
    EVEN_ODD_PAIRS,
    PARTITIONS,
    by_label,
    dirichlet,
    even_odd_labels,
    even_odd_pairs,
    iid,
    make_partition,
    mixing,
)
from app.data.preprocess import STANDARDIZE_MODES, Standardizer, fit_standardizer, standardize_silos
from app.data.sources import SOURCES, Dataset, DataUnavailableError, load_source, read_idx
from app.data.split import fixed_size_batch, train_test_split_indices

__all__ = [
    "EVEN_ODD_PAIRS",
    "PARTITIONS",
    "SOURCES",
    "STANDARDIZE_MODES",
    "DataUnavailableError",
    "Dataset",
    "Standardizer",
    "by_label",
    "dirichlet",
    "even_odd_labels",
    "even_odd_pairs",
    "fit_standardizer",
    "fixed_size_batch",
    "iid",
    "load_source",
    "make_partition",
    "mixing",
    "read_idx",
    "standardize_silos",
    "train_test_split_indices",
]
