"""`make stop` (python -m app.launch --stop) ends this checkout's local SuperLink, by pid, and
nobody else's: two stand-in processes that look like Flower's local SuperLink (argv[0]
flower-superlink, --simulation), one started with this checkout's FLWR_HOME, one with another;
then the same with a detached child each (as a run's processes are), which goes with its own
SuperLink only."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from app.launch import flower_env, stop_own_superlinks
from app.runtime.local_superlink import local_superlinks, own_superlink_fast_poll


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


def _fake_superlink_with_run(home: Path) -> subprocess.Popen:
    """A stand-in SuperLink of ``home`` with a detached child (as SuperExec and a run's
    flwr-simulation are: a session of their own, the same FLWR_HOME)."""
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "time.sleep(60)")
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    return subprocess.Popen(["bash", "-c", 'exec -a flower-superlink "$0" "$@"', sys.executable, "-c", code,
                             "--simulation"], env=env, start_new_session=True)


def test_stop_also_ends_the_processes_of_this_checkouts_runs(tmp_path: Path) -> None:
    """The SuperLink's detached descendants of this checkout (SuperExec, flwr-simulation, Ray) go
    with it; another checkout's SuperLink and its descendants stay."""
    from app.runtime.local_superlink import descendants

    env = flower_env() | {"FLWR_HOME": str(tmp_path / "mine")}
    mine, other = _fake_superlink_with_run(tmp_path / "mine"), _fake_superlink_with_run(tmp_path / "other")
    kids: dict[int, list[int]] = {}
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(kids.get(p.pid) for p in (mine, other)):
            kids = {p.pid: descendants([p.pid], str(h))
                    for p, h in ((mine, tmp_path / "mine"), (other, tmp_path / "other"))}
            time.sleep(0.1)
        assert len(kids[mine.pid]) == 1 and len(kids[other.pid]) == 1, kids
        assert descendants([other.pid], str(tmp_path / "mine")) == []  # not of this FLWR_HOME
        assert stop_own_superlinks(env, wait_s=5) == [mine.pid]
        mine.wait(timeout=5)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and Path(f"/proc/{kids[mine.pid][0]}").exists():
            time.sleep(0.1)
        assert not Path(f"/proc/{kids[mine.pid][0]}").exists()  # the run's process went with it
        assert other.poll() is None and Path(f"/proc/{kids[other.pid][0]}").exists()
    finally:
        for p in (mine, other):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)
        for pid in kids.get(other.pid, []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
