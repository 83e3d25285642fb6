"""Replace-one L2 sensitivities of the released statistics (no torch: the release plans of
app/algorithms/ use these before any gradient exists)."""

from __future__ import annotations

import math

#: L2 sensitivity of a private evaluation's statistics in normalised units (app/privacy/evaluation.py)
EVAL_SENSITIVITY = math.sqrt(2.0)


def mean_sensitivity(clip: float, batch_size: int) -> float:
    """L2 sensitivity of the mean of ``batch_size`` rows clipped to ``clip`` under
    replace-one adjacency (the paper's Definition 2): 2L / K."""
    return 2.0 * clip / batch_size


def difference_sensitivity(clip: float, diff_clip: float, batch_size: int) -> float:
    """L2 sensitivity of a SPIDER/SVRG difference release on K records: 2C/K when each
    per-record difference is clipped to C = ``diff-clip`` > 0, else 4L/K (the difference of two
    means of rows clipped to L, the paper's branch for unknown smoothness)."""
    return 2.0 * diff_clip / batch_size if diff_clip > 0 else 2.0 * mean_sensitivity(clip, batch_size)
