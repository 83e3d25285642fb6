"""Proximal operators for composite losses f = f0 + f1 (base layer: numpy only, no Flower).

The server's step for a composite loss is ``w <- prox_{eta f1}(z)`` with

    prox_{eta f1}(z) = argmin_w  f1(w) + ||w - z||^2 / (2 eta).

Parameters are a model's named layers, ``dict[str, np.ndarray]`` (float32). Every operator acts on
the concatenation of all layers (the flat parameter vector); where an operator has groups
(group lasso), a group is by default one dict entry (one layer).

Every operator returns new float32 arrays with the same keys (in the same order) and shapes as its
input, never mutates the input, and computes in float64 internally. ``eta`` must be a finite number
> 0 in every call. Bad settings raise a one-line ``ValueError`` naming the parameter, the value and
the allowed range.

``gradient_mapping`` is the non-convex utility measure of the paper: the norm of
``G_eta(w) = (w - prox_{eta f1}(w - eta * grad f0(w))) / eta``, which is 0 exactly at the
stationary points of f0 + f1 and equals ``||grad f0(w)||`` when f1 = 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "PROX_KINDS",
    "Box",
    "ElasticNet",
    "GroupLasso",
    "L1",
    "L2Ball",
    "NoProx",
    "Prox",
    "SquaredL2",
    "gradient_mapping",
    "gradient_mapping_vector",
    "make_prox",
]

Params = dict[str, np.ndarray]

#: kinds accepted by make_prox (the values of the run-config key ``prox.kind``)
PROX_KINDS = ("none", "l1", "l2", "elastic-net", "group-lasso", "l2-ball", "box")

#: relative tolerance of the constraint indicators' value() (float32 rounding of a projection)
FEASIBILITY_RTOL = 1e-6


@runtime_checkable
class Prox(Protocol):
    """f1 of a composite loss, through its proximal operator and its value."""

    name: str

    def __call__(self, w: Params, eta: float) -> Params:
        """prox_{eta f1}(w): new float32 arrays, same keys and shapes; ``w`` is not mutated."""
        ...

    def value(self, w: Params) -> float:
        """f1(w); +inf outside a constraint set."""
        ...


# ----------------------------------------------------------------------------- validation


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _check(param: str, value: Any, *, lo: float = 0.0, lo_open: bool = False, inf_ok: bool = False) -> float:
    """A real number >= lo (> lo if lo_open), finite unless inf_ok; else a one-line ValueError."""
    allowed = f"{'(' if lo_open else '['}{lo:g}, inf{']' if inf_ok else ')'}"
    if not _is_number(value):
        raise ValueError(f"{param} = {value!r} must be a number; allowed: {allowed}")
    v = float(value)
    if math.isnan(v) or (math.isinf(v) and not (inf_ok and v > 0)) or v < lo or (lo_open and v == lo):
        raise ValueError(f"{param} = {value!r} is out of range; allowed: {allowed}")
    return v


def _check_eta(eta: Any) -> float:
    return _check("eta", eta, lo=0.0, lo_open=True)


def _as64(w: Any, what: str = "w") -> dict[str, np.ndarray]:
    """Float64 copies of a dict of arrays (copies, so in-place work never touches the caller's)."""
    if not isinstance(w, Mapping):
        raise ValueError(f"{what} = {type(w).__name__} must be a dict of named arrays")
    out: dict[str, np.ndarray] = {}
    for k, v in w.items():
        a = np.array(v, dtype=np.float64, copy=True)
        out[k] = a
    return out


def _to32(w: Mapping[str, np.ndarray]) -> Params:
    return {k: np.asarray(v).astype(np.float32) for k, v in w.items()}


def _sqnorm(w: Mapping[str, np.ndarray], keys: Sequence[str] | None = None) -> float:
    keys = list(w) if keys is None else keys
    return float(sum(np.vdot(w[k], w[k]).real for k in keys))


def _soft(z: np.ndarray, t: float) -> np.ndarray:
    """Soft-thresholding sign(z) * max(|z| - t, 0)."""
    return np.sign(z) * np.maximum(np.abs(z) - t, 0.0)


# ----------------------------------------------------------------------------- operators


class _ProxBase:
    """Shared plumbing: validation, float64 work, float32 result. Subclasses define _prox/_value."""

    name: ClassVar[str] = ""

    def __call__(self, w: Params, eta: float) -> Params:
        eta = _check_eta(eta)
        return _to32(self._prox(_as64(w), eta))

    def value(self, w: Params) -> float:
        return float(self._value(_as64(w)))

    # float64 in, float64 out; may modify z in place (it is always a private copy)
    def _prox(self, z: dict[str, np.ndarray], eta: float) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _value(self, w: dict[str, np.ndarray]) -> float:
        raise NotImplementedError


@dataclass(frozen=True)
class NoProx(_ProxBase):
    """f1 = 0. prox_{eta f1}(z) = z (identity); value 0."""

    name: ClassVar[str] = "none"

    def _prox(self, z, eta):
        return z

    def _value(self, w):
        return 0.0


@dataclass(frozen=True)
class L1(_ProxBase):
    """f1(w) = lam * ||w||_1.

    prox_{eta f1}(z) = sign(z) * max(|z| - eta * lam, 0)  (soft-thresholding, coordinatewise).
    """

    strength: float = 0.0
    name: ClassVar[str] = "l1"

    def __post_init__(self):
        object.__setattr__(self, "strength", _check("l1.strength", self.strength))

    def _prox(self, z, eta):
        t = eta * self.strength
        return {k: _soft(v, t) for k, v in z.items()}

    def _value(self, w):
        return self.strength * float(sum(np.abs(v).sum() for v in w.values()))


@dataclass(frozen=True)
class SquaredL2(_ProxBase):
    """f1(w) = (lam / 2) * ||w||_2^2  (weight decay).

    prox_{eta f1}(z) = z / (1 + eta * lam).
    """

    strength: float = 0.0
    name: ClassVar[str] = "l2"

    def __post_init__(self):
        object.__setattr__(self, "strength", _check("l2.strength", self.strength))

    def _prox(self, z, eta):
        s = 1.0 / (1.0 + eta * self.strength)
        return {k: v * s for k, v in z.items()}

    def _value(self, w):
        return 0.5 * self.strength * _sqnorm(w)


@dataclass(frozen=True)
class ElasticNet(_ProxBase):
    """f1(w) = l1 * ||w||_1 + (l2 / 2) * ||w||_2^2.

    prox_{eta f1}(z) = soft(z, eta * l1) / (1 + eta * l2),  soft(z, t) = sign(z) * max(|z| - t, 0).
    """

    l1: float = 0.0
    l2: float = 0.0
    name: ClassVar[str] = "elastic-net"

    def __post_init__(self):
        object.__setattr__(self, "l1", _check("elastic-net.l1", self.l1))
        object.__setattr__(self, "l2", _check("elastic-net.l2", self.l2))

    def _prox(self, z, eta):
        t, s = eta * self.l1, 1.0 / (1.0 + eta * self.l2)
        return {k: _soft(v, t) * s for k, v in z.items()}

    def _value(self, w):
        return self.l1 * float(sum(np.abs(v).sum() for v in w.values())) + 0.5 * self.l2 * _sqnorm(w)


@dataclass(frozen=True)
class GroupLasso(_ProxBase):
    """f1(w) = lam * sum_g ||w_g||_2  over disjoint groups g of layers.

    Groups: by default each layer (dict entry) is a group; otherwise ``groups`` is a list of lists
    of layer names (a group is the concatenation of its layers). Groups must be disjoint; layers in
    no group are not regularised (the prox leaves them unchanged).

    prox_{eta f1}(z)_g = max(0, 1 - eta * lam / ||z_g||_2) * z_g  (block soft-thresholding;
    0 when z_g = 0).
    """

    strength: float = 0.0
    groups: Sequence[Sequence[str]] | None = None
    name: ClassVar[str] = "group-lasso"

    def __post_init__(self):
        object.__setattr__(self, "strength", _check("group-lasso.strength", self.strength))
        if self.groups is None:
            return
        if isinstance(self.groups, str) or not isinstance(self.groups, Sequence):
            raise ValueError(f"group-lasso.groups = {self.groups!r} must be a list of lists of layer names")
        groups, seen = [], set()
        for g in self.groups:
            if isinstance(g, str) or not isinstance(g, Sequence) or len(g) == 0:
                raise ValueError(
                    f"group-lasso.groups entry {g!r} must be a non-empty list of layer names"
                )
            for name in g:
                if not isinstance(name, str):
                    raise ValueError(f"group-lasso.groups layer name {name!r} must be a string")
                if name in seen:
                    raise ValueError(
                        f"group-lasso.groups = {self.groups!r} names layer {name!r} twice; groups must be disjoint"
                    )
                seen.add(name)
            groups.append(tuple(g))
        object.__setattr__(self, "groups", tuple(groups))

    def _groups_for(self, w: Mapping[str, np.ndarray]) -> list[tuple[str, ...]]:
        if self.groups is None:
            return [(k,) for k in w]
        for g in self.groups:
            for name in g:
                if name not in w:
                    raise ValueError(
                        f"group-lasso.groups layer {name!r} is not a parameter; allowed: {', '.join(w)}"
                    )
        return list(self.groups)

    def _prox(self, z, eta):
        t = eta * self.strength
        for g in self._groups_for(z):
            n = math.sqrt(_sqnorm(z, g))
            s = max(0.0, 1.0 - t / n) if n > 0 else 0.0
            for k in g:
                z[k] = z[k] * s
        return z

    def _value(self, w):
        return self.strength * sum(math.sqrt(_sqnorm(w, g)) for g in self._groups_for(w))


@dataclass(frozen=True)
class L2Ball(_ProxBase):
    """f1 = indicator of {w : ||w||_2 <= r} (the whole parameter vector, all layers together).

    prox_{eta f1}(z) = projection = z * min(1, r / ||z||_2)  (independent of eta).
    value: 0 if ||w|| <= r * (1 + 1e-6), +inf otherwise.
    """

    radius: float = 1.0
    name: ClassVar[str] = "l2-ball"

    def __post_init__(self):
        object.__setattr__(self, "radius", _check("l2-ball.radius", self.radius, lo_open=True))

    def _prox(self, z, eta):
        n = math.sqrt(_sqnorm(z))
        if n <= self.radius:
            return z
        s = self.radius / n
        return {k: v * s for k, v in z.items()}

    def _value(self, w):
        return 0.0 if math.sqrt(_sqnorm(w)) <= self.radius * (1.0 + FEASIBILITY_RTOL) else math.inf


@dataclass(frozen=True)
class Box(_ProxBase):
    """f1 = indicator of {w : lower <= w_i <= upper for every coordinate i}.

    prox_{eta f1}(z) = projection = clip(z, lower, upper)  (independent of eta).
    Either bound may be infinite (e.g. lower=0, upper=inf: non-negativity).
    value: 0 inside (each bound with tolerance 1e-6 * max(1, |bound|)), +inf otherwise.
    """

    lower: float = -1.0
    upper: float = 1.0
    name: ClassVar[str] = "box"

    def __post_init__(self):
        for p in ("lower", "upper"):
            v = getattr(self, p)
            if not _is_number(v) or math.isnan(float(v)):
                raise ValueError(f"box.{p} = {v!r} must be a number; allowed: [-inf, inf], lower < upper")
            object.__setattr__(self, p, float(v))
        if not self.lower < self.upper:
            raise ValueError(
                f"box.lower = {self.lower!r} must be < box.upper = {self.upper!r}; allowed: lower < upper"
            )

    def _prox(self, z, eta):
        return {k: np.clip(v, self.lower, self.upper) for k, v in z.items()}

    def _value(self, w):
        lo = self.lower - FEASIBILITY_RTOL * max(1.0, abs(self.lower))
        hi = self.upper + FEASIBILITY_RTOL * max(1.0, abs(self.upper))
        for v in w.values():
            if v.size and (v.min() < lo or v.max() > hi):
                return math.inf
        return 0.0


# ----------------------------------------------------------------------------- factory

_KIND_PARAMS: dict[str, tuple[str, ...]] = {
    "none": (),
    "l1": (),
    "l2": (),
    "elastic-net": ("l2",),
    "group-lasso": ("groups",),
    "l2-ball": (),
    "box": ("lower", "upper"),
}


def make_prox(kind: str, strength: float = 0.0, **params: Any) -> Prox:
    """Build f1 from the run-config names ``prox.kind`` / ``prox.strength`` (+ kind's params).

    - ``none``: NoProx (strength is checked but unused)
    - ``l1``: L1(strength)
    - ``l2``: SquaredL2(strength), f1 = (strength/2)||w||^2
    - ``elastic-net``: ElasticNet(l1=strength, l2=params["l2"]) (``l2`` required)
    - ``group-lasso``: GroupLasso(strength, groups=params.get("groups"))
    - ``l2-ball``: L2Ball(radius=strength), strength > 0
    - ``box``: Box(lower, upper), each defaulting to -strength / +strength
    """
    if kind not in PROX_KINDS:
        raise ValueError(f"prox.kind = {kind!r} is not allowed; allowed: {', '.join(PROX_KINDS)}")
    allowed = _KIND_PARAMS[kind]
    for p in params:
        if p not in allowed:
            raise ValueError(
                f"prox parameter {p!r} is not accepted by prox.kind = {kind!r}; allowed: "
                f"{', '.join(allowed) if allowed else 'none'}"
            )
    if kind == "l2-ball":
        return L2Ball(radius=_check("prox.strength", strength, lo_open=True))
    strength = _check("prox.strength", strength)
    if kind == "none":
        return NoProx()
    if kind == "l1":
        return L1(strength)
    if kind == "l2":
        return SquaredL2(strength)
    if kind == "elastic-net":
        if "l2" not in params:
            raise ValueError("prox parameter 'l2' is required by prox.kind = 'elastic-net'; allowed: [0, inf)")
        return ElasticNet(l1=strength, l2=params["l2"])
    if kind == "group-lasso":
        return GroupLasso(strength, groups=params.get("groups"))
    # box
    return Box(lower=params.get("lower", -strength), upper=params.get("upper", strength))


# ----------------------------------------------------------------------------- gradient mapping


def gradient_mapping_vector(w: Params, grad: Params, prox: Prox, eta: float) -> dict[str, np.ndarray]:
    """G_eta(w) = (w - prox_{eta f1}(w - eta * grad)) / eta, per layer (float64 arrays)."""
    eta = _check_eta(eta)
    w64, g64 = _as64(w), _as64(grad, "grad")
    if set(w64) != set(g64):
        raise ValueError(f"grad layers {sorted(g64)} must match w layers {sorted(w64)}")
    for k in w64:
        if w64[k].shape != g64[k].shape:
            raise ValueError(f"grad[{k!r}] shape {g64[k].shape} must match w[{k!r}] shape {w64[k].shape}")
    z = {k: w64[k] - eta * g64[k] for k in w64}
    if isinstance(prox, _ProxBase):
        p = prox._prox(z, eta)  # float64 all the way: no float32 rounding in the measure
    else:
        p = {k: np.asarray(v, dtype=np.float64) for k, v in prox(z, eta).items()}
    return {k: (w64[k] - p[k]) / eta for k in w64}


def gradient_mapping(w: Params, grad: Params, prox: Prox, eta: float) -> float:
    """||G_eta(w)||_2 over all layers: the paper's utility measure for non-convex composite losses."""
    return math.sqrt(_sqnorm(gradient_mapping_vector(w, grad, prox, eta)))
