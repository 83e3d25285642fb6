"""The launcher's start and end (issue 14): it names the run as the ServerApp does without
importing it (torch), and decides from the run's own summary.json (this Flower run id, its
status) as soon as the ServerApp's last line is streamed, ending the ``flwr run`` log stream
itself. Stand-in ``flwr run`` processes here; the real one in tests/test_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from app import launch

ROOT = Path(__file__).resolve().parent.parent


def test_the_launcher_and_the_server_app_name_a_run_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """One function names the run for both (the launcher must know the folder summary.json goes
    to); its name is the documented pattern."""
    import app.results as results
    import app.server_app as server_app
    from app.config import parse_settings

    assert server_app.run_name is results.run_name
    fixed = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):  # noqa: ANN001
            return fixed

    monkeypatch.setattr("datetime.datetime", Frozen)
    s = parse_settings(launch.default_run_config() | {"privacy.epsilon": 0.75, "seed": 3})
    assert results.run_name(s, 1234567) == "20260102-030405-mbsgd-wbcd-eps0.75-seed3-34567"
    s = parse_settings(launch.default_run_config() | {"privacy.mode": "off"})
    assert results.run_name(s, 7).endswith("-epsinf-seed0-00007")
    assert results.run_name(parse_settings(launch.default_run_config() | {"run-name": "mine"}), 1) == "mine"


def test_the_launcher_does_not_import_the_server_app() -> None:
    code = "import sys, app.launch; print('app.server_app' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


def _fake_flwr_run(tmp: Path, summary: dict | None, last: str, linger: float = 60.0, run_id: str = "42") -> subprocess.Popen:
    """Prints as ``flwr run --stream`` does, writes ``summary``, prints ``last``, then streams on
    (as Flower's does while it tears the engine down) for ``linger`` seconds."""
    script = textwrap.dedent(f"""
        import json, sys, time
        print("Successfully started run {run_id}", flush=True)
        print("[silofl] round   1/1  ...", flush=True)
        summary = {summary!r}
        if summary is not None:
            (__import__("pathlib").Path({str(tmp / "summary.json")!r})).write_text(json.dumps(summary))
        print({last!r}, flush=True)
        time.sleep({linger})
    """)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_ends_when_the_summary_and_last_line_are_there(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    proc = _fake_flwr_run(tmp_path, {"run_id": 42, "status": "completed"}, "INFO : silofl run r1 completed")
    t0 = time.perf_counter()
    rc, run_id, summary = launch.follow_run(proc, "r1", tmp_path / "summary.json")
    assert time.perf_counter() - t0 < 20 and proc.poll() is not None  # the stream was ended here
    assert (rc, run_id, summary) == (None, "42", {"run_id": 42, "status": "completed"})
    assert "silofl run r1 completed" in capsys.readouterr().out  # echoed


def test_a_failed_summary_is_returned(tmp_path: Path) -> None:
    proc = _fake_flwr_run(tmp_path, {"run_id": 42, "status": "failed", "status_reason": "x"}, "[silofl] run FAILED: x")
    rc, run_id, summary = launch.follow_run(proc, "r1", tmp_path / "summary.json")
    assert summary is not None and summary["status"] == "failed"


def test_another_runs_summary_is_not_this_runs(tmp_path: Path) -> None:
    """A resumed run's folder holds the summary of the attempt before: not this run's."""
    (tmp_path / "summary.json").write_text(json.dumps({"run_id": 7, "status": "failed"}))
    proc = _fake_flwr_run(tmp_path, None, "INFO : something else", linger=1.0)
    rc, run_id, summary = launch.follow_run(proc, "r1", tmp_path / "summary.json")
    assert (rc, run_id, summary) == (0, "42", None)  # waited for the stream to end; no summary of run 42


def test_the_summary_without_its_last_line_ends_the_wait_after_tail_s(tmp_path: Path) -> None:
    proc = _fake_flwr_run(tmp_path, {"run_id": 42, "status": "completed"}, "INFO : (line lost)")
    t0 = time.perf_counter()
    rc, _, summary = launch.follow_run(proc, "r1", tmp_path / "summary.json", tail_s=0.5)
    assert rc is None and summary is not None and time.perf_counter() - t0 < 20


def test_an_unhealthy_runs_last_line_ends_the_wait(tmp_path: Path) -> None:
    """A diverged (or no-progress) run's ServerApp ends with ``silofl run NAME diverged``: the
    launcher stops on that line, not after tail_s."""
    proc = _fake_flwr_run(tmp_path, {"run_id": 42, "status": "diverged"}, "INFO : silofl run r1 diverged")
    t0 = time.perf_counter()
    rc, _, summary = launch.follow_run(proc, "r1", tmp_path / "summary.json", tail_s=30)
    assert rc is None and summary is not None and summary["status"] == "diverged"
    assert time.perf_counter() - t0 < 20
