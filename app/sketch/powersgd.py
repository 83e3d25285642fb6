"""PowerSGD baseline (Vogels, Karimireddy and Jaggi 2019), one power iteration per round.

Not a JL map and not unbiased: a rank-r approximation with warm start and error feedback.
For every matrix layer ``M`` (shape ``(r_l, *rest)`` viewed as ``r_l x c_l``), each round:

    M' = M + E            (E: the error-feedback buffer, if error_feedback)
    P  = orth(M' Q)       (Q: c_l x rank, the previous round's Q, or N(0, 1) at the start)
    Q  = M'^T P
    payload += [P, Q]     (each client sends its own P and Q: (r_l + c_l) rank floats)
    E  = M' - P Q^T ;  state.Q = Q   (warm start for the next round)

and ``decompress`` returns ``P Q^T`` per layer: the projection ``P P^T M'`` of M' on the span of
``M' Q``, which equals M' whenever ``rank(M') <= rank`` and Q is generic. Layers that are not
matrices, or for which ``rank (r_l + c_l) >= r_l c_l``, are sent as is (no error feedback).

Stateful: ``Q`` and ``E`` live in a ``PowerSGDState`` the caller keeps between rounds (and may
save with ``state_dict()``), counted in ``state_bytes``. The initial Q of a layer is drawn from
the generator of ``(seed, round, layer)`` of the round in which that layer is first compressed.
The server only decompresses and needs no state. ``rank`` is given, or derived per layer from
``ratio`` as ``max(1, floor(ratio r_l c_l / (r_l + c_l)))``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from app.sketch.base import Layout, Sketch, as_int, cpu_generator, normalize_layout
from app.sketch.kronecker import matrix_shape


class PowerSGDState:
    """Per-silo PowerSGD memory: warm-start ``Q`` and error buffer ``E`` per matrix layer."""

    def __init__(self, layout: Sequence[Sequence[int]]) -> None:
        self.layout: Layout = normalize_layout(layout)
        self.q: dict[int, torch.Tensor] = {}
        self.error: dict[int, torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for d in (self.q, self.error) for t in d.values())

    def state_dict(self) -> dict[str, Any]:
        return {"layout": [list(s) for s in self.layout],
                "q": {i: t.detach().cpu().clone() for i, t in self.q.items()},
                "error": {i: t.detach().cpu().clone() for i, t in self.error.items()}}

    @classmethod
    def from_state_dict(cls, sd: dict[str, Any]) -> "PowerSGDState":
        st = cls(sd["layout"])
        st.q = {int(i): t.clone() for i, t in sd["q"].items()}
        st.error = {int(i): t.clone() for i, t in sd["error"].items()}
        return st


class PowerSGDSketch(Sketch):
    """Rank-``rank`` PowerSGD with warm start and optional error feedback (see the module docstring)."""

    kind = "powersgd"

    def __init__(self, layout, *, ratio: float | None = None, rank: int | None = None,
                 seed: int, round: int, device=None, state: PowerSGDState | None = None,
                 error_feedback: bool = True, layerwise: bool | None = None) -> None:
        super().__init__(layout, seed=seed, round=round, device=device)
        if layerwise is False:
            raise ValueError("powersgd works per layer; layerwise=False is not supported")
        if (ratio is None) == (rank is None):
            raise ValueError("powersgd: give exactly one of rank or ratio")
        if ratio is not None and not 0.0 < float(ratio) <= 1.0:
            raise ValueError(f"ratio must be in (0, 1], got {ratio}")
        if rank is not None and as_int(rank, "rank") < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        if state is None:
            state = PowerSGDState(self.layout)
        elif state.layout != self.layout:
            raise ValueError("the PowerSGD state was made for another layout")
        self.state = state
        self.error_feedback = bool(error_feedback)
        # per layer: (x offset, size, (r, c, rank) or None for raw, payload offset)
        self.plan: list[tuple[int, int, tuple[int, int, int] | None, int]] = []
        p_off = 0
        for off, m, shape in zip(self.layer_offsets, self.layer_sizes, self.layout):
            rc = matrix_shape(shape)
            spec = None
            if rc is not None:
                r, c = rc
                rk = (as_int(rank, "rank") if rank is not None
                      else max(1, math.floor(float(ratio) * r * c / (r + c))))
                rk = min(rk, r, c)
                if rk * (r + c) < r * c:
                    spec = (r, c, rk)
            self.plan.append((off, m, spec, p_off))
            p_off += m if spec is None else spec[2] * (spec[0] + spec[1])
        self._k = p_off

    @property
    def k(self) -> int:
        return self._k

    @property
    def ranks(self) -> list[int | None]:
        return [None if spec is None else spec[2] for _, _, spec, _ in self.plan]

    @property
    def state_bytes(self) -> int:
        return self.state.nbytes

    def _initial_q(self, layer: int, c: int, rank: int, device, dtype) -> torch.Tensor:
        gen = cpu_generator(self.layer_seed(layer))
        return torch.randn(c, rank, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)

    def _compress(self, x: torch.Tensor) -> torch.Tensor:
        out = x.new_empty(self.k)
        for i, (off, m, spec, p_off) in enumerate(self.plan):
            seg = x[off:off + m]
            if spec is None:
                out[p_off:p_off + m] = seg
                continue
            r, c, rk = spec
            mat = seg.view(r, c)
            if self.error_feedback and i in self.state.error:
                mat = mat + self.state.error[i].to(device=x.device, dtype=x.dtype)
            q = self.state.q.get(i)
            if q is None or tuple(q.shape) != (c, rk):  # first round (or the rank changed)
                q = self._initial_q(i, c, rk, x.device, x.dtype)
            else:
                q = q.to(device=x.device, dtype=x.dtype)
            p, _ = torch.linalg.qr(mat @ q)  # reduced: r x rank, orthonormal columns
            q_new = mat.t() @ p
            if self.error_feedback:
                self.state.error[i] = mat - p @ q_new.t()
            self.state.q[i] = q_new
            out[p_off:p_off + r * rk] = p.reshape(-1)
            out[p_off + r * rk:p_off + rk * (r + c)] = q_new.reshape(-1)
        return out

    def _decompress(self, y: torch.Tensor) -> torch.Tensor:
        out = y.new_empty(self.n)
        for off, m, spec, p_off in self.plan:
            if spec is None:
                out[off:off + m] = y[p_off:p_off + m]
                continue
            r, c, rk = spec
            p = y[p_off:p_off + r * rk].view(r, rk)
            q = y[p_off + r * rk:p_off + rk * (r + c)].view(c, rk)
            out[off:off + m] = (p @ q.t()).reshape(-1)
        return out
