"""SRHT: subsampled randomised Hadamard transform.

``S = sqrt(m'/k) R H D P`` where

* ``P`` zero-pads the block (m entries) to ``m' = 2^ceil(log2 m)`` (padding, not chunking: one
  transform per block, at most 2x memory);
* ``D = diag(d)``, ``d_i = +-1`` uniform (drawn for the m real entries; the padding is zero);
* ``H`` the normalised Walsh-Hadamard transform (Sylvester order, ``H = H^T = H^-1``), computed
  by ``fwht`` in torch in O(m' log m');
* ``R`` keeps k of the m' coordinates, uniform without replacement.

``E[R^T R] = (k/m') I`` so ``E[S^T S] = (m'/k) P^T D H (k/m') H D P = P^T P = I_m``.
Draw order: signs (randint), then rows (randperm).
"""

from __future__ import annotations

import math

import torch

from app.sketch.base import BlockOperator, LinearSketch, random_signs


def next_pow2(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Normalised fast Walsh-Hadamard transform along the last dimension (a power of two).

    Orthonormal and symmetric (so its own inverse); equals ``scipy.linalg.hadamard(m) / sqrt(m)``.
    O(m log m) time, a few copies of x in memory."""
    m = x.shape[-1]
    if m < 1 or m & (m - 1):
        raise ValueError(f"fwht needs a power-of-two length, got {m}")
    lead = x.shape[:-1]
    y = x.reshape(-1, m)
    h = 1
    while h < m:
        y = y.view(y.shape[0], m // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(*lead, m) * (1.0 / math.sqrt(m))


class SRHTOperator(BlockOperator):
    def __init__(self, m: int, k: int, seed63: int) -> None:
        super().__init__(m, k, seed63)
        self.m_pad = next_pow2(m)
        self.scale = math.sqrt(self.m_pad / k)

    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        signs = random_signs(self.m, gen)
        rows = torch.randperm(self.m_pad, generator=gen)[: self.k]
        return {"signs": signs, "rows": rows}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        s = self.structures(x.device, x.dtype)
        z = x.new_zeros(self.m_pad)
        z[: self.m] = x * s["signs"]
        return fwht(z)[s["rows"]] * self.scale

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        s = self.structures(y.device, y.dtype)
        z = y.new_zeros(self.m_pad)
        z[s["rows"]] = y * self.scale
        return fwht(z)[: self.m] * s["signs"]


class SRHTSketch(LinearSketch):
    """``S = sqrt(m'/k) R H D`` per block (see the module docstring)."""

    kind = "srht"

    def _make_operator(self, shape, m, k, seed63):
        return SRHTOperator(m, k, seed63)
