"""The config's option lists are the implementing modules' registries: every registered option
is accepted by the config and nothing else is; every algorithm has a server step and a conf file."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import config, sketch_settings
from app.algorithms import ALGORITHMS
from app.config import ConfigError, parse_settings
from app.data.federated import TRUST_SHIFTS
from app.data.partition import PARTITIONS
from app.data.scaling import PCA_FITS, SCALING_MODES
from app.data.sources import SOURCES
from app.models import MODELS
from app.privacy import settings as privacy_settings
from app.privacy.mechanism import MECHANISMS
from app.privacy.policy import NOISE_SEEDS
from app.prox import PROX_KINDS
from app.sketch import SKETCH_KINDS
from strategies import STRATEGIES, options
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
    # the rule lists are derived from each rule's declared needs (strategies/options.py)
    assert options.AGGREGATORS == ("gradbant", *RULES)
    assert options.KRUM_AGGREGATORS == KRUM_RULES == ("krum", "multi-krum")  # n > 2f + 2, Blanchard et al. 2017
    assert options.F_AGGREGATORS == F_RULES and all("f" in RULES[r].inputs for r in F_RULES)
    assert {"krum", "multi-krum", "trimmed-mean"} <= set(F_RULES) and "mean" not in F_RULES
    assert options.TRUST_AGGREGATORS == ("gradbant", "fltrust")
    assert config.MODELS == MODELS and sketch_settings.SKETCH_KINDS == ("none", *SKETCH_KINDS)
    assert privacy_settings.PRIVACY_MODES == ("off", *MECHANISMS) and options.TRUST_SHIFTS == TRUST_SHIFTS


def test_every_algorithm_has_a_server_step_and_a_hydra_option() -> None:
    """A file in conf/algorithm/ is optional (app/hydra_options.py stores the others); none names
    an algorithm that is not registered."""
    from hydra import compose, initialize_config_dir

    assert set(STRATEGIES) == set(ALGORITHMS)
    for name, cls in STRATEGIES.items():
        assert name in cls.algorithms
    assert {p.stem for p in (CONF / "algorithm").glob("*.yaml")} <= set(ALGORITHMS)
    assert {p.stem for p in (CONF / "aggregator").glob("*.yaml")} <= set(options.AGGREGATORS)
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        for name in ALGORITHMS:
            assert compose("config", overrides=[f"algorithm={name}"])["algorithm"] == name
        for rule in options.AGGREGATORS:
            cfg = compose("config", overrides=[f"+aggregator={rule}"])
            assert (cfg["algorithm"], cfg["aggregator"]) == ("robust", rule)


def test_hydra_options_come_from_the_registries_where_conf_has_no_file(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import copy
    import shutil

    from hydra.core.config_store import ConfigStore

    from app.config import ALGORITHMS
    from app.hydra_options import register
    from strategies.options import AGGREGATORS

    store = ConfigStore.instance()
    monkeypatch.setattr(store, "repo", copy.deepcopy(store.repo))  # this test's entries go with it

    shutil.copytree(CONF, tmp_path / "conf")
    (tmp_path / "conf" / "algorithm" / "spider.yaml").unlink()
    (tmp_path / "conf" / "aggregator" / "krum.yaml").unlink()
    stored = register(ALGORITHMS, AGGREGATORS, tmp_path / "conf")
    assert {"algorithm/spider", "aggregator/krum"} <= set(stored)
    assert not {"algorithm/mbsgd", "algorithm/localsgd", "aggregator/mean"} & set(stored)  # their files win
