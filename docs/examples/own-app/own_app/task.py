"""The user's model and records, shared by both apps: an MLP 30-5-2 on the Wisconsin breast-cancer
records (scikit-learn's copy), split into the server's own records (a trust set for Grad-BANT and a
test set) and four hospitals' records. Hospital 3's labels are flipped: a poisoned silo."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from sklearn.datasets import load_breast_cancer

#: the plan every silo holds itself to and the server plans for (the silo's own values always win)
#: BATCH = 0: every release is on all of a silo's records (the full batch)
ROUNDS, EPSILON, CLIP, BATCH, SPIDER_Q = 6, 3.0, 1.0, 0, 2
SILOS, TRUST, TEST = 4, 40, 114
POISONED = 3


class Net(torch.nn.Module):
    """The user's model: no BatchNorm (per-record gradients), the same names on every party."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(30, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@lru_cache(maxsize=1)
def _split() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(7).permutation(len(y))  # a public, fixed split
    return x.astype(np.float32), y.astype(np.int64), order


def _scaled(x: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Standardised with the statistics of the server's own records (published; no silo's record used)."""
    own = x[order[: TRUST + TEST]]
    return (x - own.mean(axis=0)) / (own.std(axis=0) + 1e-6)


def server_records() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The server's trust set (x, y) and test set (x, y): records no silo holds."""
    x, y, order = _split()
    x = _scaled(x, order)
    trust, test = order[:TRUST], order[TRUST: TRUST + TEST]
    t = torch.from_numpy
    return t(x[trust]), t(y[trust]), t(x[test]), t(y[test])


def silo_records(partition: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Hospital ``partition``'s own training records (the poisoned one's labels flipped)."""
    x, y, order = _split()
    x = _scaled(x, order)
    mine = np.array_split(order[TRUST + TEST:], SILOS)[partition]
    labels = 1 - y[mine] if partition == POISONED else y[mine]
    return torch.from_numpy(x[mine]), torch.from_numpy(labels)


def silo_sizes() -> tuple[int, int]:
    """The smallest and largest silo's record count: public bounds for noise-aware Grad-BANT."""
    sizes = [len(silo_records(partition)[1]) for partition in range(SILOS)]
    return min(sizes), max(sizes)
