"""The run config's ``model`` when it names your own model, and its ``model-kwargs``: their form
only (no import, no torch), so that parsing a config stays light. Building and checking the model
is app/models/custom.py's job. :func:`zoo_layout` gives a zoo model's parameter shapes from its spec
alone (no torch), for the launcher's pre-flight.

A model is a built-in zoo name (app/models/zoo.py), an import path ``"package.module:Class"``
(the attribute may be dotted, ``"pkg.mod:Outer.Factory"``), or the name of an entry point in the
group :data:`ENTRY_POINT_GROUP` of an installed distribution.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
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


Layout = dict[str, tuple[int, ...]]


def _linear(name: str, fan_in: int, fan_out: int, bias: bool = True) -> Layout:
    """nn.Linear(fan_in, fan_out): weight [out, in], bias [out]."""
    return {f"{name}.weight": (fan_out, fan_in), **({f"{name}.bias": (fan_out,)} if bias else {})}


def _conv(name: str, c_in: int, c_out: int, k: int, bias: bool = True) -> Layout:
    """nn.Conv2d(c_in, c_out, k): weight [out, in, k, k], bias [out]."""
    return {f"{name}.weight": (c_out, c_in, k, k), **({f"{name}.bias": (c_out,)} if bias else {})}


def _norm(name: str, channels: int) -> Layout:
    """nn.GroupNorm(g, channels) (affine): weight [channels], bias [channels]."""
    return {f"{name}.weight": (channels,), f"{name}.bias": (channels,)}


def _resnet18(in_channels: int, num_classes: int) -> Layout:
    """torchvision's ResNet-18 as app/models/zoo.py ``resnet18_groupnorm`` builds it: a 3x3 stem
    without bias, four stages of two BasicBlocks (64, 128, 256, 512 channels; a 1x1 projection and
    its norm in the first block of stages 2-4), the fc head."""
    out: Layout = {**_conv("conv1", in_channels, 64, 3, bias=False), **_norm("bn1", 64)}
    width = 64
    for stage, channels in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            p, c_in = f"layer{stage}.{block}", width if block == 0 else channels
            out |= _conv(f"{p}.conv1", c_in, channels, 3, bias=False) | _norm(f"{p}.bn1", channels)
            out |= _conv(f"{p}.conv2", channels, channels, 3, bias=False) | _norm(f"{p}.bn2", channels)
            if block == 0 and c_in != channels:
                out |= _conv(f"{p}.downsample.0", c_in, channels, 1, bias=False) | _norm(f"{p}.downsample.1", channels)
        width = channels
    return out | _linear("fc", 512, num_classes)


def zoo_layout(name: str, feature_shape: Sequence[int], num_classes: int, hidden: Sequence[int]) -> Layout | None:
    """The parameter shapes, in ``named_parameters()`` order, of zoo model ``name`` (app/models/zoo.py
    ``build_model``) for inputs of ``feature_shape`` -- a pure function of the spec, no torch
    (tests/test_zoo_layout.py checks it against the built module for every zoo model). None for
    anything else: a name outside the zoo, or a shape or size the zoo's constructors would refuse
    or that is not positive (build the model with torch then: its error is the one to show)."""
    shape = tuple(int(s) for s in feature_shape)
    widths = [int(h) for h in hidden]
    if not shape or min(shape) <= 0 or num_classes <= 0:
        return None
    in_features = math.prod(shape)
    if name == "logistic":
        return _linear("linear", in_features, num_classes)
    if name == "mlp":
        if widths and min(widths) <= 0:
            return None
        out: Layout = {}
        for i, (a, b) in enumerate(zip([in_features, *widths], [*widths, num_classes])):
            out |= _linear(f"net.{2 * i}", a, b)
        return out
    if name == "lenet5":
        if len(shape) != 3 or shape[1] != shape[2] or shape[1] < 16:
            return None
        side = ((shape[1] - 4) // 2 - 4) // 2
        return (_conv("features.0", shape[0], 6, 5) | _conv("features.3", 6, 16, 5)
                | _linear("classifier.0", 16 * side * side, 120) | _linear("classifier.2", 120, 84)
                | _linear("classifier.4", 84, num_classes))
    if name == "resnet18":
        return _resnet18(shape[0], num_classes) if len(shape) == 3 else None
    return None
