"""Communication-efficient compressors for Grad-BANT (JL sketches) and their baselines.

One interface (``Sketch``), one factory (``make_sketch``); every random draw comes from a CPU
``torch.Generator`` seeded by ``derive_seed(seed, "sketch", round, layer)``. See ``base.py``.
Base layer: never imports Flower.
"""

from app.sketch.adaptive import AdaptiveSketch, jl_constant, jl_min_k
from app.sketch.base import (
    SKETCH_KINDS, WHOLE_VECTOR, BlockOperator, Layout, LinearSketch, PayloadError, Sketch,
    make_sketch, normalize_layout,
)
from app.sketch.countsketch import CountSketch
from app.sketch.dense import GaussianSketch, RademacherSketch
from app.sketch.fjlt import FJLTSketch
from app.sketch.kronecker import KroneckerSketch
from app.sketch.layerwise import allocate_energy, allocate_uniform, layer_energy
from app.sketch.powersgd import PowerSGDSketch, PowerSGDState
from app.sketch.randk import RandKSketch
from app.sketch.srft import SRFTSketch, dht
from app.sketch.srht import SRHTSketch, fwht

__all__ = [
    "SKETCH_KINDS", "WHOLE_VECTOR", "Layout", "PayloadError", "Sketch", "BlockOperator",
    "LinearSketch", "make_sketch", "normalize_layout",
    "GaussianSketch", "RademacherSketch", "SRHTSketch", "SRFTSketch", "FJLTSketch", "CountSketch",
    "RandKSketch", "KroneckerSketch", "AdaptiveSketch", "PowerSGDSketch", "PowerSGDState",
    "allocate_uniform", "allocate_energy", "layer_energy", "jl_min_k", "jl_constant", "fwht", "dht",
]
