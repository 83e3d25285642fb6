"""Hydra sweeps: job rows, failures, resume, validation-split selection, reports."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import app.sweep as sweep
from app import report
from app.federation import engine_backend_config
from app.launch import default_run_config

ROOT = Path(__file__).resolve().parent.parent


def nested(**over) -> dict:
    """A composed config as Hydra hands it to a job (nested keys, plus the sweep node), on
    Flower's engine (``sweep.engine=flower``: the tests here stand in for it with fake_federation)
    unless ``over`` names another."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    over = {"sweep.engine": "flower"} | over
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"{k}={v}" for k, v in over.items()])
    return OmegaConf.to_container(cfg, resolve=True)


def fake_federation(calls: list[dict]):
    """Stands in for the engine: validation error falls with lr, test error is 0.1 + lr / 10."""
    def run(cfg: dict, warm: bool = True, fast=None, **_) -> dict:
        calls.append(cfg)
        if cfg["seed"] == 13:
            raise RuntimeError("silo exploded")
        lr = float(cfg["lr"])
        rows = [{"round": 1, "wall_s": 0.1, "test_error": 0.5, "uploads_G": 2.0},
                {"round": 2, "wall_s": 0.1, "test_error": 0.1 + lr / 10, "uploads_G": 4.0}]
        return {"status": "completed", "test_error": 0.1 + lr / 10, "test_accuracy": 0.9 - lr / 10,
                "val_error": 1.0 / lr if cfg.get("validation-fraction") else None, "eps_max_spent": 3.0,
                "silos": [{"eps_spent": 3.0}, {"eps_spent": 2.9}], "rounds_rows": rows, "wall_s": 1.0,
                "overhead_s": 0.8, "run_dir": "x", "client_errors": []}
    return run


def test_grid_selection_uses_validation_error_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", fake_federation(calls))
    cfg = nested(**{"sweep.tuning": "grid", "+sweep.grid.lr": "[0.1,0.5,2.0]", "sweep.name": "t"})
    row = sweep.sweep_job(cfg)
    assert len(calls) == 3 and all(c["validation-fraction"] == 0.2 for c in calls)
    assert row["selected"] == {"lr": 2.0} and row["lr"] == 2.0  # lowest validation error (1/lr)
    assert row["test_error"] == pytest.approx(0.1 + 2.0 / 10)  # the selected point's test error
    assert row["best_test_error"] == pytest.approx(0.3) and row["eps_per_silo"] == [3.0, 2.9]


def test_failed_job_is_recorded_and_resume_skips_completed_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", fake_federation(calls))
    ok, bad, invalid = nested(seed=1), nested(seed=13), nested(**{"num-rounds": 0})
    assert sweep.sweep_job(ok)["status"] == "completed"
    assert sweep.sweep_job(bad)["status"] == "failed"
    assert sweep.sweep_job(invalid)["status"] == "failed"  # a config error is a failed job, not a crash
    rows = list(csv.DictReader((tmp_path / "outputs/sweeps/default/results.csv").open()))
    assert [r["status"] for r in rows] == ["completed", "failed", "failed"]
    assert "silo exploded" in rows[1]["error"] and "num-rounds = 0 is out of range" in rows[2]["error"]
    assert set(default_run_config()) <= set(rows[0])  # every setting is a column
    n = len(calls)
    assert sweep.sweep_job(ok)["status"] == "skipped" and len(calls) == n  # resume
    sweep.sweep_job(bad)  # failed jobs run again
    assert len(calls) == n + 1


def test_results_written_by_another_version_keep_their_columns(tmp_path: Path) -> None:
    """A results.csv whose header lacks an option added since (or holds one removed) is rewritten
    under the union of the headers before the row is appended: before, the new row's values
    landed under the old header's names, shifted by one column from the new option on."""
    path = tmp_path / "results.csv"
    old = sweep.ResultsFile(path)
    old.fields = [f for f in old.fields if f != "seed"] + ["retired-option"]
    old.append({"job": "a", "status": "completed", "test_error": 0.25, "lr": 0.1, "retired-option": "x"})
    sweep.ResultsFile(path).append({"job": "b", "status": "completed", "test_error": 0.5, "lr": 0.3, "seed": 7})
    rows = sweep.ResultsFile(path).rows()
    assert [(r["job"], r["test_error"], r["lr"], r["seed"], r["retired-option"]) for r in rows] == [
        ("a", "0.25", "0.1", "", "x"), ("b", "0.5", "0.3", "7", "")]


def test_report_tables_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("pandas", reason="app.report needs pandas (pyproject dependency; pip install pandas)")
    fields = sweep.ResultsFile(tmp_path / "results.csv")
    for algo, eps, seed, err in [("mbsgd", 1.5, 0, 0.10), ("mbsgd", 1.5, 1, 0.20), ("spider", 1.5, 0, 0.30),
                                 ("mbsgd", 3.0, 0, 0.05)]:
        fields.append({"job": f"{algo}{eps}{seed}", "status": "completed", "algorithm": algo, "privacy.epsilon": eps,
                       "privacy.mode": "isrl", "seed": seed, "test_error": err, "sketch.kind": "none", "overhead_s": 2.0})
    fields.append({"job": "off", "status": "completed", "algorithm": "mbsgd", "privacy.epsilon": 3.0,
                   "privacy.mode": "off", "seed": 0, "test_error": 0.02, "sketch.kind": "none"})
    fields.append({"job": "f", "status": "failed", "algorithm": "spider", "privacy.epsilon": 3.0, "error": "boom"})
    report.main([str(tmp_path)])
    md = (tmp_path / "results.md").read_text()
    assert "| algorithm | ε = 1.5 | ε = 3 | ε = ∞ |" in md  # privacy off is ε = ∞
    assert "| mbsgd | 15.00% ± 7.07% (n=2) | 5.00% (n=1) | 2.00% (n=1) |" in md
    assert "| spider | 30.00% (n=1) | n/a | n/a |" in md and "boom" in md
    assert (tmp_path / "error_vs_epsilon.png").stat().st_size > 1000


@pytest.mark.e2e
def test_hydra_multirun_on_the_simulation_engine(tmp_path: Path) -> None:
    """`python -m app.sweep -m` with two jobs on Flower's simulation engine: two rows, each a
    completed federation within its budget; a second run resumes (skips both)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "app.sweep", "-m", "experiment=smoke", "sweep.name=e2e", "num-rounds=2",
           "sweep.engine=flower"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader((tmp_path / "outputs/sweeps/e2e/results.csv").open()))
    assert [r["status"] for r in rows] == ["completed", "completed"]
    assert sorted(float(r["privacy.epsilon"]) for r in rows) == [1.5, 3.0]
    for r in rows:
        assert max(json.loads(r["eps_per_silo"])) <= float(r["privacy.epsilon"]) and float(r["test_error"]) < 0.4
    again = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert again.stdout.count("already has a result") == 2 and again.returncode == 0


def test_the_simulation_client_app_answers_every_query_the_server_sends(tmp_path: Path) -> None:
    """The sweep wraps silofl's ClientApp; a query it does not forward would be an error reply
    (e.g. no identity answer: the attack harness would silently mark no silo Byzantine)."""
    from flwr.app import Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from app import wire
    from app.launch import merged_run_config
    from app.federation import simulation_apps

    cfg = merged_run_config([]) | {"outputs-dir": str(tmp_path / "o")}
    _, client = simulation_apps(cfg)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 7, 0
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 1, "num-partitions": 2,
                                                        "state-dir": str(tmp_path / "s")},
                      state=RecordDict(), run_config={})
    replies = {kind: client(Message(RecordDict(), dst_node_id=7, message_type=kind), context)
               for kind in (wire.LEDGER_QUERY, wire.IDENTITY_QUERY)}
    assert not any(r.has_error() for r in replies.values())
    assert wire.read_identity(replies[wire.IDENTITY_QUERY].content, 2) == 1
    assert wire.read_ledger(replies[wire.LEDGER_QUERY].content)["silo"] == 1


def test_an_unhealthy_job_is_a_result_kept_on_resume_and_listed_in_the_report(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A diverged run ran to its end: its row keeps the status and the hint (``error``), resume does
    not run it again (it would diverge again), and the report counts it in its table and lists it."""
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []

    def diverging(cfg: dict, warm: bool = True, fast=None) -> dict:
        calls.append(cfg)
        rows = [{"round": 1, "wall_s": 0.1, "test_error": 0.6, "uploads_G": 1.0}]
        return {"status": "diverged", "status_reason": "diverged: the loss grew; most likely lr=50 is too large",
                "test_error": 0.6, "test_accuracy": 0.4, "rounds_rows": rows, "wall_s": 1.0, "overhead_s": 0.5,
                "run_dir": "x", "client_errors": [], "silos": []}

    pytest.importorskip("pandas", reason="app.report needs pandas (pyproject dependency; pip install pandas)")
    monkeypatch.setattr(sweep, "run_federation", diverging)
    job = nested(lr=50.0, **{"sweep.name": "h"})
    row = sweep.sweep_job(job)
    assert row["status"] == "diverged" and "lr=50 is too large" in row["error"]
    assert sweep.sweep_job(job)["status"] == "skipped" and len(calls) == 1
    report.main([str(tmp_path / "outputs/sweeps/h")])
    md = (tmp_path / "outputs/sweeps/h/results.md").read_text()
    assert "| all | 60.00% (n=1; 1 diverged) |" in md and "Jobs: 1 (0 failed, 1 diverged)" in md
    assert "- diverged job" in md and "lr=50 is too large" in md


def run_sweep_main(args: list[str], tmp_path: Path, fake: bool = True) -> subprocess.CompletedProcess:
    """``python -m app.sweep ARGS`` in a child process (Hydra's basic launcher); ``fake``: the
    engine stood in for by fake_federation."""
    code = ("import sys, app.sweep as s, tests.test_sweep as t\n"
            + ("s.run_federation = s.run_in_process = t.fake_federation([])\n" if fake else "") + "sys.exit(s.main())")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-c", code, *args, "sweep.name=t"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_sketch_ratio_without_a_sketch_is_refused_in_one_line_and_the_sweep_exits_1(tmp_path: Path) -> None:
    """Before: two identical federations (kind none) under two k/n values, exit 0."""
    proc = run_sweep_main(["-m", "sketch.ratio=0.1,0.5"], tmp_path)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 1
    assert err.count("config error: sketch.ratio = 0.1 is set but sketch.kind = 'none'") == 1
    assert "Traceback" not in out + err and "nan" not in out
    assert "[sweep] done: 2 jobs (2 failed)" in out
    assert err.count("[sweep] FAILED job") == 2 and "(sketch.ratio=0.5 sweep.name=t):" in err
    rows = list(csv.DictReader((tmp_path / "outputs/sweeps/t/results.csv").open()))
    assert [r["status"] for r in rows] == ["failed", "failed"]


def test_a_sweep_with_a_sketch_reports_progress_and_exits_0(tmp_path: Path) -> None:
    proc = run_sweep_main(["-m", "sketch=srht", "sketch.ratio=0.1,0.5", "seed=0,1"], tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[sweep] progress 1/4 jobs: 1 ran to their end, 0 failed, 0 skipped" in out and "ETA" in out
    assert "[sweep] progress 4/4 jobs" in out and "[sweep] done: 4 jobs (4 completed)" in out
    rows = list(csv.DictReader((tmp_path / "outputs/sweeps/t/results.csv").open()))
    assert sorted(float(r["sketch.ratio"]) for r in rows) == [0.1, 0.1, 0.5, 0.5]


def test_a_bad_value_inside_a_sweep_is_the_one_line_config_error(tmp_path: Path) -> None:
    """Before: a traceback for the bad job, and the sweep exited 0."""
    proc = run_sweep_main(["-m", "privacy.epsilon=1,-3"], tmp_path)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out + err
    assert "config error: privacy.epsilon = -3" in err
    assert "[sweep] done: 2 jobs (1 completed, 1 failed)" in out
    assert "FAILED job" in err and "(privacy.epsilon=-3 sweep.name=t):" in err


def test_every_run_config_dataset_name_is_a_hydra_dataset_option() -> None:
    """Hydra's `dataset=NAME` takes the run config's names (fashion-mnist, ...); fmnist-iid and
    fmnist-pairs stay as named setups of fashion-mnist."""
    from app.config import DATASETS

    for name in DATASETS:
        assert nested(dataset=name)["dataset"] == name
    flat = sweep.flatten_run_config
    assert flat(nested(dataset="fmnist-iid")) == flat(nested(dataset="fashion-mnist"))
    pairs = flat(nested(dataset="fmnist-pairs"))
    assert (pairs["dataset"], pairs["partition"], pairs["num-silos"]) == ("fashion-mnist", "even-odd-pairs", 25)


def test_the_engine_joins_an_existing_ray_cluster_and_takes_its_resources(monkeypatch: pytest.MonkeyPatch) -> None:
    """Local: Ray starts with min(CPUs, silos) CPUs. With a cluster address (sweep.ray-address or
    RAY_ADDRESS) Ray is joined with no CPU count of ours (ray.init refuses num_cpus then, and Flower
    sizes its actor pool from every node's CPUs); per-actor resources come from the sweep."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    local = engine_backend_config(3)
    assert local["init_args"] == {"address": "local", "num_cpus": min(os.cpu_count() or 1, 3)}  # a Ray of its own
    assert local["client_resources"] == {"num_cpus": 1.0, "num_gpus": 0.0}
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert engine_backend_config(3)["init_args"] == {"address": "10.0.0.5:6379"}
    cfg = engine_backend_config(3, {"ray-address": "auto", "client-cpus": 2, "client-gpus": 0.5})
    assert cfg == {"client_resources": {"num_cpus": 2.0, "num_gpus": 0.5}, "init_args": {"address": "auto"}}
    with pytest.raises(sweep.ConfigError, match="client-cpus"):
        engine_backend_config(3, {"client-cpus": -1})


def test_jobs_that_differ_only_in_settings_that_do_not_act_run_once(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """privacy=off with ε = 1, 3: one federation; the second job's row repeats it and says so.
    The report then counts that seed once, at ε = ∞."""
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", fake_federation(calls))
    rows = [sweep.sweep_job(nested(**{"privacy": "off", "privacy.epsilon": e, "sweep.name": "d"})) for e in (1, 3)]
    rows.append(sweep.sweep_job(nested(**{"privacy.epsilon": 3, "sweep.name": "d"})))  # private: runs
    assert len(calls) == 2 and [r["status"] for r in rows] == ["completed"] * 3
    assert rows[1]["error"] == f"same federation as job {rows[0]['job']}"
    assert float(rows[1]["test_error"]) == rows[0]["test_error"]
    assert sweep.sweep_job(nested(**{"privacy": "off", "privacy.epsilon": 3, "sweep.name": "d"}))["status"] == "skipped"
    pytest.importorskip("pandas")
    md = report.GridReport.build(report.load_rows(tmp_path / "outputs/sweeps/d"), tmp_path).markdown()
    assert "| ε = 3 | ε = ∞ |" in md and "| all | 15.00% (n=1) | 15.00% (n=1) |" in md
    assert "1 job(s) repeat another's settings" in md


def test_a_job_is_tracked_through_the_one_tracking_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """sweep.tracking (over SILOFL_TRACKING) logs a finished job's run to silofl/<sweep.name> with its
    job id, through app.tracking's hook (the one app.launch uses); a failed job is not logged; a bad
    value is one warning line naming sweep.tracking. MLflow itself is stood in for (optional extra)."""
    from app import tracking

    logged: list[tuple] = []
    monkeypatch.setattr(tracking, "log_run", lambda run_dir, **kw: logged.append((run_dir, kw)) or "rid")
    monkeypatch.setenv(tracking.TRACKING_ENV, "none")
    cfg = {"tracking": "mlflow", "tracking-uri": "file:///tmp/x", "name": "s"}
    sweep.track({"job": "j1", "status": "failed", "run_dir": "runs/j1"}, cfg)
    sweep.track({"job": "j1", "status": "completed", "run_dir": "runs/j1"}, cfg | {"tracking": None})  # env: none
    assert logged == []
    sweep.track({"job": "j1", "status": "diverged", "run_dir": "runs/j1"}, cfg)
    assert logged == [("runs/j1", {"experiment": "silofl/s", "uri": "file:///tmp/x", "tags": {"silofl.job": "j1"}})]
    sweep.track({"job": "j1", "status": "completed", "run_dir": "runs/j1"}, cfg | {"tracking": "wandb"})
    assert "j1: not tracked: TrackingError: sweep.tracking = 'wandb'; allowed: none, mlflow" in capsys.readouterr().err
    assert len(logged) == 1


def test_flower_still_offers_no_supported_in_process_simulation() -> None:
    """Why sweeps call the deprecated run_simulation (app/federation.py, docs/configuration.md):
    in the installed Flower it is still there and still deprecated in favour of `flwr run`, and
    flwr.simulation's other public entries are no in-process runtime (run_simulation_process needs
    a SuperLink's Runtime API address and token; start_simulation is the legacy strategy API).
    When this fails, Flower has changed: look again for a supported in-process path."""
    import inspect

    import flwr.simulation as fs

    assert set(fs.__all__) == {"SimulationIoConnection", "run_simulation", "run_simulation_process",
                               "start_simulation"}
    source = inspect.getsource(fs.run_simulation)
    assert "warn_deprecated_feature(" in source and "use `flwr run`" in source
    params = inspect.signature(fs.run_simulation_process).parameters
    assert {"runtime_api_address", "token"} <= set(params)


def test_a_row_cut_by_a_kill_is_set_aside_not_glued_to_the_next_job(tmp_path: Path, capsys) -> None:
    """A job killed (or a disk filled) part-way through its row's write leaves a file that does
    not end in a newline. Before: the next job's row was glued onto the cut one, so that job was
    lost and the cut row read as `completed` with the other job's tail. Now the cut row is moved
    to results.csv.partial (its job counts as not run), and each row is one line in one write."""
    path = tmp_path / "results.csv"
    results = sweep.ResultsFile(path)
    results.append({"job": "a", "status": "completed", "test_error": 0.25, "lr": 0.1})
    results.append({"job": "b", "status": "completed", "test_error": 0.5, "lr": 0.2})
    whole = path.read_bytes()
    cut = whole[: whole.rindex(b"0.2")]  # job b's row cut after its status and before its lr
    path.write_bytes(cut)
    assert sweep.ResultsFile(path).rows()[-1]["job"] == "a"  # a cut row is not a row
    assert not sweep.ResultsFile(path).completed("b")  # so job b runs again on resume
    sweep.ResultsFile(path).append({"job": "c", "status": "failed", "error": "boom\nline two", "lr": 0.3})
    assert "ended in a cut row" in capsys.readouterr().err
    rows = sweep.ResultsFile(path).rows()
    assert [(r["job"], r["status"], r["lr"], r["error"]) for r in rows] == [
        ("a", "completed", "0.1", ""), ("c", "failed", "0.3", "boom line two")]
    assert (tmp_path / "results.csv.partial").read_bytes() == cut[cut.rindex(b"\n") + 1:] + b"\n"
    assert path.read_bytes().endswith(b"\r\n") and path.read_bytes().count(b"\n") == 3  # header + 2 rows
    path.write_bytes(path.read_bytes()[:40])  # even the header cut: the file starts again
    sweep.ResultsFile(path).append({"job": "d", "status": "completed", "lr": 0.4})
    assert [r["job"] for r in sweep.ResultsFile(path).rows()] == ["d"]


def test_a_split_the_data_cannot_make_is_a_one_line_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys) -> None:
    """`num-silos=4` on WBCD (by-label partition, 2 classes): the job is refused in one line by the
    launcher's pre-flight before the engine starts. Before, the engine's ServerApp raised
    ValueError inside the federation and the sweep printed tracebacks."""
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", fake_federation(calls))
    row = sweep.sweep_job(nested(dataset="wbcd", **{"num-silos": 4}))
    err = capsys.readouterr().err
    assert row["status"] == "failed" and calls == []
    assert row["error"].startswith("ConfigError: ValueError: num_silos=4; by-label partition needs num_silos in [1, 2]")
    assert "Traceback" not in err and "config error: ValueError: num_silos=4" in err
