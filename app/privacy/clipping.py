"""Per-sample clipping of whole gradient vectors (not per tensor).

The clipped rows are the input of the Gaussian mechanism, so their bound must hold for *any*
model the server sends: a crafted model can make one record's per-sample gradient overflow to
inf or NaN (e.g. a first-layer weight of 1e37 on a feature only that record has large). Such a
row is replaced by the zero vector, and a finite row whose float32 norm overflows is scaled
with its norm computed without overflow, so every returned row is finite with norm <= L and
the replace-one sensitivity of the mean of K rows stays 2L/K whatever the server sent.
"""

from __future__ import annotations

import torch


def clip_rows(grads: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row g_i of ``grads`` [B, d] to g_i * min(1, L / ||g_i||_2); a row with a NaN
    or inf entry becomes 0 (a zero row has norm 0 <= L, so this is still a valid clipping of
    that record: the mechanism's sensitivity is unchanged, and whether a row was non-finite
    never shows in the output).

    Afterwards every row is finite with norm <= L, so replacing one record changes the sum of
    the rows by at most 2L (replace-one sensitivity). ``clip = inf`` (no privacy) leaves rows
    unchanged. Rows with finite norms are scaled exactly as ``grads * min(1, L / (||g|| + 1e-12))``.
    """
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    if clip == float("inf"):
        return grads
    norms = grads.norm(dim=1, keepdim=True)
    # a finite norm means every entry of its row is finite (a NaN or inf entry makes the sum of
    # squares NaN or inf): only when some norm is not is each entry looked at
    if not bool(torch.isfinite(norms).all()):
        finite_row = torch.isfinite(grads).all(dim=1, keepdim=True)
        if not bool(finite_row.all()):
            grads = torch.where(finite_row, grads, torch.zeros((), dtype=grads.dtype, device=grads.device))
            norms = grads.norm(dim=1, keepdim=True)
    if not bool(torch.isfinite(norms).all()):  # finite entries whose squares overflow: ||g|| = m ||g / m||
        peak = grads.abs().amax(dim=1, keepdim=True)
        safe_norms = peak * (grads / peak.clamp_min(torch.finfo(grads.dtype).tiny)).norm(dim=1, keepdim=True)
        norms = torch.where(torch.isfinite(norms), norms, safe_norms)
    factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
    return grads * factor
