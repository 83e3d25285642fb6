"""The config's option lists are the implementing modules' registries: every registered option
is accepted by the config and nothing else is; every algorithm has a server step and a conf file."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import config
from app.algorithms import ALGORITHMS
from app.config import ConfigError, parse_settings
from app.data.federated import TRUST_SHIFTS
from app.data.partition import PARTITIONS
from app.data.scaling import PCA_FITS, SCALING_MODES
from app.data.sources import SOURCES
from app.models import MODELS
from app.privacy.mechanism import MECHANISMS
from app.privacy.policy import NOISE_SEEDS
from app.prox import PROX_KINDS
from app.sketch import SKETCH_KINDS
from strategies import STRATEGIES
from strategies.aggregation import F_RULES, KRUM_RULES, RULES

CONF = Path(__file__).resolve().parents[1] / "conf"

#: run-config key -> (the registry it must accept exactly, extra keys some options need)
REGISTRIES = {
    "algorithm": (tuple(ALGORITHMS), {"trust.size": 50}),
    "dataset": (SOURCES, {}),
    "partition": (PARTITIONS, {}),
    "standardize": (SCALING_MODES, {}),
    "pca-fit": (PCA_FITS, {}),
    "model": (MODELS, {}),
    "prox.kind": (PROX_KINDS, {"prox.strength": 1.0}),
    "sketch.kind": (("none", *SKETCH_KINDS), {}),
    "aggregator": (("gradbant", *RULES), {"algorithm": "gradbant", "trust.size": 50, "num-silos": 5,
                                          "silos-per-round": 5, "byzantine.f": 0}),
    "trust.shift": (TRUST_SHIFTS, {}),
    "privacy.mode": (("off", *MECHANISMS), {}),
    "privacy.noise-seed": (NOISE_SEEDS, {}),
}


@pytest.mark.parametrize("key", sorted(REGISTRIES))
def test_every_registered_option_is_accepted_and_nothing_else(key: str) -> None:
    registry, extra = REGISTRIES[key]
    for option in registry:
        cfg = extra | {key: option}
        if key == "prox.kind" and option != "none":
            cfg["algorithm"] = "mbsgd"
        parse_settings(cfg)
    with pytest.raises(ConfigError, match=f"{key} = 'not-an-option' is not allowed"):
        parse_settings(extra | {key: "not-an-option"})


def test_copied_option_lists_equal_their_registries() -> None:
    assert config.AGGREGATORS == ("gradbant", *RULES)
    assert config.KRUM_AGGREGATORS == KRUM_RULES
    assert config.F_AGGREGATORS == F_RULES and all("f" in RULES[r].inputs for r in F_RULES)
    assert config.MODELS == MODELS and config.SKETCH_KINDS == ("none", *SKETCH_KINDS)
    assert config.PRIVACY_MODES == ("off", *MECHANISMS) and config.TRUST_SHIFTS == TRUST_SHIFTS


def test_every_algorithm_has_a_server_step_and_a_conf_file() -> None:
    assert set(STRATEGIES) == set(ALGORITHMS)
    for name, cls in STRATEGIES.items():
        assert name in cls.algorithms
        assert (CONF / "algorithm" / f"{name}.yaml").exists(), name
    assert {p.stem for p in (CONF / "algorithm").glob("*.yaml")} == set(ALGORITHMS)
