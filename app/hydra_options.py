"""Hydra options from the registries: ``algorithm=<name>`` for every registered algorithm and
``+aggregator=<rule>`` for every aggregation rule, so a new algorithm or rule needs no file in
conf/. A file conf/algorithm/<name>.yaml (or conf/aggregator/<rule>.yaml) still wins: it may set
more (conf/algorithm/localsgd.yaml: local-steps). app.sweep calls :func:`register` before Hydra
composes; so do the tests that compose conf/ themselves (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def register(algorithms: Iterable[str], aggregators: Iterable[str], conf: Path = ROOT / "conf") -> list[str]:
    """Store the options conf/ has no file for in Hydra's ConfigStore: ``algorithm=<name>`` for each
    of ``algorithms`` and ``+aggregator=<rule>`` for each of ``aggregators`` (the registries, which
    the caller passes: app.config.ALGORITHMS, AGGREGATORS); returns the ``group/name`` stored."""
    from hydra.core.config_store import ConfigStore

    store, stored = ConfigStore.instance(), []
    options = [("algorithm", name, {"algorithm": name}) for name in algorithms]
    options += [("aggregator", rule, {"algorithm": "robust", "aggregator": rule}) for rule in aggregators]
    for group, name, node in options:
        if not (conf / group / f"{name}.yaml").exists():
            store.store(group=group, name=name, node=node, package="_global_")
            stored.append(f"{group}/{name}")
    return stored
