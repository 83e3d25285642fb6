"""One module per algorithm: its phases, round schedule and silo release plan (base layer: no
Flower, no torch). The registry is built from the modules of this package, each defining an
``ALGORITHM`` instance; strategies/ and clients/ both read it.

Adding an algorithm ``foo``: ``app/algorithms/foo.py`` with ``ALGORITHM = Foo()`` (its phases,
``round_phases`` and, if its releases differ from a plain minibatch gradient, ``release``), its
server step as a ``FederatedOptimizer`` subclass with ``algorithms = ("foo",)`` in ``strategies/foo.py``
(its options, if any: a dataclass of ``app.options.option`` fields in foo.py, one ``group`` line in
``app.config.Settings`` and one field of :class:`AlgorithmOptions` that ``Settings.algorithm_options``
fills, then ``python -m app.config_sync --write``). Hydra's ``algorithm=foo`` needs
no file (app/hydra_options.py); ``conf/algorithm/foo.yaml`` only to set more. Nothing else lists algorithms.
"""

from __future__ import annotations

import importlib
import pkgutil

from app.algorithms.base import (
    TRAINING_PHASES, Algorithm, AlgorithmOptions, Phase, ReleaseSpec, evaluation_rounds, planned_evaluations,
    planned_release_counts, release_plan,
)


def _discover() -> dict[str, Algorithm]:
    found: dict[str, Algorithm] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name in ("base", "options"):  # options.py: the training options (app/config.py)
            continue
        algorithm = getattr(importlib.import_module(f"{__name__}.{info.name}"), "ALGORITHM", None)
        if isinstance(algorithm, Algorithm):
            if algorithm.name in found:
                raise RuntimeError(f"two algorithm modules are named {algorithm.name!r}")
            found[algorithm.name] = algorithm
    return found


#: algorithm name -> its definition, in a fixed order (the option list of ``algorithm``)
ALGORITHMS: dict[str, Algorithm] = dict(sorted(_discover().items()))


def get_algorithm(name: str) -> Algorithm:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}") from None


__all__ = ["ALGORITHMS", "TRAINING_PHASES", "Algorithm", "AlgorithmOptions", "Phase", "ReleaseSpec", "evaluation_rounds",
           "get_algorithm", "planned_evaluations", "planned_release_counts", "release_plan"]
