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

#: Kinds that are always per layer (block-diagonal S).
PER_LAYER_ONLY = ("kronecker",)


def sketch_round_config(kind: str, ratio: float, epsilon: float, layerwise: bool, run_seed: int,
                        server_round: int) -> dict[str, Any]:
    """The round-config entries that describe this round's sketch ({} without a sketch)."""
    if kind == "none":
        return {}
    return {"sketch-kind": kind, "sketch-ratio": float(ratio), "sketch-epsilon": float(epsilon),
            "sketch-layerwise": bool(layerwise or kind in PER_LAYER_ONLY),
            "sketch-seed": derive_seed(run_seed, "sketch-seed", server_round)}


def sketch_from_config(config: Mapping[str, Any], layout: Sequence[Sequence[int]]) -> Sketch | None:
    """Build the round's sketch from its round config (None when the round has no sketch)."""
    kind = str(config.get("sketch-kind", "none"))
    if kind == "none":
        return None
    size = {"epsilon": float(config["sketch-epsilon"])} if kind == "adaptive" else {"ratio": float(config["sketch-ratio"])}
    return make_sketch(kind, [tuple(s) for s in layout], seed=int(config["sketch-seed"]), round=int(config["round"]),
                       layerwise=bool(config["sketch-layerwise"]), **size)
