"""Per-record gradient rows for many silos in one call: the batched simulation path.

A simulation that serves many virtual silos in one process (app/local_grid.py with
``batched=True``, ``sweep.engine=batched``) answers one exchange's messages in turn, each in a
thread of its own (:class:`RowBatcher`), through the same code as the one-silo-at-a-time path:
each silo admits the instruction, records the release in its own ledger, draws its own batch and
its own noise from its own generators, clips, privatises and encodes, exactly as alone. What
differs is where two computations on its records run: the per-record gradient matrix
G_i = [grad f0(w, x_ij)]_j of its batch (:func:`per_sample_rows`, app/privacy/per_sample.py) and
an open evaluation's model outputs (:func:`forward_logits`). A silo's thread hands the request to
the exchange's :class:`RowBatcher` and waits; once every silo of the exchange is waiting (or
done), the batcher computes all requests that share a model architecture, a point w and a kind
in one call on the concatenated records, G = per_sample_grads(model, w, [x_1; ...; x_m]), and
gives each silo its own block back. Records never interact in these computations, so each block
is the silo's own; the arithmetic of a row can still differ in the last bits (a matrix product
over m·K rows may take another kernel than over K rows), which tests/test_batched_path.py
measures against the one-at-a-time path. On 2 CPU cores with the zoo's small models the threads'
hand-offs cost more than the batching saves (docs/results.md, "Speed after issue 37").

Outside a batcher's threads both functions compute here, so the default path (and the golden
runs) are unchanged. Standard library and torch only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from torch.func import functional_call

from app.privacy.per_sample import per_sample_grads

T = TypeVar("T")

#: the most rows x parameters one batched call computes at once (float32: 256 MiB); requests
#: beyond it are split into several calls, each holding whole requests
MAX_ELEMENTS = 1 << 26

_CURRENT = threading.local()

#: what a request asks: per-record gradient rows [K, d], or the model's outputs
ROWS, LOGITS = "rows", "logits"


def in_batch() -> bool:
    """Whether this thread is one of a :class:`RowBatcher`'s (the batched simulation path)."""
    return getattr(_CURRENT, "worker", None) is not None


def _served(kind: str, model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor,
            y: torch.Tensor | None) -> torch.Tensor:
    worker: _Worker = _CURRENT.worker
    request = worker.wait_for(_Request(model, params, x, y, kind))
    if request.error is not None:
        raise request.error
    assert request.rows is not None
    return request.rows


def per_sample_rows(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor,
                    y: torch.Tensor) -> torch.Tensor:
    """``per_sample_grads(model, params, x, y)``: computed by this thread's :class:`RowBatcher`
    together with the other silos' requests when the thread is one of a batcher's, else here."""
    if not in_batch():
        return per_sample_grads(model, params, x, y)
    return _served(ROWS, model, params, x, y)


def forward_logits(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The model's outputs on ``x`` at ``params`` (no gradient), with the other silos' in one
    forward pass in a batcher's thread (records never interact in these models' forward)."""
    if not in_batch():
        with torch.no_grad():
            return functional_call(model, params, (x,))
    return _served(LOGITS, model, params, x, None)


@dataclass
class _Request:
    model: nn.Module
    params: dict[str, torch.Tensor]
    x: torch.Tensor
    y: torch.Tensor | None
    kind: str = ROWS
    rows: torch.Tensor | None = None
    error: BaseException | None = None


def _architecture(model: nn.Module) -> tuple[Any, ...]:
    """What must be equal for two silos' rows to come from one call: the module's class and
    structure (its repr names every layer and its sizes) and its parameters' names and shapes;
    a module with buffers (which the forward reads and each silo holds its own of) is served
    alone."""
    own = (id(model),) if any(True for _ in model.buffers()) else ()
    return (type(model), repr(model), tuple((k, tuple(v.shape)) for k, v in model.named_parameters())) + own


def _same_point(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k] is b[k] or (a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and a[k].device == b[k].device
                         and torch.equal(a[k], b[k])) for k in a)


def _groups(requests: Sequence[_Request]) -> list[list[_Request]]:
    """The requests that one call can serve together: the same architecture, the same point w
    (equal values), the same record dtype, shape and device; in order of first appearance."""
    groups: list[tuple[tuple[Any, ...], list[_Request]]] = []
    arch: dict[int, tuple[Any, ...]] = {}
    for r in requests:
        key = arch.setdefault(id(r.model), _architecture(r.model)) + (
            r.kind, r.x.dtype, tuple(r.x.shape[1:]), r.x.device, None if r.y is None else r.y.dtype)
        for gkey, members in groups:
            if gkey == key and _same_point(members[0].params, r.params):
                members.append(r)
                break
        else:
            groups.append((key, [r]))
    return [members for _, members in groups]


def _chunks(members: list[_Request], per_row: int) -> list[list[_Request]]:
    """``members`` cut into runs of at most :data:`MAX_ELEMENTS` rows x parameters (at least one request each)."""
    out: list[list[_Request]] = [[]]
    size = 0
    for r in members:
        k = len(r.x) * per_row
        if out[-1] and size + k > MAX_ELEMENTS:
            out.append([])
            size = 0
        out[-1].append(r)
        size += k
    return out


def compute(requests: Sequence[_Request]) -> None:
    """Serve ``requests``: one call per group and chunk (:func:`_groups`; ``per_sample_grads``
    for rows, the model's forward for outputs), each request's block set on it (or the call's error)."""
    for members in _groups(requests):
        first = members[0]
        per_row = sum(v.numel() for v in first.params.values())
        for chunk in _chunks(members, per_row):
            try:
                x = chunk[0].x if len(chunk) == 1 else torch.cat([r.x for r in chunk])
                if first.kind == LOGITS:
                    with torch.no_grad():
                        out = functional_call(first.model, first.params, (x,))
                else:
                    y = chunk[0].y if len(chunk) == 1 else torch.cat([r.y for r in chunk])  # type: ignore[misc]
                    out = per_sample_grads(first.model, first.params, x, y)
                blocks = [out] if len(chunk) == 1 else list(torch.split(out, [len(r.x) for r in chunk]))
                for r, block in zip(chunk, blocks, strict=True):
                    r.rows = block
            except BaseException as exc:  # noqa: BLE001 - each waiting silo sees the call's error as its own
                for r in chunk:
                    r.error = exc


class _Worker:
    """One call's thread, run only when the batcher hands it the turn (:class:`RowBatcher`)."""

    def __init__(self, batcher: RowBatcher, call: Callable[[], Any]) -> None:
        self.batcher = batcher
        self.call = call
        self.turn = threading.Semaphore(0)
        self.request: _Request | None = None
        self.result: Any = None
        self.done = False
        self.thread = threading.Thread(target=self._work, daemon=True, name="silofl-batched-silo")

    def _work(self) -> None:
        self.turn.acquire()
        _CURRENT.worker = self
        try:
            self.result = self.call()
        except BaseException as exc:  # noqa: BLE001 - returned to the caller, as the call's result
            self.result = exc
        finally:
            _CURRENT.worker = None
            self.done = True
            self.batcher._yielded.release()

    def wait_for(self, request: _Request) -> _Request:
        """In this worker's thread: hand the turn back with ``request``; return once it is served."""
        self.request = request
        self.batcher._yielded.release()
        self.turn.acquire()
        return request


class RowBatcher:
    """Runs calls in turn, each in a thread of its own, and serves their
    :func:`per_sample_rows` requests in batches (module docstring).

    Exactly one of the calls runs at any time, in a fixed order: call 1 runs until it asks for
    rows (or ends), then call 2, and so on; when every call has asked or ended, their requests
    are served in one batch and the calls that asked go on, again one at a time in order. So no
    two calls ever run at once (the threads never contend), the schedule is the same in every
    run, and a call's result depends only on what it owns (its silo's ledger, draws and
    records), as on the one-at-a-time path."""

    def __init__(self) -> None:
        self._yielded = threading.Semaphore(0)
        #: how many requests and batched calls it served (for the run's report and tests)
        self.requests = 0
        self.batches = 0

    def _step(self, worker: _Worker) -> None:
        """Give ``worker`` the turn and wait until it asks for rows or ends."""
        worker.turn.release()
        self._yielded.acquire()

    def run(self, calls: Sequence[Callable[[], T]]) -> list[T | BaseException]:
        """Each call's result (or the exception it raised), in order."""
        workers = [_Worker(self, c) for c in calls]
        for w in workers:
            w.thread.start()
        for w in workers:
            self._step(w)
        while True:
            asking = [w for w in workers if not w.done and w.request is not None]
            if not asking:
                break
            compute([w.request for w in asking if w.request is not None])
            self.requests += len(asking)
            self.batches += 1
            for w in asking:
                w.request = None
                self._step(w)
        for w in workers:
            w.thread.join()
        return [w.result for w in workers]
