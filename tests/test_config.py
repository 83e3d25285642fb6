"""Configuration errors stop the run with one line naming key, value and allowed range."""

from __future__ import annotations

import pytest

from app.config import ConfigError, check_silo_sizes, parse_settings
from app.launch import main as launch_main
from app.launch import merged_run_config


@pytest.mark.parametrize("cfg,words", [
    ({"privacy.epsilon": 0}, ["privacy.epsilon", "0", "(0, inf)"]),
    ({"privacy.epsilon": -1.0}, ["privacy.epsilon", "-1.0"]),
    ({"privacy.delta": 1.0}, ["privacy.delta", "(0, 1)"]),
    ({"privacy.delta": 0.0}, ["privacy.delta"]),
    ({"silos-per-round": 3}, ["silos-per-round", "3", "num-silos = 2"]),
    ({"algorithm": "sgd"}, ["algorithm", "'sgd'", "mbsgd"]),
    ({"dataset": "imagenet"}, ["dataset", "'imagenet'", "wbcd"]),
    ({"num-rounds": 0}, ["num-rounds", "[1,"]),
    ({"lr": "fast"}, ["lr", "'fast'", "number"]),
    ({"mlp-hidden": "5,x"}, ["mlp-hidden"]),
    ({"epsilon": 3}, ["unknown config key 'epsilon'"]),
])
def test_bad_values_name_key_value_and_range(cfg: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_settings(cfg)
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message


def test_batch_larger_than_smallest_silo() -> None:
    s = parse_settings({"batch-size": 200})
    with pytest.raises(ConfigError, match=r"batch-size = 200 .*\[0, 170\]"):
        check_silo_sizes(s, [170, 286])


def test_defaults_are_the_embedded_wbcd_run() -> None:
    s = parse_settings(merged_run_config([]))
    assert (s.algorithm, s.dataset, s.partition, s.num_silos, s.model, s.model_hidden) == (
        "mbsgd", "wbcd", "label", 2, "mlp", (5,))
    assert s.privacy.epsilon == 3.0 and s.privacy.delta is None and s.delta_for(170) == 1 / 170**2


def test_launcher_rejects_bad_config_before_starting_flower(capsys: pytest.CaptureFixture[str]) -> None:
    assert launch_main(["--run-config", "privacy.epsilon=-2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: privacy.epsilon = -2") and "\n" not in err
    assert launch_main(["--run-config", "batch-size=1000"]) == 2
    assert "batch-size = 1000" in capsys.readouterr().err
