"""Dense JL sketches: Gaussian and Rademacher.

* ``gaussian``:   ``S_ij ~ N(0, 1/k)`` i.i.d.
* ``rademacher``: ``S_ij = +-1/sqrt(k)`` with probability 1/2 each, i.i.d.

Both have ``E[S^T S] = I`` and, for any x,
``E||S^T S x||^2 = (n + k + 1)/k ||x||^2`` (Gaussian; E g^4 = 3) and
``(n + k - 1)/k ||x||^2`` (Rademacher; the diagonal of ``G^T G`` is exactly k).

The ``k x m`` block is never materialised: it is generated in row blocks of
``rows_per_block = clamp(2**22 // m, 1, k)`` rows (at most ~4M floats, 16 MB, at a time) from the
block's CPU generator, always in the same order; ``compress`` computes ``y[rows] = S_rows x`` and
``decompress`` accumulates ``S_rows^T y[rows]``, regenerating identical rows. ``rows_per_block``
depends on (m, k) only, so it is part of the definition of S: memory O(rows_per_block * m),
time O(k m) per call, nothing cached (``state_bytes = 0``).
"""

from __future__ import annotations

import math

import torch

from app.sketch.base import BlockOperator, LinearSketch

BLOCK_ELEMS = 1 << 22


class DenseOperator(BlockOperator):
    """A dense ``k x m`` Gaussian or Rademacher block, regenerated row block by row block."""

    def __init__(self, m: int, k: int, seed63: int, *, dist: str = "gaussian") -> None:
        super().__init__(m, k, seed63)
        if dist not in ("gaussian", "rademacher"):
            raise ValueError(f"dist must be 'gaussian' or 'rademacher', got {dist!r}")
        self.dist = dist
        self.rows_per_block = max(1, min(k, BLOCK_ELEMS // m))

    def row_blocks(self, device: torch.device, dtype: torch.dtype):
        """Yield ``(r0, r1, S[r0:r1])`` (scaled, on ``device``) in a fixed order."""
        gen = self.generator()
        scale = 1.0 / math.sqrt(self.k)
        for r0 in range(0, self.k, self.rows_per_block):
            r1 = min(self.k, r0 + self.rows_per_block)
            if self.dist == "gaussian":
                blk = torch.randn(r1 - r0, self.m, generator=gen, dtype=torch.float32)
            else:
                blk = torch.randint(0, 2, (r1 - r0, self.m), generator=gen, dtype=torch.float32)
                blk.mul_(2.0).sub_(1.0)
            yield r0, r1, blk.to(device=device, dtype=dtype).mul_(scale)

    def matrix(self, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole block (for tests and small cases only)."""
        return torch.cat([b for *_, b in self.row_blocks(torch.device(device), dtype)])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        y = x.new_empty(self.k)
        for r0, r1, blk in self.row_blocks(x.device, x.dtype):
            torch.mv(blk, x, out=y[r0:r1])
        return y

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        x = y.new_zeros(self.m)
        for r0, r1, blk in self.row_blocks(y.device, y.dtype):
            x.addmv_(blk.t(), y[r0:r1])
        return x


class GaussianSketch(LinearSketch):
    """Dense Gaussian JL sketch, ``S_ij ~ N(0, 1/k)`` (see the module docstring)."""

    kind = "gaussian"

    def _make_operator(self, shape, m, k, seed63):
        return DenseOperator(m, k, seed63, dist="gaussian")


class RademacherSketch(LinearSketch):
    """Dense Rademacher JL sketch, ``S_ij = +-1/sqrt(k)`` (see the module docstring)."""

    kind = "rademacher"

    def _make_operator(self, shape, m, k, seed63):
        return DenseOperator(m, k, seed63, dist="rademacher")
