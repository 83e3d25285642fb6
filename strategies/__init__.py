"""Server side: the round loop (loop.py), reply validation and decoding (replies.py),
evaluation (evaluation.py), one server step per optimiser, the aggregation rules as components
(aggregators.py; the rules' maths in aggregation.py), Grad-BANT and the simulation's attack harness.

``STRATEGIES`` maps each algorithm of ``app/algorithms/`` to the optimiser that serves it: every
``FederatedOptimizer`` subclass in this package names its algorithms in ``algorithms``. It is
built on first use, so importing one piece (``strategies.aggregation``: numpy only) loads
neither torch nor Flower's server.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strategies.loop import FederatedOptimizer


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


def _registry() -> dict[str, type[FederatedOptimizer]]:
    from app.algorithms import ALGORITHMS
    from strategies.loop import FederatedOptimizer

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


def __getattr__(name: str) -> Any:
    """``STRATEGIES`` (built once, on first use) and ``FederatedOptimizer``."""
    if name == "STRATEGIES":
        globals()["STRATEGIES"] = value = _registry()
        return value
    if name == "FederatedOptimizer":
        from strategies.loop import FederatedOptimizer

        return FederatedOptimizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["STRATEGIES", "FederatedOptimizer"]
