"""Models used by silofl; none of them uses BatchNorm, so all are DP-compatible."""

from app.models.zoo import MODELS, build_model, flat_params, num_params

__all__ = ["MODELS", "build_model", "flat_params", "num_params"]
