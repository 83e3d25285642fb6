"""shuffle.amplification = auto (the default): sampling only where record-level amplification is
real, i.e. the batches are secret from the server (privacy.noise-seed = os) and the effective
count-on is 1; otherwise none. The rule itself, then the silo's record in summary.json for both
branches (a simulation with run-seeded batches, and os-seeded batches at count-on 1)."""

from __future__ import annotations

import pytest

from app.config import ConfigError, parse_settings
from app.launch import merged_run_config
from app.privacy.amplification_choice import resolve_amplification


@pytest.mark.parametrize("setting,seed,count_on,expected", [
    ("auto", "os", 1, "sampling"),      # secret batches, every silo carries its own noise
    ("auto", "run", 1, "none"),         # the server knows the run seed: the batches are not secret
    ("auto", "os", 2, "none"),          # count-on 2: requirements of different sizes would not meet
    ("auto", "run", 25, "none"),
    ("sampling", "run", 25, "none"),    # a request is not a reason: the server knows these batches
    ("sampling", "run", 1, "none"),
    ("sampling", "os", 2, "sampling"),  # granted: the batches are secret (count-on is the silos' utility)
    ("none", "os", 1, "none"),          # asking for less is always granted
])
def test_the_rule(setting, seed, count_on, expected) -> None:
    value, why = resolve_amplification(setting, seed, count_on)
    assert value == expected and why and "\n" not in why
    assert why.startswith("auto: " + expected) == (setting == "auto")


def test_auto_is_the_default_and_bad_values_are_refused() -> None:
    assert parse_settings(merged_run_config([])).shuffle.amplification == "auto"
    with pytest.raises(ConfigError):
        parse_settings(merged_run_config([]) | {"shuffle.amplification": "always"})
    with pytest.raises(ValueError):
        resolve_amplification("always", "os", 1)


SHUFFLE = {"privacy.mode": "shuffle", "num-rounds": 1, "partition": "iid", "privacy.epsilon": 3.0, "num-silos": 2,
           "silos-per-round": 2, "model": "logistic", "lr": 0.5, "privacy.delta": 1e-5, "batch-size": 8}


@pytest.mark.parametrize("over,expected,why", [
    ({}, "none", "run seed"),
    ({"privacy.noise-seed": "os", "shuffle.count-on": 1}, "sampling", "secret"),
    # issue 34 section 2: an explicit request for sampling where the server can recompute the batches
    # (noise-seed = run) was honoured: eps 1.00 claimed for trials whose realisable eps was >= 6.12
    ({"shuffle.amplification": "sampling"}, "none", "run seed"),
])
def test_the_silo_records_which_and_why(federation, over, expected, why) -> None:
    summary, rows, _ = federation(SHUFFLE | over, sub=expected, name=expected)
    assert summary["status"] == "completed" and rows[0]["answered"] == 2
    for silo in summary["silos"]:
        assert silo["shuffle"]["record_amplification"].startswith(expected)
        setting = over.get("shuffle.amplification", "auto")
        assert silo["shuffle"]["record_amplification_why"].startswith(f"{setting}: {expected}")
        assert why in silo["shuffle"]["record_amplification_why"]
        (release,) = silo["releases"]
        assert release.get("amplification", "none") == expected and release["batch"] < release["n"]
