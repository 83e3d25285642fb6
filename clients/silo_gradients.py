"""The silo's gradients on its own records: per-record rows clipped to a release's sensitivity,
the batches and blocks they are computed on, and the full gradient an open evaluation returns.

Every draw is keyed to the ledger's sequence number for the release (never to the round the
server sends), so a release's randomness never repeats (:class:`ReleaseDraws`). The noise is
not added here: a mechanism (clients/silo_mechanism.py, clients/silo_shuffle.py) adds it to
the rows these give.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from app.data.federated import SiloData
from app.data.split import fixed_size_batch
from app.models.losses import cross_entropy
from app.privacy.clipping import clip_rows
from app.privacy.per_sample import batch_loss
from app.privacy.row_batcher import per_sample_rows
from app.seeding import np_rng, torch_gen


@dataclass(frozen=True)
class ReleaseDraws:
    """The generators of one silo's releases: the OS CSPRNG when ``os_entropy`` (node config
    ``noise-seed="os"``); else derived from (run ``seed``, silo ``index``, "release", seq, parts),
    which makes simulations reproducible and lets whoever knows the seed recompute them."""

    seed: int
    index: int
    os_entropy: bool

    def np_rng(self, seq: int, *parts: Any) -> np.random.Generator:
        """The numpy generator of release ``seq`` (its ledger sequence number) for ``parts``."""
        if self.os_entropy:
            return np.random.default_rng(secrets.randbits(128))
        return np_rng(self.seed, "silo", self.index, "release", seq, *parts)

    def torch_gen(self, seq: int, *parts: Any) -> torch.Generator:
        """Like :meth:`np_rng`, for torch draws (on the CPU)."""
        if self.os_entropy:
            return torch.Generator().manual_seed(secrets.randbits(63))
        return torch_gen(self.seed, "silo", self.index, "release", seq, *parts)


def on_device(data: SiloData, device: torch.device) -> SiloData:
    """``data``'s records moved to ``device`` (the silo computes on these)."""
    return replace(data, train_x=data.train_x.to(device), train_y=data.train_y.to(device),
                   test_x=data.test_x.to(device), test_y=data.test_y.to(device),
                   val_x=None if data.val_x is None else data.val_x.to(device),
                   val_y=None if data.val_y is None else data.val_y.to(device))


def as_tensors(params: Mapping[str, np.ndarray], device: torch.device) -> dict[str, torch.Tensor]:
    """``params`` (admitted: the silo's layout, finite) as tensors on ``device``."""
    return {k: torch.as_tensor(v, device=device) for k, v in params.items()}


def unflatten(vec: torch.Tensor, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The flat ``vec`` cut into ``like``'s names and shapes."""
    out, offset = {}, 0
    for k, v in like.items():
        out[k] = vec[offset: offset + v.numel()].reshape(v.shape)
        offset += v.numel()
    return out


class RecordGradients:
    """Per-record gradients of ``model`` on the training records of ``records`` (on ``device``);
    in a batched simulation, computed with the other silos' in one call (app/privacy/row_batcher.py).

    ``clip``: L, each record's gradient is clipped to norm L (inf: no privacy); ``diff_clip``: C,
    with C > 0 and ``private`` a SPIDER difference row is clip_C(g(w) - g(w')) instead of
    clip_L g(w) - clip_L g(w'); ``block_seed``: the seed of the silo's secret permutation into
    disjoint blocks (Algorithm 6, drawn at calibration); ``draws``: the batches' generators."""

    def __init__(self, model: torch.nn.Module, records: SiloData, device: torch.device, clip: float,
                 diff_clip: float, private: bool, block_seed: int, draws: ReleaseDraws) -> None:
        self.model = model
        self.train_x, self.train_y = records.train_x, records.train_y
        self.n = records.n
        self.device = device
        self.clip = clip
        self.diff_clip = diff_clip
        self.private = private
        self.block_seed = block_seed
        self.draws = draws

    def clipped_rows(self, w: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """clip_L grad f0(w, x_i) for every record of (x, y), one row each [K, d]."""
        return clip_rows(per_sample_rows(self.model, dict(w), x, y), self.clip)

    def difference_rows(self, w: Mapping[str, torch.Tensor], w_prev: Mapping[str, torch.Tensor], x: torch.Tensor,
                        y: torch.Tensor) -> torch.Tensor:
        """Per-record differences on (x, y): clip_C(g(w) - g(w')) with ``diff-clip`` C > 0 (norm <= C),
        else clip_L g(w) - clip_L g(w') (norm <= 2L)."""
        g_now = per_sample_rows(self.model, dict(w), x, y)
        g_prev = per_sample_rows(self.model, dict(w_prev), x, y)
        if self.diff_clip > 0 and self.private:
            return clip_rows(g_now - g_prev, self.diff_clip)
        return clip_rows(g_now, self.clip) - clip_rows(g_prev, self.clip)

    def mean_gradient(self, w: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Flat gradient of the mean loss on (x, y) (what the per-sample route averages to)."""
        params = {k: v.detach().requires_grad_(True) for k, v in w.items()}
        loss = cross_entropy(torch.func.functional_call(self.model, params, (x,)), y)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(params.values()))])

    def loss(self, w: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> float:
        """The mean loss of ``w`` on (x, y)."""
        return batch_loss(self.model, dict(w), x, y)

    def full_gradient(self, w: Mapping[str, torch.Tensor], chunk: int = 4096) -> dict[str, np.ndarray]:
        """Gradient of the mean training loss (1/n) sum_x f0(w, x), accumulated in chunks."""
        params = {k: v.detach().clone().requires_grad_(True) for k, v in w.items()}
        total = {k: torch.zeros_like(v) for k, v in params.items()}
        for start in range(0, self.n, chunk):
            x, y = self.train_x[start:start + chunk], self.train_y[start:start + chunk]
            loss = cross_entropy(torch.func.functional_call(self.model, params, (x,)), y) * (len(y) / self.n)
            for k, g in zip(params, torch.autograd.grad(loss, list(params.values())), strict=True):
                total[k] += g
        return {k: v.detach().cpu().numpy() for k, v in total.items()}

    def batch(self, k: int, seq: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K of the n records, uniformly without replacement (release ``seq``, local step ``step``)."""
        idx = torch.as_tensor(fixed_size_batch(self.n, k, self.draws.np_rng(seq, "batch", step)), device=self.device)
        return self.train_x[idx], self.train_y[idx]

    def block(self, k: int, rnd: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``rnd`` (1-based) of K records of the silo's secret permutation (Algorithm 6)."""
        perm = np.random.default_rng(self.block_seed).permutation(self.n)
        idx = torch.as_tensor(perm[(rnd - 1) * k: rnd * k], device=self.device)
        return self.train_x[idx], self.train_y[idx]
