"""How much noise survives a sketch and its lift: E||S^T S xi||^2 for xi ~ N(0, I_n), and for
any zero-mean xi independent of S.

For xi ~ N(0, I_n) independent of S, E_xi ||S^T S xi||^2 = ||S^T S||_F^2, so the factor is
E_S ||S^T S||_F^2 (n without a sketch). S is block diagonal (one block per layer, or one for the
whole vector) and the blocks are independent, so the factor is the sum over the blocks of m
entries and k rows:

* identity block (k = m): m;
* ``gaussian`` (S_ij ~ N(0, 1/k)): m (m + k + 1) / k  (E tr((G G^T)^2) = k m (k + m + 1));
* ``rademacher`` (S_ij = +-1/sqrt(k)): m (m + k - 1) / k;
* ``countsketch`` (one +-1 per column, uniform bucket): m (m + k - 1) / k too ((S^T S)_jl =
  s_j s_l [h(j) = h(l)]: row j of (S^T S)^2 sums 1 + #{l != j in j's bucket}, of mean 1 + (m - 1)/k);
* ``randk`` (sqrt(m/k) times k of the m coordinates): m^2 / k ((S^T S)^2 = (m/k)^2 diag(kept));
* ``srht`` per chunk of s real entries padded to p with r rows (S = sqrt(p/r) R H D, R r of
  the p rows without replacement): s + s (s - 1) (p - r) / (r (p - 1)); with s = p this is s^2/r.
  (The diagonal of H R^T R H is r/p; an off-diagonal entry is (1/p) times the sum of r of the p
  signs of a +-1 column with sum 0, whose variance is r (p - r) / (p - 1).)

For every kind here E_S[(S^T S)^2] is diagonal with a constant value kappa = factor / m on each
block (SRHT: on each chunk, kappa = chunk factor / s): its off-diagonal entries carry a random sign
of D (SRHT), of a row (Gaussian, Rademacher) or of a column (CountSketch) that has mean 0
(RandK's S^T S is diagonal), and the rows of a block (chunk) are
exchangeable. Hence for any zero-mean noise xi independent of S with per-coordinate variances v_j
(correlated or not: only the diagonal of its covariance enters),

    E||S^T S xi||^2 = tr(E[(S^T S)^2] Cov xi) = sum_j kappa_j v_j       (:func:`lift_noise_weights`),

which is what noise-aware Grad-BANT needs for a minibatch's sampling noise (not isotropic).

Only these kinds have an exact factor here (``exact_kinds``); any other raises. Base layer: no Flower.
"""

from __future__ import annotations

import numpy as np

from app.sketch_settings import NOISE_AWARE_SKETCH_KINDS as EXACT_KINDS  # the kinds with an exact factor (+ "none")
from app.sketch.base import IdentityOperator, LinearSketch, Sketch


def srht_chunk_factor(size: int, padded: int, rows: int) -> float:
    """E||S^T S||_F^2 of one SRHT chunk (see the module docstring)."""
    if padded == 1:
        return float(size)  # a 1 x 1 chunk: S = +-1
    return size + size * (size - 1) * (padded - rows) / (rows * (padded - 1))


def _pieces(sketch: Sketch) -> list[tuple[int, list[tuple[int, int, float]]]]:
    """Per block of ``sketch``: its offset and its pieces (start within the block, size, and
    E||S^T S||_F^2 of the piece): the whole block, or each SRHT chunk (the module docstring)."""
    if sketch.kind not in EXACT_KINDS or not isinstance(sketch, LinearSketch):
        raise NotImplementedError(f"no exact noise factor for sketch kind {sketch.kind!r}; exact for {EXACT_KINDS}")
    from app.sketch.srht import SRHTOperator

    out = []
    for off, m, _, op in sketch.blocks:
        k = op.k
        if isinstance(op, IdentityOperator):
            pieces = [(0, m, float(m))]
        elif isinstance(op, SRHTOperator):
            pieces = [(start, size, srht_chunk_factor(size, padded, rows)) for start, size, padded, rows in op.chunks]
        elif sketch.kind == "gaussian":
            pieces = [(0, m, m * (m + k + 1) / k)]
        elif sketch.kind in ("rademacher", "countsketch"):
            pieces = [(0, m, m * (m + k - 1) / k)]
        elif sketch.kind == "randk":
            pieces = [(0, m, m * m / k)]
        else:  # pragma: no cover - guarded by EXACT_KINDS
            raise NotImplementedError(type(op).__name__)
        out.append((off, pieces))
    return out


def lift_noise_factor(sketch: Sketch | None, n: int | None = None) -> float:
    """E||S^T S xi||^2 / sigma^2 for xi ~ N(0, sigma^2 I_n): n without a sketch (give ``n``)."""
    if sketch is None:
        if n is None:
            raise ValueError("without a sketch the factor is n: give n")
        return float(n)
    total = 0.0
    for _, pieces in _pieces(sketch):
        total += sum(factor for *_, factor in pieces)
    return float(total)


def lift_noise_weights(sketch: Sketch | None, n: int) -> np.ndarray:
    """kappa [n]: the diagonal of E_S[(S^T S)^2] (see the module docstring), so that
    E||S^T S xi||^2 = kappa . Var(xi) for zero-mean xi independent of S; all ones without a
    sketch. ``kappa.sum()`` equals :func:`lift_noise_factor`: each piece's factor spread evenly
    over its entries."""
    if sketch is None:
        return np.ones(n)
    kappa = np.empty(n)
    for off, pieces in _pieces(sketch):
        for start, size, factor in pieces:
            kappa[off + start:off + start + size] = factor / size
    return kappa
