"""The server's durable state: one checkpoint file per run, rewritten atomically after every round.

A checkpoint is a tree of plain values (None, bool, int, float, str, lists, str-keyed dicts),
numpy arrays, sets of ints and numpy Generators. It is stored as ONE ``.npz`` file: every array
under its own name, and the tree (with references to those names) as JSON in ``__tree__``. No
pickle: loading a checkpoint cannot run code. The file is written to a temporary name in the same
folder, fsynced and renamed over the old one, so a crash leaves the previous round's checkpoint
or this round's, never a part of one.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from app.filelock import write_bytes_atomically

#: bump when the layout of the tree changes; a checkpoint of another format is refused
FORMAT = 1
_TREE = "__tree__"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, of another format, or for other settings."""


def _encode(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        f = float(value)
        return f if math.isfinite(f) else {"__float__": repr(f)}
    if isinstance(value, np.ndarray):
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"__array__": name}
    if isinstance(value, np.random.Generator):
        return {"__rng__": value.bit_generator.state}
    if isinstance(value, (set, frozenset)):
        return {"__set__": sorted(_encode(v, arrays) for v in value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v, arrays) for v in value]
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            return {"__items__": [[_encode(k, arrays), _encode(v, arrays)] for k, v in value.items()]}
        return {"__dict__": {k: _encode(v, arrays) for k, v in value.items()}}
    raise TypeError(f"cannot checkpoint a value of type {type(value).__name__}")


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(node, list):
        return [_decode(v, arrays) for v in node]
    if not isinstance(node, dict):
        return node
    if "__array__" in node:
        return arrays[node["__array__"]]
    if "__float__" in node:
        return float(node["__float__"])
    if "__rng__" in node:
        state = node["__rng__"]
        bit_gen = getattr(np.random, state["bit_generator"])()
        bit_gen.state = state
        return np.random.Generator(bit_gen)
    if "__set__" in node:
        return {_decode(v, arrays) for v in node["__set__"]}
    if "__items__" in node:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in node["__items__"]}
    if "__dict__" in node:
        return {k: _decode(v, arrays) for k, v in node["__dict__"].items()}
    raise CheckpointError(f"unknown checkpoint node {sorted(node)}")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temporary file, fsync, rename, fsync the folder)."""
    arrays: dict[str, np.ndarray] = {}
    tree = json.dumps({"format": FORMAT, "state": _encode(state, arrays)})
    buf = io.BytesIO()
    np.savez(buf, **{_TREE: np.frombuffer(tree.encode(), dtype=np.uint8)}, **arrays)
    write_bytes_atomically(path, buf.getvalue(), sync_dir=True)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The state saved at ``path``; CheckpointError (one line naming what is wrong) if it is
    missing, empty, truncated, not an ``.npz`` of this layout, or of another format. Nothing in
    the file escapes as another exception (BadZipFile, EOFError, KeyError, ...)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        if path.stat().st_size == 0:
            raise CheckpointError(f"checkpoint {path} is unreadable: the file is empty")
        with np.load(path, allow_pickle=False) as data:
            if not hasattr(data, "files"):  # np.load read a bare .npy array, not an .npz archive
                raise CheckpointError(f"checkpoint {path} is unreadable: not an .npz archive")
            if _TREE not in data.files:
                raise CheckpointError(f"checkpoint {path} is malformed: no {_TREE!r} entry (not a silofl checkpoint)")
            arrays = {k: data[k] for k in data.files}
        tree = json.loads(arrays.pop(_TREE).tobytes().decode())
    except CheckpointError:
        raise
    except Exception as exc:  # BadZipFile, EOFError, zlib/CRC errors, bad JSON or UTF-8, ...
        raise CheckpointError(f"checkpoint {path} is unreadable: {_reason(exc)}") from exc
    if not isinstance(tree, dict) or "state" not in tree:
        raise CheckpointError(f"checkpoint {path} is malformed: its tree is not {{format, state}}")
    if tree.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {tree.get('format')!r}; this version reads {FORMAT}")
    try:
        state = _decode(tree["state"], arrays)
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint {path} is malformed: {exc}") from exc
    except Exception as exc:  # a missing array, a bad generator state, a node of the wrong type, ...
        raise CheckpointError(f"checkpoint {path} is malformed: {_reason(exc)}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is malformed: its state is a {type(state).__name__}, not a dict")
    return state


def _reason(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text}"


# -- what a resumed run needs -------------------------------------------------------------------
#: the fields the server's checkpoint holds (strategies.loop.FederatedOptimizer.state and the
#: ServerApp's additions), with the type each must have
_FIELDS: dict[str, tuple[type, ...]] = {
    "rows": (list,), "client_errors": (list,), "roster": (dict,), "sampler": (dict,),
    "optimizer": (dict,), "settings": (dict,), "run_config": (dict,), "run_name": (str,),
    "ledger_run_key": (str,),
}


def check_resume_state(state: dict[str, Any], num_rounds: int, layout: dict[str, tuple[int, ...]]) -> None:
    """Check a loaded checkpoint before a run resumes from it: CheckpointError naming the first
    field that is wrong. The round is an integer in [0, num-rounds]; the model has exactly the
    parameters of ``layout``, each a finite float32 array of its shape; every other array in the
    state is finite; the loop's counters are non-negative integers (uploads a finite float >= 0);
    the other fields have their types (lists, dicts, strings, a numpy Generator)."""
    rnd = state.get("round")
    if rnd is None:
        raise CheckpointError("no round")
    if not _is_int(rnd):
        raise CheckpointError(f"round = {rnd!r} is not an integer")
    if not 0 <= rnd <= num_rounds:
        raise CheckpointError(f"round = {rnd} is out of range; allowed: [0, num-rounds = {num_rounds}]")
    if "model" not in state:
        raise CheckpointError("no model")
    _check_model("model", state["model"], layout)
    for name, types in _FIELDS.items():
        if not isinstance(state.get(name), types):
            raise CheckpointError(f"{name} is {_kind(state.get(name))}; expected "
                                  f"{' or '.join(t.__name__ for t in types)}")
    for name in ("unavailable", "relay_exchanges"):
        if not _is_int(state.get(name)) or state[name] < 0:
            raise CheckpointError(f"{name} = {state.get(name)!r} is not an integer >= 0")
    uploads = state.get("uploads")
    if not isinstance(uploads, (int, float)) or isinstance(uploads, bool) or not 0 <= uploads < math.inf:
        raise CheckpointError(f"uploads = {uploads!r} is not a finite number >= 0")
    if not all(isinstance(r, dict) for r in state["rows"]):
        raise CheckpointError("rows holds an entry that is not a dict")
    if not all(isinstance(e, str) for e in state["client_errors"]):
        raise CheckpointError("client_errors holds an entry that is not a string")
    if not all(_is_int_text(k) and _is_int(v) for k, v in state["roster"].items()):
        raise CheckpointError("roster is not a map of node ids to silo slots (integers)")
    if state.get("pending") is not None and not isinstance(state["pending"], dict):
        raise CheckpointError(f"pending is {_kind(state['pending'])}; expected a dict or None")
    if not _is_int(state.get("run_id")):
        raise CheckpointError(f"run_id = {state.get('run_id')!r} is not an integer")
    sampler = state["sampler"]
    if not isinstance(sampler.get("rng"), np.random.Generator):
        raise CheckpointError(f"sampler.rng is {_kind(sampler.get('rng'))}; expected a numpy Generator")
    if not _is_int(sampler.get("seen")) or sampler["seen"] < 0:
        raise CheckpointError(f"sampler.seen = {sampler.get('seen')!r} is not an integer >= 0")
    if sampler.get("round") is not None and not _is_int(sampler["round"]):
        raise CheckpointError(f"sampler.round = {sampler['round']!r} is not an integer or None")
    if sampler.get("value") is not None:
        _check_model("sampler.value", sampler["value"], layout)
    for name, value in state["optimizer"].items():  # a gradient estimate in the model's layout, ...
        if isinstance(value, dict) and value and all(isinstance(v, np.ndarray) for v in value.values()):
            _check_model(f"optimizer.{name}", value, layout)
    _check_arrays_finite(state, "")


def _check_model(name: str, model: Any, layout: dict[str, tuple[int, ...]]) -> None:
    if not isinstance(model, dict):
        raise CheckpointError(f"{name} is {_kind(model)}; expected a dict of arrays")
    missing, extra = sorted(set(layout) - set(model)), sorted(set(model) - set(layout))
    if missing or extra:
        raise CheckpointError(f"{name} does not match the model's parameters"
                              + (f"; missing {', '.join(missing)}" if missing else "")
                              + (f"; unknown {', '.join(map(str, extra))}" if extra else ""))
    for key, shape in layout.items():
        arr = model[key]
        if not isinstance(arr, np.ndarray):
            raise CheckpointError(f"{name}[{key!r}] is {_kind(arr)}; expected a float32 array")
        if tuple(arr.shape) != tuple(shape):
            raise CheckpointError(f"{name}[{key!r}] has shape {tuple(arr.shape)}; the model's is {tuple(shape)}")
        if arr.dtype != np.float32:
            raise CheckpointError(f"{name}[{key!r}] has dtype {arr.dtype}; the model's is float32")
        if not np.isfinite(arr).all():
            raise CheckpointError(f"{name}[{key!r}] holds {int((~np.isfinite(arr)).sum())} non-finite value(s)")


def _check_arrays_finite(node: Any, where: str) -> None:
    """Every numeric array anywhere in ``node`` is finite."""
    if isinstance(node, np.ndarray):
        if node.dtype.kind not in "biuf":
            raise CheckpointError(f"{where or 'state'} is an array of dtype {node.dtype}; expected numbers")
        if node.dtype.kind == "f" and not np.isfinite(node).all():
            raise CheckpointError(f"{where or 'state'} holds {int((~np.isfinite(node)).sum())} non-finite value(s)")
    elif isinstance(node, dict):
        for k, v in node.items():
            _check_arrays_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, (list, tuple)):
        for i, v in enumerate(node):
            _check_arrays_finite(v, f"{where}[{i}]")


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_int_text(value: Any) -> bool:
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


def _kind(value: Any) -> str:
    return "missing" if value is None else f"a {type(value).__name__}"
