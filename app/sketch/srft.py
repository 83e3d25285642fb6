"""SRFT: subsampled randomised Fourier transform, in its real form.

``S = sqrt(m/k) R F D`` where

* ``D = diag(d)``, ``d_i = +-1`` uniform (random signs);
* ``F`` the normalised discrete Hartley transform, ``F_jl = cas(2 pi j l / m) / sqrt(m)`` with
  ``cas = cos + sin``: the real part minus the imaginary part of the FFT, computed with
  ``torch.fft.fft`` in O(m log m) for any m (no padding). ``F`` is real, symmetric and
  orthonormal (``F^2 = I``), so the payload is real and one float per row;
* ``R`` keeps k of the m coordinates, uniform without replacement.

``E[R^T R] = (k/m) I`` so ``E[S^T S] = (m/k) D F (k/m) F D = I``.
Draw order: signs (randint), then rows (randperm).
"""

from __future__ import annotations

import math

import torch

from app.sketch.base import BlockOperator, LinearSketch, random_signs


def dht(x: torch.Tensor) -> torch.Tensor:
    """Normalised discrete Hartley transform of a real 1-D tensor (orthonormal, self-inverse)."""
    f = torch.fft.fft(x)
    return (f.real - f.imag) * (1.0 / math.sqrt(x.shape[-1]))


class SRFTOperator(BlockOperator):
    def __init__(self, m: int, k: int, seed63: int) -> None:
        super().__init__(m, k, seed63)
        self.scale = math.sqrt(m / k)

    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        signs = random_signs(self.m, gen)
        rows = torch.randperm(self.m, generator=gen)[: self.k]
        return {"signs": signs, "rows": rows}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        s = self.structures(x.device, x.dtype)
        return dht(x * s["signs"])[s["rows"]] * self.scale

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        s = self.structures(y.device, y.dtype)
        z = y.new_zeros(self.m)
        z[s["rows"]] = y * self.scale
        return dht(z) * s["signs"]


class SRFTSketch(LinearSketch):
    """``S = sqrt(m/k) R F D`` with the real (Hartley) Fourier transform (see the module docstring)."""

    kind = "srft"

    def _make_operator(self, shape, m, k, seed63):
        return SRFTOperator(m, k, seed63)
