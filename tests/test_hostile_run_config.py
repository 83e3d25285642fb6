"""Every run-config key is hostile input to the silo (issue 34 section 2, docs/threat-model.md).

Generated from the option declarations (app/options.py: each parser's ``hostile`` edge values,
or :data:`EXTRA` for the few hand-written parsers): the real silo node (app/client_app.py ->
app/node_runtime.py), capped and deployed, with its own file, is driven with each hostile value on
two files that differ in one record, and must (independent facts, not the silo's own report):

* keep the ledger within the node's own cap (``epsilon-cap``), whatever the run asks;
* have recorded every release it answered (ledger rows >= answered training replies);
* claim no record-level amplification for batches the server can recompute (``noise-seed = run``,
  checked on a simulation node whose noise seed the run config sets);
* import and call no code the run config names (a marker a hostile ``model`` would write);
* refuse with the same bytes on both files (tests/test_refusal_privacy.py's property).

A declared key without a row in docs/threat-model.md's table fails here, and so does a key with
neither edge values nor an :data:`EXTRA` entry.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict

from app import wire
from app.config import Settings
from app.options import declared
from tests.helpers import refusal_bytes

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(MessageType.TRAIN)
CAP = 3.0
OPTIONS = declared(Settings)
#: the hostile values of the keys whose parser is hand-written (no ``hostile`` edges)
EXTRA: dict[str, tuple[Any, ...]] = {
    "algorithm": ("mbsgd", "localsgd", "proxsgd", "spider", "spider-alt", "svrg", "plsvrg", "robust"),
    "model": ("mlp", "logistic", "lenet5", "subprocess:call", "os.path:join"),
    "model-kwargs": ("", '{"width": 100000000}'),
    "pre-aggregators": ("", "nnm,bucketing,arc"),
    "privacy.delta": ("auto", 0.999999, 1e-300),
}


def hostile_values(key: str) -> tuple[Any, ...]:
    opt = OPTIONS[key][1]
    values = getattr(opt.parse, "hostile", None) or EXTRA.get(key)
    assert values, f"run-config key {key!r} has no hostile values: give its parser .hostile or add it to EXTRA"
    return tuple(values)


def documented_keys() -> list[str]:
    text = (ROOT / "docs" / "threat-model.md").read_text()
    section = text.split("## The run config is hostile input", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def test_every_key_has_one_row_in_the_threat_models_table() -> None:
    rows = documented_keys()
    assert sorted(rows) == sorted(OPTIONS), (
        f"docs/threat-model.md's key table: missing {sorted(set(OPTIONS) - set(rows))}, "
        f"stale {sorted(set(rows) - set(OPTIONS))}")
    assert len(rows) == len(set(rows))


def records(age0: int = 30) -> Any:
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"f1": rng.normal(size=60), "f2": rng.normal(size=60),
                       "diagnosis": np.where(rng.random(60) < 0.5, "benign", "malignant"),
                       "age": np.arange(60) % 40 + 20})
    df.loc[0, "age"] = age0
    return df


SCHEMA = json.dumps({"features": ["f1", "f2"], "label": "diagnosis", "classes": ["benign", "malignant"],
                     "ignore": ["age"]})
BASE = {"data.schema": SCHEMA, "num-silos": 2, "silos-per-round": 2, "model": "logistic", "num-rounds": 3,
        "privacy.epsilon": 1.0, "batch-size": 8, "standardize": "local", "eval-every": 1}
RUN_IDS = iter(range(10**5, 10**7))


def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"linear.weight": (rng.normal(size=(2, 2)) * 0.1).astype(np.float32),
            "linear.bias": np.zeros(2, np.float32)}


def drive(run_config: dict[str, Any], node_config: dict[str, Any]) -> tuple[list[bytes], list[bool], Any]:
    """Three training requests (each round's first phase as the algorithm plans it, with the
    folded evaluation asked) to the real ClientApp of a fresh run; returns the refusals' bytes, which
    replies were releases, and the silo object (None if it never got built)."""
    from flwr.supercore.task_identity import TaskIdentity

    from app import node_runtime
    from app.algorithms import get_algorithm
    from app.client_app import app
    from app.config import parse_settings

    run_id = next(RUN_IDS)
    ctx = Context(run_id=run_id, node_id=1, node_config=dict(node_config), state=RecordDict(),
                  run_config=dict(run_config))
    try:
        s = parse_settings(run_config)
        phases = [get_algorithm(s.algorithm).round_phases(s.algorithm_options(), r)[0] for r in (1, 2, 3)]
    except Exception:  # noqa: BLE001 - a config the launcher would refuse: a hostile server sends it anyway
        phases = [wire.Phase.GRAD] * 3
    refusals, released = [], []
    for rnd, phase in enumerate(phases, start=1):
        prev = arrays() if phase in (wire.Phase.DIFF,) else None
        content = wire.Instruction(rnd, phase, arrays(), prev=prev, local_steps=2, lr=0.1,
                                   evaluate_round=rnd - 1 if rnd > 1 else None).encode()
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 1, 0
        reply = app(Message(content, dst_node_id=1, message_type=TRAIN), ctx).content
        if wire.refusal_of(reply) is not None:
            refusals.append(refusal_bytes(reply))
        released.append(wire.refusal_of(reply) is None)
    built = [v for k, v in node_runtime._SILOS.items() if k[0] == run_id]
    return refusals, released, (built[0] if built else None)


def cases() -> list[tuple[str, Any]]:
    return [(key, value) for key in OPTIONS for value in hostile_values(key)]


@pytest.mark.slow
def test_no_hostile_value_of_any_key_lets_a_silo_spend_more_than_it_records(tmp_path: Path) -> None:
    from app.launch import merged_run_config

    marker = tmp_path / "the-server-ran-code-here"
    files = {}
    for name, age0 in (("d", 30), ("dprime", 97)):
        files[name] = tmp_path / f"{name}.csv"
        records(age0).to_csv(files[name], index=False)
    pin = tmp_path / "schema.json"  # the operator's own copy (node config data-schema)
    pin.write_text(SCHEMA)
    base = merged_run_config([]) | BASE
    scenarios = [({key: value}, f"{key}={value!r}") for key, value in cases()]
    scenarios.append(({"model": "subprocess:call", "model-kwargs": json.dumps({"args": ["touch", str(marker)]})},
                      "model=subprocess:call with model-kwargs"))
    failures: list[str] = []
    answered = 0
    for i, (over, label) in enumerate(scenarios):
        seen = {}
        for name, path in files.items():
            node = {"partition-id": 0, "num-partitions": 2, "data-file": str(path), "epsilon-cap": CAP,
                    "data-schema": str(pin), "state-dir": str(tmp_path / f"state-{name}-{i}")}
            refusals, released, silo = drive(base | over, node)
            seen[name] = (refusals, released)
            ledger = getattr(silo, "ledger", None)
            if ledger is not None:
                spent = ledger.spent()
                if not spent <= CAP * (1 + 1e-6):
                    failures.append(f"{label}: {name} spent {spent} > cap {CAP}")
                rows = sum(r.count for r in ledger.recorded() if r.kind not in ("eval", "preprocess-stats"))
                if rows < sum(released):
                    failures.append(f"{label}: {name} answered {sum(released)} releases, recorded {rows}")
                claimed = [r for r in ledger.recorded() if getattr(r, "amplification", "none") != "none"]
                if claimed and silo.s.privacy.noise_seed != "os":
                    failures.append(f"{label}: amplification claimed with noise-seed {silo.s.privacy.noise_seed}")
        if seen["d"] != seen["dprime"]:
            failures.append(f"{label}: the refusals differ between files that differ in one record")
        answered += sum(seen["d"][1])
    assert answered >= len(scenarios), f"only {answered} releases answered: the base run must train"
    assert not marker.exists(), "a model named by the run config ran code on the silo"
    assert not failures, "\n".join(failures[:20])


@pytest.mark.parametrize("over", [{"shuffle.amplification": "sampling"}, {"shuffle.amplification": "auto"},
                                  {"shuffle.amplification": "sampling", "privacy.noise-seed": "os"}])
def test_amplification_is_claimed_only_for_batches_the_server_cannot_recompute(tmp_path: Path, over) -> None:
    """A simulation node (no cap: the run config sets its noise seed) in shuffle mode: whatever
    shuffle.amplification asks, a claim comes only with OS-drawn batches."""
    from app import node_runtime
    from app.launch import merged_run_config

    cfg = merged_run_config([]) | {"privacy.mode": "shuffle", "num-silos": 2, "silos-per-round": 2, "num-rounds": 2,
                                   "partition": "iid", "model": "logistic", "privacy.delta": 1e-5,
                                   "batch-size": 8, "shuffle.count-on": 1} | over
    ctx = Context(run_id=next(RUN_IDS), node_id=1, node_config={"partition-id": 0, "num-partitions": 3,
                                                                "state-dir": str(tmp_path)},
                  state=RecordDict(), run_config=cfg)
    silo = node_runtime.silo(ctx)
    claimed = silo.s.shuffle.amplification
    assert (claimed == "sampling") == (silo.s.privacy.noise_seed == "os"), silo.amplification_why
    assert not math.isnan(silo.plan[wire.Phase.GRAD].trials)
