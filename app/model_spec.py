"""The run config's ``model`` when it names your own model, and its ``model-kwargs``: their form
only (no import, no torch), so that parsing a config stays light. Building and checking the model
is app/models/custom.py's job.

A model is a built-in zoo name (app/models/zoo.py), an import path ``"package.module:Class"``
(the attribute may be dotted, ``"pkg.mod:Outer.Factory"``), or the name of an entry point in the
group :data:`ENTRY_POINT_GROUP` of an installed distribution.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: the entry-point group a package registers its models in (``[project.entry-points."silofl.models"]``)
ENTRY_POINT_GROUP = "silofl.models"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")


def is_import_path(spec: str) -> bool:
    """True for ``"package.module:Attr"`` (the form, not whether it imports)."""
    return bool(IMPORT_PATH.match(spec))


def entry_point_names() -> list[str]:
    """The names registered in :data:`ENTRY_POINT_GROUP` by the installed distributions."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def check_model_spec(key: str, value: str, zoo: tuple[str, ...], error: type[Exception]) -> str:
    """``value`` if it is an import path or a registered entry point, else ``error`` (one line)."""
    if ":" in value:
        if not is_import_path(value):
            raise error(f"{key} = {value!r} is not an import path; write \"package.module:Class\" "
                        "(the module importable on the server and on every silo)")
        return value
    if value in entry_point_names():
        return value
    names = entry_point_names()
    registered = f"registered {ENTRY_POINT_GROUP} entry points: {', '.join(names)}" if names else \
        f"no {ENTRY_POINT_GROUP} entry point is installed"
    raise error(f"{key} = {value!r} is not allowed; allowed: {', '.join(zoo)}, an import path "
                f"\"package.module:Class\", or an entry point's name ({registered})")


def parse_model_kwargs(key: str, value: str, error: type[Exception]) -> str:
    """``model-kwargs``: a JSON object (``'{"width": 64}'``) as canonical JSON (sorted keys), or
    "" for none; ``error`` (one line) for anything else."""
    if not value.strip():
        return ""
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as exc:
        raise error(f"{key} = {value!r} is not JSON ({exc.msg} at character {exc.pos}); write a JSON object, "
                    "e.g. '{\"width\": 64}'") from None
    if not isinstance(obj, dict):
        raise error(f"{key} = {value!r} must be a JSON object of keyword arguments, e.g. '{{\"width\": 64}}'")
    return json.dumps(obj, sort_keys=True)


def model_kwargs(text: str) -> dict[str, Any]:
    """The keyword arguments of a parsed ``model-kwargs`` ("" = none)."""
    return json.loads(text) if text else {}
