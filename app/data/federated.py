"""The federation's data: each silo's train/test split, built reproducibly from the settings.

Every process (each silo, and the launcher's pre-flight check) builds the same split from
(dataset, partition, seed); a silo keeps only its own part in memory. Pre-processing
(app/data/scaling.py) is inside the guarantee by default: public ranges, the server's public
sample (carved out before the partition, like the trust set), or DP statistics that each silo
computes itself after its ledger has charged them (``SiloData.dp_stats``). ``standardize=pooled``
and ``pca-fit=pooled`` use all silos' training data and ``local`` the silo's own without noise:
outside the guarantee, kept to reproduce papers (``preprocessing_steps`` says which).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from typing import TYPE_CHECKING, Any

import numpy as np

from app.data.partition import even_odd_labels, make_partition
from app.data.preprocess import Standardizer, fit_pca, fit_standardizer, standardize_silos
from app.data.scaling import PUBLIC_RANGES, DPStatsStep, clip_records, range_scaler, resolve_scaling
from app.data.sources import load_source
from app.data.split import stratified_sample, train_test_split_indices
from app.seeding import np_rng

if TYPE_CHECKING:
    import torch

    from app.data.options import DataOptions


@dataclass(frozen=True)
class SiloData:
    """One silo's records as CPU tensors (x float32, y int64)."""

    index: int
    train_x: "torch.Tensor"
    train_y: "torch.Tensor"
    test_x: "torch.Tensor"
    test_y: "torch.Tensor"
    #: validation records carved from the silo's training split (``validation-fraction``; may be
    #: empty); used to choose hyper-parameters, never trained on.
    val_x: "torch.Tensor | None" = None
    val_y: "torch.Tensor | None" = None
    #: standardize = "dp": the DP standardisation the silo still applies itself, once its ledger
    #: has charged the release (clients/silo.py); None: the features are final
    dp_stats: DPStatsStep | None = None

    @property
    def n(self) -> int:
        return int(self.train_y.shape[0])


@dataclass(frozen=True)
class FederatedData:
    silos: tuple[SiloData, ...]
    num_classes: int
    feature_shape: tuple[int, ...]

    def train_sizes(self) -> list[int]:
        return [s.n for s in self.silos]


#: public-size = 0: the server's public sample is min(500, a tenth of the records)
AUTO_PUBLIC = -1


def data_key(data: DataOptions, seed: int, trust_size: int) -> tuple:
    """What determines the data (used for caching): the data options, the run ``seed`` and the
    ``trust.size`` records carved out for the server's trust set before the partition (none when
    the server brings its own ``server.trust-file``)."""
    trust_size = 0 if data.server_trust_file else trust_size  # the server's own file: nothing carved out
    own = (data.data_schema, data.data_simulation_file) if data.data_schema else None
    # own records resolve auto as a deployed silo does (app/data/own_data.py): public, else dp
    if own is None:
        mode = resolve_scaling(data.standardize, data.dataset)
    else:
        from app.data.own_data import own_mode, run_schema

        mode = own_mode(data, run_schema(data))
    needs_public = mode == "server" or (data.pca and (data.pca_fit == "public" or mode == "public"))
    public = (data.public_size or AUTO_PUBLIC) if needs_public else 0
    return (data.dataset, data.data_dir, data.partition, data.partition_alpha, data.partition_p, mode,
            data.test_fraction, data.num_silos, seed, data.validation_fraction, data.pca, trust_size,
            data.pca_fit, public, data.preprocess_share, data.preprocess_clip, own)


def build_federated_data(data: DataOptions, seed: int, trust_size: int) -> FederatedData:
    """Load, partition, split and standardise; cached per process by :func:`data_key`."""
    return _build(data_key(data, seed, trust_size))


def silo_splits(data: DataOptions, seed: int,
                trust_size: int) -> tuple[object, list[tuple[np.ndarray, np.ndarray]], np.ndarray, int]:
    """(source, [(train indices, test indices) per silo], task labels, num classes), numpy only
    (the launcher's pre-flight check uses this without importing torch). The train indices
    exclude the validation records (:func:`validation_indices`)."""
    source, splits, labels, num_classes, _, _, _ = _splits(data_key(data, seed, trust_size))
    return source, splits, labels, num_classes


@functools.lru_cache(maxsize=4)
def _splits(key: tuple) -> tuple:
    """(source, splits, labels, num classes, validation indices, trust indices, public indices)."""
    dataset, data_dir, partition, alpha, p, _, test_fraction, num_silos, seed, val_fraction, _pca, trust_size = key[:12]
    public_size, own = key[13], key[16]
    if own is not None:  # a simulation of own files: the researcher's one file, split like a built-in source
        source = _own_source(own)
    else:
        source = load_source(dataset, data_dir or None, rng=np_rng(seed, "synthetic-data"))
    labels = source.y
    num_classes = source.num_classes
    # the server's trust set comes out first, so it is disjoint from every silo
    trust = stratified_sample(labels, trust_size, np_rng(seed, "trust-set")) if trust_size else np.zeros(0, np.int64)
    rest = np.setdiff1d(np.arange(len(labels)), trust)
    public = np.zeros(0, np.int64)
    if public_size:  # the server's public sample (pre-processing), disjoint from the trust set and every silo
        size = public_size if public_size != AUTO_PUBLIC else min(500, max(len(rest) // 10, 2))
        public = rest[stratified_sample(labels[rest], size, np_rng(seed, "public-set"))]
        rest = np.setdiff1d(rest, public)
    if partition == "even-odd-pairs":
        parts = make_partition(partition, labels[rest], num_silos, np_rng(seed, "partition"))
        labels = even_odd_labels(labels)
        num_classes = 2
    else:
        parts = make_partition(partition, labels[rest], num_silos, np_rng(seed, "partition"), alpha=alpha, p=p)
    parts = [rest[idx] for idx in parts]
    splits = [train_test_split_indices(idx, test_fraction, np_rng(seed, "split", i)) for i, idx in enumerate(parts)]
    vals = []
    for i, (tr, te) in enumerate(splits):  # validation records come out of the training split
        tr, va = train_test_split_indices(tr, val_fraction, np_rng(seed, "validation", i))
        splits[i] = (tr, te)
        vals.append(va)
    return source, splits, labels, num_classes, vals, trust, public


def _own_public(own: tuple[str, str], shape: tuple[int, ...]) -> Standardizer | None:
    """The public scaling ``data.schema`` declares (statistics, else ranges; None: neither)."""
    from app.data.own_data import public_scaler
    from app.data.schema import load_schema

    return public_scaler(load_schema(own[0]), shape)


def _own_ranges(own: tuple[str, str]) -> tuple[np.ndarray, np.ndarray] | None:
    """The public feature ranges ``data.schema`` declares (None: none declared)."""
    from app.data.schema import load_schema

    return load_schema(own[0]).range_arrays()


def _own_source(own: tuple[str, str]) -> object:
    """``data.simulation-file`` read against ``data.schema``; without a file the records live
    only on the silos (a deployment): DataUnavailableError, as for a data set not on this disk."""
    from app.data.own_data import simulation_source
    from app.data.sources import DataUnavailableError

    schema, path = own
    if not path:
        raise DataUnavailableError("data.schema is set and data.simulation-file is not: the records are the silos' "
                                   "own files (node config data-file), not readable here")
    return simulation_source(schema, path)


@functools.lru_cache(maxsize=4)
def _features(key: tuple) -> tuple[np.ndarray, list[Any], DPStatsStep | None]:
    """The source's features after PCA (if any), one scaler per silo and, for ``dp``, the step each
    silo still applies itself. The old modes (pooled, local, none; PCA on the pooled records) are
    computed exactly as before."""
    source, splits, _, _, _, _, public = _splits(key)
    dataset, mode, pca, pca_fit, share, clip = key[0], key[5], key[10], key[12], key[14], key[15]
    x = source.x
    if pca:  # pca-fit = pooled: on all silos' training records (outside the guarantee)
        fit_on = x[public] if pca_fit == "public" else np.concatenate([x[tr] for tr, _ in splits])
        x = fit_pca(fit_on, pca).apply(x)
    train = [x[tr] for tr, _ in splits]
    if mode in ("pooled", "local", "none"):
        return x, standardize_silos(None, train, mode), None
    shape = tuple(x.shape[1:])
    ranges = None if pca else PUBLIC_RANGES.get(dataset) if key[16] is None else _own_ranges(key[16])
    own_public = None if pca or key[16] is None else _own_public(key[16], shape)
    if mode == "server" or (mode == "public" and pca):  # the server's public sample's statistics
        shared = fit_standardizer(x[public])
    elif mode == "public" and own_public is not None:  # the schema's public statistics or ranges
        shared = own_public
    elif mode == "public":
        if ranges is None:
            raise ValueError(f"standardize = 'public': {dataset} has no public feature ranges; use 'dp' or 'server'")
        shared = range_scaler(*ranges, shape)
    else:  # dp: public ranges first (where known), then each silo's DP statistics
        shared = Standardizer.identity(shape) if ranges is None else range_scaler(*ranges, shape)
        return x, [shared for _ in train], DPStatsStep(clip, share, shared)
    return x, [shared for _ in train], None


@functools.lru_cache(maxsize=4)
def _build(key: tuple) -> FederatedData:
    import torch

    _, splits, labels, num_classes, vals, _, _ = _splits(key)
    x, scalers, dp_step = _features(key)

    def tensor(idx: np.ndarray, scaler) -> tuple["torch.Tensor", "torch.Tensor"]:
        return (torch.from_numpy(np.ascontiguousarray(scaler.apply(x[idx]), dtype=np.float32)),
                torch.from_numpy(labels[idx].astype(np.int64)))

    silos = []
    for i, ((tr, te), va, scaler) in enumerate(zip(splits, vals, scalers, strict=True)):
        (train_x, train_y), (test_x, test_y), (val_x, val_y) = tensor(tr, scaler), tensor(te, scaler), tensor(va, scaler)
        silos.append(SiloData(i, train_x, train_y, test_x, test_y, val_x, val_y, dp_step))
    return FederatedData(tuple(silos), num_classes, tuple(x.shape[1:]))

def apply_dp_stats(data: SiloData, noise_multiplier: float, seed: int) -> SiloData:
    """``data`` with its DP standardisation applied (``data.dp_stats``, app/data/scaling.py), the
    noise drawn from ``seed``: the silo calls this once its ledger has charged the release."""
    import torch

    from app.data.scaling import dp_transform

    val = data.val_x if data.val_x is not None else data.train_x[:0]
    train, (test, v) = dp_transform(data.dp_stats, data.train_x.numpy(), [data.test_x.numpy(), val.numpy()],
                                    noise_multiplier, np.random.default_rng(seed))
    return replace(data, train_x=torch.from_numpy(train), test_x=torch.from_numpy(test),
                   val_x=None if data.val_x is None else torch.from_numpy(v), dp_stats=None)


@dataclass(frozen=True)
class TrustSet:
    """A small labelled set the server holds, disjoint from every silo, with the silos'
    pre-processing applied: the trust set (Grad-BANT / FLTrust) or the public sample."""

    x: "torch.Tensor"
    y: "torch.Tensor"


def build_trust_set(data: DataOptions, seed: int, size: int, classes: tuple[int, ...], shift: str) -> TrustSet:
    """``size`` (``trust.size``) records drawn stratified by label before the silos' partition (so
    no silo holds them), restricted to ``classes`` (``trust.classes``) if given, with the ``shift``
    (``trust.shift``) applied; or the server's own ``server.trust-file`` (all of it, or a
    stratified ``size`` of it). ``seed``: the run seed."""
    if data.server_trust_file:  # the server's own file, checked against the run's schema
        from app.data.own_data import server_records

        tx, ty = server_records(data, data.server_trust_file)
        if size and size < len(ty):
            keep = stratified_sample(ty, size, np_rng(seed, "trust-set"))
            tx, ty = tx[keep], ty[keep]
        return _trust_set(seed, classes, shift, tx, ty)
    key = data_key(data, seed, size)
    trust = _splits(key)[5]
    if not len(trust):
        raise ValueError("trust.size = 0: this run has no trust set")
    return _trust_set(seed, classes, shift, *_server_held(key, trust))


def _server_held(key: tuple, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of the source's records ``idx`` that the server holds (its trust set or
    public sample), with the silos' pre-processing: the shared scaler, and under ``dp`` the silos'
    clipping then the server's own statistics of its own records."""
    labels = _splits(key)[2]
    x, scalers, dp_step = _features(key)
    scaler = scalers[0]  # pooled: the one shared scaler (local: silo 0's, none: identity; public/server: shared)
    hx, hy = scaler.apply(x[idx]).astype(np.float32), labels[idx].astype(np.int64)
    if dp_step is not None:
        hx = clip_records(hx, dp_step.clip)
        hx = fit_standardizer(hx).apply(hx).astype(np.float32)
    return hx, hy


def public_sample(data: DataOptions, seed: int, trust_size: int) -> TrustSet:
    """The server's public sample (the records its public pre-processing is fitted on: carved out
    before the partition, disjoint from every silo and from the trust set) with the silos'
    pre-processing applied, as the server would score a model on it: a score that reads no
    silo's record, so it costs no silo any epsilon. ``trust_size``: the run's ``trust.size``
    (it fixes which records are carved out first). ValueError when the run has no public sample
    (it has one when ``pca`` is fitted on it or ``standardize`` is ``server``)."""
    import torch

    key = data_key(data, seed, trust_size)
    public = _splits(key)[6]
    if not len(public):
        raise ValueError("this run has no public sample at the server: it has one with pca-fit = 'public' "
                         "(pca > 0) or standardize = 'server'")
    px, py = _server_held(key, public)
    return TrustSet(torch.from_numpy(np.ascontiguousarray(px)), torch.from_numpy(py))


def _trust_set(seed: int, classes: tuple[int, ...], shift: str, tx: np.ndarray, ty: np.ndarray) -> TrustSet:
    """The trust set restricted to ``trust.classes`` and with ``trust.shift`` applied."""
    import torch

    if classes:
        keep = np.isin(ty, classes)
        if not keep.any():
            raise ValueError(f"trust.classes = {list(classes)} leaves no trust record")
        tx, ty = tx[keep], ty[keep]
    tx = apply_shift(tx, shift, np_rng(seed, "trust-shift"))
    return TrustSet(torch.from_numpy(np.ascontiguousarray(tx)), torch.from_numpy(ty))


#: the trust set's appearance shifts (``trust.shift``)
TRUST_SHIFTS = ("none", "noise", "blur")


def apply_shift(x: np.ndarray, shift: str, rng: np.random.Generator) -> np.ndarray:
    """Appearance shifts of the trust set for the ablation: ``noise`` adds N(0, 0.5^2) to every
    (standardised) feature; ``blur`` averages each pixel with its 3x3 neighbours (images only)."""
    if shift == "none":
        return x
    if shift == "noise":
        return (x + rng.normal(0.0, 0.5, size=x.shape)).astype(np.float32)
    if shift == "blur":
        if x.ndim != 4:
            raise ValueError(f"trust.shift = 'blur' needs image features [N, C, H, W]; got shape {x.shape[1:]}")
        pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
        h, w = x.shape[2], x.shape[3]
        out = sum(pad[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)) / 9.0
        return out.astype(np.float32)
    raise ValueError(f"trust.shift = {shift!r}; allowed: {', '.join(TRUST_SHIFTS)}")


#: Public metadata of each source: (feature shape, number of classes). The server builds the
#: model from this without touching any silo's data.
SOURCE_META: dict[str, tuple[tuple[int, ...], int]] = {
    "wbcd": ((30,), 2),
    "digits": ((64,), 10),
    "fashion-mnist": ((1, 28, 28), 10),
    "tv-fashion-mnist": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "synthetic": ((20,), 2),
    "synthetic-image": ((3, 32, 32), 10),
}


def dataset_meta(data: DataOptions) -> tuple[tuple[int, ...], int]:
    """(feature shape, number of classes) of the task the data options describe."""
    if data.data_schema:  # own records: the schema is the public metadata
        from app.data.schema import load_schema

        schema = load_schema(data.data_schema)
        shape, classes = schema.feature_shape, schema.num_classes
    else:
        shape, classes = SOURCE_META[data.dataset]
    if data.pca:
        shape = (data.pca,)
    if data.partition == "even-odd-pairs":
        classes = 2
    return shape, classes
