"""Public standardisation of a silo's own records: the schema's ``statistics`` (computed from a
file public to whoever runs app.data.public_statistics, e.g. the server's trust file) scale every
silo's records as (x - mean) / std without reading them, so the default pre-processing of an
own-data run is inside epsilon."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.config import parse_settings
from app.data.own_data import own_scaler, server_records
from app.data.public_statistics import main as public_statistics_main
from app.data.schema import SchemaError, parse_schema


def _table(tmp_path: Path, rows: int, seed: int) -> tuple[Path, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal([10.0, -3.0, 500.0], [2.0, 0.5, 80.0], size=(rows, 3))
    df = pd.DataFrame(x, columns=["a", "b", "c"])
    df["y"] = np.where(rng.random(rows) < 0.5, "no", "yes")
    path = tmp_path / f"t{seed}.csv"
    df.to_csv(path, index=False)
    return path, x


def test_the_cli_writes_the_public_files_mean_and_std_and_a_silo_scales_with_them(tmp_path: Path) -> None:
    public, x_pub = _table(tmp_path, 200, 0)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"features": ["a", "b", "c"], "label": "y", "classes": ["no", "yes"]}))
    assert public_statistics_main([str(public), "--schema", str(schema), "--out", str(schema)]) == 0
    doc = json.loads(schema.read_text())
    np.testing.assert_allclose([doc["statistics"]["mean"][k] for k in "abc"], x_pub.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose([doc["statistics"]["std"][k] for k in "abc"], x_pub.std(axis=0), rtol=1e-6)
    s = parse_settings({"data.schema": str(schema)})  # standardize = auto
    silo_path, x_silo = _table(tmp_path, 50, 1)
    scaler, dp_step = own_scaler(s, parse_schema(doc), x_silo)
    assert dp_step is None  # public: nothing to charge
    expected = (x_silo - x_pub.mean(axis=0)) / x_pub.std(axis=0)  # the formula, from the public file only
    np.testing.assert_allclose(scaler.apply(x_silo), expected, rtol=1e-5, atol=1e-6)
    # the silo's own records do not enter: another silo file gives the same transform
    _, x_other = _table(tmp_path, 80, 2)
    scaler2, _ = own_scaler(s, parse_schema(doc), x_other)
    np.testing.assert_allclose(scaler2.mean, scaler.mean)
    np.testing.assert_allclose(scaler2.std, scaler.std)
    sx, _ = server_records(s, str(silo_path))  # the server's files scale the same way
    np.testing.assert_allclose(sx, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("stats, message", [
    ({"mean": 0.0}, "statistics must be"),
    ({"mean": 0.0, "std": 0.0}, "std of every feature must be a finite number > 0"),
    ({"mean": {"a": 1, "b": 2}, "std": 1.0}, "statistics mean give no value for feature 'c'"),
    ({"mean": [1.0, 2.0], "std": 1.0}, "statistics mean lists 2 values for 3 features"),
    ({"mean": {"z": 1}, "std": 1.0}, "statistics mean name 'z', which is not a feature"),
])
def test_malformed_statistics_are_one_line_refusals(stats: dict, message: str) -> None:
    with pytest.raises(SchemaError, match=message) as info:
        parse_schema({"features": ["a", "b", "c"], "label": "y", "classes": ["no", "yes"], "statistics": stats})
    assert "\n" not in str(info.value)


def test_without_public_scaling_auto_is_dp_and_public_is_refused(tmp_path: Path) -> None:
    doc = {"features": ["a", "b", "c"], "label": "y", "classes": ["no", "yes"]}
    _, x = _table(tmp_path, 30, 3)
    _, dp_step = own_scaler(parse_settings({"data.schema": json.dumps(doc)}), parse_schema(doc), x)
    assert dp_step is not None  # DP statistics of the silo's own records, charged to its ledger
    with pytest.raises(SchemaError, match="needs public statistics or ranges"):
        own_scaler(parse_settings({"data.schema": json.dumps(doc), "standardize": "public"}), parse_schema(doc), x)


def test_summary_names_the_own_records_scaling(tmp_path: Path) -> None:
    from app.data.preprocessing_report import preprocessing_steps

    def steps(config: dict) -> dict:
        s = parse_settings(config)
        return preprocessing_steps(s, s.privacy.enabled)

    base = {"features": ["a", "b", "c"], "label": "y", "classes": ["no", "yes"]}
    public = steps({"data.schema": json.dumps(base | {"statistics": {"mean": 0, "std": 1}})})
    assert public["covered_by_eps"] and public["steps"][-1]["mode"] == "public"
    assert "data.schema" in public["steps"][-1]["how"]
    dp = steps({"data.schema": json.dumps(base)})
    assert dp["steps"][-1]["mode"] == "dp" and dp["covered_by_eps"]
    local = steps({"data.schema": json.dumps(base), "standardize": "local"})
    assert not local["covered_by_eps"] and "NOT covered" in local["caveat"]
