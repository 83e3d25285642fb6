"""Checkouts that do not collide (issue 16): each checkout's launcher uses its own local
SuperLink on its own ports (Flower 1.42's FLWR_LOCAL_SUPERLINK_HTTP_API_PORT /
FLWR_LOCAL_CONTROL_API_PORT), chosen free and remembered under its FLWR_HOME; a SuperLink that
is not this checkout's neither blocks a launch nor is stopped by ``--stop``. Stand-in SuperLinks
(processes whose command line looks like Flower's: argv[0] flower-superlink, --simulation) and a
stand-in ``flwr`` here; the last test runs two real launches from two FLWR_HOMEs at once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from app import launch
from app.runtime import local_superlink

ROOT = Path(__file__).resolve().parent.parent


def _home_env(home: Path) -> dict[str, str]:
    env = launch.flower_env() | {"FLWR_HOME": str(home)}
    for key in local_superlink.LOCAL_PORT_ENV:
        env.pop(key, None)
    env.pop("SILOFL_FAST_POLL", None)
    return env


def _fake_superlink(home: Path, port: int | None = None, control: int | None = None) -> subprocess.Popen:
    """A process that looks like Flower's local SuperLink of ``home`` (listening on ``port`` when given)."""
    code = "import time; time.sleep(60)"
    if port is not None:
        code = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
                "time.sleep(60)")
    args = ["--simulation", *(["--port", str(port)] if port else []),
            *(["--control-api-address", f"127.0.0.1:{control}"] if control else [])]
    env = dict(os.environ, FLWR_HOME=str(home), FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    env.pop("SILOFL_FAST_POLL", None)
    proc = subprocess.Popen(["bash", "-c", 'exec -a flower-superlink "$0" "$@"', sys.executable, "-c", code, *args],
                            env=env, start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(s.pid == proc.pid for s in local_superlink.running_superlinks()):
        time.sleep(0.05)
    while port is not None and time.monotonic() < deadline and local_superlink.port_free(port):
        time.sleep(0.05)
    return proc


def _end(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=5)


def test_the_port_choice_skips_a_taken_port(tmp_path: Path) -> None:
    """A remembered port that another process holds now is not used: two new free ones are
    chosen and remembered; ports that are free stay remembered from one launch to the next."""
    env = _home_env(tmp_path / "home")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        assert not local_superlink.port_free(busy)
        (tmp_path / "home").mkdir()
        (tmp_path / "home" / local_superlink.PORTS_FILE).write_text(json.dumps({"http-api-port": busy,
                                                                        "control-api-port": local_superlink.free_port()}))
        ports = local_superlink.own_local_superlink(env)
        assert busy not in ports and len(set(ports)) == 2 and all(local_superlink.port_free(p) for p in ports)
        assert not set(ports) & set(local_superlink.FLOWER_LOCAL_PORTS)
        assert local_superlink.remembered_ports(env) == ports
        assert (env[local_superlink.LOCAL_PORT_ENV[0]], env[local_superlink.LOCAL_PORT_ENV[1]]) == (str(ports[0]), str(ports[1]))
        assert local_superlink.own_local_superlink(_home_env(tmp_path / "home")) == ports  # remembered, still free
        assert local_superlink.free_port({busy}) != busy


def test_two_flwr_homes_get_disjoint_ports(tmp_path: Path) -> None:
    a, b = _home_env(tmp_path / "a"), _home_env(tmp_path / "b")
    ports_a = local_superlink.own_local_superlink(a)
    # checkout a's SuperLink is up on its ports (a stand-in): b must not pick them, nor a new pair for a
    link_a = _fake_superlink(tmp_path / "a", *ports_a)
    try:
        ports_b = local_superlink.own_local_superlink(b)
        assert not set(ports_a) & set(ports_b)
        assert local_superlink.own_local_superlink(_home_env(tmp_path / "a")) == ports_a  # its own, held by it: kept
        assert link_a.poll() is None
        assert local_superlink.own_local_superlink(_home_env(tmp_path / "b")) == ports_b
    finally:
        _end(link_a)


def test_this_checkouts_superlink_on_flowers_default_ports_is_restarted(tmp_path: Path) -> None:
    """One started on Flower's fixed ports (by plain ``flwr run``, or an older silofl) is this
    checkout's (its FLWR_HOME) but not on its ports: it is stopped, and the launch uses its own."""
    env = _home_env(tmp_path / "home")
    old = _fake_superlink(tmp_path / "home")  # no --port: Flower's default, as far as we know
    other = _fake_superlink(tmp_path / "other")
    try:
        ports = local_superlink.own_local_superlink(env, wait_s=2)  # our child: a zombie until waited for below
        assert old.wait(timeout=15) is not None
        assert other.poll() is None  # another checkout's: untouched
        assert not set(ports) & set(local_superlink.FLOWER_LOCAL_PORTS)
    finally:
        _end(old, other)


FAKE_FLWR = textwrap.dedent("""\
    #!{python}
    # stand-in `flwr run`: records the ports it was given, then writes the run's summary as the ServerApp would
    import json, os, pathlib, re, sys
    args = sys.argv[1:]
    cfg = args[args.index("--run-config") + 1]
    out = pathlib.Path(re.search(r'outputs-dir="([^"]*)"', cfg).group(1)) / re.search(r'run-name="([^"]*)"', cfg).group(1)
    pathlib.Path(os.environ["FAKE_FLWR_RECORD"]).write_text(json.dumps(
        {{k: os.environ.get(k) for k in ("FLWR_HOME", "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")}}))
    print("Successfully started run 42", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({{"run_id": 42, "status": "completed"}}))
    print(f"INFO : silofl run {{out.name}} completed", flush=True)
""")


def test_a_foreign_superlink_neither_blocks_a_launch_nor_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Another checkout's SuperLink (another FLWR_HOME) is running and listening: the launch goes
    on (with a stand-in ``flwr``) on this checkout's own ports, and ``python -m app.launch --stop``
    of this checkout leaves it running."""
    foreign_port = local_superlink.free_port()
    foreign = _fake_superlink(tmp_path / "other", foreign_port, local_superlink.free_port({foreign_port}))
    mine = tmp_path / "mine"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "flwr").write_text(FAKE_FLWR.format(python=sys.executable))
    (bin_dir / "flwr").chmod(0o755)
    record = tmp_path / "flwr-env.json"
    try:
        monkeypatch.setenv("FLWR_HOME", str(mine))
        monkeypatch.setenv("FAKE_FLWR_RECORD", str(record))
        monkeypatch.setenv("PATH", os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]))
        for key in local_superlink.LOCAL_PORT_ENV:
            monkeypatch.delenv(key, raising=False)
        rc = launch.main(["--no-preflight", "--run-config", f'outputs-dir="{tmp_path / "out"}" num-rounds=1'])
        assert rc == 0, capsys.readouterr()
        seen = json.loads(record.read_text())
        ports = local_superlink.remembered_ports(_home_env(mine))
        assert ports is not None and foreign_port not in ports
        assert seen == {"FLWR_HOME": str(mine), "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(ports[0]),
                        "FLWR_LOCAL_CONTROL_API_PORT": str(ports[1])}
        assert f"local SuperLink: 127.0.0.1:{ports[0]}" in capsys.readouterr().out
        stop = subprocess.run([sys.executable, "-m", "app.launch", "--stop"], cwd=ROOT, env=_home_env(mine),
                              capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0 and "no local SuperLink of this checkout is running" in stop.stdout
        assert foreign.poll() is None and not local_superlink.port_free(foreign_port)
    finally:
        _end(foreign)


@pytest.mark.e2e
def test_two_checkouts_launch_at_once(tmp_path: Path) -> None:
    """Two real launches (``flwr run`` with the local simulation SuperLink) from two FLWR_HOMEs at
    the same time: both complete, each on its own SuperLink and ports; then ``--stop`` of each
    ends its own SuperLink and no other."""
    homes = [tmp_path / "a", tmp_path / "b"]
    envs = [_home_env(h) for h in homes]
    for env in envs:
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    results: list[subprocess.CompletedProcess | None] = [None, None]

    def one(i: int) -> None:
        cfg = f'num-rounds=1 outputs-dir="{tmp_path / "out"}" run-name="e2e-{i}"'
        results[i] = subprocess.run([sys.executable, "-m", "app.launch", "--no-preflight", "--run-config", cfg],
                                    cwd=ROOT, env=envs[i], capture_output=True, text=True, timeout=400)

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=450)
        ports = [local_superlink.remembered_ports(env) for env in envs]
        for i, res in enumerate(results):
            assert res is not None and res.returncode == 0, (res.stdout[-3000:] + res.stderr[-3000:]) if res else i
            assert f"local SuperLink: 127.0.0.1:{ports[i][0]}" in res.stdout
        assert ports[0] and ports[1] and not set(ports[0]) & set(ports[1])
        links = [[s for s in local_superlink.running_superlinks() if s.home == str(h)] for h in homes]
        assert [[s.ports for s in ls] for ls in links] == [[ports[0]], [ports[1]]]
        for i, env in enumerate(envs):
            stop = subprocess.run([sys.executable, "-m", "app.launch", "--stop"], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=60)
            assert f"stopped local SuperLink pid(s) [{links[i][0].pid}]" in stop.stdout, stop.stdout + stop.stderr
            if i == 0:  # b's is still there
                assert [s.pid for s in local_superlink.running_superlinks() if s.home == str(homes[1])] == [links[1][0].pid]
        assert not [s for s in local_superlink.running_superlinks() if s.home in {str(h) for h in homes}]
    finally:
        for env in envs:
            local_superlink.stop_own_superlinks(env, wait_s=5)
