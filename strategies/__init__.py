"""Server side: the round loop (loop.py), reply validation and decoding (replies.py),
evaluation (evaluation.py), one server step per optimiser, the aggregation rules, Grad-BANT and
the simulation's attack harness.

``STRATEGIES`` maps each algorithm of ``app/algorithms/`` to the optimiser that serves it: every
``FederatedOptimizer`` subclass in this package names its algorithms in ``algorithms``.
"""

from __future__ import annotations

import importlib
import pkgutil

from app.algorithms import ALGORITHMS
from strategies.loop import FederatedOptimizer


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _registry() -> dict[str, type[FederatedOptimizer]]:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
    found: dict[str, type[FederatedOptimizer]] = {}
    for cls in _subclasses(FederatedOptimizer):
        for name in cls.__dict__.get("algorithms", ()):
            if name in found:
                raise RuntimeError(f"algorithm {name!r} is served by both {found[name].__name__} and {cls.__name__}")
            found[name] = cls
    missing = sorted(set(ALGORITHMS) - set(found))
    if missing:
        raise RuntimeError(f"no server step for algorithm(s) {missing}: add a FederatedOptimizer naming them")
    return dict(sorted(found.items()))


STRATEGIES: dict[str, type[FederatedOptimizer]] = _registry()

__all__ = ["STRATEGIES", "FederatedOptimizer"]
