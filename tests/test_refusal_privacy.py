"""A silo's refusals say nothing about its records (issue 34 section 1, app/refusal.py).

The attack, against the real ClientApp (app/client_app.py -> app/node_runtime.py): a server that
writes ``data.schema`` names a sensitive column (``age``) as the label with classes that do not
fit, reads the class the refusal quotes, adds it to ``classes`` and asks again. Before the fix it
recovered every distinct value of the column, one refused run a value, with ``epsilon-cap`` set
and no ledger ever written. The property that closes it: for two record files that differ in one
record (replace-one), the bytes of a refusal are the same, on every refusal path (schema, data
loading, the silo's own failure, a ledger it cannot use, admission, policy, budget).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from flwr.app import Context, Message, MessageType, RecordDict

from app import wire
from app.refusal import DATA_REASON, INTERNAL_REASON, LEDGER_REASON

TRAIN = str(MessageType.TRAIN)
N = 60


def records(seed: int = 0, *, age0: int | None = None, id0: str | None = None) -> pd.DataFrame:
    """A hospital's file: two numeric features, a diagnosis, a sensitive ``age`` (27 distinct
    values, one patient's 97 unique) and a text record id. ``age0``/``id0`` replace record 0's."""
    rng = np.random.default_rng(seed)
    ages = np.array([30 + (i % 26) for i in range(N)])
    ages[7] = 97  # one patient's unique age
    df = pd.DataFrame({"f1": rng.normal(size=N), "f2": rng.normal(size=N), "age": ages,
                       "diagnosis": np.where(rng.random(N) < 0.5, "benign", "malignant"),
                       "id": [f"patient-{i:03d}" for i in range(N)]})
    if age0 is not None:
        df.loc[0, "age"] = age0
    if id0 is not None:
        df.loc[0, "id"] = id0
    return df


class Node:
    """One silo node with its own file, answered by the real ClientApp, a new Flower run per
    ``ask``. ``extra``: node config on top (None: a simulation's node, no cap, so the run's
    data.schema is the one checked; ``CAPPED``: a capped node, which needs a pinned schema)."""

    run_ids = iter(range(5000, 10**6))

    def __init__(self, tmp: Path, df: pd.DataFrame, name: str, extra: dict[str, Any] | None = None) -> None:
        self.path = tmp / f"{name}.csv"
        df.to_csv(self.path, index=False)
        self.state = tmp / f"state-{name}"
        self.node_config = {"partition-id": 0, "num-partitions": 2, "data-file": str(self.path),
                            "state-dir": str(self.state)} | (extra or {})

    def ask(self, run_config: dict[str, Any], content: RecordDict | None = None, run_id: int | None = None,
            message_type: str = TRAIN) -> RecordDict:
        from flwr.supercore.task_identity import TaskIdentity

        from app.client_app import app
        from app.launch import merged_run_config

        run_id = next(self.run_ids) if run_id is None else run_id
        ctx = Context(run_id=run_id, node_id=1, node_config=dict(self.node_config), state=RecordDict(),
                      run_config=merged_run_config([]) | {"num-silos": 2, "silos-per-round": 2} | run_config)
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 1, 0
        msg = Message(content if content is not None else RecordDict(), dst_node_id=1, message_type=message_type)
        return app(msg, ctx).content


def wire_bytes(content: RecordDict) -> bytes:
    """What the node sends back, less its ledger witness (tests/helpers.py refusal_bytes)."""
    from tests.helpers import refusal_bytes

    return refusal_bytes(content)


def schema(**doc: Any) -> str:
    return json.dumps(doc)


CAPPED = {"epsilon-cap": 3.0}


@pytest.mark.parametrize("capped", [False, True])
def test_the_schema_enumeration_recovers_no_value_of_a_column(tmp_path: Path, capped: bool) -> None:
    """The review's attack, scripted: label = age, classes grown by whatever the refusal quotes,
    on a simulation's node and on a capped one (epsilon-cap = 3, as in the review). Before the
    fix: all 27 distinct ages (97 included) in 28 refused runs. After: none, and the refusal is
    one fixed text that names no value, column count or path; the capped node, which pins no
    schema, does not even read its records for a schema the server chose."""
    node = Node(tmp_path, records(), "d", CAPPED if capped else None)
    classes = ["-1", "-2"]
    reasons = set()
    expected = (wire.REFUSED_POLICY, None) if capped else (wire.REFUSED_DATA, DATA_REASON)
    for _ in range(40):
        reply = node.ask({"data.schema": schema(features=["f1", "f2"], label="age", classes=classes,
                                                ignore=["diagnosis", "id"])})
        code, reason = wire.refusal_of(reply)
        assert code == expected[0]
        assert expected[1] is None or reason == expected[1]
        reasons.add(reason)
        found = re.findall(r"class '([^']*)'", reason)
        if not found or found[0] in classes:
            break
        classes.append(found[0])
    recovered = set(classes) - {"-1", "-2"}
    assert recovered == set(), f"the server read {len(recovered)} values of age back: {sorted(recovered)}"
    assert len(reasons) == 1
    assert "97" not in reasons.pop() and str(node.path) not in DATA_REASON
    assert not list(node.state.glob("ledger-*")), "nothing was spent"


# each case: (run-config overrides, how D' differs from D) -- both files refuse
DATA_CASES = {
    "a sensitive label": ({"data.schema": schema(features=["f1", "f2"], label="age", classes=["-1", "-2"],
                                                 ignore=["diagnosis", "id"])}, {"age0": 55}),
    "a numeric label": ({"data.schema": schema(features=["f2", "age"], label="f1", classes=["0", "1"],
                                               ignore=["diagnosis", "id"])}, {"age0": 61}),
    "an id as the label": ({"data.schema": schema(features=["f1"], label="id", classes=["a", "b"],
                                                  ignore=["diagnosis", "f2", "age"])}, {"id0": "patient-999"}),
    "a text feature": ({"data.schema": schema(features=["id"], label="diagnosis", classes=["benign", "malignant"],
                                              ignore=["f1", "f2", "age"])}, {"id0": "xyz"}),
    "no ignore list": ({"data.schema": schema(features=["f1"], label="diagnosis", classes=["benign", "malignant"])},
                       {"age0": 55}),
    "a missing column": ({"data.schema": schema(features=["f1", "weight"], label="diagnosis",
                                                classes=["benign", "malignant"], ignore=["f2", "age", "id"])},
                         {"age0": 55}),
    "pre-processing the records fails": ({"data.schema": schema(features=["f1", "f2"], label="diagnosis",
                                                                classes=["benign", "malignant"], ignore=["age", "id"]),
                                          "standardize": "pooled"}, {"age0": 55}),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_a_refusal_is_the_same_bytes_for_files_that_differ_in_one_record(tmp_path: Path, case: str) -> None:
    run_config, change = DATA_CASES[case]
    d = Node(tmp_path, records(), "d").ask(run_config, run_id=1)
    d_prime = Node(tmp_path, records(**change), "dprime").ask(run_config, run_id=1)
    assert wire.refusal_of(d) == (wire.REFUSED_DATA, DATA_REASON)
    assert wire_bytes(d) == wire_bytes(d_prime)


@pytest.mark.parametrize("value", ["/etc/hostname", "/no/such/file.json", "{not json", "schema.json"])
def test_a_silo_opens_no_path_the_server_names(tmp_path: Path, value: str, monkeypatch) -> None:
    """A data.schema path is never opened on the silo's host: an existing file, a missing one and
    garbage give the same bytes (no file-existence oracle); inline JSON is the only form read."""
    opened: list[str] = []
    real = Path.read_text

    def spy(self: Path, *a: Any, **k: Any) -> str:
        opened.append(str(self))
        return real(self, *a, **k)

    node = Node(tmp_path, records(), "d")
    (tmp_path / "schema.json").write_text(schema(features=["f1", "f2"], label="diagnosis",
                                                 classes=["benign", "malignant"], ignore=["age", "id"]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Path, "read_text", spy)
    reply = node.ask({"data.schema": value}, run_id=1)
    reference = Node(tmp_path, records(), "ref").ask({"data.schema": "/no/such/other.json"}, run_id=1)
    assert wire.refusal_of(reply)[0] == wire.REFUSED_DATA
    assert wire_bytes(reply) == wire_bytes(reference)
    assert not [p for p in opened if p.endswith(("hostname", "file.json", "schema.json"))]


def test_the_operator_reads_the_detail_locally(tmp_path: Path, capsys) -> None:
    """What the server no longer reads, the node's operator does: ``python -m app.data check``."""
    from app.data.__main__ import main

    df = records()
    df.to_csv(tmp_path / "mine.csv", index=False)
    bad = schema(features=["f1", "f2"], label="age", classes=["-1", "-2"], ignore=["diagnosis", "id"])
    assert main(["check", "--schema", bad, "--data-file", str(tmp_path / "mine.csv")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("REFUSED: SchemaError:") and "class '30'" in out
    good = schema(features=["f1", "f2"], label="diagnosis", classes=["benign", "malignant"], ignore=["age", "id"])
    assert main(["check", "--schema", good, "--data-file", str(tmp_path / "mine.csv"),
                 "--run-config", 'standardize="local"']) == 0
    assert capsys.readouterr().out.startswith(f"OK: {tmp_path / 'mine.csv'} fits the schema: 48 training, 12 test")


GOOD = {"data.schema": schema(features=["f1", "f2"], label="diagnosis", classes=["benign", "malignant"],
                              ignore=["age", "id"]), "standardize": "local", "num-rounds": 3,
        "privacy.epsilon": 1.0, "batch-size": 8, "model": "logistic"}


def _instruction(rnd: int) -> RecordDict:
    rng = np.random.default_rng(0)
    arrays = {"linear.weight": rng.normal(size=(2, 2)).astype(np.float32), "linear.bias": np.zeros(2, np.float32)}
    return wire.Instruction(rnd, wire.Phase.GRAD, arrays).encode()


def test_a_capped_node_checks_its_records_only_against_its_operators_schema(tmp_path: Path) -> None:
    """A capped node with a pinned schema (node config data-schema) trains when the run's schema is
    the same document, and refuses any other with a policy reason that reads no record."""
    pin = tmp_path / "pinned.json"
    pin.write_text(GOOD["data.schema"])
    node = Node(tmp_path, records(), "d", CAPPED | {"data-schema": str(pin)})
    assert wire.refusal_of(node.ask(GOOD, _instruction(1), run_id=7)) is None
    other = GOOD | {"data.schema": schema(features=["f1", "f2"], label="age", classes=["-1", "-2"],
                                          ignore=["diagnosis", "id"])}
    code, reason = wire.refusal_of(node.ask(other, _instruction(1), run_id=8))
    assert code == wire.REFUSED_POLICY and "pinned" in reason


def test_the_other_refusal_paths_are_the_same_bytes_on_d_and_d_prime(tmp_path: Path, monkeypatch) -> None:
    """Admission, policy, budget, an unusable ledger and the silo's own failure: releases and
    refusals in one sequence of requests on D and on D' (record 0 replaced), capped nodes with a
    pinned schema; every refusal is byte-identical, and the failure's text (here one that quotes a
    record) never leaves the node."""
    pin = tmp_path / "pinned.json"
    pin.write_text(GOOD["data.schema"])
    extra = CAPPED | {"data-schema": str(pin)}
    nodes = [Node(tmp_path, records(), "d", extra), Node(tmp_path, records(age0=55, id0="patient-x"), "dprime", extra)]
    seen: list[list[bytes]] = [[], []]
    for i, node in enumerate(nodes):
        ask = [
            ({"privacy.epsilon": 50.0} | {k: v for k, v in GOOD.items() if k != "privacy.epsilon"}, _instruction(1)),
            (GOOD, wire.Instruction(0, wire.Phase.GRAD, {}).encode()),   # admission: round 0, no model
            (GOOD, _instruction(1)), (GOOD, _instruction(2)), (GOOD, _instruction(3)),
            (GOOD, _instruction(4)),                                     # beyond the plan
        ]
        for run_id, (cfg, content) in enumerate(ask):
            reply = node.ask(cfg, content, run_id=100 + min(run_id, 1))
            if wire.refusal_of(reply) is not None:
                seen[i].append(wire_bytes(reply))
        # the silo's own failure whose text quotes a record
        from clients import silo as silo_module

        def boom(self, content):  # noqa: ANN001
            raise ValueError(f"record 0 is {self.data.train_x[0].tolist()}")
        monkeypatch.setattr(silo_module.Silo, "train", boom)
        reply = node.ask(GOOD, _instruction(1), run_id=100)
        assert wire.refusal_of(reply) == (wire.REFUSED_INTERNAL, INTERNAL_REASON)
        seen[i].append(wire_bytes(reply))
        monkeypatch.undo()
        # a ledger that no longer matches its mark
        for ledger in node.state.glob("ledger-*.json"):
            ledger.write_text(ledger.read_text()[:-40])
        from app import node_runtime

        node_runtime._SILOS.clear()
        reply = node.ask(GOOD, _instruction(1), run_id=100)
        assert wire.refusal_of(reply) == (wire.REFUSED_LEDGER, LEDGER_REASON)
        seen[i].append(wire_bytes(reply))
    assert len(seen[0]) >= 5
    assert seen[0] == seen[1]
