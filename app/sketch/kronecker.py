"""Kronecker JL for matrix-shaped layers.

A layer of shape ``(r, *rest)`` is viewed as the matrix ``M`` (``r x c``, ``c = prod(rest)``),
whose row-major flattening is the layer's slice of the update. With factors ``A`` (``k1 x r``)
and ``B`` (``k2 x c``),

    S = A (x) B,   S vec_r(M) = vec_r(A M B^T),   S^T vec_r(Y) = vec_r(A^T Y B),

which is the identity ``(A (x) B) vec(X) = vec(B X A^T)`` for the column-major ``vec`` with
``X = M^T``. ``A_ij ~ N(0, 1/k1)``, ``B_ij ~ N(0, 1/k2)`` (or ``+-1/sqrt(k1)``, ``+-1/sqrt(k2)``
with ``dist="rademacher"``), independent, so ``E[S^T S] = E[A^T A] (x) E[B^T B] = I_r (x) I_c = I``.
Memory O(k1 r + k2 c) instead of O(k r c); time O(k1 r c + k1 k2 c).

The per-layer target ``k_l`` (from the allocation) is split as ``k1 = clamp(round(r sqrt(rho)),
1, r)``, ``k2 = clamp(round(k_l / k1), 1, c)`` with ``rho = k_l / (r c)``, so the layer sends
``k1 k2 ~ k_l`` floats; ``k`` reports the actual total. Layers that are not matrices (vectors,
biases, or a dimension of 1) fall back to a dense Gaussian block with ``k_l`` rows.
Always per layer. Draw order per layer: A, then B.
"""

from __future__ import annotations

import math

import torch

from app.sketch.base import BlockOperator, LinearSketch, random_signs
from app.sketch.dense import DenseOperator


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(r, c)`` if a layer of this shape is treated as a matrix, else None."""
    if len(shape) < 2:
        return None
    r, c = shape[0], math.prod(shape[1:])
    return (r, c) if r >= 2 and c >= 2 else None


def split_k(r: int, c: int, k: int) -> tuple[int, int]:
    rho = k / (r * c)
    k1 = min(r, max(1, round(r * math.sqrt(rho))))
    k2 = min(c, max(1, round(k / k1)))
    return k1, k2


class KroneckerOperator(BlockOperator):
    def __init__(self, r: int, c: int, k_target: int, seed63: int, *, dist: str = "gaussian") -> None:
        self.r, self.c = r, c
        self.k1, self.k2 = split_k(r, c, k_target)
        super().__init__(r * c, self.k1 * self.k2, seed63)
        if dist not in ("gaussian", "rademacher"):
            raise ValueError(f"dist must be 'gaussian' or 'rademacher', got {dist!r}")
        self.dist = dist

    def _draw(self, gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
        if self.dist == "gaussian":
            f = torch.randn(rows, cols, generator=gen, dtype=torch.float32)
        else:
            f = random_signs((rows, cols), gen)
        return f.mul_(1.0 / math.sqrt(rows))

    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        a = self._draw(gen, self.k1, self.r)
        b = self._draw(gen, self.k2, self.c)
        return {"A": a, "B": b}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        s = self.structures(x.device, x.dtype)
        return (s["A"] @ x.view(self.r, self.c) @ s["B"].t()).reshape(-1)

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        s = self.structures(y.device, y.dtype)
        return (s["A"].t() @ y.view(self.k1, self.k2) @ s["B"]).reshape(-1)


class KroneckerSketch(LinearSketch):
    """Per-layer ``A (x) B`` for matrix layers, dense Gaussian for the rest (see the module docstring)."""

    kind = "kronecker"
    default_layerwise = True
    allow_global = False

    def __init__(self, layout, *, dist: str = "gaussian", **kw) -> None:
        if dist not in ("gaussian", "rademacher"):
            raise ValueError(f"kronecker dist must be 'gaussian' or 'rademacher', got {dist!r}")
        self.dist = dist
        super().__init__(layout, **kw)

    def _make_operator(self, shape, m, k, seed63):
        rc = matrix_shape(shape)
        if rc is None:
            return DenseOperator(m, k, seed63, dist="gaussian")
        return KroneckerOperator(*rc, k, seed63, dist=self.dist)
