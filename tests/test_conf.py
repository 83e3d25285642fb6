"""conf/ (Hydra) and pyproject's [tool.flwr.app.config] hold the same defaults, and every config
group composes into a valid run config."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from app.config import SCHEMA, flatten_run_config, parse_settings
from app.launch import default_run_config

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"


def composed(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=list(overrides))
    return flatten_run_config(OmegaConf.to_container(cfg, resolve=False))


def test_hydra_defaults_match_pyproject() -> None:
    flat = composed()
    assert flat == default_run_config()
    assert set(flat) == set(SCHEMA)
    assert parse_settings(flat) == parse_settings(default_run_config())


@pytest.mark.parametrize("group", ["algorithm", "dataset", "model", "privacy", "sketch", "attack", "+aggregator",
                                   "+rule", "+budget"])
def test_every_group_option_composes_into_a_valid_run_config(group: str) -> None:
    for option in sorted(p.stem for p in (CONF / group.lstrip("+")).glob("*.yaml")):
        extra = ["algorithm=robust", "trust.size=50"] if group in ("attack", "+aggregator", "+rule") else []
        if group == "attack":  # 5 silos: a fraction 0.4 of WBCD's 2 makes no silo Byzantine (refused)
            extra += ["num-silos=5", "silos-per-round=5"]
        if group == "+aggregator" and option not in ("gradbant", "mean", "fltrust"):
            extra += ["attack.fraction=0.2", "num-silos=5"]  # Krum needs num-silos > 2f + 2
            extra += ["silos-per-round=5", "byzantine.f=1"]  # no attack: the rule is told f
        if group == "+rule":  # 10 silos (Krum with f = 3 needs n > 8); f = 0 unless the preset states one
            states_f = "byzantine:" in (CONF / "rule" / f"{option}.yaml").read_text()
            extra += ["num-silos=10", "silos-per-round=10"] + ([] if states_f else ["byzantine.f=0"])
            extra += ["sketch=srht"] if option == "robajol" else []  # RobAJoL: a JL sketch
        flat = composed(f"{group}={option}", *extra)
        assert set(flat) == set(SCHEMA), (group, option)
        s = parse_settings(flat)
        if group in ("algorithm", "dataset", "model"):
            assert getattr(s, group) in (option, "fashion-mnist", "cifar10")


def test_command_line_overrides_reach_the_run_config() -> None:
    flat = composed("algorithm=spider", "privacy.epsilon=0.75", "spider.q=2", "sketch=srht", "privacy=off")
    s = parse_settings(flat)
    assert (s.algorithm, s.spider.q, s.sketch.kind, s.privacy.mode) == ("spider", 2, "srht", "off")
    assert composed("privacy.epsilon=inf")["privacy.epsilon"] == "inf"


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")))
def test_experiments_compose(experiment: str) -> None:
    parse_settings(composed(f"experiment={experiment}"))
