"""conf/config.yaml (Hydra) and pyproject's [tool.flwr.app.config] hold the same defaults."""

from __future__ import annotations

from pathlib import Path

import yaml

from app.config import SCHEMA, parse_settings
from app.launch import default_run_config

ROOT = Path(__file__).resolve().parent.parent


def test_hydra_defaults_match_pyproject() -> None:
    conf = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    assert conf == default_run_config()
    assert set(conf) == set(SCHEMA)
    assert parse_settings(conf) == parse_settings(default_run_config())
