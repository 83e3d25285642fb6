"""Run a federation with ``flwr run`` and exit non-zero when anything failed.

``flwr run`` exits 0 even when the ServerApp or a ClientApp fails, so this launcher:
1. validates the run config (pyproject defaults + ``--run-config`` overrides) and the data
   (K <= n for every silo) before any Flower process starts, with a one-line error;
2. sets a project-local ``FLWR_HOME``, disables telemetry and runtime dependency installation,
   and ``OMP_NUM_THREADS=1``;
3. runs ``flwr run --stream`` with ``num-supernodes = num-silos`` (+ 1, the shuffler, in shuffle mode) and an absolute outputs dir, on
   a staged copy of the app's sources (``flwr run .`` would walk the whole checkout, a multi-GB
   ``.venv`` included, to build the app bundle: about 7 s per run on a 2-core machine);
4. decides from the run's own ``summary.json``: the run succeeded when the summary that the
   ServerApp writes as its last step names this Flower run id and says ``completed``; a summary
   that says ``failed``, or none when the stream ends, fails the launch (exit 1); one that says
   ``diverged`` or ``no-progress`` (app/run_health.py: the run ran to its end, its outputs are
   written, but its model is not one to use) exits 3 with the diagnosis and the setting most
   likely to blame as the last line, so that a script or CI job stops. It returns as soon as
   that summary is there and the ServerApp's last line has been streamed, instead of waiting for
   Flower to shut its engine down and starting the ``flwr`` CLI again for ``flwr ls`` (about 8 s);
   the engine's teardown finishes inside the SuperLink. ``flwr ls`` is read only to explain a
   run that ended without a summary.

The local simulation SuperLink is this checkout's own: ``flwr run`` starts it (detached, with
this environment) when nothing answers on its port, and Flower 1.42 takes that port and the
Control API's from ``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` / ``FLWR_LOCAL_CONTROL_API_PORT``
(``flwr/cli/constant.py``; default 39091 / 39093, the same for every checkout). The launcher sets
both to this checkout's ports (:func:`own_local_superlink`): the ones remembered in
``$FLWR_HOME/silofl-local-superlink.json`` when this checkout's SuperLink (found by its
FLWR_HOME) holds them or they are free, else two new free ports (never Flower's defaults), which
it remembers. So checkouts on one machine never share a SuperLink or a port, and a SuperLink that
is not this checkout's (another FLWR_HOME, Flower's default ports) is neither used nor touched.
This checkout's SuperLink is restarted when it runs on other ports or with other settings.

``--fast-poll`` turns on the opt-in engine poll patch (app.sweep.fast_poll: the simulation
engine looks for instructions every 5 ms instead of 0.1 s) in the local SuperLink's runs: it sets
``SILOFL_FAST_POLL`` for the SuperLink (restarting this checkout's local SuperLink when it runs
with the other setting) and the ClientApp applies the patch in the engine's process.

Usage: ``python -m app.launch [--run-config "key=value ..."] [--superlink NAME] [--no-preflight] [--fast-poll]``,
``python -m app.launch --resume RUN_NAME [--superlink NAME]`` (continue a run from its last
checkpoint, with its own run config) and ``python -m app.launch --stop`` (end the local
simulation SuperLink of this checkout and its runs' processes, by pid; nobody else's; its ports
stay remembered).
Exit codes: 0 success, 1 the run failed, 2 bad configuration (one line ``config error: ...``, before
any Flower process starts: a ``--run-config`` fragment that does not parse, a bad key or value, an
outputs-dir that cannot be written, device = "cuda" without CUDA for the local simulation, a
checkpoint that cannot be resumed), 3 the run diverged or made no progress.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent


def flower_env(root: Path = ROOT) -> dict[str, str]:
    """Environment for every Flower process started from here (inherited by the local SuperLink)."""
    env = dict(os.environ)
    env.setdefault("FLWR_HOME", str(root / ".flwr"))
    env |= {
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        "RAY_DEDUP_LOGS": "0",
        "PYTHONUNBUFFERED": "1",
    }
    # the local SuperLink's SuperExec looks for a new run every second by default (flwr 1.42);
    # 0.2 s starts a run 0.4 s sooner on average for a few HTTP requests a second while idle
    env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def default_run_config(root: Path = ROOT) -> dict[str, Any]:
    from flwr.common.config import flatten_dict

    with (root / "pyproject.toml").open("rb") as fh:
        return flatten_dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def merged_run_config(overrides: list[str], root: Path = ROOT) -> dict[str, Any]:
    """pyproject's run config with the ``--run-config`` strings ``overrides`` on top;
    ConfigError (one line naming the fragment) for anything in them Flower's parser would drop
    or misread (app.config.check_run_config_args)."""
    parsed = parse_config_overrides(overrides)
    cfg = default_run_config(root)
    cfg.update(parsed)
    return cfg


def preflight(cfg: dict[str, Any]) -> Any:
    """Validate settings and data; returns Settings or raises ConfigError."""
    from app.config import check_silo_sizes, parse_settings
    from app.data.federated import silo_splits

    settings = parse_settings(cfg)
    if settings.data_schema:  # own records (docs/your-data.md): the schema, and a simulation's file, here
        from app.config import ConfigError
        from app.data.schema import SchemaError, load_schema

        try:
            load_schema(settings.data_schema)
            if not settings.data_simulation_file:
                return settings  # the records are the silos' own files: each silo checks K <= n itself
            _, splits, _, _ = silo_splits(settings)
        except SchemaError as exc:
            raise ConfigError(str(exc)) from None
    else:
        _, splits, _, _ = silo_splits(settings)
    check_silo_sizes(settings, [len(train) for train, _ in splits])
    return settings


def toml_value(v: Any) -> str:
    """A run-config value as a TOML literal, for `flwr run --run-config`."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def local_superlinks(env: dict[str, str]) -> list[tuple[int, str, bool]]:
    """The running ``flower-superlink --simulation`` processes: (pid, FLWR_HOME, runtime
    dependency installation off). Linux only (reads /proc); others' processes we may not read
    are skipped."""
    return [(s.pid, s.home, s.no_install) for s in _local_superlinks()]


class LocalSuperLink(NamedTuple):
    """A running ``flower-superlink --simulation``: its pid, the FLWR_HOME, runtime dependency
    installation off, ``SILOFL_FAST_POLL`` ("" when unset) it was started with, and the ports on
    its command line (``--port``, ``--control-api-address``; None when absent)."""

    pid: int
    home: str
    no_install: bool
    fast_poll: str
    ports: tuple[int | None, int | None]


def _cmdline_ports(cmdline: list[bytes]) -> tuple[int | None, int | None]:
    """(``--port``, the port of ``--control-api-address``) of a SuperLink's command line."""
    found: dict[str, int | None] = {"--port": None, "--control-api-address": None}
    for i, part in enumerate(cmdline):
        key, eq, value = part.decode(errors="replace").partition("=")
        if key in found:
            value = value if eq else (cmdline[i + 1].decode(errors="replace") if i + 1 < len(cmdline) else "")
            with contextlib.suppress(ValueError):
                found[key] = int(value.rsplit(":", 1)[-1])
    return found["--port"], found["--control-api-address"]


def _local_superlinks() -> list[LocalSuperLink]:
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
                                    environ.get(b"SILOFL_FAST_POLL", b"").decode(), _cmdline_ports(cmdline)))
    return found


def own_superlink_fast_poll(env: dict[str, str]) -> list[tuple[int, str]]:
    """This checkout's running local SuperLinks and the ``SILOFL_FAST_POLL`` each was started with."""
    return [(s.pid, s.fast_poll) for s in _local_superlinks() if s.home == env["FLWR_HOME"]]


def stop_own_superlinks(env: dict[str, str], wait_s: float = 10.0, keep: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """SIGTERM (then SIGKILL after ``wait_s``) the local simulation SuperLinks started with this
    checkout's FLWR_HOME, their process groups (Flower starts them detached, as group leaders)
    and the processes below them that carry the same FLWR_HOME (SuperExec, a run's
    ``flwr-simulation`` and its Ray processes, each detached in a group of its own, which would
    otherwise finish a run's teardown on their own); returns the SuperLinks' pids. Nothing else
    is touched, nor the SuperLinks in ``keep`` (e.g. those that ran before a test session)."""
    mine = [pid for pid, _ in own_superlink_fast_poll(env) if pid not in keep]
    end_processes(mine + _descendants(mine, env["FLWR_HOME"]), wait_s)
    return mine


def _descendants(pids: list[int], home: str) -> list[int]:
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
        running = _local_superlinks()
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


#: What the app bundle needs: the packages Flower imports and the project file.
APP_SOURCES = ("pyproject.toml", "README.md", ".gitignore", "app", "strategies", "clients")


def stage_app(env: dict[str, str], root: Path = ROOT) -> Path:
    """Copy the app's sources to ``$FLWR_HOME/silofl-app`` (replacing an older copy) and return it."""
    stage = Path(env["FLWR_HOME"]) / "silofl-app"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    copy_app_sources(stage, root)
    return stage


def copy_app_sources(dst: Path, root: Path = ROOT) -> None:
    """Copy :data:`APP_SOURCES` of ``root`` into the existing folder ``dst`` (no caches)."""
    for name in APP_SOURCES:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dst / name)


def run_status(run_id: str, env: dict[str, str], superlink: str | None) -> str:
    cmd = ["flwr", "ls", *( [superlink] if superlink else []), "--run-id", run_id, "--format", "json"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    try:
        runs = json.loads(out.stdout)["runs"]
        return str(runs[0]["status"])
    except (ValueError, KeyError, IndexError):
        return f"unknown ({out.stdout.strip()[:200]} {out.stderr.strip()[:200]})"


def run_summary(path: Path, run_id: str | None) -> dict[str, Any] | None:
    """``path``'s summary if the ServerApp of Flower run ``run_id`` wrote it (a resumed run's
    folder may hold the summary of an earlier attempt), else None."""
    if run_id is None:
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or being replaced
        return None
    return summary if str(summary.get("run_id")) == run_id else None


class _Stream:
    """``flwr run --stream``'s output, echoed line by line from a thread; notes the run id and
    whether the ServerApp's last line (``silofl run NAME completed`` (or ``diverged``,
    ``no-progress``) / ``run FAILED``) went by."""

    def __init__(self, proc: subprocess.Popen, name: str) -> None:
        import threading

        self.proc, self.name, self.run_id = proc, name, None
        self.t0, self.server_started = time.monotonic(), False
        self.last_line = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        from app.run_health import FINISHED

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if self.run_id is None and (m := re.search(r"Successfully started run (\d+)", line)):
                self.run_id = m.group(1)
                self._stage(f"run {self.run_id} accepted by the SuperLink; starting the simulation engine "
                            "(Ray) and the ServerApp")
            elif not self.server_started and f"[silofl] run {self.name}:" in line:
                self.server_started = True
                self._stage("ServerApp running; the engine starts the silos' ClientApps for round 1")
            if any(f"silofl run {self.name} {st}" in line for st in FINISHED) or "[silofl] run FAILED" in line:
                self.last_line.set()

    def _stage(self, what: str) -> None:
        """A start-up stage line (the seconds before round 1 are otherwise silent)."""
        sys.stdout.write(f"[silofl] stage +{time.monotonic() - self.t0:.1f}s: {what}\n")
        sys.stdout.flush()


def follow_run(proc: subprocess.Popen, name: str, summary_path: Path, poll_s: float = 0.1,
               tail_s: float = 5.0) -> tuple[int | None, str | None, dict[str, Any] | None]:
    """Echo ``flwr run --stream`` until the run's summary is written and its last line streamed
    (at most ``tail_s`` after the summary), then end the CLI (only a log stream: the run itself
    has finished and its engine shuts down inside the SuperLink). Returns the CLI's exit code
    (None when it was ended here), the Flower run id and this run's summary (None if none)."""
    stream = _Stream(proc, name)
    summary, seen_at = None, None
    while proc.poll() is None:
        if summary is None and (summary := run_summary(summary_path, stream.run_id)) is not None:
            seen_at = time.monotonic()
        if summary is not None and (stream.last_line.is_set() or time.monotonic() - seen_at > tail_s):
            break
        stream.last_line.wait(poll_s) if summary is not None else time.sleep(poll_s)
    rc = proc.poll()
    if rc is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    else:
        stream.thread.join(timeout=5)
    return rc, stream.run_id, summary or run_summary(summary_path, stream.run_id)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-config", "-c", action="append", default=[], help='e.g. "privacy.epsilon=0.75 seed=1"')
    ap.add_argument("--superlink", default=None, help="SuperLink connection name (default: the local simulation one)")
    ap.add_argument("--federation-config", action="append", default=[], help="extra simulation settings")
    ap.add_argument("--no-preflight", action="store_true", help="skip the data check (config is still validated)")
    ap.add_argument("--resume", metavar="RUN_NAME", default=None,
                    help="continue RUN_NAME (under outputs-dir) from its last checkpoint, with its run config")
    ap.add_argument("--fast-poll", action="store_true",
                    help="opt-in engine poll patch for the local SuperLink's runs (5 ms instead of 0.1 s; flwr 1.42)")
    ap.add_argument("--stop", action="store_true", help="end this checkout's local simulation SuperLink and exit")
    args = ap.parse_args(argv)

    if args.stop:
        stopped = stop_own_superlinks(flower_env())
        print(f"[silofl] stopped local SuperLink pid(s) {stopped}" if stopped else
              "[silofl] no local SuperLink of this checkout is running")
        return 0

    from app.config import ConfigError, parse_settings

    try:
        cfg = merged_run_config(args.run_config)
        if args.resume:
            cfg, args.run_config = resume_config(cfg, args.resume)
        settings = parse_settings(cfg) if args.no_preflight else preflight(cfg)
        outputs = Path(settings.outputs_dir)
        outputs = outputs if outputs.is_absolute() else (ROOT / outputs)
        check_outputs_dir(outputs)
        if not args.superlink:
            check_local_device(settings)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. data missing
        print(f"config error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2

    # The ServerApp's name for the run, fixed here and passed as run-name so that the launcher
    # knows where summary.json will be. Flower's run id is not known before the run starts: the
    # five-digit suffix that tells apart runs started in the same second is drawn here instead.
    from app.results import run_name  # light: not the ServerApp (torch)

    name = settings.run_name if args.resume else run_name(settings, secrets.randbelow(100_000))
    overrides = {k: v for k, v in cfg.items() if k in parse_config_overrides(args.run_config)}
    overrides |= {"outputs-dir": str(outputs), "run-name": name}
    run_config = " ".join(f"{k}={toml_value(v)}" for k, v in overrides.items())
    fed_cfg = [f"num-supernodes={settings.simulation_nodes()}", *args.federation_config]
    env = flower_env()
    if args.fast_poll:
        env["SILOFL_FAST_POLL"] = "1"
    else:
        env.pop("SILOFL_FAST_POLL", None)
    if not args.superlink:
        # this checkout's own SuperLink, on its own ports; the engine runs in its processes, with
        # the environment it started with (own_local_superlink restarts one with other settings)
        http_port, _ = own_local_superlink(env)
        print(f"[silofl] local SuperLink: 127.0.0.1:{http_port} (this checkout's, FLWR_HOME={env['FLWR_HOME']})",
              flush=True)
    cmd = ["flwr", "run", str(stage_app(env)), *([args.superlink] if args.superlink else []), "--stream", "--run-config", run_config]
    if not args.superlink:
        cmd += ["--federation-config", " ".join(fed_cfg)]
    summary_path = outputs / name / "summary.json"
    where = f"SuperLink {args.superlink}" if args.superlink else f"{settings.simulation_nodes()} virtual SuperNodes"
    print(f"[silofl] stage: flwr run {name} ({where}); start-up lines follow until round 1", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rc, run_id, summary = follow_run(proc, name, summary_path)
    wall = time.perf_counter() - t0
    if run_id is None or (rc not in (None, 0) and summary is None):
        print(f"[silofl] flwr run failed (exit code {rc}, run id {run_id})", file=sys.stderr)
        return 1
    if summary is None:  # the stream ended without this run's summary: ask Flower why
        status = run_status(run_id, env, args.superlink)
        print(f"[silofl] FAILED: run {run_id} ended with status {status} and wrote no {summary_path}; "
              f"see `flwr log {run_id}`", file=sys.stderr)
        return 1
    # in Flower's words (finished:completed / finished:failed), as `flwr ls` would say it
    status = f"finished:{summary.get('status')}"
    print(f"[silofl] run {run_id}: status {status}, {wall:.1f}s wall, summary {summary_path}", flush=True)
    code, line = summary_verdict(summary, run_id, summary_path)
    from app.tracking import track_from_env  # SILOFL_TRACKING=mlflow: the run's files to MLflow

    track_from_env(summary_path.parent)
    if line:
        print(line, file=sys.stderr, flush=True)
    return code


#: exit code of a run that ran to its end but diverged or made no progress (app/run_health.py)
EXIT_UNHEALTHY = 3


def summary_verdict(summary: dict[str, Any], run_id: str, summary_path: Path) -> tuple[int, str | None]:
    """The launcher's exit code for this run's summary, and its last line (None on success):
    0 ``completed``; 3 ``diverged`` / ``no-progress`` with what was seen and the setting most
    likely to blame; 1 anything else (``failed``)."""
    from app.run_health import UNHEALTHY

    status = str(summary.get("status"))
    reason = summary.get("status_reason") or ""
    if status == "completed":
        return 0, None
    if status in UNHEALTHY:
        health = summary.get("health") or {}
        blame = health.get("blame") or {}
        seen = health.get("reason") or reason
        hint = f"; most likely {blame['suggestion']}" if blame.get("suggestion") else ""
        return EXIT_UNHEALTHY, (f"[silofl] {status.replace('-', ' ').upper()}: run {run_id}: {seen}{hint} "
                                f"(its outputs are in {summary_path.parent}; exit code {EXIT_UNHEALTHY})")
    return 1, (f"[silofl] FAILED: run {run_id} ended with status finished:{status}"
               + (f": {reason}" if reason else "") + f"; see `flwr log {run_id}`")


def resume_config(cfg: dict[str, Any], name: str) -> tuple[dict[str, Any], list[str]]:
    """The run config to continue run ``name`` with: the checkpoint's own run config, plus
    resume = true and the silos' original per-run ledger name. Returns it and the overrides to
    pass (every key, so the ServerApp sees exactly the original's settings)."""
    from app.checkpoint import CheckpointError, check_resume_state, load_checkpoint
    from app.config import ConfigError, parse_settings

    outputs = Path(parse_settings(cfg).outputs_dir)
    outputs = outputs if outputs.is_absolute() else (ROOT / outputs)
    try:
        state = load_checkpoint(outputs / name / "checkpoint.npz")
    except Exception as exc:
        raise ConfigError(f"--resume {name}: cannot resume: {exc}") from exc
    original = state.get("run_config")
    if not original or not isinstance(original, dict):
        raise ConfigError(f"--resume {name}: the checkpoint holds no run config (written by an older version)")
    resumed = default_run_config() | original | {"resume": True, "run-name": name}
    try:  # the same checks as the ServerApp's (app.server_app.load_resume_state), before any process starts
        settings = parse_settings(resumed)
        check_resume_state(state, settings.num_rounds, model_layout(settings))
    except (CheckpointError, ConfigError) as exc:
        raise ConfigError(f"--resume {name}: cannot resume: checkpoint {outputs / name / 'checkpoint.npz'} "
                          f"is malformed: {exc}") from exc
    resumed["ledger-run-key"] = state["ledger_run_key"]
    return resumed, [" ".join(f"{k}={toml_value(v)}" for k, v in resumed.items())]


def model_layout(settings: Any) -> dict[str, tuple[int, ...]]:
    """The shapes of the run's model parameters (what the ServerApp builds; imports torch)."""
    from app.data.federated import dataset_meta
    from app.models import build_model

    feature_shape, num_classes = dataset_meta(settings)
    model = build_model(settings.model, feature_shape, num_classes, hidden=settings.model_hidden)
    return {k: tuple(v.shape) for k, v in model.named_parameters()}


def parse_config_overrides(overrides: list[str]) -> dict[str, Any]:
    """The ``--run-config`` strings parsed as Flower parses them, after refusing (ConfigError)
    what Flower's parser would drop or misread."""
    from flwr.common.config import parse_config_args

    from app.config import check_run_config_args

    check_run_config_args(overrides)
    return parse_config_args(overrides)


def check_outputs_dir(outputs: Path) -> None:
    """ConfigError unless ``outputs`` (the run's outputs-dir) exists or can be made, and a file can be
    written in it: checked before the run starts rather than when its first file is written."""
    import tempfile

    from app.config import ConfigError

    try:
        outputs.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=outputs, prefix=".silofl-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"outputs-dir = {str(outputs)!r} cannot be written ({type(exc).__name__}: "
                          f"{exc.strerror or exc}); choose a folder this user can write") from None


def check_local_device(settings: Any) -> None:
    """ConfigError for device = "cuda" on a machine without CUDA, for a run of the local simulation
    (its silos run on this machine). A run on a SuperLink (--superlink) is not checked here: its
    silos' machines may have what this one lacks; there, the first round whose ClientApps fail
    ends the run with their reason (strategies.loop.ClientAppsFailed)."""
    from app.config import ConfigError

    if settings.device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError('device = "cuda" but this machine has no CUDA device that torch can use (the local '
                          'simulation runs its silos here); use device = "cpu", or "auto" (CUDA where there is one)')


if __name__ == "__main__":
    sys.exit(main())
