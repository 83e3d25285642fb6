"""Hydra options from the registries: ``algorithm=<name>`` for every registered algorithm and
``+aggregator=<rule>`` for every aggregation rule, so a new algorithm or rule needs no file in
conf/. A file conf/algorithm/<name>.yaml (or conf/aggregator/<rule>.yaml) still wins: it may set
more (conf/algorithm/localsgd.yaml: local-steps). app.sweep calls :func:`register` before Hydra
composes; so do the tests that compose conf/ themselves (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def register(conf: Path = ROOT / "conf") -> list[str]:
    """Store the options conf/ has no file for in Hydra's ConfigStore; the ``group/name`` stored."""
    from hydra.core.config_store import ConfigStore

    from app.config import AGGREGATORS, ALGORITHMS

    store, stored = ConfigStore.instance(), []
    options = [("algorithm", name, {"algorithm": name}) for name in ALGORITHMS]
    options += [("aggregator", rule, {"algorithm": "robust", "aggregator": rule}) for rule in AGGREGATORS]
    for group, name, node in options:
        if not (conf / group / f"{name}.yaml").exists():
            store.store(group=group, name=name, node=node, package="_global_")
            stored.append(f"{group}/{name}")
    return stored
