"""SecAgg+'s communication graph: a random k-regular (Harary-style) graph from a public seed.

Bell, Bonawitz, Gascon, Lepoint & Raykova (CCS 2020), Sec. 3: each client shares its secrets
with, and masks against, only its neighbours in a random k-regular graph, k = O(log n), instead
of all n - 1 others (classic SecAgg, Bonawitz et al. 2017, is the complete graph). The
construction follows Flower's SecAgg+ workflow (flwr.server.workflow.secure_aggregation.
secaggplus_workflow: shuffle the nodes, then join each one to the ``k/2`` next and previous
ones on the ring): a Harary graph H(k, n) on a uniformly random ordering of the nodes.

* degree >= n - 1: the complete graph.
* k even: position i is joined to i +- 1, ..., i +- k/2 (mod n).
* k odd and n even: as for k - 1, plus the opposite position i + n/2 (k-regular).
* k odd and n odd: no k-regular graph exists (n k would be odd); k + 1 is used.

The ordering is a Fisher-Yates shuffle of the sorted nodes driven by SHA-256 in counter mode
keyed by ``seed`` (rejection sampling, so every ordering is equally likely), fully specified
here so that any party recomputes the same graph from the same public seed on any platform.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

DOMAIN = b"silofl-secagg-graph-v1"


class _Stream:
    """Uniform integers below n from SHA-256(DOMAIN || seed || counter) words (rejection sampling)."""

    def __init__(self, seed: bytes) -> None:
        self._seed = bytes(seed)
        self._counter = 0
        self._words: list[int] = []

    def _word(self) -> int:
        if not self._words:
            block = hashlib.sha256(DOMAIN + self._seed + self._counter.to_bytes(8, "big")).digest()
            self._counter += 1
            self._words = [int.from_bytes(block[i: i + 8], "big") for i in range(0, 32, 8)]
        return self._words.pop(0)

    def below(self, n: int) -> int:
        limit = (1 << 64) - (1 << 64) % n  # largest multiple of n <= 2**64
        while True:
            w = self._word()
            if w < limit:
                return w % n


def shuffled(nodes: Sequence[int], seed: bytes) -> list[int]:
    """The sorted ``nodes`` in a uniformly random order determined by ``seed`` (Fisher-Yates)."""
    order = sorted(nodes)
    stream = _Stream(seed)
    for i in range(len(order) - 1, 0, -1):
        j = stream.below(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def neighbours(nodes: Sequence[int], degree: int, seed: bytes) -> dict[int, frozenset[int]]:
    """node -> its neighbours (never itself) in the graph above; symmetric, fixed by ``seed``."""
    if not isinstance(seed, (bytes, bytearray)):
        raise ValueError("seed must be bytes")
    if not isinstance(degree, int) or isinstance(degree, bool) or degree < 0:
        raise ValueError(f"degree must be an int >= 0, got {degree!r}")
    node_list = list(nodes)
    if any(not isinstance(v, int) or isinstance(v, bool) for v in node_list):
        raise ValueError("nodes must be ints")
    if len(set(node_list)) != len(node_list):
        raise ValueError("nodes must be distinct")
    n = len(node_list)
    if degree >= n - 1:
        everyone = frozenset(node_list)
        return {v: everyone - {v} for v in node_list}
    order = shuffled(node_list, seed)
    if degree % 2 == 1 and n % 2 == 1:
        degree += 1
    half = degree // 2
    edges: dict[int, set[int]] = {v: set() for v in order}
    for i, v in enumerate(order):
        offsets = list(range(1, half + 1))
        if degree % 2 == 1:
            offsets.append(n // 2)
        for off in offsets:
            w = order[(i + off) % n]
            edges[v].add(w)
            edges[w].add(v)
    return {v: frozenset(edges[v]) for v in node_list}
