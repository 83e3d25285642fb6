"""FJLT: the fast Johnson-Lindenstrauss transform of Ailon and Chazelle (2009).

``S = P H D`` (on the block zero-padded to ``m' = 2^ceil(log2 m)``, as in ``srht``) where ``D``
are random signs, ``H`` the normalised Walsh-Hadamard transform, and ``P`` a sparse ``k x m'``
Gaussian core: ``P_ij = b_ij g_ij / sqrt(k q)`` with ``b_ij ~ Bernoulli(q)`` and
``g_ij ~ N(0, 1)``, all independent. Then ``E[P_ij^2] = 1/k``, ``E[P^T P] = I`` and
``E[S^T S] = D H I H D = I``.

``q`` (sparsity, the expected share of nonzeros) is a parameter; the default
``q = min(1, log2(m')^2 / m')`` follows Ailon-Chazelle's ``q = Theta(log^2 n / d)``.
``P`` is drawn in O(nnz) (never densely): the gaps between consecutive nonzeros of the row-major
``b`` are i.i.d. Geometric(q), drawn as ``floor(log U / log(1 - q)) + 1`` in float64 chunks of a
size fixed by (k, m', q); then the nnz Gaussian values. Memory O(q k m'), time O(m' log m' + nnz).
Draw order: signs, gap chunks, values.
"""

from __future__ import annotations

import math

import torch

from app.sketch.base import BlockOperator, LinearSketch, random_signs
from app.sketch.srht import fwht, next_pow2


def default_q(m_pad: int) -> float:
    return min(1.0, math.log2(max(m_pad, 2)) ** 2 / m_pad)


class FJLTOperator(BlockOperator):
    def __init__(self, m: int, k: int, seed63: int, *, q: float | None = None) -> None:
        super().__init__(m, k, seed63)
        self.m_pad = next_pow2(m)
        self.q = default_q(self.m_pad) if q is None else float(q)
        if not 0.0 < self.q <= 1.0:
            raise ValueError(f"fjlt sparsity q must be in (0, 1], got {q}")

    def _positions(self, gen: torch.Generator) -> torch.Tensor:
        total = self.k * self.m_pad
        if self.q >= 1.0:
            return torch.arange(total, dtype=torch.int64)
        log1mq = math.log1p(-self.q)
        chunk = max(1024, int(1.1 * self.q * total) + 64)
        parts, start = [], -1  # the last position drawn so far
        while start < total - 1:
            u = 1.0 - torch.rand(chunk, generator=gen, dtype=torch.float64)  # in (0, 1]
            gaps = torch.floor(torch.log(u) / log1mq) + 1.0
            pos = start + torch.cumsum(gaps, 0)
            start = int(pos[-1].item())
            parts.append(pos[pos < total].to(torch.int64))
        return torch.cat(parts)

    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        signs = random_signs(self.m, gen)
        pos = self._positions(gen)
        vals = torch.randn(pos.numel(), generator=gen, dtype=torch.float32)
        vals.mul_(1.0 / math.sqrt(self.k * self.q))
        return {"signs": signs, "rows": pos // self.m_pad, "cols": pos % self.m_pad, "vals": vals}

    @property
    def nnz(self) -> int:
        return int(self._build(self.generator())["vals"].numel())

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        s = self.structures(x.device, x.dtype)
        z = x.new_zeros(self.m_pad)
        z[: self.m] = x * s["signs"]
        z = fwht(z)
        return x.new_zeros(self.k).index_add_(0, s["rows"], s["vals"] * z[s["cols"]])

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        s = self.structures(y.device, y.dtype)
        z = y.new_zeros(self.m_pad).index_add_(0, s["cols"], s["vals"] * y[s["rows"]])
        return fwht(z)[: self.m] * s["signs"]


class FJLTSketch(LinearSketch):
    """``S = P H D`` with a sparse Gaussian core ``P`` of density ``q`` (see the module docstring)."""

    kind = "fjlt"

    def __init__(self, layout, *, q: float | None = None, **kw) -> None:
        if q is not None and not 0.0 < float(q) <= 1.0:
            raise ValueError(f"fjlt sparsity q must be in (0, 1], got {q}")
        self.q = q  # None: default_q(m') per block
        super().__init__(layout, **kw)

    def _make_operator(self, shape, m, k, seed63):
        return FJLTOperator(m, k, seed63, q=self.q)
