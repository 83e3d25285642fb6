"""Message keys and (de)serialisation of arrays, configs and metrics.

This is the only base-layer module that imports Flower. Everything that arrives from the
network is validated here: a malformed reply raises :class:`ReplyError` (the strategy then
drops that silo for the round), never anything else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

# Record keys (DESIGN.md section 3).
ARRAYS = "arrays"  # w_r, server -> silo
PREV_ARRAYS = "prev_arrays"  # w_{r-1} or a snapshot, server -> silo
CONFIG = "config"  # round, phase, batch sizes, step size, clip, ...
UPDATE = "update"  # the silo's message, silo -> server
METRICS = "metrics"  # eps-spent (and the batch loss when privacy is off)
STATUS = "status"  # present when a silo refuses: code + reason
SKETCH = "sketch"  # the single array of a sketched update (payload of S x)

#: Status codes a silo may answer with instead of an update.
REFUSED_BUDGET = "budget-exceeded"
REFUSED_CONFIG = "bad-request"
REFUSED_POLICY = "silo-policy"

Layout = Mapping[str, tuple[int, ...]]


class ReplyError(ValueError):
    """A message does not have the expected keys, shapes, dtype or values."""


def params_to_record(params: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Named float arrays -> ArrayRecord (order preserved)."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v, dtype=np.float32)) for k, v in params.items()})


def record_to_params(record: Any, layout: Layout | None = None, *, what: str = "arrays") -> dict[str, np.ndarray]:
    """ArrayRecord -> named float32 arrays, checked against ``layout`` when given:
    same names, same shapes, a float dtype and only finite values."""
    if not isinstance(record, ArrayRecord):
        raise ReplyError(f"{what}: expected an ArrayRecord, got {type(record).__name__}")
    out: dict[str, np.ndarray] = {}
    for key in record:
        try:
            arr = record[key].numpy()
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
    if STATUS not in content.config_records:
        return None
    status = content.config_records[STATUS]
    return str(status.get("code", "unknown")), str(status.get("reason", ""))


def read_metrics(content: RecordDict, required: tuple[str, ...], *, what: str = "metrics") -> dict[str, float]:
    """The reply's MetricRecord as floats; ``required`` keys must be present and numbers
    (``eps-spent`` may be +inf for a non-private silo; other values must be finite)."""
    if METRICS not in content.metric_records:
        raise ReplyError(f"{what}: no MetricRecord named {METRICS!r}")
    raw = content.metric_records[METRICS]
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, list):
            continue
        out[key] = float(value)
    for key in required:
        if key not in out:
            raise ReplyError(f"{what}: missing {key!r}")
        if math.isnan(out[key]) or (math.isinf(out[key]) and key != "eps-spent"):
            raise ReplyError(f"{what}[{key!r}] = {out[key]} is not finite")
    return out


def read_update(content: RecordDict, layout: Layout) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Validate a training reply: the update matches ``layout`` and the metrics are sane."""
    if UPDATE not in content.array_records:
        raise ReplyError(f"reply has no ArrayRecord named {UPDATE!r} (keys: {list(content.keys())})")
    update = record_to_params(content.array_records[UPDATE], layout, what=UPDATE)
    metrics = read_metrics(content, ("eps-spent",))
    return update, metrics


def read_instruction(content: RecordDict) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray] | None]:
    """A silo reads the server's message: (w_r, config, w_{r-1} or None)."""
    if ARRAYS not in content.array_records or CONFIG not in content.config_records:
        raise ReplyError(f"instruction must carry {ARRAYS!r} and {CONFIG!r}; got {list(content.keys())}")
    arrays = record_to_params(content.array_records[ARRAYS], what=ARRAYS)
    prev = None
    if PREV_ARRAYS in content.array_records:
        prev = record_to_params(content.array_records[PREV_ARRAYS], what=PREV_ARRAYS)
    return arrays, dict(content.config_records[CONFIG]), prev


LEDGER = "ledger"
IDENTITY = "identity"


def identity_reply(partition_id: int) -> RecordDict:
    """A node's answer to the attack harness's one-time identity query (simulations only)."""
    return RecordDict({IDENTITY: ConfigRecord({"partition-id": int(partition_id)})})


def read_identity(content: RecordDict, num_partitions: int) -> int:
    """The partition id in an identity reply: an integer in [0, num_partitions), else ReplyError."""
    try:
        value = content.config_records[IDENTITY]["partition-id"]
    except (KeyError, TypeError) as exc:
        raise ReplyError(f"identity reply is malformed: {exc}") from exc
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_partitions:
        raise ReplyError(f"identity reply partition-id = {value!r} is not an integer in [0, {num_partitions})")
    return int(value)


def ledger_reply(report: Mapping[str, Any]) -> RecordDict:
    """A silo's public privacy record (JSON text in a ConfigRecord)."""
    import json

    return RecordDict({LEDGER: ConfigRecord({"json": json.dumps(report)})})


def read_ledger(content: RecordDict) -> dict[str, Any]:
    """Parse :func:`ledger_reply`; raises ReplyError when malformed."""
    import json

    try:
        data = json.loads(str(content.config_records[LEDGER]["json"]))
    except (KeyError, ValueError) as exc:
        raise ReplyError(f"ledger reply is malformed: {exc}") from exc
    if not isinstance(data, dict):
        raise ReplyError("ledger reply is not an object")
    return data
