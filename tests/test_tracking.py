"""app.tracking: a run's files logged to MLflow's local file store, read back through MLflow."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")

from app import tracking  # noqa: E402

ROUNDS = [{"round": 1, "train_loss": 0.7, "test_error": 0.5, "eps_max": 0.5, "uploads_G": 1.0, "wall_s": 0.1},
          {"round": 2, "train_loss": 0.5, "eps_max": 1.0, "uploads_G": 2.0, "wall_s": 0.1, "note": "text"},
          {"round": 3, "train_loss": 0.4, "test_error": 0.2, "eps_max": 1.5, "uploads_G": 3.0, "wall_s": 0.1}]


def make_run(d: Path, name: str = "r1", status: str = "completed") -> Path:
    d.mkdir(parents=True)
    summary = {"run_name": name, "status": status, "test_error": 0.2, "test_accuracy": 0.8, "eps_max_spent": 1.5,
               "wall_s": 3.0, "config": {"algorithm": "mbsgd", "sketch": {"kind": "srht", "ratio": 0.25},
                                         "run_config": {"algorithm": "mbsgd", "privacy.epsilon": 1.5,
                                                        "sketch.ratio": 0.25, "mlp-hidden": "64"}},
               "silos": [{"silo": 0, "eps_spent": 1.5}, {"silo": 1, "eps_spent": "inf"}]}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROUNDS))
    return d


def test_a_run_is_logged_with_its_settings_metrics_per_round_and_files(tmp_path: Path) -> None:
    uri = (tmp_path / "mlruns").as_uri()
    run_dir = make_run(tmp_path / "r1")
    (tmp_path / "fig.png").write_bytes(b"\x89PNG fake")
    rid = tracking.log_run(run_dir, uri=uri, experiment="t", artifacts=[tmp_path / "fig.png"])
    client = mlflow.tracking.MlflowClient(uri)
    run = client.get_run(rid)
    assert run.data.params == {"algorithm": "mbsgd", "privacy.epsilon": "1.5", "sketch.ratio": "0.25",
                               "mlp-hidden": "64"}  # the run-config names
    assert tracking.params_of({"config": {"a": 1, "sketch": {"kind": "srht"}}}) == {"a": "1", "sketch.kind": "srht"}
    hist = client.get_metric_history(rid, "test_error")
    assert [(m.step, m.value) for m in hist] == [(1, 0.5), (3, 0.2)]  # the rounds that evaluated
    assert [m.value for m in client.get_metric_history(rid, "eps_max")] == [0.5, 1.0, 1.5]
    assert run.data.metrics["final_test_accuracy"] == 0.8 and run.data.metrics["eps_spent_silo0"] == 1.5
    assert "eps_spent_silo1" not in run.data.metrics and "note" not in run.data.metrics  # inf, text: no metric
    assert run.info.status == "FINISHED" and run.data.tags["silofl.status"] == "completed"
    assert sorted(a.path for a in client.list_artifacts(rid)) == ["fig.png", "rounds.jsonl", "summary.json"]
    assert tracking.log_run(run_dir, uri=uri, experiment="t") is None  # logged once


def test_a_sweep_logs_each_job_and_the_report(tmp_path: Path) -> None:
    uri = (tmp_path / "mlruns").as_uri()
    sweep_dir = tmp_path / "sweeps" / "s"
    make_run(sweep_dir / "runs" / "j1", "j1")
    make_run(sweep_dir / "runs" / "j2", "j2", status="diverged")
    with (sweep_dir / "results.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, ["job", "status", "run_dir"])
        w.writeheader()
        w.writerows([{"job": "j1", "status": "completed", "run_dir": "elsewhere/j1"},
                      {"job": "j2", "status": "diverged", "run_dir": "elsewhere/j2"},
                      {"job": "j3", "status": "failed", "run_dir": ""}])
    (sweep_dir / "results.md").write_text("| table |")
    assert tracking.main([str(sweep_dir), "--uri", uri]) == 0
    client = mlflow.tracking.MlflowClient(uri)
    exp = client.get_experiment_by_name("silofl/s")
    runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"j1", "j2", "s/report"}
    assert runs["j2"].info.status == "FAILED" and runs["j1"].data.tags["silofl.job"] == "j1"
    assert [a.path for a in client.list_artifacts(runs["s/report"].info.run_id)] == ["results.md"]


def test_the_environment_key_turns_tracking_on_and_a_broken_tracker_is_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = make_run(tmp_path / "r1")
    monkeypatch.delenv(tracking.TRACKING_ENV, raising=False)
    assert tracking.track_from_env(run_dir) is None  # off by default
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv(tracking.TRACKING_ENV, "mlflow")
    rid = tracking.track_from_env(run_dir)
    assert mlflow.tracking.MlflowClient((tmp_path / "mlruns").as_uri()).get_run(rid).data.params["algorithm"] == "mbsgd"
    monkeypatch.setenv(tracking.TRACKING_ENV, "wandb")
    assert tracking.track_from_env(run_dir) is None
    assert "not tracked: TrackingError: SILOFL_TRACKING = 'wandb'; allowed: none, mlflow" in capsys.readouterr().err


@pytest.fixture
def http_env(monkeypatch: pytest.MonkeyPatch):
    """MLflow's http settings as the user left them (unset), restored after the test; no store
    skipped from an earlier test."""
    for key in [*tracking.HTTP_ENV, tracking.DEADLINE_ENV, "MLFLOW_TRACKING_URI"]:
        monkeypatch.setenv(key, "x")  # recorded, so that teardown restores the original state
        monkeypatch.delenv(key)
    monkeypatch.setattr(tracking, "_GAVE_UP", {})
    return monkeypatch


def test_a_store_that_refuses_connections_costs_seconds_not_minutes(tmp_path: Path, http_env, capsys) -> None:
    """An http store on 127.0.0.1 that refuses every connection (nothing listens on the port).
    Before: MLflow's defaults (7 retries, backoff factor 2) held the run >= 90 s, and a sweep
    paid it after every job. Now: one retry without backoff, one line, and the next run of the
    process skips the store at once."""
    import socket
    import time

    with socket.socket() as s:  # a free port, closed again: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = make_run(tmp_path / "r1")
    t0 = time.monotonic()
    assert tracking.track_from_env(run_dir, kind="mlflow", uri=f"http://127.0.0.1:{port}") is None
    assert time.monotonic() - t0 < 15
    err = capsys.readouterr().err
    assert "r1: not tracked:" in err and f"python -m app.tracking {run_dir}" in err and len(err.splitlines()) == 1
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == str(tracking.HTTP_RETRIES)
    t0 = time.monotonic()
    assert tracking.track_from_env(make_run(tmp_path / "r2"), kind="mlflow", uri=f"http://127.0.0.1:{port}") is None
    assert time.monotonic() - t0 < 0.5 and "failed (" in capsys.readouterr().err


def test_a_store_that_accepts_and_never_answers_is_given_up_at_the_deadline(tmp_path: Path, http_env,
                                                                           capsys) -> None:
    """An http store on 127.0.0.1 that accepts connections (the kernel's backlog) and never
    answers: the run waits at most SILOFL_TRACKING_TIMEOUT_S (2 s here), then goes on; the
    logging thread is a daemon, so it never holds the process. Before: >= 90 s in line."""
    import socket
    import threading
    import time

    http_env.setenv(tracking.DEADLINE_ENV, "2")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)  # never accept()ed, never answered
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        t0 = time.monotonic()
        assert tracking.track_from_env(make_run(tmp_path / "r1"), kind="mlflow", uri=uri) is None
        assert time.monotonic() - t0 < 5
        assert "did not finish within 2 s (SILOFL_TRACKING_TIMEOUT_S)" in capsys.readouterr().err
        t0 = time.monotonic()
        assert tracking.track_from_env(make_run(tmp_path / "r2"), kind="mlflow", uri=uri) is None
        assert time.monotonic() - t0 < 0.5
        left = [t for t in threading.enumerate() if t.name == "silofl-tracking-r1"]
        assert left and left[0].daemon  # still waiting on the silent store, and never holds the exit
