"""RandK: the sparsification baseline.

``S = sqrt(m/k) R`` with ``R`` keeping k of the m coordinates, uniform without replacement.
The payload is ``S x = sqrt(m/k) x[idx]`` and the lift ``S^T S x`` is the m/k-scaled sparse
vector (``x_j m/k`` on the kept coordinates, 0 elsewhere), unbiased since each coordinate is
kept with probability k/m. Unlike a JL map it does not preserve inner products of sparse
vectors: for ``u = v = e_1``, ``<Su, Sv>`` is 0 or m/k, never 1 when k < m.
Draw: one randperm.
"""

from __future__ import annotations

import math

import torch

from app.sketch.base import BlockOperator, LinearSketch


class RandKOperator(BlockOperator):
    def __init__(self, m: int, k: int, seed63: int) -> None:
        super().__init__(m, k, seed63)
        self.scale = math.sqrt(m / k)

    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"idx": torch.randperm(self.m, generator=gen)[: self.k]}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.structures(x.device, x.dtype)["idx"]] * self.scale

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        z = y.new_zeros(self.m)
        z[self.structures(y.device, y.dtype)["idx"]] = y * self.scale
        return z


class RandKSketch(LinearSketch):
    """RandK with the unbiased m/k scaling (see the module docstring)."""

    kind = "randk"

    def _make_operator(self, shape, m, k, seed63):
        return RandKOperator(m, k, seed63)
