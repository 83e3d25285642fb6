"""The leaf modules a model's forward() runs, in order: what per-record gradients computed layer by
layer (app/privacy/per_sample.py) need to know of a model, and what the zoo's models say of
themselves (``forward_leaves``, app/models/zoo.py)."""

from __future__ import annotations

from torch import nn

#: (qualified name, module) of each leaf forward() calls, ("", None) for a flatten(1) between them
Leaves = list[tuple[str, nn.Module | None]]


def sequential_leaves(prefix: str, m: nn.Module) -> Leaves:
    """The leaf modules ``m`` runs, by qualified name under ``prefix``: what Sequential.forward
    iterates (named_children() would hide a module added twice); any other module is one leaf."""
    if type(m) is not nn.Sequential:
        return [(prefix, m)]
    return [leaf for name, child in m._modules.items()
            for leaf in sequential_leaves(f"{prefix}.{name}".lstrip("."), child)]


def forward_leaves(model: nn.Module) -> Leaves | None:
    """``model``'s leaves: what its own class says (a ``forward_leaves`` method defined on that very
    class, so a subclass with another forward() is not taken at its parent's word), a plain
    ``nn.Sequential``'s, or None if its forward() is not known."""
    if "forward_leaves" in type(model).__dict__:
        return model.forward_leaves()
    if type(model) is nn.Sequential:
        return sequential_leaves("", model)
    return None
