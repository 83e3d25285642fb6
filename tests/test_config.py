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


@pytest.mark.parametrize("cfg,words", [
    ({"shuffle.p": 0.3}, ["shuffle.p = 0.3 is set but privacy.mode = 'isrl'", "privacy.mode = 'shuffle'", "0.25"]),
    ({"shuffle.count-on": 1}, ["shuffle.count-on = 1 is set but privacy.mode = 'isrl'"]),
    ({"attack.kind": "ipm"}, ["attack.kind = 'ipm' with attack.fraction = 0 makes 0 of the 2 silos Byzantine",
                              "attack.fraction >= 1/num-silos = 0.5", "attack.kind = 'none'"]),
    ({"attack.kind": "sign-flip", "attack.fraction": 0.05, "num-silos": 10}, ["makes 0 of the 10 silos"]),
])
def test_inert_keys_are_refused_in_one_line(cfg: dict, words: list[str]) -> None:
    """Keys that would not act (issue 35): shuffle.* under ISRL-DP, and an attack with no
    Byzantine silo (attack.fraction 0, or below 1/num-silos). Before: accepted in silence, the run
    recorded under settings (or an attack's name) that did nothing."""
    with pytest.raises(ConfigError) as err:
        parse_settings(cfg)
    assert "\n" not in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_inert_keys_that_stay_accepted() -> None:
    """shuffle.* under privacy.mode off stay accepted, as every privacy.* key does there (a sweep's
    non-private baseline of a shuffle experiment), and are inert for reports and resume; their
    defaults under ISRL-DP and an attack that makes one silo Byzantine are fine."""
    from app.config import inert_options

    off = {"privacy.mode": "off", "shuffle.p": 0.3}
    parse_settings(off)
    assert "shuffle.p" in inert_options(off) and "shuffle.p" not in inert_options({"privacy.mode": "shuffle"})
    parse_settings({"shuffle.p": 0.25, "attack.kind": "ipm", "attack.fraction": 0.5})
