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
    """The state saved at ``path``; CheckpointError if it is missing, unreadable or of another format."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        tree = json.loads(arrays.pop(_TREE).tobytes().decode())
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {path} is unreadable: {exc}") from exc
    if tree.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {tree.get('format')!r}; this version reads {FORMAT}")
    return _decode(tree["state"], arrays)
