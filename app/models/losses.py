"""The training loss f0 of every model: the mean cross-entropy."""

from __future__ import annotations

import torch
from torch import nn


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; for one record (batch of 1) it is that record's loss."""
    return nn.functional.cross_entropy(logits, target)
