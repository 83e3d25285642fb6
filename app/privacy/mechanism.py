"""The Gaussian mechanism: add N(0, sigma^2 I) drawn from an explicit generator."""

from __future__ import annotations

import torch


def add_gaussian_noise(vec: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Return vec + N(0, sigma^2 I). The noise is drawn on the generator's device (CPU)
    and moved to ``vec``'s device, so the draw is identical on any hardware."""
    if not 0 <= sigma < float("inf"):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if sigma == 0:
        return vec
    noise = torch.randn(vec.shape, generator=generator, dtype=vec.dtype, device=generator.device)
    return vec + sigma * noise.to(vec.device)
