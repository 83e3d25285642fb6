"""Adaptive JL: k chosen from a target distortion epsilon (and failure probability delta).

For a dense Gaussian ``S`` (``N(0, 1/k)`` entries) and any fixed x, ``||Sx||^2 / ||x||^2`` is
``chi^2_k / k``, and the Chernoff bounds of Dasgupta and Gupta (2003, "An elementary proof of a
theorem of Johnson and Lindenstrauss", Lemma 2.2 with ``ln(1 + eps) <= eps - eps^2/2 + eps^3/3``
as in the proof of their Theorem 2.1) give

    Pr[ | ||Sx||^2 - ||x||^2 | > eps ||x||^2 ] <= 2 exp(-(k/2) (eps^2/2 - eps^3/3)),

and Achlioptas (2003, "Database-friendly random projections", Theorem 1.1 and its proof) gives
the same bound for Rademacher ``+-1/sqrt(k)`` entries. Setting the right side to delta:

    k >= C eps^-2 log(2/delta),   C = C(eps) = 4 / (1 - 2 eps / 3),

so C is 4 as eps -> 0 and at most 12 for eps < 1 (we use the exact C(eps), not a rounded
constant, so that the guarantee is the cited bound and no more conservative). By polarisation,
unit u, v then satisfy ``|<Su, Sv> - <u, v>| <= eps`` with probability >= 1 - 2 delta.

Per layer (default): ``k_l = min(n_l, k_JL(eps, delta))``; a layer with ``n_l <= k_JL`` is sent
as is (identity block: zero distortion, no more floats than a sketch). ``layerwise=False`` applies
the same rule to the whole vector. ``chosen_ratio`` = k/n, ``k_per_layer`` and ``constant`` report
the choice. ``base`` = "gaussian" (default) or "rademacher", the two kinds the bound covers.
"""

from __future__ import annotations

import math

from app.sketch.base import IdentityOperator, LinearSketch
from app.sketch.dense import DenseOperator


def jl_constant(epsilon: float) -> float:
    """C(eps) = 4 / (1 - 2 eps / 3) of the Dasgupta-Gupta bound."""
    return 4.0 / (1.0 - 2.0 * epsilon / 3.0)


def jl_min_k(epsilon: float, delta: float) -> int:
    """The smallest k with ``2 exp(-(k/2)(eps^2/2 - eps^3/3)) <= delta``."""
    epsilon, delta = float(epsilon), float(delta)
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"epsilon (target distortion) must be in (0, 1), got {epsilon}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta (failure probability) must be in (0, 1), got {delta}")
    return math.ceil(jl_constant(epsilon) * math.log(2.0 / delta) / epsilon**2 - 1e-9)


class AdaptiveSketch(LinearSketch):
    """k per layer from a target distortion (see the module docstring)."""

    kind = "adaptive"
    default_layerwise = True

    def __init__(self, layout, *, epsilon: float, delta: float = 0.05, base: str = "gaussian",
                 seed: int, round: int, device=None, layerwise: bool = True,
                 ratio: float | None = None, k=None) -> None:
        if ratio is not None or k is not None:
            raise ValueError("kind='adaptive' chooses k from epsilon; do not give ratio or k")
        if base not in ("gaussian", "rademacher"):
            raise ValueError(f"adaptive base must be 'gaussian' or 'rademacher', got {base!r}")
        self.epsilon, self.delta, self.base = float(epsilon), float(delta), base
        self.k_jl = jl_min_k(epsilon, delta)
        self.constant = jl_constant(self.epsilon)
        super().__init__(layout, k=1, seed=seed, round=round, device=device, layerwise=layerwise)

    def _resolve_k(self, ratio, k, allocation, energy, min_k):
        sizes = self.layer_sizes if self.layerwise else [self.n]
        return [min(m, self.k_jl) for m in sizes]

    def _make_operator(self, shape, m, k, seed63):
        if k >= m:
            return IdentityOperator(m, seed63)
        return DenseOperator(m, k, seed63, dist=self.base)

    @property
    def k_per_layer(self) -> list[int]:
        return self.k_per_block

    @property
    def chosen_ratio(self) -> float:
        return self.k / self.n
