"""The wire's records: the Flower record and field names, the refusal codes, the array codec
(float arrays <-> ``ArrayRecord``, the .npy header cached per shape) and the low-level builders and
readers the typed messages (app/wire/messages.py) and queries (app/wire/queries.py) are made of.
Record and field names live only in this package; decoding raises :class:`ReplyError`.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict


# Record keys (DESIGN.md section 3).
ARRAYS = "arrays"  # w_r, server -> silo
PREV_ARRAYS = "prev_arrays"  # w_{r-1} or a snapshot, server -> silo
CONFIG = "config"  # round, phase, the round's sketch; local-steps and lr for local releases
UPDATE = "update"  # the silo's message, silo -> server
METRICS = "metrics"  # eps-spent (and the batch loss when privacy is off)
STATUS = "status"  # present when a silo refuses: code + reason
SKETCH = "sketch"  # the single array of a sketched update (payload of S x)

#: Status codes a silo may answer with instead of an update.
REFUSED_BUDGET = "budget-exceeded"
REFUSED_CONFIG = "bad-request"
REFUSED_POLICY = "silo-policy"
REFUSED_LEDGER = "ledger-unusable"
#: the silo's update came out non-finite (the model and step size sent made it overflow)
REFUSED_NON_FINITE = "non-finite"
#: the silo's own records cannot be used for this run (schema, format, limits): the reason is
#: always the same text (app/refusal.py); the detail stays in the node's log
REFUSED_DATA = "data-unusable"
#: the silo failed while handling the request: the reason is always the same text; the
#: server counts it as a ClientApp failure (fail-on-client-error)
REFUSED_INTERNAL = "silo-error"

Layout = Mapping[str, tuple[int, ...]]


class ReplyError(ValueError):
    """A message does not have the expected keys, shapes, dtype or values."""


class NonFiniteReply(ReplyError):
    """A reply's number is NaN or infinite (a diverging model's loss, for one)."""


NUMPY_STYPE = "numpy.ndarray"  # Flower's serialisation type of an Array made from an ndarray (np.save's bytes)


@functools.lru_cache(maxsize=1024)
def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes | None:
    """The .npy header ``np.save`` writes for a C-ordered array of ``dtype`` and ``shape`` (format
    1.0), or None where np.save would use another format (a header over 64 KiB)."""
    buf = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                   "fortran_order": False, "shape": shape})
    except ValueError:
        return None
    return buf.getvalue()


def _to_array(arr: np.ndarray) -> Array:
    """``flwr.app.Array(arr)`` for a C-contiguous float32 array: the same bytes as np.save writes
    (the header cached per shape), without np.save's per-call header formatting."""
    shape = tuple(int(n) for n in arr.shape)
    header = _npy_header(arr.dtype, shape)
    if header is None:
        return Array(arr)
    return Array(dtype=str(arr.dtype), shape=shape, stype=NUMPY_STYPE, data=header + arr.tobytes())


def _from_array(array: Any) -> np.ndarray:
    """``array.numpy()`` (np.load of its bytes) for a float array whose bytes are exactly the
    header np.save writes for its dtype and shape plus the values: read directly, with the same
    result; anything else goes through Flower's own np.load (allow_pickle=False)."""
    try:
        dtype = np.dtype(array.dtype)
        shape = tuple(array.shape)
        ok = (array.stype == NUMPY_STYPE and dtype.kind == "f" and all(isinstance(n, int) and n >= 0 for n in shape))
    except (TypeError, ValueError, AttributeError):
        ok = False
    if ok:
        header = _npy_header(dtype, shape)
        data = array.data
        count = math.prod(shape)
        if header is not None and len(data) == len(header) + count * dtype.itemsize and data.startswith(header):
            return np.frombuffer(data, dtype=dtype, count=count, offset=len(header)).reshape(shape).copy()
    return array.numpy()


R = TypeVar("R", ArrayRecord, ConfigRecord, MetricRecord)


def record_of(content: RecordDict, name: str, kind: type[R]) -> R | None:
    """``content``'s record ``name`` when it is a ``kind`` (else None): what
    ``content.<kind>_records.get(name)`` returns, without building Flower's typed view of every
    record (RecordDict.array_records / config_records / metric_records copy all of them, through
    the RecordDict's own type-checked setter, at each access)."""
    record = content.get(name)
    return record if isinstance(record, kind) else None


def params_to_record(params: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Named float arrays -> ArrayRecord (order preserved)."""
    return ArrayRecord({k: _to_array(np.ascontiguousarray(v, dtype=np.float32)) for k, v in params.items()})


def record_to_params(record: Any, layout: Layout | None = None, *, what: str = "arrays") -> dict[str, np.ndarray]:
    """ArrayRecord -> named float32 arrays, checked against ``layout`` when given:
    same names, same shapes, a float dtype and only finite values."""
    if not isinstance(record, ArrayRecord):
        raise ReplyError(f"{what}: expected an ArrayRecord, got {type(record).__name__}")
    out: dict[str, np.ndarray] = {}
    for key in record:
        try:
            arr = _from_array(record[key])
        except Exception as exc:  # a corrupt buffer must not crash the caller
            raise ReplyError(f"{what}[{key!r}]: cannot be decoded ({exc})") from exc
        if arr.dtype.kind != "f":
            raise ReplyError(f"{what}[{key!r}]: dtype {arr.dtype} is not a float type")
        out[key] = arr.astype(np.float32, copy=False)
    if layout is not None:
        if list(out) != list(layout):
            missing = [k for k in layout if k not in out]
            extra = [k for k in out if k not in layout]
            raise ReplyError(f"{what}: wrong array names (missing {missing}, unexpected {extra})")
        for key, shape in layout.items():
            if tuple(out[key].shape) != tuple(shape):
                raise ReplyError(f"{what}[{key!r}]: shape {tuple(out[key].shape)} != expected {tuple(shape)}")
    for key, arr in out.items():
        if not np.all(np.isfinite(arr)):
            raise ReplyError(f"{what}[{key!r}]: contains NaN or inf")
    return out


def unflatten(flat: np.ndarray, layout: Layout, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """A flat vector -> named arrays in ``layout`` order (float32 unless ``dtype`` says)."""
    out, offset = {}, 0
    for key, shape in layout.items():
        size = int(np.prod(shape))
        out[key] = np.asarray(flat[offset: offset + size], dtype=dtype).reshape(shape)
        offset += size
    if offset != flat.size:
        raise ReplyError(f"flat update has {flat.size} values, layout needs {offset}")
    return out


def instruction(arrays: ArrayRecord, config: Mapping[str, Any], prev_arrays: ArrayRecord | None = None) -> RecordDict:
    """The content of a server -> silo message."""
    content = RecordDict({ARRAYS: arrays, CONFIG: ConfigRecord(dict(config))})
    if prev_arrays is not None:
        content[PREV_ARRAYS] = prev_arrays
    return content


def update_reply(update: Mapping[str, np.ndarray], metrics: Mapping[str, float]) -> RecordDict:
    """A silo's successful reply: its update and its metrics."""
    return RecordDict({UPDATE: params_to_record(update), METRICS: MetricRecord(dict(metrics))})


TRAIN_GRADIENT = "train-gradient"  # evaluation-only: full gradient of a silo's mean training loss


def metrics_reply(metrics: Mapping[str, float], arrays: Mapping[str, np.ndarray] | None = None) -> RecordDict:
    """An evaluation reply: metrics, and optionally the silo's full training gradient."""
    content = RecordDict({METRICS: MetricRecord(dict(metrics))})
    if arrays is not None:
        content[TRAIN_GRADIENT] = params_to_record(arrays)
    return content


def refusal_reply(code: str, reason: str, metrics: Mapping[str, float]) -> RecordDict:
    """A silo's deliberate refusal (e.g. over budget): not a crash, the server carries on."""
    return RecordDict({STATUS: ConfigRecord({"code": code, "reason": reason}), METRICS: MetricRecord(dict(metrics))})


def refusal_of(content: RecordDict) -> tuple[str, str] | None:
    """(code, reason) when ``content`` is a refusal, else None."""
    status = record_of(content, STATUS, ConfigRecord)
    if status is None:
        return None
    return str(status.get("code", "unknown")), str(status.get("reason", ""))


def read_metrics(content: RecordDict, required: tuple[str, ...], *, what: str = "metrics") -> dict[str, float]:
    """The reply's MetricRecord as floats; ``required`` keys must be present and numbers
    (``eps-spent`` may be +inf for a non-private silo; other values must be finite)."""
    raw = record_of(content, METRICS, MetricRecord)
    if raw is None:
        raise ReplyError(f"{what}: no MetricRecord named {METRICS!r}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, list):
            continue
        out[key] = float(value)
    for key in required:
        if key not in out:
            raise ReplyError(f"{what}: missing {key!r}")
        if math.isnan(out[key]) or (math.isinf(out[key]) and key != EPS_SPENT):
            raise NonFiniteReply(f"{what}[{key!r}] = {out[key]} is not finite")
    return out


def read_update(content: RecordDict, layout: Layout) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Validate a training reply: the update matches ``layout`` and the metrics are sane."""
    record = record_of(content, UPDATE, ArrayRecord)
    if record is None:
        raise ReplyError(f"reply has no ArrayRecord named {UPDATE!r} (keys: {list(content.keys())})")
    update = record_to_params(record, layout, what=UPDATE)
    metrics = read_metrics(content, (EPS_SPENT,))
    return update, metrics


# config and metric field names (only here)
ROUND, PHASE, LOCAL_STEPS, LR = "round", "phase", "local-steps", "lr"
SKETCH_FIELDS = {"kind": "sketch-kind", "ratio": "sketch-ratio", "epsilon": "sketch-epsilon",
                 "layerwise": "sketch-layerwise", "seed": "sketch-seed", "error_feedback": "sketch-error-feedback"}
EPS_SPENT, LOSS = "eps-spent", "loss"
SHUFFLER_KEY, EXCHANGE = "shuffler-key", "exchange"
#: a training instruction that also asks for the evaluation of the model it carries: the round
#: that model comes from (the previous round's result), and whether to add the training gradient
EVALUATE_ROUND = "evaluate-round"

