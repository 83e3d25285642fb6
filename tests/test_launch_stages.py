"""The launcher's start-up stage lines: the seconds before round 1 are not silent."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_the_launcher_prints_a_line_per_start_up_stage(capsys: pytest.CaptureFixture[str]) -> None:
    from app.launch import _Stream

    stream = ("Starting local SuperLink on 127.0.0.1:1...\nSuccessfully started run 42\nINFO : Starting logstream\n"
              "[silofl] run r1: mbsgd on wbcd (2 silos)\n[silofl] round   1/1  train loss 0.5\n"
              "INFO : silofl run r1 completed\n")
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.stdout.write({stream!r})"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reader = _Stream(proc, "r1")
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
