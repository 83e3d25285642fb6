"""Own records (docs/your-data.md): a silo's own file named in its node config, checked against
the run's data.schema (one-line refusals before anything is spent), the server's own trust and
test files, and a simulation of one file split by the partitioners. Files are written in tmp_path
from scikit-learn's WBCD, so every expected value comes from sklearn's own arrays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app.config import ConfigError, parse_settings
from app.data.own_files import read_records
from app.data.schema import SchemaError, load_schema

CLASSES = ["malignant", "benign"]  # sklearn's target 0, 1


def wbcd_frame() -> tuple[pd.DataFrame, list[str], np.ndarray, np.ndarray]:
    from sklearn.datasets import load_breast_cancer

    b = load_breast_cancer()
    names = [str(n) for n in b.feature_names]
    df = pd.DataFrame(b.data, columns=names)
    df["diagnosis"] = np.array(CLASSES)[b.target]
    return df, names, b.data, b.target


def write_schema(tmp_path: Path, names: list[str], **extra) -> str:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"features": names, "label": "diagnosis", "classes": CLASSES} | extra))
    return str(path)


def refusal(path: Path, schema: str, fmt: str = "") -> str:
    with pytest.raises(SchemaError) as info:
        read_records(path, load_schema(schema), fmt)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"data-file {path}: ")
    return msg


def test_csv_and_parquet_give_sklearns_records(tmp_path: Path) -> None:
    df, names, data, target = wbcd_frame()
    schema = write_schema(tmp_path, names)
    df.sample(frac=1.0, axis=1, random_state=0).to_csv(tmp_path / "a.csv", index=False)  # column order is free
    df.to_parquet(tmp_path / "a.parquet")
    for name in ("a.csv", "a.parquet"):
        x, y = read_records(tmp_path / name, load_schema(schema))
        assert x.dtype == np.float32 and x.shape == (569, 30)
        np.testing.assert_allclose(x, data.astype(np.float32))
        np.testing.assert_array_equal(y, target)


def test_missing_column_extra_column_extra_class_are_one_line_refusals(tmp_path: Path) -> None:
    df, names, _, _ = wbcd_frame()
    schema = write_schema(tmp_path, names)
    df.drop(columns=["mean radius"]).to_csv(tmp_path / "missing.csv", index=False)
    assert refusal(tmp_path / "missing.csv", schema).endswith("column 'mean radius' of the schema is missing")
    df.assign(patient="x").to_csv(tmp_path / "extra.csv", index=False)
    assert "column 'patient' is not in the schema" in refusal(tmp_path / "extra.csv", schema)
    x, _ = read_records(tmp_path / "extra.csv", load_schema(write_schema(tmp_path, names, ignore=["patient"])))
    assert x.shape == (569, 30)  # an ignored column is allowed and never read
    bad = df.copy()
    bad.loc[7, "diagnosis"] = "unknown"
    bad.to_csv(tmp_path / "class.csv", index=False)
    assert refusal(tmp_path / "class.csv", schema).endswith(
        "column 'diagnosis': class 'unknown' is not in the schema's classes ['malignant', 'benign']")
    df.assign(**{"mean radius": "abc"}).to_csv(tmp_path / "text.csv", index=False)
    assert "column 'mean radius' holds values that are not numbers" in refusal(tmp_path / "text.csv", schema)


def test_npz_wrong_shape_and_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    np.savez(tmp_path / "r.npz", x=np.zeros((4, 63)), y=np.array([0, 1, 0, 1]))
    shape64 = '{"shape": [64], "classes": [0, 1]}'
    assert refusal(tmp_path / "r.npz", shape64).endswith(
        "x has shape (4, 63): records of shape (63,), but the schema says (64,)")
    np.savez(tmp_path / "ok.npz", x=np.arange(128.0).reshape(2, 64), y=np.array([1, 0]))
    x, y = read_records(tmp_path / "ok.npz", load_schema(shape64))
    np.testing.assert_array_equal(x[1], np.arange(64.0, 128.0))
    np.testing.assert_array_equal(y, [1, 0])
    # images: class index follows the schema's order (zebra = 0), not the folders' alphabetical one
    for cls, value in (("ant", 51), ("zebra", 204)):
        (tmp_path / "img" / cls).mkdir(parents=True)
        Image.fromarray(np.full((4, 5), value, np.uint8), mode="L").save(tmp_path / "img" / cls / "a.png")
    gray = '{"shape": [1, 4, 5], "classes": ["zebra", "ant"]}'
    x, y = read_records(tmp_path / "img", load_schema(gray))
    assert x.shape == (2, 1, 4, 5)
    np.testing.assert_allclose(x[:, 0, 0, 0], [51 / 255, 204 / 255], rtol=1e-6)  # ImageFolder: ant, zebra
    np.testing.assert_array_equal(y, [1, 0])
    assert refusal(tmp_path / "img", '{"shape": [1, 5, 4], "classes": ["zebra", "ant"]}').endswith(
        "image ant/a.png has shape (1, 4, 5), but the schema says (1, 5, 4)")
    assert refusal(tmp_path / "img", '{"shape": [1, 4, 5], "classes": ["zebra", "bee"]}').endswith(
        "class 'ant' (a folder) is not in the schema's classes ['zebra', 'bee']")


def test_schema_ranges_are_exposed_and_malformed_schemas_refused(tmp_path: Path) -> None:
    s = load_schema('{"features": ["a", "b"], "classes": ["x", "y"], "ranges": {"a": [0, 1], "b": [-2, 5]}}')
    lo, hi = s.range_arrays()
    np.testing.assert_array_equal(lo, [0, -2])
    np.testing.assert_array_equal(hi, [1, 5])
    assert load_schema('{"shape": [1, 2, 2], "classes": [0, 1]}').range_arrays() is None
    for bad, words in (('{"features": ["a"]}', "classes"), ('{"classes": [0, 1]}', "exactly one of"),
                       ('{"features": ["a"], "classes": [0, 1], "ranges": {"a": [2, 1]}}', "low < high"),
                       ('{"features": ["a"], "classes": [0, 1], "colour": 1}', "unknown key 'colour'")):
        with pytest.raises(SchemaError, match=words):
            load_schema(bad)
    (tmp_path / "s.yaml").write_text("features: [a, b]\nlabel: y\nclasses: [no, yes]\n")
    assert load_schema(str(tmp_path / "s.yaml")).classes == ("False", "True")  # YAML 1.1 reads no/yes as booleans


def test_the_run_config_cannot_name_a_silos_file() -> None:
    for key in ("data-file", "data-format"):
        with pytest.raises(ConfigError) as info:
            parse_settings({key: "/srv/other/records.csv"})
        assert str(info.value).startswith(f"{key} is a silo's node-config key") and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="server.trust-file needs data.schema"):
        parse_settings({"server.trust-file": "/srv/trust.csv"})


def test_a_simulation_file_is_split_like_the_built_in_data(tmp_path: Path) -> None:
    """The same records, in sklearn's order, as a CSV: every silo gets exactly what it gets from
    dataset = "wbcd" (same partition, split and pooled standardisation)."""
    from app.data.federated import build_federated_data

    df, names, _, _ = wbcd_frame()
    df.to_csv(tmp_path / "all.csv", index=False)
    base = {"num-silos": 3, "silos-per-round": 3, "partition": "dirichlet", "seed": 4, "standardize": "pooled"}
    own_s = parse_settings(base | {"data.schema": write_schema(tmp_path, names),
                                   "data.simulation-file": str(tmp_path / "all.csv")})
    own = build_federated_data(own_s, own_s.seed, own_s.robust.trust_size)
    builtin_s = parse_settings(base)
    builtin = build_federated_data(builtin_s, builtin_s.seed, builtin_s.robust.trust_size)
    assert own.num_classes == 2 and own.feature_shape == (30,)
    for a, b in zip(own.silos, builtin.silos, strict=True):
        np.testing.assert_allclose(a.train_x.numpy(), b.train_x.numpy(), atol=1e-5)
        np.testing.assert_array_equal(a.train_y.numpy(), b.train_y.numpy())


def test_a_deployed_node_without_its_own_file_refuses(tmp_path: Path) -> None:
    from app.node_runtime import silo_records

    df, names, _, _ = wbcd_frame()
    from app.data.schema import inlined

    s = parse_settings({"data.schema": inlined(write_schema(tmp_path, names)), "standardize": "local"})
    with pytest.raises(SchemaError, match="names no data-file"):
        silo_records(s, {"partition-id": 0}, 0, deployed=True)
    df.iloc[:100].to_csv(tmp_path / "mine.csv", index=False)
    data, classes, shape = silo_records(s, {"data-file": str(tmp_path / "mine.csv")}, 0, deployed=True)
    assert (data.n, len(data.test_y), classes, shape) == (80, 20, 2, (30,))  # n is the silo's own: 100 * 0.8
    with pytest.raises(SchemaError, match="needs the run's data.schema"):  # never the benchmark instead
        silo_records(parse_settings({}), {"data-file": str(tmp_path / "mine.csv")}, 0, deployed=False)
    with pytest.raises(SchemaError, match="standardize = 'pooled' needs records a silo with its own data-file"):
        silo_records(parse_settings({"data.schema": s.data_schema, "standardize": "pooled"}),
                     {"data-file": str(tmp_path / "mine.csv")}, 0, True)
    # the default (auto) without declared ranges: DP statistics of the silo's own records, a step
    # the silo does itself once its ledger has charged it (clipped at preprocess-clip)
    data, *_ = silo_records(parse_settings({"data.schema": s.data_schema}), {"data-file": str(tmp_path / "mine.csv")},
                            0, True)
    assert data.dp_stats is not None and data.dp_stats.clip == 1.0 and data.dp_stats.share == 0.1


def test_three_silos_with_their_own_files_and_the_servers_own_trust_and_test_files(tmp_path: Path) -> None:
    """Three silos each read their own CSV (one refuses: a missing column), the server scores
    with Grad-BANT on its own trust file and evaluates on its own test file. The refusing silo
    spends nothing (no ledger file); the others' n and delta = 1/n^2 are their own files'."""
    from tests.helpers import run

    df, names, _, _ = wbcd_frame()
    shuffled = df.sample(frac=1.0, random_state=1).reset_index(drop=True)
    server_test, trust, rest = shuffled.iloc[:100], shuffled.iloc[100:160], shuffled.iloc[160:]
    sizes = (150, 130, 129)
    ends = np.cumsum(sizes)
    parts = [rest.iloc[end - size:end] for size, end in zip(sizes, ends, strict=True)]
    for i, part in enumerate(parts):
        (part.drop(columns=["worst area"]) if i == 2 else part).to_csv(tmp_path / f"silo{i}.csv", index=False)
    trust.to_parquet(tmp_path / "trust.parquet")
    server_test.to_csv(tmp_path / "test.csv", index=False)
    cfg = {"data.schema": write_schema(tmp_path, names), "num-silos": 3, "silos-per-round": 3, "standardize": "local",
           "partition": "iid", "algorithm": "robust", "aggregator": "gradbant", "trust.size": 0,
           "server.trust-file": str(tmp_path / "trust.parquet"), "server.test-file": str(tmp_path / "test.csv"),
           "gradbant.noise-aware": True, "gradbant.silo-records": "100,120", "num-rounds": 15, "lr": 0.5, "privacy.epsilon": 3.0}
    summary, rows, _ = run(tmp_path, cfg, node_config=lambda i: {"data-file": str(tmp_path / f"silo{i}.csv")})
    silos = {d["silo"]: d for d in summary["silos"]}
    from app.refusal import DATA_REASON  # the server reads no detail (tests/test_refusal_privacy.py)

    assert silos[2]["error"] == DATA_REASON
    assert not list((tmp_path / "state").glob("ledger-*-silo2.json"))
    for i in (0, 1):
        n = sizes[i] - round(sizes[i] * 0.2)
        assert silos[i]["n"] == n and silos[i]["delta"] == pytest.approx(1 / n**2)
        assert 0 < silos[i]["eps_spent"] <= 3.0 + 1e-9
    assert summary["server_test_records"] == 100
    assert summary["server_test_accuracy"] >= 0.85


def test_the_servers_trust_file_gives_a_stratified_trust_size_and_a_bad_test_file_stops_the_run(tmp_path: Path) -> None:
    """trust.size of the server's own file is drawn stratified by label (largest remainders:
    212 malignant / 357 benign of 569 -> 4 + 6 of 10); a test file that does not match the
    schema is a one-line ConfigError before round 1, as is a malformed schema at the launcher."""
    from app.data.federated import build_trust_set
    from app.launch import preflight
    from app.server_eval import load_server_test

    df, names, _, _ = wbcd_frame()
    df.to_csv(tmp_path / "trust.csv", index=False)
    cfg = {"data.schema": write_schema(tmp_path, names), "server.trust-file": str(tmp_path / "trust.csv"),
           "algorithm": "robust", "trust.size": 10}
    def trust_set(config: dict) -> object:
        s = parse_settings(config)
        return build_trust_set(s, s.seed, s.robust.trust_size, s.robust.trust_classes, s.robust.trust_shift)

    trust = trust_set(cfg)
    assert np.bincount(trust.y.numpy()).tolist() == [4, 6]
    assert len(trust_set(cfg | {"trust.size": 0}).y) == 569  # 0: all of it
    df.drop(columns=["diagnosis"]).to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(ConfigError) as info:
        load_server_test(parse_settings(cfg | {"server.test-file": str(tmp_path / "test.csv")}))
    assert str(info.value) == (f"server.test-file: data-file {tmp_path / 'test.csv'}: the label column 'diagnosis' "
                               "of the schema is missing")
    with pytest.raises(ConfigError, match="data.schema: classes .* is required"):
        preflight({"data.schema": '{"features": ["a"]}'})
