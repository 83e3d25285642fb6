"""The launcher's start-up stage lines: the seconds before round 1 are not silent."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_launcher_prints_a_line_per_start_up_stage(capsys: pytest.CaptureFixture[str]) -> None:
    from app.runtime.flwr_run import RunStream

    stream = ("Starting local SuperLink on 127.0.0.1:1...\nSuccessfully started run 42\nINFO : Starting logstream\n"
              "[silofl] run r1: mbsgd on wbcd (2 silos)\n[silofl] round   1/1  train loss 0.5\n"
              "INFO : silofl run r1 completed\n")
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdout.write({stream!r})"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = RunStream(proc, "r1")
    proc.wait(timeout=30)
    reader.thread.join(timeout=10)
    out = capsys.readouterr().out
    stages = [line for line in out.splitlines() if line.startswith("[silofl] stage +")]
    assert len(stages) == 2, out
    assert "run 42 accepted by the SuperLink" in stages[0] and "ServerApp running" in stages[1]
    lines = out.splitlines()
    assert lines.index(stages[0]) == lines.index("Successfully started run 42") + 1
    assert lines.index(stages[1]) == lines.index("[silofl] run r1: mbsgd on wbcd (2 silos)") + 1
    assert reader.run_id == "42" and reader.last_line.is_set()


def test_a_run_on_a_named_superlink_does_not_announce_the_simulation_engine(capsys) -> None:
    """`python -m app.launch --superlink NAME` (a deployment's SuperLink): the stage lines name
    the ServerApp and the SuperNodes, not Ray. Before: a deployed run printed `starting the
    simulation engine (Ray)`, which it never starts."""
    from app.runtime.flwr_run import RunStream

    stream = "Successfully started run 7\n[silofl] run r1: mbsgd on wbcd (2 silos)\nINFO : silofl run r1 completed\n"
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdout.write({stream!r})"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = RunStream(proc, "r1", simulation=False)
    proc.wait(timeout=30)
    reader.thread.join(timeout=10)
    stages = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[silofl] stage +")]
    assert len(stages) == 2 and "starting the ServerApp" in stages[0] and "the SuperNodes run" in stages[1]
    assert not any("simulation engine" in s or "Ray" in s for s in stages)


def test_the_launcher_tells_the_stream_whether_it_runs_a_simulation(monkeypatch, tmp_path) -> None:
    """python -m app.launch --superlink NAME follows its run as a deployment's (no Ray line); the
    `flwr run` it would start and the stream it would follow are stood in for."""
    import app.launch as launch

    seen = {}

    def follow(proc, name, summary_path, **kw):
        seen.update(kw)
        return 1, None, None  # "flwr run failed": main returns 1 before anything else

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(launch, "follow_run", follow)
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: None)
    assert launch.main(["--superlink", "hospitals", "--no-preflight",
                        "--run-config", f"outputs-dir='{tmp_path / 'out'}'"]) == 1
    assert seen == {"simulation": False}
