"""A Flower user's own app on silofl (docs/examples/own-app, docs/flower-library.md): its own
pyproject.toml declaring none of silofl's run-config keys, a ServerApp that builds
``FedProxSPIDER(..., aggregator=GradBANT(...))`` from constructor arguments alone, and a ClientApp
of ``PrivateSilo`` on each hospital's own records, one of them poisoned (labels flipped)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from app.config import SCHEMA

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "own-app"


def _run_config() -> dict:
    return tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_the_own_app_declares_none_of_silofls_keys() -> None:
    assert _run_config() and not set(_run_config()) & set(SCHEMA)


def test_the_own_app_runs_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Its ServerApp and ClientApp, as written (but for run-seeded noise, so that the run is
    reproducible), on the in-process grid: every silo answers every round, the poisoned hospital
    (partition 3) gets Grad-BANT weight 0 in every anchor round and the least weight in all,
    each silo spends at most its own epsilon, and the model learns on the server's held-out
    records."""
    from flwr.app import Context, RecordDict

    from app.local_grid import InProcessGrid

    monkeypatch.syspath_prepend(str(EXAMPLE))
    from own_app import client_app, server_app, task

    # reproducible: run-seeded noise and batches (the example, as a user runs it, draws them from the OS)
    monkeypatch.setattr(client_app.silo, "policy_keys", {"noise-seed": "run"})
    cfg = _run_config()
    grid = InProcessGrid(cfg, task.SILOS, str(tmp_path), run_id=1, client=client_app.app)
    server_app.app._main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    out = capsys.readouterr().out
    weights = [line for line in out.splitlines() if "Grad-BANT weights" in line]
    assert len(weights) == cfg["num-server-rounds"] and all("answered 4" in line for line in weights)
    # in-process the weights are keyed by partition; the anchors (full-gradient releases) single the
    # poisoned hospital out every time, the difference releases (4L/K noise) not always
    assert all(f"{task.POISONED}: 0.0}}" in line for line in weights if "anchor" in line), weights
    totals = [0.0] * task.SILOS
    for line in weights:
        for part, weight in ast.literal_eval(line.split("weights ", 1)[1]).items():
            totals[part] += weight
    assert totals[task.POISONED] < min(w for i, w in enumerate(totals) if i != task.POISONED), totals
    accuracy = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "server test accuracy" in line]
    assert accuracy[-1] >= 0.85 > accuracy[0], accuracy
    for partition in range(task.SILOS):
        ledger = client_app.silo.silo(grid.contexts[grid.node_ids[partition]]).ledger
        assert 2.9 < ledger.spent() <= task.EPSILON


@pytest.mark.e2e
def test_the_own_app_runs_with_flwr_run(tmp_path: Path) -> None:
    """``flwr run .`` in the example's folder, as docs/flower-library.md says, with its own
    FLWR_HOME; the local SuperLink Flower starts is stopped here, by pid."""
    from app.runtime.local_superlink import stop_own_superlinks

    env = os.environ | {"FLWR_HOME": str(tmp_path / "flwr"), "FLWR_TELEMETRY_ENABLED": "0",
                        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "OMP_NUM_THREADS": "1",
                        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    (tmp_path / "flwr").mkdir()
    try:
        proc = subprocess.run(["flwr", "run", ".", "--stream", "--federation-config", "num-supernodes=4"],
                              cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=240)
    finally:
        stop_own_superlinks(env)
    out = proc.stdout + proc.stderr
    rounds = [line for line in out.splitlines() if "Grad-BANT weights" in line]
    assert proc.returncode == 0 and len(rounds) == 6 and all("answered 4" in line for line in rounds), out[-3000:]
    accuracy = [float(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "server test accuracy" in line]
    assert len(accuracy) == 7 and accuracy[-1] > accuracy[0], out[-3000:]
