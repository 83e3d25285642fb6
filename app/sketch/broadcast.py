"""The per-round sketch that the server broadcasts and silos apply (DESIGN.md section 3).

The server puts the sketch's kind, ratio and ``sketch-seed = H(run seed, round)`` in each round's
config; a silo builds S from it, compresses its already-noised update (post-processing: the sketch
cannot weaken privacy), and the server rebuilds the same S to lift the payload back to R^n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.seeding import derive_seed
from app.sketch.base import Sketch, make_sketch
from app.sketch.powersgd import PowerSGDState

#: Kinds that are always per layer (block-diagonal S).
PER_LAYER_ONLY = ("kronecker",)


def sketch_round_config(kind: str, ratio: float, epsilon: float, layerwise: bool, run_seed: int,
                        server_round: int, error_feedback: bool = True) -> dict[str, Any]:
    """The round-config entries that describe this round's sketch ({} without a sketch)."""
    if kind == "none":
        return {}
    cfg = {"sketch-kind": kind, "sketch-ratio": float(ratio), "sketch-epsilon": float(epsilon),
           "sketch-layerwise": bool(layerwise or kind in PER_LAYER_ONLY),
           "sketch-seed": derive_seed(run_seed, "sketch-seed", server_round)}
    if kind == "powersgd":
        cfg["sketch-error-feedback"] = bool(error_feedback)
    return cfg


def sketch_from_config(config: Mapping[str, Any], layout: Sequence[Sequence[int]],
                       powersgd_state: PowerSGDState | None = None) -> Sketch | None:
    """Build the round's sketch from its round config (None when the round has no sketch).

    PowerSGD is not a JL map: each silo keeps its own ``PowerSGDState`` (warm-start Q and the
    error-feedback buffer, both functions of its past noised updates only) and passes it here;
    the server decompresses P Q^T per layer and needs no state."""
    kind = str(config.get("sketch-kind", "none"))
    if kind == "none":
        return None
    layout = [tuple(s) for s in layout]
    if kind == "powersgd":
        return make_sketch(kind, layout, seed=int(config["sketch-seed"]), round=int(config["round"]),
                           ratio=float(config["sketch-ratio"]), state=powersgd_state,
                           error_feedback=bool(config.get("sketch-error-feedback", True)))
    size = {"epsilon": float(config["sketch-epsilon"])} if kind == "adaptive" else {"ratio": float(config["sketch-ratio"])}
    return make_sketch(kind, layout, seed=int(config["sketch-seed"]), round=int(config["round"]),
                       layerwise=bool(config["sketch-layerwise"]), **size)
