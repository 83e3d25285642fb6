"""Private evaluation statistics: one Gaussian mechanism over a silo's error counts and loss sums.

With node config ``evaluation="private"`` a silo answers an evaluation request with

    test-errors + N(0, s^2),  val-errors + N(0, s^2),
    test-loss-sum + N(0, (s B)^2),  train-loss-sum + N(0, (s B)^2),   s = z * sqrt(2),

where each record's loss is clipped to [0, B] (B = ``EVAL_LOSS_BOUND``) before summing. The split
sizes are public (replace-one adjacency keeps them). Replacing one record changes only the
statistics of its own split: a test record moves (test-errors, test-loss-sum) by at most (1, B),
a validation record val-errors by 1, a training record train-loss-sum by B. In units where each
loss sum is divided by B, the release moves by at most sqrt(2) in L2 norm, so with s = z sqrt(2)
it is a Gaussian mechanism with noise multiplier z, accounted like any unsampled release.
Afterwards each value is clamped to its possible range (post-processing).
"""

from __future__ import annotations

import math

import torch

from app.privacy.sensitivity import EVAL_SENSITIVITY

#: per-record loss bound B (nats); cross-entropy above it counts as B
EVAL_LOSS_BOUND = 5.0


def noisy_statistics(stats: dict[str, float], counts: dict[str, float], noise_multiplier: float,
                     generator: torch.Generator) -> dict[str, float]:
    """Add the mechanism's noise to ``stats`` (keys ``*_errors`` and ``*_loss_sum``, the loss sums
    already of losses clipped to B) and clamp each to [0, count] or [0, count * B]; ``counts``
    maps each statistic to its split size."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"private evaluation needs a finite noise multiplier > 0, got {noise_multiplier}")
    sigma = noise_multiplier * EVAL_SENSITIVITY
    keys = sorted(stats)
    draws = torch.randn(len(keys), generator=generator, dtype=torch.float64).tolist()
    out = {}
    for key, xi in zip(keys, draws, strict=True):
        scale = EVAL_LOSS_BOUND if key.endswith("_loss_sum") else 1.0
        value = stats[key] + sigma * scale * xi
        out[key] = min(max(value, 0.0), counts[key] * scale)
    return out


def clipped_loss_sum(per_record_loss: torch.Tensor) -> float:
    """sum_i min(max(loss_i, 0), B), with a non-finite loss counted as B."""
    loss = torch.nan_to_num(per_record_loss.double(), nan=EVAL_LOSS_BOUND, posinf=EVAL_LOSS_BOUND, neginf=0.0)
    return float(loss.clamp(0.0, EVAL_LOSS_BOUND).sum())
