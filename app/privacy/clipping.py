"""Per-sample clipping of whole gradient vectors (not per tensor)."""

from __future__ import annotations

import torch


def clip_rows(grads: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row g_i of ``grads`` [B, d] to g_i * min(1, L / ||g_i||_2).

    Afterwards every row has norm <= L, so replacing one record changes the sum of the
    rows by at most 2L (replace-one sensitivity). ``clip = inf`` leaves rows unchanged.
    """
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    if clip == float("inf"):
        return grads
    norms = grads.norm(dim=1, keepdim=True)
    factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
    return grads * factor


def mean_sensitivity(clip: float, batch_size: int) -> float:
    """L2 sensitivity of the mean of ``batch_size`` rows clipped to ``clip`` under
    replace-one adjacency (the paper's Definition 2): 2L / K."""
    return 2.0 * clip / batch_size
