"""The multi-host fault drill (scripts/deploy/netns_fault_drill.py) as a test: four hosts in
network namespaces, TLS + node authentication, a silo host killed and restarted, the server host
killed and the run resumed to the uninterrupted run's model. It needs root and takes about 9
minutes on 2 cores, so it runs only when asked: ``SILOFL_NETNS_DRILL=1 python -m pytest
tests/test_netns_drill.py``. The drill starts and stops everything it uses and deletes its
namespaces; this test bounds it at 30 minutes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.e2e, pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("SILOFL_NETNS_DRILL") != "1",
                                 reason="the netns fault drill runs only with SILOFL_NETNS_DRILL=1 (root, ~9 min)"),
              pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and ip netns")]


def test_the_federation_survives_a_dead_silo_host_and_a_dead_server_host(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "deploy" / "netns_fault_drill.py"),
                           "--keep", str(tmp_path / "drill")], cwd=ROOT, capture_output=True, text=True,
                          timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "node fault: PASS" in out and "server fault: PASS" in out
    assert "final model == uninterrupted run's: True" in out
