"""This checkout's own local simulation SuperLink: finding the running ``flower-superlink
--simulation`` processes (Linux: /proc), choosing and remembering this checkout's ports, and
stopping only this checkout's SuperLinks and their processes, by pid (app.launch's
:func:`own_local_superlink` and ``--stop``; the reasons are in app/launch.py's docstring)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import NamedTuple


def local_superlinks(env: dict[str, str]) -> list[tuple[int, str, bool]]:
    """The running ``flower-superlink --simulation`` processes: (pid, FLWR_HOME, runtime
    dependency installation off). Linux only (reads /proc); others' processes we may not read
    are skipped."""
    return [(s.pid, s.home, s.no_install) for s in running_superlinks()]


class LocalSuperLink(NamedTuple):
    """A running ``flower-superlink --simulation``: its pid, the FLWR_HOME, runtime dependency
    installation off, ``SILOFL_FAST_POLL`` ("" when unset) it was started with, and the ports on
    its command line (``--port``, ``--control-api-address``; None when absent)."""

    pid: int
    home: str
    no_install: bool
    fast_poll: str
    ports: tuple[int | None, int | None]


def cmdline_ports(cmdline: list[bytes]) -> tuple[int | None, int | None]:
    """(``--port``, the port of ``--control-api-address``) of a SuperLink's command line."""
    found: dict[str, int | None] = {"--port": None, "--control-api-address": None}
    for i, part in enumerate(cmdline):
        key, eq, value = part.decode(errors="replace").partition("=")
        if key in found:
            value = value if eq else (cmdline[i + 1].decode(errors="replace") if i + 1 < len(cmdline) else "")
            with contextlib.suppress(ValueError):
                found[key] = int(value.rsplit(":", 1)[-1])
    return found["--port"], found["--control-api-address"]


def running_superlinks() -> list[LocalSuperLink]:
    """Every running ``flower-superlink --simulation`` whose command line and environment we
    may read (Linux only: /proc)."""
    proc_dir = Path("/proc")
    found: list[LocalSuperLink] = []
    if not proc_dir.exists():
        return found
    for pid_dir in proc_dir.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            cmdline = (pid_dir / "cmdline").read_bytes().split(b"\0")
            if not any(part.endswith(b"flower-superlink") for part in cmdline[:2]) or b"--simulation" not in cmdline:
                continue
            environ = dict(
                item.split(b"=", 1) for item in (pid_dir / "environ").read_bytes().split(b"\0") if b"=" in item
            )
        except OSError:
            continue
        found.append(LocalSuperLink(int(pid_dir.name), environ.get(b"FLWR_HOME", b"").decode(),
                                    environ.get(b"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", b"") == b"1",
                                    environ.get(b"SILOFL_FAST_POLL", b"").decode(), cmdline_ports(cmdline)))
    return found


def own_superlink_fast_poll(env: dict[str, str]) -> list[tuple[int, str]]:
    """This checkout's running local SuperLinks and the ``SILOFL_FAST_POLL`` each was started with."""
    return [(s.pid, s.fast_poll) for s in running_superlinks() if s.home == env["FLWR_HOME"]]


def stop_own_superlinks(env: dict[str, str], wait_s: float = 10.0, keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """SIGTERM (then SIGKILL after ``wait_s``) the local simulation SuperLinks started with this
    checkout's FLWR_HOME, their process groups (Flower starts them detached, as group leaders)
    and the processes below them that carry the same FLWR_HOME (SuperExec, a run's
    ``flwr-simulation`` and its Ray processes, each detached in a group of its own, which would
    otherwise finish a run's teardown on their own); returns the SuperLinks' pids. Nothing else
    is touched, nor the SuperLinks in ``keep`` (e.g. those that ran before a test session)."""
    mine = [pid for pid, _ in own_superlink_fast_poll(env) if pid not in keep]
    end_processes(mine + descendants(mine, env["FLWR_HOME"]), wait_s)
    return mine


def descendants(pids: list[int], home: str) -> list[int]:
    """The processes below ``pids`` (by parent pid, read from /proc) started with FLWR_HOME ``home``."""
    children: dict[int, list[int]] = {}
    for pid_dir in Path("/proc").iterdir() if pids else ():
        if pid_dir.name.isdigit():
            try:  # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces and parentheses
                ppid = int((pid_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(pid_dir.name))
    found, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            try:
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"FLWR_HOME={home}".encode() in environ:
                found.append(child)
                todo.append(child)
    return found


def end_processes(pids: list[int] | set[int], wait_s: float = 10.0) -> None:
    """SIGTERM each of ``pids`` (its whole process group when it leads one, as Flower's detached
    SuperLinks do), then SIGKILL what is still there after ``wait_s``. Only these pids."""
    import signal

    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGTERM)
            else:
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    for pid in pids:
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


#: Flower 1.42's ``flwr`` CLI (flwr/cli/constant.py, read when it starts) takes the local
#: SuperLink's HTTP API port (Runtime, Control and Fleet API; ``flower-superlink --port``) and its
#: gRPC Control API port (``--control-api-address``) from these; ``flwr run`` starts the local
#: SuperLink on them, and every ``flwr`` command connects to 127.0.0.1 on the first.
LOCAL_PORT_ENV = ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")
#: Flower's defaults for those two, the same for every checkout: never this checkout's.
FLOWER_LOCAL_PORTS = (39091, 39093)
#: This checkout's local SuperLink ports, remembered under its FLWR_HOME.
PORTS_FILE = "silofl-local-superlink.json"


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now, as the SuperLink's uvicorn binds it (SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(avoid: set[int] | tuple[int, ...] = ()) -> int:
    """A port that is free on 127.0.0.1 now (the kernel's pick), not in ``avoid`` nor Flower's defaults."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in avoid and port not in FLOWER_LOCAL_PORTS:
            return port


def remembered_ports(env: dict[str, str]) -> tuple[int, int] | None:
    """The two ports in ``$FLWR_HOME/silofl-local-superlink.json``, or None (no file, or not two ports)."""
    try:
        data = json.loads((Path(env["FLWR_HOME"]) / PORTS_FILE).read_text())
        ports = (int(data["http-api-port"]), int(data["control-api-port"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ports if all(0 < p < 65536 for p in ports) and ports[0] != ports[1] else None


def own_local_superlink(env: dict[str, str], wait_s: float = 10.0) -> tuple[int, int]:
    """Make ``env``'s ``flwr`` commands use this checkout's own local SuperLink; returns its
    (HTTP API, Control API) ports, also set in ``env`` (:data:`LOCAL_PORT_ENV`).

    This checkout's SuperLinks are those started with its FLWR_HOME. One of them is kept when it
    runs on the remembered ports with this launch's settings (runtime dependency installation
    off, ``env``'s ``SILOFL_FAST_POLL``); any other of them is stopped (by pid). Without one kept,
    the remembered ports are used when both are free, not Flower's defaults and on no other
    running SuperLink's command line; else two new free ports are chosen and remembered. A
    SuperLink that is not this checkout's is never stopped, and never used: nothing of ours
    connects to its ports. A port that another process takes between this check and the
    SuperLink's start makes that start fail (``flwr run`` says so); the next launch picks anew."""
    home = Path(env["FLWR_HOME"])
    want_fast = env.get("SILOFL_FAST_POLL", "")
    from app.filelock import exclusive_lock, write_json_atomically

    with exclusive_lock(home / (PORTS_FILE + ".lock")):  # one launcher of this checkout at a time
        remembered = remembered_ports(env)
        running = running_superlinks()
        own = [s for s in running if s.home == env["FLWR_HOME"]]
        keep = [s for s in own
                if remembered and s.ports == remembered and s.no_install and s.fast_poll == want_fast][:1]
        for s in own:
            if s in keep:
                continue
            if s.ports != remembered:
                why = f"it runs on port(s) {'/'.join(str(p) for p in s.ports)}, not this checkout's"
            elif not s.no_install:
                why = "its runtime dependency installation is on"
            elif s.fast_poll != want_fast:
                why = f"to turn the engine poll patch {'on' if want_fast else 'off'}"
            else:
                why = "one is enough"
            print(f"[silofl] restarting this checkout's local SuperLink (pid {s.pid}): {why}", flush=True)
            end_processes([s.pid], wait_s)
        if keep:
            ports = remembered
        else:
            others = {p for s in running if s.home != env["FLWR_HOME"] for p in s.ports if p is not None}
            if not (remembered and all(port_free(p) and p not in others and p not in FLOWER_LOCAL_PORTS
                                       for p in remembered)):
                http = free_port(others)
                remembered = (http, free_port(others | {http}))
            ports = remembered
            write_json_atomically(home / PORTS_FILE, {"http-api-port": ports[0], "control-api-port": ports[1]})
    env |= {LOCAL_PORT_ENV[0]: str(ports[0]), LOCAL_PORT_ENV[1]: str(ports[1])}
    return ports
