"""The uplink compressor's options (``sketch.*``), declared once (app/options.py). Here and not in
app/sketch/ because that package imports torch and parsing a config must not."""

from __future__ import annotations

from dataclasses import dataclass

from app.options import boolean, choice, number, option

#: "none" + app.sketch.SKETCH_KINDS (a copy: tests/test_registries.py). PowerSGD keeps per-silo
#: state (warm start, error feedback) across the rounds the silo takes part in.
SKETCH_KINDS = ("none", "gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch", "randk", "kronecker",
                "adaptive", "powersgd")
#: sketch kinds with an exact expected noise energy E||S^T S xi||^2 (app/sketch/noise.py), for gradbant.noise-aware
NOISE_AWARE_SKETCH_KINDS = ("none", "gaussian", "rademacher", "srht", "countsketch", "randk")
#: linear JL maps drawn from the round's broadcast seed, so one S_t for every silo: the kinds under
#: which ``aggregation-space = sketch`` may run a rule on the sketches y_i = S_t x_i (RobAJoL,
#: docs/byzantine.md). Not randk (linear but not JL: it cannot preserve distances between sparse
#: vectors) nor powersgd (not linear, and each silo keeps its own state).
JL_SKETCH_KINDS = ("gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch", "kronecker", "adaptive")
_NO_SKETCH = ("sketch.kind", ("none",))


@dataclass(frozen=True)
class SketchSettings:
    """The silos' compressor (app/sketch/): kind, k/n, the adaptive sketch's JL epsilon, per layer
    or whole-vector, PowerSGD's error feedback."""

    kind: str = option("sketch.kind", choice(SKETCH_KINDS), "none", "the silos' compressor of their updates")
    ratio: float = option("sketch.ratio", number(0, 1, lo_open=True), 0.5, "k/n", inert=_NO_SKETCH)
    epsilon: float = option("sketch.epsilon", number(0, 1, lo_open=True, hi_open=True), 0.3,
                            "adaptive: the target distortion", inert=_NO_SKETCH)
    layerwise: bool = option("sketch.layerwise", boolean, True, "layer-wise (block-diagonal) sketch",
                             inert=_NO_SKETCH)
    error_feedback: bool = option("sketch.error-feedback", boolean, True, "powersgd: keep the error feedback",
                                  inert=_NO_SKETCH)
