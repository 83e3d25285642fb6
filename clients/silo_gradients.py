"""The silo's noisy gradients (clients/silo.py's Silo): per-record rows clipped to the
release's sensitivity, batches and noise keyed to the ledger's sequence number for the release
(never to the round the server sends), the full gradient for evaluation."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from app.algorithms import ReleaseSpec
from app.data.split import fixed_size_batch
from app.models.losses import cross_entropy
from app.privacy.clipping import clip_rows
from app.privacy.mechanism import make_mechanism
from app.privacy.per_sample import batch_loss, per_sample_grads
from app.seeding import np_rng, torch_gen


class SiloGradients:
    """Silo's gradient methods (a mixin of :class:`clients.silo.Silo`)."""

    def _noisy_gradient(self, w: Mapping[str, torch.Tensor], spec: ReleaseSpec, seq: int, step: int,
                        batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], float]:
        """One release (ledger sequence number ``seq``, local step ``step``): clipped mean of K
        per-sample gradients plus N(0, sigma^2 I), on K records drawn without replacement (or on
        the given ``batch``)."""
        x, y = batch if batch is not None else self._batch(spec.batch, seq, step)
        if not self.private:  # no clipping, no noise: the plain minibatch gradient (no per-sample pass)
            return _unflatten(self._mean_gradient(w, x, y), w), batch_loss(self.model, dict(w), x, y)
        rows = clip_rows(per_sample_grads(self.model, dict(w), x, y), self.clip)
        noisy = make_mechanism(self.s.privacy.mode, spec.sigma).release(rows, self._torch_gen(seq, "noise", step))
        return _unflatten(noisy, w), float("nan")

    def _noisy_difference(self, w: Mapping[str, torch.Tensor], w_prev: Mapping[str, torch.Tensor], spec: ReleaseSpec,
                          seq: int) -> tuple[dict[str, torch.Tensor], float]:
        """One SPIDER difference release on one batch of K2 records (see the module docstring)."""
        x, y = self._batch(spec.batch, seq, 0)
        rows = self._difference_rows(w, w_prev, x, y)
        if not self.private:
            return _unflatten(rows.mean(dim=0), w), batch_loss(self.model, dict(w), x, y)
        noisy = make_mechanism(self.s.privacy.mode, spec.sigma).release(rows, self._torch_gen(seq, "noise", 0))
        return _unflatten(noisy, w), float("nan")

    def _difference_rows(self, w: Mapping[str, torch.Tensor], w_prev: Mapping[str, torch.Tensor], x: torch.Tensor,
                         y: torch.Tensor) -> torch.Tensor:
        """Per-record differences on (x, y): clip_C(g(w) - g(w')) with ``diff-clip`` C > 0 (norm <= C),
        else clip_L g(w) - clip_L g(w') (norm <= 2L)."""
        g_now = per_sample_grads(self.model, dict(w), x, y)
        g_prev = per_sample_grads(self.model, dict(w_prev), x, y)
        if self.s.diff_clip > 0 and self.private:
            return clip_rows(g_now - g_prev, self.s.diff_clip)
        return clip_rows(g_now, self.clip) - clip_rows(g_prev, self.clip)

    def _mean_gradient(self, w: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Flat gradient of the mean loss on (x, y) (what the per-sample route averages to)."""
        params = {k: v.detach().requires_grad_(True) for k, v in w.items()}
        loss = cross_entropy(torch.func.functional_call(self.model, params, (x,)), y)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(params.values()))])

    def _full_gradient(self, w: Mapping[str, torch.Tensor], chunk: int = 4096) -> dict[str, np.ndarray]:
        """Gradient of the mean training loss (1/n) sum_x f0(w, x), accumulated in chunks."""
        params = {k: v.detach().clone().requires_grad_(True) for k, v in w.items()}
        total = {k: torch.zeros_like(v) for k, v in params.items()}
        for start in range(0, self.n, chunk):
            x, y = self.train_x[start:start + chunk], self.train_y[start:start + chunk]
            loss = cross_entropy(torch.func.functional_call(self.model, params, (x,)), y) * (len(y) / self.n)
            for k, g in zip(params, torch.autograd.grad(loss, list(params.values())), strict=True):
                total[k] += g
        return {k: v.detach().cpu().numpy() for k, v in total.items()}

    def _batch(self, k: int, seq: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K of the n records, uniformly without replacement."""
        idx = torch.as_tensor(fixed_size_batch(self.n, k, self._np_rng(seq, "batch", step)), device=self.device)
        return self.train_x[idx], self.train_y[idx]

    def _block(self, k: int, rnd: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``rnd`` (1-based) of K records of the silo's secret permutation (Algorithm 6)."""
        perm = np.random.default_rng(self.block_seed).permutation(self.n)
        idx = torch.as_tensor(perm[(rnd - 1) * k: rnd * k], device=self.device)
        return self.train_x[idx], self.train_y[idx]

    def _tensors(self, params: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """``params`` (admitted: this silo's layout, finite) as tensors on the silo's device."""
        return {k: torch.as_tensor(v, device=self.device) for k, v in params.items()}

    def _np_rng(self, seq: int, *parts: Any) -> np.random.Generator:
        """The generator of release ``seq`` (its ledger sequence number) for ``parts``: the OS
        CSPRNG with ``noise-seed="os"``; else derived from (run seed, silo, seq, parts), which
        makes simulations reproducible and lets whoever knows the seed recompute it."""
        if self.s.privacy.noise_seed == "os":
            return np.random.default_rng(secrets.randbits(128))
        return np_rng(self.s.seed, "silo", self.data.index, "release", seq, *parts)

    def _torch_gen(self, seq: int, *parts: Any) -> torch.Generator:
        """Like :meth:`_np_rng`, for torch draws (on the CPU)."""
        if self.s.privacy.noise_seed == "os":
            return torch.Generator().manual_seed(secrets.randbits(63))
        return torch_gen(self.s.seed, "silo", self.data.index, "release", seq, *parts)


def _unflatten(vec: torch.Tensor, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, offset = {}, 0
    for k, v in like.items():
        out[k] = vec[offset: offset + v.numel()].reshape(v.shape)
        offset += v.numel()
    return out
