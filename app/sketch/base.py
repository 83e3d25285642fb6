"""The Sketch interface shared by every compressor (DESIGN.md sections 2 and 4).

A sketch compresses a flattened model update ``x`` (``n`` floats, the concatenation of the
layers in ``layout``) to a 1-D payload of ``payload_size`` floats, and the server lifts a payload
back to ``n`` floats. For the linear (JL) kinds the payload is ``S x`` for a random ``k x n``
matrix ``S`` and the lift is ``S^T S x`` (Grad-BANT with JL compression); every JL kind here is
scaled so that ``E[S^T S] = I``, i.e. the lift is an unbiased estimate of ``x``.

Randomness: ``S`` is a function of ``(seed, round, layer)`` only. Each diagonal block of ``S``
(one per layer when ``layerwise``, or one for the whole vector, tagged ``"all"``) draws everything
from one CPU ``torch.Generator`` seeded with ``derive_seed(seed, "sketch", round, layer)``; the
draws are made on the CPU in float32 and only then moved to the update's device and cast to its
dtype, so the server and every silo build the same ``S`` on any hardware. Structures of size
O(n) are cached per sketch object (and count as regenerable, not as state); dense matrices are
never cached, they are regenerated block by block on each call.

The base layer: this package never imports Flower.
"""

from __future__ import annotations

import importlib
import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from app.seeding import derive_seed

Layout = list[tuple[int, ...]]
"""Layer shapes, in the order the layers are flattened; ``n`` = total number of entries."""

SKETCH_KINDS: tuple[str, ...] = (
    "gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch", "randk",
    "kronecker", "adaptive", "powersgd",
)

# kind -> "module:Class" (modules are imported on first use; they import this module).
_REGISTRY: dict[str, str] = {
    "gaussian": "dense:GaussianSketch",
    "rademacher": "dense:RademacherSketch",
    "srht": "srht:SRHTSketch",
    "srft": "srft:SRFTSketch",
    "fjlt": "fjlt:FJLTSketch",
    "countsketch": "countsketch:CountSketch",
    "randk": "randk:RandKSketch",
    "kronecker": "kronecker:KroneckerSketch",
    "adaptive": "adaptive:AdaptiveSketch",
    "powersgd": "powersgd:PowerSGDSketch",
}

WHOLE_VECTOR = "all"
"""The ``layer`` part of the seed of a sketch that acts on the whole vector (not layerwise)."""


class PayloadError(ValueError):
    """A payload that cannot be lifted: wrong type, shape, length or non-finite entries.

    The server treats it as a dropped silo (DESIGN.md section 3, step 5)."""


# --------------------------------------------------------------------------------------------
# helpers


def as_int(value: object, name: str) -> int:
    """``value`` as a Python int (numpy integers too; a bool or a non-integer is a ValueError)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # numpy ints -> int, so that derive_seed sees the same repr
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def normalize_layout(layout: Sequence[Sequence[int]]) -> Layout:
    """Validate ``layout`` and return it as a list of int tuples (every layer has >= 1 entry)."""
    if isinstance(layout, (str, bytes)) or not isinstance(layout, Sequence) or len(layout) == 0:
        raise ValueError(f"layout must be a non-empty list of layer shapes, got {layout!r}")
    out: Layout = []
    for i, shape in enumerate(layout):
        if isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        try:
            dims = tuple(as_int(d, "dimension") for d in shape)
        except (TypeError, ValueError):
            raise ValueError(f"layout[{i}] must be a tuple of positive ints, got {shape!r}") from None
        if any(d <= 0 for d in dims):
            raise ValueError(f"layout[{i}] = {dims} has a zero or negative dimension")
        out.append(dims)
    return out


def layer_sizes(layout: Sequence[Sequence[int]]) -> list[int]:
    return [math.prod(s) for s in normalize_layout(layout)]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other float type is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def random_signs(shape: int | tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Independent +-1 entries (float32, CPU) drawn from ``gen``: the D of SRHT/SRFT/FJLT, the
    signs of CountSketch and the Rademacher factors of Kronecker sketches."""
    size = (shape,) if isinstance(shape, int) else tuple(shape)
    return torch.randint(0, 2, size, generator=gen, dtype=torch.float32).mul_(2).sub_(1)


def cpu_generator(seed63: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed63)


# --------------------------------------------------------------------------------------------
# the interface


class Sketch(ABC):
    """A compressor for flattened updates of a model with layer shapes ``layout``.

    ``compress(update[n]) -> payload`` (1-D float), ``decompress(payload) -> [n]``;
    ``k`` = floats on the wire (``payload_size``), ``state_bytes`` = bytes that must be stored
    beyond the seed (0 for every regenerated matrix). ``ratio`` = k / n actually achieved.
    """

    kind: str = ""

    def __init__(self, layout: Sequence[Sequence[int]], *, seed: int, round: int,
                 device: torch.device | str | None = None) -> None:
        self.layout: Layout = normalize_layout(layout)
        self.layer_sizes: list[int] = [math.prod(s) for s in self.layout]
        self.n: int = sum(self.layer_sizes)
        self.layer_offsets: list[int] = [0]
        for m in self.layer_sizes[:-1]:
            self.layer_offsets.append(self.layer_offsets[-1] + m)
        self.seed: int = as_int(seed, "seed")
        self.round: int = as_int(round, "round")
        if self.round < 0:
            raise ValueError(f"round must be >= 0, got {self.round}")
        self.device: torch.device | None = torch.device(device) if device is not None else None

    # -- randomness ---------------------------------------------------------------------------
    def layer_seed(self, layer: int | str) -> int:
        """The 63-bit seed of the block for ``layer`` (an int, or ``WHOLE_VECTOR``)."""
        return derive_seed(self.seed, "sketch", self.round, layer)

    # -- sizes --------------------------------------------------------------------------------
    @property
    @abstractmethod
    def k(self) -> int:
        """Total number of floats the payload carries."""

    @property
    def payload_size(self) -> int:
        return self.k

    @property
    def state_bytes(self) -> int:
        return 0

    @property
    def ratio(self) -> float:
        return self.k / self.n

    # -- compression --------------------------------------------------------------------------
    def compress(self, update: torch.Tensor) -> torch.Tensor:
        """The payload for ``update`` (1-D, ``n`` floats), on ``update.device``."""
        return self._compress(self._check_update(update))

    def decompress(self, payload: Any) -> torch.Tensor:
        """The lifted update (``n`` floats) on ``payload.device``; ``PayloadError`` if invalid."""
        return self._decompress(self.validate_payload(payload))

    def validate_payload(self, payload: Any) -> torch.Tensor:
        """``payload`` as a 1-D float tensor of ``payload_size`` finite entries, or ``PayloadError``."""
        what = f"{self.kind} payload"
        if isinstance(payload, np.ndarray):
            if payload.dtype.kind != "f":
                raise PayloadError(f"{what} must hold floats, got numpy dtype {payload.dtype}")
            payload = torch.from_numpy(np.ascontiguousarray(payload))
        if not isinstance(payload, torch.Tensor):
            raise PayloadError(f"{what} must be a 1-D float tensor, got {type(payload).__name__}")
        if not payload.is_floating_point():
            raise PayloadError(f"{what} must hold floats, got dtype {payload.dtype}")
        if payload.dim() != 1:
            raise PayloadError(f"{what} must be 1-D, got shape {tuple(payload.shape)}")
        if payload.numel() != self.payload_size:
            raise PayloadError(
                f"{what} has {payload.numel()} floats, expected {self.payload_size} "
                f"(n={self.n}, {len(self.layout)} layers, round {self.round})")
        finite = torch.isfinite(payload)
        if not bool(finite.all()):
            nan = int(torch.isnan(payload).sum())
            inf = int((~finite).sum()) - nan
            raise PayloadError(f"{what} has {nan} NaN and {inf} infinite entries "
                               f"out of {payload.numel()}")
        return payload.to(compute_dtype(payload.dtype))

    def _check_update(self, update: Any) -> torch.Tensor:
        if not isinstance(update, torch.Tensor):
            raise ValueError(f"{self.kind} sketch compresses a torch.Tensor, got {type(update).__name__}")
        if update.dim() != 1 or update.numel() != self.n:
            raise ValueError(f"{self.kind} sketch expects a 1-D update of n={self.n} entries "
                             f"(layout {self.layout}), got shape {tuple(update.shape)}")
        if not update.is_floating_point():
            raise ValueError(f"{self.kind} sketch expects a float update, got dtype {update.dtype}")
        return update.to(compute_dtype(update.dtype))

    @abstractmethod
    def _compress(self, x: torch.Tensor) -> torch.Tensor: ...

    @abstractmethod
    def _decompress(self, y: torch.Tensor) -> torch.Tensor: ...

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(n={self.n}, k={self.k}, layers={len(self.layout)}, "
                f"seed={self.seed}, round={self.round})")


# --------------------------------------------------------------------------------------------
# linear sketches: block-diagonal S built from one operator per block


class BlockOperator(ABC):
    """One diagonal block ``S_b`` (``k x m``) of a linear sketch.

    All its randomness comes from ``cpu_generator(seed63)``, drawn in a fixed order. Subclasses
    either override ``_build`` (small O(m) structures, cached on the last device used) or
    regenerate on every call (dense matrices)."""

    def __init__(self, m: int, k: int, seed63: int) -> None:
        if not 1 <= k <= m:
            raise ValueError(f"a sketch block needs 1 <= k <= m, got k={k}, m={m}")
        self.m, self.k, self.seed63 = m, k, seed63
        self._cache: dict[str, torch.Tensor] | None = None
        self._cache_key: tuple[torch.device, torch.dtype] | None = None

    def generator(self) -> torch.Generator:
        return cpu_generator(self.seed63)

    def _build(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        """Draw the block's random structures on the CPU (float tensors in float32)."""
        raise NotImplementedError

    def structures(self, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        key = (device, dtype)
        if self._cache_key != key:
            cpu = self._build(self.generator())
            self._cache = {name: (t.to(device=device, dtype=dtype) if t.is_floating_point()
                                  else t.to(device=device)) for name, t in cpu.items()}
            self._cache_key = key
        assert self._cache is not None
        return self._cache

    @abstractmethod
    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``S_b x`` for ``x`` of length m."""

    @abstractmethod
    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        """``S_b^T y`` for ``y`` of length k."""


class IdentityOperator(BlockOperator):
    """``S_b = I`` (k = m): the block is sent as is (used where compression would not help)."""

    def __init__(self, m: int, seed63: int = 0) -> None:
        super().__init__(m, m, seed63)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    def adjoint(self, y: torch.Tensor) -> torch.Tensor:
        return y.clone()


class LinearSketch(Sketch):
    """Block-diagonal ``S = diag(S_1, ..., S_B)``: one block for the whole vector
    (``layerwise=False``, seed tag ``"all"``) or one block per layer (``layerwise=True``, seed
    tag = the layer's index), with ``k`` allocated across layers by ``allocation``:

    * ``"uniform"``: ``k_l`` proportional to ``n_l`` (at least 1, at most ``n_l``);
    * ``"energy"``: ``k_l`` grows with the layer's share of ``energy`` (e.g. ``||g_l||^2`` of the
      previous round's aggregate, which the server also knows), floored at ``min_k``.

    Give exactly one of ``ratio`` (k/n in (0, 1]) or ``k`` (an int total, or a list of per-layer
    ``k_l``, which implies ``layerwise``). A block-diagonal S with ``E[S_l^T S_l] = I`` for every
    block has ``E[S^T S] = I``.
    """

    default_layerwise: bool = False
    allow_global: bool = True

    def __init__(self, layout: Sequence[Sequence[int]], *, ratio: float | None = None,
                 k: int | Sequence[int] | None = None, seed: int, round: int,
                 device: torch.device | str | None = None, layerwise: bool | None = None,
                 allocation: str | None = None, energy: Sequence[float] | None = None,
                 min_k: int = 1) -> None:
        super().__init__(layout, seed=seed, round=round, device=device)
        if isinstance(k, Sequence) and not isinstance(k, (str, bytes)):
            if layerwise is False:
                raise ValueError("a list of per-layer k implies layerwise=True")
            layerwise = True
        if layerwise is None:
            layerwise = self.default_layerwise
        if not layerwise and not self.allow_global:
            raise ValueError(f"{self.kind} sketches are per layer; layerwise=False is not supported")
        self.layerwise = bool(layerwise)
        ks = self._resolve_k(ratio, k, allocation, energy, min_k)
        self._set_blocks(ks)
        if self.device is not None:
            self.prepare(self.device)

    # -- k ------------------------------------------------------------------------------------
    def _resolve_k(self, ratio: float | None, k: int | Sequence[int] | None,
                   allocation: str | None, energy: Sequence[float] | None,
                   min_k: int) -> list[int]:
        from app.sketch.layerwise import allocate_energy, allocate_uniform

        if (ratio is None) == (k is None):
            raise ValueError(f"{self.kind} sketch: give exactly one of ratio (k/n) or k")
        if not self.layerwise and (allocation is not None or energy is not None):
            raise ValueError("allocation/energy apply only with layerwise=True")
        if isinstance(k, Sequence) and not isinstance(k, (str, bytes)):
            if allocation is not None or energy is not None:
                raise ValueError("give either per-layer k or an allocation, not both")
            ks = [as_int(v, "k") for v in k]
            if len(ks) != len(self.layout):
                raise ValueError(f"got {len(ks)} per-layer k for {len(self.layout)} layers")
            for i, (kl, nl) in enumerate(zip(ks, self.layer_sizes)):
                if not 1 <= kl <= nl:
                    raise ValueError(f"k[{i}] = {kl} is outside [1, n_{i} = {nl}]")
            return ks
        if ratio is not None:
            ratio = float(ratio)
            if not (0.0 < ratio <= 1.0) or math.isnan(ratio):
                raise ValueError(f"ratio must be in (0, 1], got {ratio}")
            total = max(1, round(ratio * self.n))
        else:
            total = as_int(k, "k")
            if not 1 <= total <= self.n:
                raise ValueError(f"k must be in [1, n = {self.n}], got {total}")
        if not self.layerwise:
            return [total]
        total = min(max(total, len(self.layout)), self.n)  # every layer needs at least one row
        allocation = allocation or "uniform"
        if allocation == "uniform":
            if energy is not None:
                raise ValueError("energy is only used with allocation='energy'")
            return allocate_uniform(self.layer_sizes, total)
        if allocation == "energy":
            if energy is None:
                raise ValueError("allocation='energy' needs the energy profile (one value per layer)")
            return allocate_energy(self.layer_sizes, total, energy, min_k=min_k)
        raise ValueError(f"allocation must be 'uniform' or 'energy', got {allocation!r}")

    # -- blocks -------------------------------------------------------------------------------
    def _set_blocks(self, ks: list[int]) -> None:
        if self.layerwise:
            specs = [(off, m, shape, i) for i, (off, m, shape)
                     in enumerate(zip(self.layer_offsets, self.layer_sizes, self.layout))]
        else:
            specs = [(0, self.n, (self.n,), WHOLE_VECTOR)]
        self.blocks: list[tuple[int, int, int, BlockOperator]] = []  # (x offset, m, y offset, op)
        y_off = 0
        for (off, m, shape, tag), kb in zip(specs, ks):
            op = self._make_operator(shape, m, kb, self.layer_seed(tag))
            self.blocks.append((off, m, y_off, op))
            y_off += op.k
        self._k = y_off

    def _make_operator(self, shape: tuple[int, ...], m: int, k: int, seed63: int) -> BlockOperator:
        raise NotImplementedError

    @property
    def k(self) -> int:
        return self._k

    @property
    def k_per_block(self) -> list[int]:
        return [op.k for *_, op in self.blocks]

    def prepare(self, device: torch.device | str, dtype: torch.dtype = torch.float32) -> None:
        """Build (and cache) the regenerable structures on ``device`` ahead of the first call."""
        device = torch.device(device)
        for *_, op in self.blocks:
            try:
                op.structures(device, dtype)
            except NotImplementedError:
                pass

    # -- maps ---------------------------------------------------------------------------------
    def _compress(self, x: torch.Tensor) -> torch.Tensor:
        parts = [op.apply(x[off:off + m]) for off, m, _, op in self.blocks]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _decompress(self, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.n, dtype=y.dtype, device=y.device)
        for off, m, y_off, op in self.blocks:
            out[off:off + m] = op.adjoint(y[y_off:y_off + op.k])
        return out


# --------------------------------------------------------------------------------------------
# factory


def _sketch_class(kind: str) -> type[Sketch]:
    module, cls = _REGISTRY[kind].split(":")
    return getattr(importlib.import_module(f"app.sketch.{module}"), cls)


def make_sketch(kind: str, layout: Sequence[Sequence[int]], *, ratio: float | None = None,
                epsilon: float | None = None, seed: int, round: int,
                device: torch.device | str | None = None, **params: Any) -> Sketch:
    """Build a sketch of ``kind`` (one of ``SKETCH_KINDS``) for models with layer shapes ``layout``.

    ``ratio``: k/n in (0, 1] (or pass ``k=`` an int, or a per-layer list); ``epsilon``: the target
    distortion, only for ``kind="adaptive"`` (which picks k from it). Other ``params`` go to the
    kind: ``layerwise``, ``allocation`` ("uniform" | "energy"), ``energy``, ``min_k`` for the
    linear kinds; ``q`` (fjlt); ``dist`` (kronecker: "gaussian" | "rademacher"); ``delta``,
    ``base`` (adaptive); ``rank``, ``state``, ``error_feedback`` (powersgd).
    """
    if kind not in SKETCH_KINDS:
        raise ValueError(f"unknown sketch kind {kind!r}; choose one of {', '.join(SKETCH_KINDS)}")
    if kind == "adaptive":
        if epsilon is None:
            raise ValueError("kind='adaptive' needs epsilon (the target distortion)")
        params["epsilon"] = epsilon
    elif epsilon is not None:
        raise ValueError(f"epsilon applies only to kind='adaptive', not {kind!r}; give ratio or k")
    if ratio is not None:
        params["ratio"] = ratio
    return _sketch_class(kind)(layout, seed=seed, round=round, device=device, **params)
