"""The per-round sketch that the server broadcasts and silos apply (DESIGN.md section 3).

The server puts the round's :class:`RoundSketch` (kind, size and ``seed = H(run seed, round)``)
in each instruction; a silo builds S from it, compresses its already-noised update
(post-processing: the sketch cannot weaken privacy), and the server rebuilds the same S to lift
the payload back to R^n. The silo-side half is ``Sketch.compress``, the server-side half
``Sketch.decompress``: one object, both halves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.seeding import derive_seed

#: Kinds that are always per layer (block-diagonal S).
PER_LAYER_ONLY = ("kronecker",)


@dataclass(frozen=True)
class RoundSketch:
    """What both sides need to build round ``round``'s sketch S."""

    kind: str
    ratio: float
    epsilon: float
    layerwise: bool
    seed: int
    round: int
    error_feedback: bool = True


def round_sketch(kind: str, ratio: float, epsilon: float, layerwise: bool, run_seed: int, server_round: int,
                 error_feedback: bool = True) -> RoundSketch | None:
    """This round's sketch from the run's sketch settings (None without a sketch)."""
    if kind == "none":
        return None
    return RoundSketch(kind, float(ratio), float(epsilon), bool(layerwise or kind in PER_LAYER_ONLY),
                       derive_seed(run_seed, "sketch-seed", server_round), server_round, bool(error_feedback))


def build_sketch(spec: RoundSketch | None, layout: Sequence[Sequence[int]], powersgd_state: object | None = None):
    """The round's ``Sketch`` (None when the round has no sketch).

    PowerSGD is not a JL map: each silo keeps its own ``PowerSGDState`` (warm-start Q and the
    error-feedback buffer, both functions of its past noised updates only) and passes it here;
    the server decompresses P Q^T per layer and needs no state."""
    if spec is None:
        return None
    from app.sketch.base import make_sketch  # torch: only where a sketch is built

    layout = [tuple(s) for s in layout]
    if spec.kind == "powersgd":
        return make_sketch(spec.kind, layout, seed=spec.seed, round=spec.round, ratio=spec.ratio,
                           state=powersgd_state, error_feedback=spec.error_feedback)
    size = {"epsilon": spec.epsilon} if spec.kind == "adaptive" else {"ratio": spec.ratio}
    return make_sketch(spec.kind, layout, seed=spec.seed, round=spec.round, layerwise=spec.layerwise, **size)
