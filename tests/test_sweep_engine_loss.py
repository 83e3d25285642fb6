"""A sweep job whose simulation engine loses a Ray actor (a raylet, a node) in the middle of the
federation is resumed from its last checkpoint on a fresh engine, not failed (issue 35, section 3:
``ActorUnavailableError`` at round 10 of 60 failed the job). The reference for "resumed correctly"
is the same job without the loss: the same rounds, the same final numbers, the same ε per silo.

The heavier check, a raylet of a two-node Ray cluster killed by its pid, is a script:
``python -m scripts.bench.sweep_raylet_kill`` (docs/ray-cluster.md, "A node lost in the middle of a job")."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

import app.sweep as sweep
from app.checkpoint import save_checkpoint
from app.federation import EngineLost, retry_config
from app.results import load_rounds
from tests.helpers import without_wall
from tests.test_sweep import fake_federation, nested


def _losing(calls: list[dict], losses: int, key: str = "run77", round_cut: int | None = 2):
    """The stand-in engine of tests/test_sweep.py, losing its actors in the first ``losses``
    federations (after writing the checkpoint of round ``round_cut``, None: none), as
    app.federation.run_federation reports it."""
    ok = fake_federation(calls)

    def run(cfg: dict, warm: bool = True, fast=None) -> dict:
        if len(calls) < losses:
            calls.append(cfg)
            if round_cut is not None:
                out = Path(cfg["outputs-dir"]) / cfg["run-name"]
                out.mkdir(parents=True, exist_ok=True)
                save_checkpoint(out / "checkpoint.npz", {"round": round_cut, "ledger_run_key": key})
            raise EngineLost("the simulation engine lost 1 actor(s) or node(s): ActorUnavailableError: "
                             "the actor is unavailable", ledger_run_key=key, wall_s=2.0)
        return ok(cfg, warm, fast)
    return run


@pytest.fixture()
def no_engine_restart(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    restarts: list[int] = []
    monkeypatch.setattr("app.runtime.engine_patches.restart_engine", lambda: restarts.append(1))
    return restarts


def test_a_job_whose_engine_was_lost_is_resumed_from_its_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     no_engine_restart: list[int]) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", _losing(calls, losses=1))
    row = sweep.sweep_job(nested(**{"sweep.name": "t"}))
    assert row["status"] == "completed" and row["retries"] == 1 and no_engine_restart == [1]
    first, second = calls
    assert first["resume"] is False and first["ledger-run-key"] == ""
    # the second federation continues the first: its checkpoint, its silos' ledgers
    assert second["resume"] is True and second["ledger-run-key"] == "run77"
    assert second == first | {"resume": True, "ledger-run-key": "run77"}
    assert row["wall_s"] == pytest.approx(3.0, abs=0.05) and row["overhead_s"] == pytest.approx(2.8, abs=0.05)  # both attempts
    rows = list(csv.DictReader((tmp_path / "outputs/sweeps/t/results.csv").open()))
    assert len(rows) == 1 and rows[0]["status"] == "completed" and rows[0]["retries"] == "1"


def test_a_job_lost_before_its_first_checkpoint_runs_again_under_the_same_ledgers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_engine_restart: list[int]) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", _losing(calls, losses=1, round_cut=None))
    row = sweep.sweep_job(nested(**{"sweep.name": "t"}))
    assert row["status"] == "completed" and row["retries"] == 1
    assert calls[1]["resume"] is False and calls[1]["ledger-run-key"] == "run77"


def test_a_checkpoint_of_another_run_is_not_resumed(tmp_path: Path) -> None:
    """A checkpoint left in the run's folder by an earlier sweep (another ledger run key) is not
    the lost federation's: the retry starts again from round 1, under the lost one's ledgers."""
    cfg = {"outputs-dir": str(tmp_path), "run-name": "j"}
    (tmp_path / "j").mkdir()
    save_checkpoint(tmp_path / "j" / "checkpoint.npz", {"round": 4, "ledger_run_key": "run1"})
    assert retry_config(cfg, EngineLost("x", ledger_run_key="run2")) == cfg | {"ledger-run-key": "run2", "resume": False}
    assert retry_config(cfg, EngineLost("x", ledger_run_key="run1")) == cfg | {"ledger-run-key": "run1", "resume": True}
    assert retry_config(cfg, EngineLost("x")) == cfg  # lost before the ServerApp started


def test_retries_are_bounded_and_other_errors_are_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              no_engine_restart: list[int]) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", _losing(calls, losses=5))
    row = sweep.sweep_job(nested(**{"sweep.name": "t", "sweep.retries": 2}))
    assert len(calls) == 3 and row["status"] == "failed"
    assert row["error"].startswith("EngineLost: ") and "resumed 2 time(s); sweep.retries = 2" in row["error"]
    assert no_engine_restart == [1, 1]
    calls = []
    monkeypatch.setattr(sweep, "run_federation", fake_federation(calls))
    row = sweep.sweep_job(nested(**{"sweep.name": "u", "seed": 13}))  # the stand-in's ClientApp failure
    assert len(calls) == 1 and row["status"] == "failed" and row["error"] == "RuntimeError: silo exploded"
    assert no_engine_restart == [1, 1]
    row = sweep.sweep_job(nested(**{"sweep.name": "v", "sweep.retries": -1}))
    assert row["status"] == "failed" and row["error"].startswith("ConfigError: sweep.retries = -1")


def test_only_the_engines_own_losses_count() -> None:
    """Ray's errors for a lost actor, worker, raylet or node; not a ClientApp that raised (a
    RayTaskError wrapping it), nor Ray's out-of-memory kill, nor anything else."""
    import ray.exceptions as rex
    from flwr.clientapp.client_app import ClientAppException

    from app.runtime.engine_patches import is_engine_loss

    assert is_engine_loss(rex.ActorDiedError()) and is_engine_loss(rex.ActorUnavailableError("gone", b"\0" * 16))
    assert is_engine_loss(rex.NodeDiedError("node")) and is_engine_loss(rex.WorkerCrashedError())
    assert is_engine_loss(rex.LocalRayletDiedError())
    task = rex.RayTaskError("run", "tb", ClientAppException("bad data")).as_instanceof_cause()
    assert not is_engine_loss(task) and not is_engine_loss(ClientAppException("x"))
    assert not is_engine_loss(rex.OutOfMemoryError("oom")) and not is_engine_loss(RuntimeError("x"))


def test_the_servers_grid_stops_at_an_engine_loss_not_at_a_clientapp_failure() -> None:
    """EngineWatchGrid raises EngineLost once the engine recorded a loss after its mark, before the
    ServerApp sees the replies (whatever fail-on-client-error says); with none, replies pass."""
    from app.runtime import engine_patches
    from app.federation import EngineWatchGrid

    class Grid:
        def pull_messages(self, ids):
            return ["reply"]

        def push_messages(self, messages):
            return ["id"]

    mark = len(engine_patches.engine_losses())
    grid = EngineWatchGrid(Grid(), mark, "run5")
    assert grid.push_messages(["m"]) == ["id"] and grid.pull_messages(["id"]) == ["reply"]
    engine_patches._LOSSES.append("ActorUnavailableError: the actor is unavailable")
    try:
        with pytest.raises(EngineLost, match="lost 1 actor.*ActorUnavailableError") as lost:
            grid.pull_messages(["id"])
        assert lost.value.ledger_run_key == "run5"
        assert EngineWatchGrid(Grid(), mark + 1, "run6").pull_messages(["id"]) == ["reply"]  # an earlier loss
    finally:
        del engine_patches._LOSSES[mark:]


# -- the real engine: a Ray actor killed in the middle of a job --------------------------------
def _kill_the_engines_actors_after(round_: int, killed: list[str]):
    """A server-side hook (around app.server_app.progress_line, called once a round's row is
    recorded): once the row of ``round_`` is recorded, kill every ClientApp actor of the warm
    engine (ray.kill, as a lost raylet or node takes its actors), once."""
    import app.server_app as server_app
    from app.runtime import engine_patches

    line = server_app.progress_line

    def hook(row: dict, num_rounds: int) -> str:
        if int(row["round"]) == round_ and not killed:
            import ray

            for pool in engine_patches._WARM_POOLS.values():
                for actor in [*pool.pool, *pool._future_to_actor.values()]:
                    ray.kill(actor)
                    killed.append(actor._actor_id.hex())
        return line(row, num_rounds)
    return hook


@pytest.mark.slow
@pytest.mark.e2e
def test_an_actor_killed_mid_job_resumes_to_the_uninterrupted_result(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the job's row read ``failed``, ``ClientAppFailure: round 4: 2 ClientApp failure(s), the
    run is stopped (fail-on-client-error = true); first: node … (train): The actor is dead because it
    was killed by `ray.kill`.``. Now the job ends completed with retries 1 and the numbers of the
    same job run without the kill: every round row, the test error, ε per silo (about 40 s)."""
    from app.runtime.engine_patches import engine_losses, restart_engine

    monkeypatch.chdir(tmp_path)
    over = {"num-rounds": 6, "eval-every": 1}
    try:
        ref = sweep.sweep_job(nested(**over, **{"sweep.name": "ref"}))
        assert ref["status"] == "completed", ref.get("error")
        killed: list[str] = []
        mark = len(engine_losses())
        monkeypatch.setattr("app.server_app.progress_line", _kill_the_engines_actors_after(2, killed))
        row = sweep.sweep_job(nested(**over, **{"sweep.name": "cut"}))
    finally:
        restart_engine()  # this test's Ray (and its processes) ends here
    assert killed, "no actor was killed"
    assert row["status"] == "completed", row.get("error")
    assert engine_losses(mark) and row["retries"] == 1 and ref["retries"] == 0
    assert row["test_error"] == ref["test_error"] and row["eps_per_silo"] == ref["eps_per_silo"]
    assert row["rounds_done"] == ref["rounds_done"] == 6
    rows, ref_rows = (load_rounds(Path(r["run_dir"]) / "rounds.jsonl") for r in (row, ref))
    assert without_wall(rows) == without_wall(ref_rows)
    import json

    summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
    assert 1 <= summary["resumed_after_round"] < 6 and summary["status"] == "completed"
    ref_summary = json.loads((Path(ref["run_dir"]) / "summary.json").read_text())
    for silo, ref_silo in zip(summary["silos"], ref_summary["silos"], strict=True):  # no release charged twice
        assert silo["releases"] == ref_silo["releases"] and np.isclose(silo["eps_spent"], ref_silo["eps_spent"])
    results = list(csv.DictReader((tmp_path / "outputs/sweeps/cut/results.csv").open()))
    assert len(results) == 1 and results[0]["status"] == "completed" and results[0]["retries"] == "1"
