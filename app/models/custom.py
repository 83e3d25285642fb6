"""Your own model: resolve ``model`` (an import path or a ``silofl.models`` entry point,
app/model_spec.py), build it, and check it for record-level DP before anything trains.

The callable (a ``torch.nn.Module`` subclass or a factory returning one) is called with the
run's ``model-kwargs``, plus, for each of these names its signature declares and the kwargs do
not set: ``feature_shape`` (tuple, one record's shape), ``in_features`` (their product),
``num_classes``, and for images [C, H, W] ``in_channels`` (C). With a ``generator`` (the server's seeded w_0) the construction runs under
``torch.manual_seed(s)`` with s drawn from it, so every process that builds the model from the
same run seed gets the same initial weights, whatever layers the model has.

The DP check (:func:`check_dp_compatible`), on one fake batch of two records of the run's input
shape: no BatchNorm (its batch statistics mix records); logits [2, num_classes]; the same output
for the same batch (no Dropout-style randomness, which per-record gradients cannot follow); each record's
output does not depend on the other record in its batch; per-sample gradients
(app/privacy/per_sample.py) give one finite row of d = number of parameters per record, equal
to the record's own gradient. A refusal is one line (ConfigError) naming the model and the fix.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from app.options import ConfigError
from app.model_spec import ENTRY_POINT_GROUP, model_kwargs

#: where a refusal sends the reader
DOC = "docs/your-model.md"
#: (spec, kwargs, feature shape, classes) already checked in this process
_CHECKED: set[tuple[str, str, tuple[int, ...], int]] = set()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def resolve_model(spec: str) -> Callable[..., Any]:
    """The class or factory ``spec`` names (``"pkg.mod:Attr"`` or an entry point's name);
    ConfigError (one line) when it cannot be imported or found."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except Exception as exc:  # ImportError, or the module failing as it imports
            raise ConfigError(f"model = {spec!r}: cannot import module {module_name!r} ({_one_line(exc)}); it must be "
                              f"importable on the server and on every silo ({DOC})") from None
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ConfigError(f"model = {spec!r}: module {module_name!r} has no attribute {attr!r} ({DOC})")
            obj = getattr(obj, part)
        return obj
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec]
    if not found:
        raise ConfigError(f"model = {spec!r}: no {ENTRY_POINT_GROUP} entry point of that name is installed here ({DOC})")
    try:
        return found[0].load()
    except Exception as exc:
        raise ConfigError(f"model = {spec!r}: entry point {found[0].value!r} cannot be loaded ({_one_line(exc)})") from None


def construct(spec: str, feature_shape: Sequence[int], num_classes: int, kwargs: Mapping[str, Any] | str = "",
              generator: torch.Generator | None = None) -> nn.Module:
    """Build ``spec``'s model (see the module docstring); ConfigError (one line) when it is not a
    ``torch.nn.Module`` or its construction fails."""
    factory = resolve_model(spec)
    if isinstance(factory, type) and not issubclass(factory, nn.Module):
        raise ConfigError(f"model = {spec!r} is the class {factory.__qualname__}, not a torch.nn.Module subclass ({DOC})")
    if not callable(factory):
        raise ConfigError(f"model = {spec!r} is a {type(factory).__name__}, not a torch.nn.Module class or a factory")
    args = dict(model_kwargs(kwargs) if isinstance(kwargs, str) else kwargs)
    shape = tuple(int(s) for s in feature_shape)
    try:
        declared = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        declared = {}
    offered = [("feature_shape", shape), ("in_features", math.prod(shape)), ("num_classes", num_classes)]
    if len(shape) == 3:  # images [C, H, W]
        offered.append(("in_channels", shape[0]))
    for name, value in offered:
        if name in declared and name not in args:
            args[name] = value

    def build() -> Any:
        try:
            return factory(**args)
        except Exception as exc:
            raise ConfigError(f"model = {spec!r} could not be built with arguments {sorted(args)} "
                              f"({_one_line(exc)}); set model-kwargs ({DOC})") from None

    if generator is None:
        model = build()
    else:  # a seeded construction: the same w_0 in every process, whatever the layers
        seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build()
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model = {spec!r} returned a {type(model).__name__}, not a torch.nn.Module ({DOC})")
    return model


def check_dp_compatible(model: nn.Module, feature_shape: Sequence[int], num_classes: int, spec: str) -> None:
    """ConfigError (one line) unless ``model`` can be trained with record-level DP (module docstring)."""
    from app.privacy.per_sample import model_params, per_sample_grads, per_sample_grads_loop

    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            raise ConfigError(f"model = {spec!r} has a BatchNorm layer ({name or 'the model'}: {type(module).__name__}), "
                              "whose batch statistics mix records; record-level DP needs per-record layers: use "
                              f"GroupNorm or LayerNorm ({DOC})")
    shape = tuple(int(s) for s in feature_shape)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((2, *shape), generator=gen)
    y = torch.tensor([0, num_classes - 1])
    try:
        with torch.no_grad():
            out, again, alone = model(x), model(x), model(x[:1])
    except Exception as exc:
        raise ConfigError(f"model = {spec!r} fails on a batch of the run's records [2, {', '.join(map(str, shape))}] "
                          f"({_one_line(exc)})") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(f"model = {spec!r} maps a batch [2, {', '.join(map(str, shape))}] to {got}; it must give "
                          f"logits [2, {num_classes}] (num_classes = {num_classes} of the run's data) ({DOC})")
    if not torch.equal(out, again):
        raise ConfigError(f"model = {spec!r} gives two outputs for the same batch (randomness in training, e.g. "
                          f"Dropout); per-record gradients need a deterministic forward: remove it ({DOC})")
    if not _close(out[:1], alone):
        raise ConfigError(f"model = {spec!r} mixes records: a record's output changes with the other records in its "
                          f"batch; record-level DP needs each record processed alone ({DOC})")
    params = model_params(model)
    d = sum(v.numel() for v in params.values())
    try:
        rows = per_sample_grads(model, params, x, y)
        own = per_sample_grads_loop(model, params, x[:1], y[:1])
    except Exception as exc:
        raise ConfigError(f"model = {spec!r}: per-sample gradients fail ({_one_line(exc)}); avoid in-place "
                          f"updates of inputs, randomness (Dropout) and data-dependent Python control flow ({DOC})") from None
    if tuple(rows.shape) != (2, d) or not bool(torch.isfinite(rows).all()):
        raise ConfigError(f"model = {spec!r}: per-sample gradients are not {2} finite rows of d = {d} ({DOC})")
    if not _close(rows[:1], own):
        raise ConfigError(f"model = {spec!r}: a record's per-sample gradient differs from its own gradient; "
                          f"record-level DP needs each record processed alone ({DOC})")


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    """max |a - b| <= rel * max |b| (+ 1e-6): float32 agreement relative to the tensor's scale (the
    batched and the single-record kernels sum in different orders)."""
    return float((a - b).abs().max()) <= rel * float(b.abs().max()) + 1e-6


def build_custom(spec: str, feature_shape: Sequence[int], num_classes: int, kwargs: Mapping[str, Any] | str = "",
                 generator: torch.Generator | None = None) -> nn.Module:
    """:func:`construct` then :func:`check_dp_compatible` (once per process and configuration)."""
    model = construct(spec, feature_shape, num_classes, kwargs, generator)
    key = (spec, kwargs if isinstance(kwargs, str) else repr(sorted(kwargs.items())),
           tuple(int(s) for s in feature_shape), int(num_classes))
    if key not in _CHECKED:
        check_dp_compatible(model, feature_shape, num_classes, spec)
        _CHECKED.add(key)
    return model
