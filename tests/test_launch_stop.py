"""`make stop` (python -m app.launch --stop) ends this checkout's local SuperLink, by pid, and
nobody else's: two stand-in processes that look like Flower's local SuperLink (argv[0]
flower-superlink, --simulation), one started with this checkout's FLWR_HOME, one with another."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from app.launch import flower_env, local_superlinks, own_superlink_fast_poll, stop_own_superlinks


def _fake_superlink(home: Path) -> subprocess.Popen:
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    return subprocess.Popen(["bash", "-c", 'exec -a flower-superlink python3 -c "import time; time.sleep(60)" --simulation'],
                            env=env, start_new_session=True)


def test_stop_ends_only_this_checkouts_superlink(tmp_path: Path) -> None:
    env = flower_env() | {"FLWR_HOME": str(tmp_path / "mine")}
    mine, other = _fake_superlink(tmp_path / "mine"), _fake_superlink(tmp_path / "other")
    try:
        time.sleep(0.5)
        seen = local_superlinks(env)
        assert (mine.pid, str(tmp_path / "mine"), True) in seen and (other.pid, str(tmp_path / "other"), True) in seen
        assert [pid for pid, _ in own_superlink_fast_poll(env)] == [mine.pid]  # the other one is not this checkout's
        assert stop_own_superlinks(env, wait_s=5) == [mine.pid]
        assert mine.wait(timeout=5) is not None
        assert other.poll() is None  # another checkout's SuperLink is still running
    finally:
        for p in (mine, other):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
