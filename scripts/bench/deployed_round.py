"""How long a deployed round takes: a real SuperLink and N SuperNodes on loopback, per mode.

Modes (each on a fresh insecure SuperLink, fresh SuperNodes, fresh state, free ports):

* ``floor``     the no-op app (scripts/bench/noop_app: numpy only, the same exchanges per round
                as silofl's default run), polling replies as silofl's ServerApp does: Flower's floor;
* ``floor-3s``  the same with Flower's own ``Grid.send_and_receive`` (3 s between pulls): the
                floor of a ServerApp that does not poll faster (silofl before poll-interval);
* ``before``    silofl at ``--before-ref`` (git archive of that commit; default b69d7fb, before the deployment work), whose
                ClientApp builds the silo in every ``flwr-clientapp`` process;
* ``inproc``    silofl of the working tree without a silo service (the thin ClientApp imports
                app.node_runtime in every ``flwr-clientapp`` process);
* ``after``     silofl of the working tree with one silo service per SuperNode
                (``python -m app.runtime.silo_service``, ``silo-service='<socket>'`` in the node config).
* ``executor``  silofl of the working tree, each SuperNode started with ``--isolation process``
                and one long-lived ``python -m app.runtime.executor`` running every task in process.

Every mode runs ``--rounds`` rounds of its app's default run (silofl: ISRL-DP MB-SGD on WBCD,
2 silos, each with node config ``epsilon-cap=3.0 evaluation='private'``), with the same
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` (``--superexec-poll`` on the SuperNodes, ``--superlink-poll``
on the SuperLink) and, where the app has it, the same
server ``poll-interval`` (``--server-poll``). A round's wall time is the ServerApp's own (the
``wall_s`` of rounds.jsonl); its CPU time is the CPU every process of the deployment (SuperLink,
SuperNodes, SuperExecs, every ``flwr-clientapp`` and ``flwr-serverapp``, silo services; not
``flwr run`` itself) used between the row of the previous round and its own, read from /proc
(this script makes itself a child subreaper so that nothing escapes the count). Start-up is
excluded: round 1 (which builds the silos) is reported apart, the table is the median over
rounds 2..R of every repeat.

    .venv/bin/python -m scripts.bench.deployed_round [--rounds 5] [--repeats 1] [--nodes 2]
        [--modes floor,floor-3s,before,inproc,after] [--superexec-poll 0.05] [--server-poll 0.05]
        [--json results.json]

Nothing in Flower is patched: the knobs are Flower's documented environment variable
FLWR_SUPEREXEC_TASK_POLL_INTERVAL and the apps' own run config. The SuperNode's 3 s sleep after
an empty pull (flwr/supernode/start_client_internal.py) and its 0.5 s reply wait are fixed in
Flower 1.42, so every exchange costs about 3 s plus a ``flwr-clientapp`` start.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.runtime.flwr_run import APP_SOURCES, copy_app_sources

ROOT = Path(__file__).resolve().parents[2]
NOOP_APP = Path(__file__).resolve().parent / "noop_app"
MODES = ("floor", "floor-3s", "before", "inproc", "after", "executor")
CLK_TCK = os.sysconf("SC_CLK_TCK")
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(home: Path, superexec_poll: float) -> dict[str, str]:
    env = dict(os.environ)
    env |= {"FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "OMP_NUM_THREADS": "1", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(superexec_poll),
            "PATH": str(BIN) + os.pathsep + env.get("PATH", "")}
    env.pop("PYTHONPATH", None)
    return env


# -- CPU accounting over the process tree ---------------------------------------------------------

def become_subreaper() -> None:
    """Orphaned descendants are re-parented to this process, so their CPU stays in the count."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        print("[bench] warning: cannot become a child subreaper; orphans' CPU may be missed", file=sys.stderr)


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, utime + stime + cutime + cstime in seconds) of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                raw = fh.read().decode(errors="replace")
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2:].split()
        table[int(entry)] = (int(rest[1]), sum(int(x) for x in rest[11:15]) / CLK_TCK)
    return table


def tree_cpu(groups: dict[int, str], exclude: set[int]) -> dict[str, float]:
    """CPU seconds so far of every descendant of this process, by the group of its top-level
    ancestor (``groups``: pid of a child we started -> its name); ``exclude``d subtrees left out."""
    table = _proc_table()
    me = os.getpid()
    out: dict[str, float] = {}
    for pid, (_, cpu) in table.items():
        chain, p = [], pid
        while p in table and p != me and p > 1:
            chain.append(p)
            p = table[p][0]
        if p != me or pid == me or any(c in exclude for c in chain):
            continue
        top = chain[-1]
        name = groups.get(top, "orphans")
        out[name] = out.get(name, 0.0) + cpu
    return out


# -- one deployment -------------------------------------------------------------------------------

@dataclass
class RunResult:
    mode: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    seen_at: list[float] = field(default_factory=list)
    cpu_at: list[dict[str, float]] = field(default_factory=list)
    status: str = "?"
    flwr_run_wall: float = 0.0
    error: str = ""

    def rounds(self) -> list[dict[str, Any]]:
        """Per round: wall (ServerApp), wall between rows, CPU between rows (total and by group)."""
        out = []
        for i, row in enumerate(self.rows):
            r: dict[str, Any] = {"round": row.get("round", i + 1), "wall_s": float(row.get("wall_s", float("nan"))),
                                 "answered": row.get("answered")}
            if i > 0 and i < len(self.cpu_at):
                prev, now = self.cpu_at[i - 1], self.cpu_at[i]
                by = {k: now.get(k, 0.0) - prev.get(k, 0.0) for k in set(now) | set(prev)}
                r |= {"between_s": self.seen_at[i] - self.seen_at[i - 1], "cpu_s": sum(by.values()),
                      "cpu_by": {k: round(v, 3) for k, v in sorted(by.items())}}
            out.append(r)
        return out


class Deployment:
    def __init__(self, mode: str, work: Path, nodes: int, superexec_poll: float, service: bool,
                 superlink_poll: float = 1.0) -> None:
        self.mode, self.work, self.nodes, self.service = mode, work, nodes, service
        self.superexec_poll, self.superlink_poll = superexec_poll, superlink_poll
        self.port = free_port()
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list[Any] = []
        self.home = work / "home"
        self.home.mkdir(parents=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "bench"\n[superlink.bench]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n')

    def _start(self, name: str, cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
        log = (self.work / f"{name}.log").open("w")
        self.logs.append(log)
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def log_text(self, name: str) -> str:
        path = self.work / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        # the SuperLink's own SuperExec only launches the ServerApp, once per run: Flower's
        # default poll there (polling it every 0.05 s would cost ~0.15 CPU s per second)
        env = base_env(self.home, self.superlink_poll)
        self._start("superlink", ["flower-superlink", "--insecure", "--port", str(self.port)], env, self.work)
        _wait(lambda: _tcp_open(self.port), 60, "the SuperLink did not open its port", self.log_text("superlink"))
        for i in range(self.nodes):
            node_dir = self.work / f"node{i}"
            (node_dir / "home").mkdir(parents=True)
            node_config = (f"partition-id={i} num-partitions={self.nodes} state-dir='{node_dir / 'state'}' "
                           "epsilon-cap=3.0 evaluation='private'")
            node_env = base_env(node_dir / "home", self.superexec_poll)
            if self.service:
                sock = node_dir / "svc" / "silo.sock"
                self._start(f"service{i}", [sys.executable, "-m", "app.runtime.silo_service", "--socket", str(sock),
                                            "--node-config", node_config], node_env, ROOT)
                _wait(lambda s=sock: _service_up(s), 120, f"silo service {i} did not come up",
                      lambda i=i: self.log_text(f"service{i}"))
                node_config += f" silo-service='{sock}'"
            rt_port = free_port()
            isolation = ["--isolation", "process"] if self.mode == "executor" else []
            self._start(f"supernode{i}", ["flower-supernode", "--insecure", "--superlink", f"127.0.0.1:{self.port}",
                                          "--port", str(rt_port), *isolation, "--node-config", node_config],
                        node_env, node_dir)
            if self.mode == "executor":
                self._start(f"service{i}", [sys.executable, "-m", "app.runtime.executor", "--runtime-api",
                                            f"127.0.0.1:{rt_port}", "--node-config", node_config], node_env, ROOT)
                _wait(lambda i=i: "[silofl-executor] ready" in self.log_text(f"service{i}"), 120,
                      f"executor {i} did not come up", lambda i=i: self.log_text(f"service{i}"))
        for i in range(self.nodes):
            _wait(lambda i=i: "SuperNode ID" in self.log_text(f"supernode{i}"), 120,
                  f"SuperNode {i} did not connect", lambda i=i: self.log_text(f"supernode{i}"))

    def groups(self) -> dict[int, str]:
        return {p.pid: name for name, p in self.procs.items()}

    def stop(self) -> None:
        for name in sorted(self.procs, key=lambda n: (not n.startswith("supernode"), n)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        _reap_orphans()
        for log in self.logs:
            log.close()


def _tcp_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _service_up(sock: Path) -> bool:
    from app.runtime import silo_protocol

    try:
        silo_protocol.ping(str(sock), timeout=1.0)
        return True
    except (silo_protocol.ServiceUnavailable, silo_protocol.ServiceError):
        return False


def _wait(ok, timeout: float, what: str, log) -> None:
    end = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > end:
            text = log() if callable(log) else log
            raise RuntimeError(f"{what} within {timeout:.0f} s; log tail:\n{text[-3000:]}")
        time.sleep(0.2)


def _reap_orphans() -> None:
    """Stop and reap what was re-parented to us (SuperExecs, ClientApps of stopped SuperNodes)."""
    deadline = time.monotonic() + 10
    while True:
        kids = [pid for pid, (ppid, _) in _proc_table().items() if ppid == os.getpid()]
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        live = [pid for pid in kids if os.path.exists(f"/proc/{pid}")]
        if not live:
            return
        for pid in live:
            try:
                os.kill(pid, signal.SIGTERM if time.monotonic() < deadline else signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.3)


def stage(mode: str, work: Path, before_ref: str) -> Path:
    """The app directory ``flwr run`` ships for ``mode``."""
    dst = work / "app-src"
    if mode.startswith("floor"):
        shutil.copytree(NOOP_APP, dst, ignore=shutil.ignore_patterns("__pycache__"))
    elif mode == "before":
        dst.mkdir()
        names = [n for n in APP_SOURCES if subprocess.run(["git", "cat-file", "-e", f"{before_ref}:{n}"], cwd=ROOT,
                                                            capture_output=True).returncode == 0]
        archive = subprocess.run(["git", "archive", "--format=tar", before_ref, *names], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dst)], input=archive, check=True)
    else:
        dst.mkdir()
        copy_app_sources(dst)
    return dst


def run_config(mode: str, rounds: int, out: Path, server_poll: float) -> str:
    cfg = {"num-rounds": rounds, "outputs-dir": str(out), "run-name": mode}
    if mode == "floor":
        cfg["poll-interval"] = server_poll
    elif mode == "floor-3s":
        cfg["poll-interval"] = 0.0
    elif mode in ("inproc", "after", "executor") and _has_key(ROOT / "pyproject.toml", "poll-interval"):
        cfg["poll-interval"] = server_poll
    return " ".join(f"{k}={json.dumps(v)}" for k, v in cfg.items())


def _has_key(pyproject: Path, key: str) -> bool:
    import tomllib

    return key in tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]


def run_mode(mode: str, args: argparse.Namespace) -> RunResult:
    work = Path(tempfile.mkdtemp(prefix=f"bench-{mode}-"))
    result = RunResult(mode)
    dep = Deployment(mode, work, args.nodes, args.superexec_poll, service=mode == "after",
                     superlink_poll=args.superlink_poll)
    out = work / "out"
    rows_path = out / mode / "rounds.jsonl"
    try:
        app_dir = stage(mode, work, args.before_ref)
        dep.start()
        env = base_env(dep.home, args.superexec_poll)
        cmd = ["flwr", "run", str(app_dir), "bench", "--stream", "--run-config",
               run_config(mode, args.rounds, out, args.server_poll)]
        t0 = time.monotonic()
        log = (work / "flwr-run.log").open("w")
        runner = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        stop = threading.Event()

        def watch() -> None:
            seen = 0
            while not stop.is_set():
                try:
                    text = rows_path.read_text()
                except OSError:
                    text = ""
                lines = [ln for ln in text[: text.rfind("\n") + 1].splitlines() if ln.strip()]  # whole lines only
                if len(lines) > seen:
                    now, cpu = time.monotonic(), tree_cpu(dep.groups(), {runner.pid})
                    for ln in lines[seen:]:
                        result.rows.append(json.loads(ln))
                        result.seen_at.append(now)
                        result.cpu_at.append(cpu)
                    seen = len(lines)
                    print(f"[bench] {mode}: round {seen}/{args.rounds} "
                          f"({result.rows[-1].get('wall_s', float('nan')):.2f} s)", flush=True)
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            runner.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            runner.kill()
            result.error = f"flwr run did not finish within {args.timeout} s"
        result.flwr_run_wall = time.monotonic() - t0
        time.sleep(0.2)
        stop.set()
        watcher.join()
        log.close()
        summary = out / mode / "summary.json"
        result.status = json.loads(summary.read_text()).get("status", "?") if summary.exists() else "no summary"
        if len(result.rows) < args.rounds and not result.error:
            result.error = f"only {len(result.rows)} of {args.rounds} rounds; see {work}/flwr-run.log"
    except Exception as exc:  # report and go on with the other modes
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        dep.stop()
    if result.error:
        print(f"[bench] {mode}: FAILED: {result.error} (logs in {work})", file=sys.stderr)
    elif not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def _median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def summarize(results: list[RunResult]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        runs = [r for r in results if r.mode == mode and not r.error]
        if not runs:
            continue
        later = [rd for r in runs for rd in r.rounds()[1:]]
        first = [r.rounds()[0] for r in runs if r.rows]
        groups: dict[str, list[float]] = {}  # part (superlink, supernode, service, ...) -> CPU per round
        for rd in later:
            parts: dict[str, float] = {}
            for k, v in rd.get("cpu_by", {}).items():
                parts[k.rstrip("0123456789")] = parts.get(k.rstrip("0123456789"), 0.0) + v
            for k, v in parts.items():
                groups.setdefault(k, []).append(v)
        table[mode] = {
            "wall_s": _median([rd["wall_s"] for rd in later]),
            "wall_min_s": min((rd["wall_s"] for rd in later), default=float("nan")),
            "wall_max_s": max((rd["wall_s"] for rd in later), default=float("nan")),
            "cpu_s": _median([rd.get("cpu_s", float("nan")) for rd in later]),
            "cpu_by_s": {k: round(_median(v), 3) for k, v in sorted(groups.items())},
            "round1_wall_s": _median([rd["wall_s"] for rd in first]),
            "rounds": len(later), "runs": len(runs), "status": sorted({r.status for r in runs}),
        }
    return table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--superexec-poll", type=float, default=0.05,
                    help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the SuperNodes' SuperExecs (Flower's default: 1 s)")
    ap.add_argument("--superlink-poll", type=float, default=1.0,
                    help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL of the SuperLink's SuperExec (it starts the ServerApp)")
    ap.add_argument("--server-poll", type=float, default=0.05, help="the ServerApps' poll-interval (s)")
    ap.add_argument("--before-ref", default="b69d7fb", help="the commit whose silofl is 'before' (default: the last one before the deployment work)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds one flwr run may take")
    ap.add_argument("--json", type=Path, default=None, help="write every round and the table here")
    ap.add_argument("--keep", action="store_true", help="keep the work directories (logs, ledgers)")
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown or args.rounds < 2 or (args.nodes != 2 and any(not m.startswith("floor") for m in modes)):
        print(f"bad arguments: known modes are {', '.join(MODES)} (got {sorted(unknown)} unknown); --rounds must be "
              ">= 2; silofl's default run needs --nodes 2", file=sys.stderr)
        return 2
    become_subreaper()
    results = []
    for rep in range(args.repeats):
        for mode in modes:
            print(f"[bench] repeat {rep + 1}/{args.repeats}: {mode}", flush=True)
            results.append(run_mode(mode, args))
    table = summarize(results)
    floor = table.get("floor", {}).get("wall_s")
    print(f"\nper round, median of rounds 2..{args.rounds} over {args.repeats} repeat(s); "
          f"{args.nodes} nodes, FLWR_SUPEREXEC_TASK_POLL_INTERVAL={args.superexec_poll} (SuperNodes; "
          f"{args.superlink_poll} SuperLink), "
          f"server poll-interval={args.server_poll}")
    print(f"{'mode':<9} {'wall s':>7} {'min':>6} {'max':>6} {'CPU s':>6} {'/floor':>7} {'round 1 s':>9}  CPU by part (s)")
    for mode, row in table.items():
        ratio = row["wall_s"] / floor if floor else float("nan")
        by = " ".join(f"{k}={v:.2f}" for k, v in row["cpu_by_s"].items())
        print(f"{mode:<9} {row['wall_s']:7.2f} {row['wall_min_s']:6.2f} {row['wall_max_s']:6.2f} {row['cpu_s']:6.2f} "
              f"{ratio:7.2f} {row['round1_wall_s']:9.2f}  {by}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "table": table,
                                         "runs": [{"mode": r.mode, "status": r.status, "error": r.error,
                                                   "flwr_run_wall_s": r.flwr_run_wall, "rounds": r.rounds()}
                                                  for r in results]}, indent=1))
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
