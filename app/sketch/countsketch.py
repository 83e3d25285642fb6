"""CountSketch (Charikar, Chen and Farach-Colton 2002; Clarkson and Woodruff 2013).

``S`` is ``k x m`` with one nonzero per column: ``S[h(j), j] = s_j``, where ``h: [m] -> [k]``
(uniform hash buckets) and ``s_j = +-1`` (uniform signs) are independent. No scaling is needed:
``(S^T S)_jj = 1`` and ``(S^T S)_jl = s_j s_l [h(j) = h(l)]`` has mean 0 for ``j != l``, so
``E[S^T S] = I``; ``Var <Su, Sv> <= 2/k ||u||^2 ||v||^2``. O(m) time and memory.
Draw order: buckets (randint), then signs (randint).
"""

from __future__ import annotations

import torch

from app.sketch.base import BlockOperator, LinearSketch, random_signs


class CountSketchOperator(BlockOperator):
    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        buckets = torch.randint(0, self.k, (self.m,), generator=gen)
        signs = random_signs(self.m, gen)
        return {"buckets": buckets, "signs": signs}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        s = self.structures(x.device, x.dtype)
        return x.new_zeros(self.k).index_add_(0, s["buckets"], x * s["signs"])

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        s = self.structures(y.device, y.dtype)
        return y[s["buckets"]] * s["signs"]


class CountSketch(LinearSketch):
    """CountSketch: hashed buckets with random signs (see the module docstring)."""

    kind = "countsketch"

    def _make_operator(self, shape, m, k, seed63):
        return CountSketchOperator(m, k, seed63)
