"""Communication-efficient compressors for Grad-BANT (JL sketches) and their baselines.

One interface (``Sketch``), one factory (``make_sketch``); every random draw comes from a CPU
``torch.Generator`` seeded by ``derive_seed(seed, "sketch", round, layer)``. See ``base.py``.
Base layer: never imports Flower.

The names below are loaded on first access (PEP 562 ``__getattr__``): the compressors import
torch, and ``app.sketch.broadcast`` (the round's ``RoundSketch``, which app.wire and so every
ClientApp process reads) must not pay for torch before a sketch is built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the submodule that defines it
_WHERE = {
    "AdaptiveSketch": "adaptive", "jl_constant": "adaptive", "jl_min_k": "adaptive",
    "SKETCH_KINDS": "base", "WHOLE_VECTOR": "base", "BlockOperator": "base", "Layout": "base",
    "LinearSketch": "base", "PayloadError": "base", "Sketch": "base", "make_sketch": "base",
    "normalize_layout": "base",
    "CountSketch": "countsketch",
    "GaussianSketch": "dense", "RademacherSketch": "dense",
    "FJLTSketch": "fjlt",
    "KroneckerSketch": "kronecker",
    "allocate_energy": "layerwise", "allocate_uniform": "layerwise", "layer_energy": "layerwise",
    "PowerSGDSketch": "powersgd", "PowerSGDState": "powersgd",
    "RandKSketch": "randk",
    "SRFTSketch": "srft", "dht": "srft",
    "SRHTSketch": "srht", "fwht": "srht",
}

__all__ = [
    "SKETCH_KINDS", "WHOLE_VECTOR", "Layout", "PayloadError", "Sketch", "BlockOperator",
    "LinearSketch", "make_sketch", "normalize_layout",
    "GaussianSketch", "RademacherSketch", "SRHTSketch", "SRFTSketch", "FJLTSketch", "CountSketch",
    "RandKSketch", "KroneckerSketch", "AdaptiveSketch", "PowerSGDSketch", "PowerSGDState",
    "allocate_uniform", "allocate_energy", "layer_energy", "jl_min_k", "jl_constant", "fwht", "dht",
]


def __getattr__(name: str) -> Any:
    """``app.sketch.<name>``: imports its submodule (and torch) on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'app.sketch' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"app.sketch.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:  # the names, for type checkers and linters
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
