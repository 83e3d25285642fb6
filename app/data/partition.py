"""Partitioners: split record indices into disjoint silos.

Every partitioner takes ``labels`` (1-D non-negative integer array) and a
``numpy.random.Generator`` and returns one sorted int64 index array per silo.
Silos are disjoint; an empty silo is a ValueError naming the silo.
"""

from __future__ import annotations

import numbers

import numpy as np

PARTITIONS: tuple[str, ...] = ("label", "even-odd-pairs", "dirichlet", "iid", "mixing")

EVEN_DIGITS: tuple[int, ...] = (0, 2, 4, 6, 8)
ODD_DIGITS: tuple[int, ...] = (1, 3, 5, 7, 9)
#: The 25 (even, odd) class pairs in lexicographic order; silo s holds pair s.
EVEN_ODD_PAIRS: tuple[tuple[int, int], ...] = tuple((e, o) for e in EVEN_DIGITS for o in ODD_DIGITS)

_DIRICHLET_MAX_ATTEMPTS = 1000


# --------------------------------------------------------------------------- validation


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels.shape={labels.shape}; must be a non-empty 1-D array")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels.dtype={labels.dtype}; must be an integer dtype")
    if labels.min() < 0:
        raise ValueError(f"labels contain {int(labels.min())}; must be >= 0")
    return labels


def _check_num_silos(num_silos: int, n: int) -> int:
    if not isinstance(num_silos, numbers.Integral) or isinstance(num_silos, bool) or not 1 <= num_silos <= n:
        raise ValueError(f"num_silos={num_silos!r}; must be an integer in [1, {n}] (number of records)")
    return int(num_silos)


def _check_rng(rng: np.random.Generator) -> None:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng={rng!r}; must be a numpy.random.Generator")


def _finish(parts: list[np.ndarray], kind: str) -> list[np.ndarray]:
    out = [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    for s, part in enumerate(out):
        if part.size == 0:
            raise ValueError(f"partition={kind!r}: silo {s} is empty; use fewer silos or another partition")
    return out


def _check(labels: np.ndarray, num_silos: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    labels = _check_labels(labels)
    _check_rng(rng)
    return labels, _check_num_silos(num_silos, labels.size)


# --------------------------------------------------------------------------- partitioners


def _label_to_silo(labels: np.ndarray, num_silos: int) -> np.ndarray:
    """Silo of every record under by_label: class of rank i (among present classes) -> i * S // C."""
    classes, rank = np.unique(labels, return_inverse=True)
    c = classes.size
    if num_silos > c:
        raise ValueError(f"num_silos={num_silos}; by-label partition needs num_silos in [1, {c}] (number of classes)")
    return (rank.reshape(-1) * num_silos) // c


def by_label(labels: np.ndarray, num_silos: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Each silo gets whole classes: the C present classes, in increasing order, are cut into
    ``num_silos`` contiguous groups (class rank c -> silo c * num_silos // C). Deterministic;
    ``rng`` is accepted for a uniform signature. Requires num_silos <= C.
    """
    labels, num_silos = _check(labels, num_silos, rng)
    silo = _label_to_silo(labels, num_silos)
    return _finish([np.flatnonzero(silo == s) for s in range(num_silos)], "label")


def even_odd_labels(labels: np.ndarray) -> np.ndarray:
    """Binary task label for digit-like classes 0..9: 1 if the class is odd, 0 if even."""
    labels = _check_labels(labels)
    if labels.max() > 9:
        raise ValueError(f"labels contain {int(labels.max())}; even/odd task needs classes in 0..9")
    return (labels % 2).astype(np.int64)


def even_odd_pairs(labels: np.ndarray, num_silos: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Lowy et al. MNIST setup: silo s holds the records of pair ``EVEN_ODD_PAIRS[s]`` (even, odd digit).

    ``num_silos`` in 1..25 uses the first ``num_silos`` pairs in lexicographic order. Each class's
    records are shuffled with ``rng`` and split evenly (sizes differ by at most 1) among the silos
    whose pair contains that class (5 silos per class when num_silos == 25). Records of classes
    used by no silo (possible when num_silos < 25, e.g. digits 3, 5, 7, 9 for num_silos == 1) are dropped.
    Use :func:`even_odd_labels` for the binary task label. Labels must lie in 0..9.
    """
    labels = _check_labels(labels)
    _check_rng(rng)
    if labels.max() > 9:
        raise ValueError(f"labels contain {int(labels.max())}; even-odd-pairs needs classes in 0..9")
    if not isinstance(num_silos, numbers.Integral) or isinstance(num_silos, bool) or not 1 <= num_silos <= 25:
        raise ValueError(f"num_silos={num_silos!r}; even-odd-pairs needs an integer in [1, 25]")
    pairs = EVEN_ODD_PAIRS[:num_silos]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_silos)]
    for c in range(10):
        users = [s for s, pair in enumerate(pairs) if c in pair]
        if not users:
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for s, chunk in zip(users, np.array_split(idx, len(users))):
            parts[s].append(chunk)
    return _finish([np.concatenate(p) for p in parts], "even-odd-pairs")


def dirichlet(
    labels: np.ndarray,
    num_silos: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
    *,
    max_attempts: int = _DIRICHLET_MAX_ATTEMPTS,
) -> list[np.ndarray]:
    """Label-skew split (Hsu et al. 2019): for each class, shuffle its records and cut them by
    proportions drawn from Dirichlet(alpha * 1_S). The whole draw is repeated until every silo has
    at least ``min_size`` records; after ``max_attempts`` draws it is a ValueError.
    """
    labels, num_silos = _check(labels, num_silos, rng)
    if not isinstance(alpha, numbers.Real) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha={alpha!r}; must be a finite number > 0")
    n = labels.size
    if not isinstance(min_size, numbers.Integral) or isinstance(min_size, bool) or not 1 <= min_size * num_silos <= n:
        raise ValueError(f"min_size={min_size!r}; must be an integer in [1, {n // num_silos}] (records / silos)")
    if not isinstance(max_attempts, numbers.Integral) or max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts!r}; must be an integer >= 1")
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(int(max_attempts)):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_silos)]
        for idx in by_class:
            props = rng.dirichlet(np.full(num_silos, float(alpha)))
            cuts = (np.cumsum(props)[:-1] * idx.size).astype(np.int64)
            for s, chunk in enumerate(np.split(rng.permutation(idx), cuts)):
                parts[s].append(chunk)
        sizes = [sum(c.size for c in p) for p in parts]
        if min(sizes) >= min_size:
            return _finish([np.concatenate(p) for p in parts], "dirichlet")
    raise ValueError(
        f"min_size={min_size}; no Dirichlet(alpha={alpha}) draw over {num_silos} silos reached it in "
        f"{max_attempts} attempts; raise alpha, lower min_size or use fewer silos"
    )


def iid(labels: np.ndarray, num_silos: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle all records with ``rng`` and cut into near-equal silos (sizes differ by at most 1)."""
    labels, num_silos = _check(labels, num_silos, rng)
    return _finish(np.array_split(rng.permutation(labels.size), num_silos), "iid")


def mixing(labels: np.ndarray, num_silos: int, p: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Heterogeneity knob of Woodworth et al. (2020): a share ``p`` of the data is IID, the rest by label.

    Precisely: draw a permutation ``perm`` of all N records with ``rng``; the first m = round(p * N)
    (Python ``round``, ties to even) form a common pool, cut into near-equal consecutive chunks,
    chunk s to silo s (IID). The remaining N - m records go to the silo their class maps to under
    :func:`by_label` (class map computed from all labels, so it does not depend on the draw).
    p = 0 gives exactly the by_label silos; p = 1 gives exactly ``iid(labels, num_silos, rng)``
    for the same generator state. Requires num_silos <= number of classes, p in [0, 1].
    """
    labels, num_silos = _check(labels, num_silos, rng)
    if not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p!r}; must be a number in [0, 1]")
    silo_of = _label_to_silo(labels, num_silos)
    perm = rng.permutation(labels.size)
    m = int(round(float(p) * labels.size))
    pool_parts = np.array_split(perm[:m], num_silos)
    rest = perm[m:]
    rest_silo = silo_of[rest]
    parts = [np.concatenate([pool_parts[s], rest[rest_silo == s]]) for s in range(num_silos)]
    return _finish(parts, "mixing")


def make_partition(
    kind: str,
    labels: np.ndarray,
    num_silos: int,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    p: float = 0.0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """Dispatch to the partitioner named ``kind`` (one of :data:`PARTITIONS`).

    ``alpha`` and ``min_size`` apply to ``dirichlet``; ``p`` to ``mixing``; both are validated
    whatever the kind, so a bad setting never passes silently.
    """
    if kind not in PARTITIONS:
        raise ValueError(f"partition={kind!r}; known: {', '.join(PARTITIONS)}")
    if not isinstance(alpha, numbers.Real) or not np.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha={alpha!r}; must be a finite number > 0")
    if not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"p={p!r}; must be a number in [0, 1]")
    if kind == "label":
        return by_label(labels, num_silos, rng)
    if kind == "even-odd-pairs":
        return even_odd_pairs(labels, num_silos, rng)
    if kind == "dirichlet":
        return dirichlet(labels, num_silos, alpha, rng, min_size)
    if kind == "iid":
        return iid(labels, num_silos, rng)
    return mixing(labels, num_silos, p, rng)
