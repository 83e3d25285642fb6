"""A multi-host fault drill on one machine: a SuperLink and 3 SuperNodes, each on its own
"host" (a Linux network namespace with its own address), TLS + SuperNode authentication, the
deployment scripts of this folder, and the silos' services.

    sudo .venv/bin/python -m scripts.deploy.netns_fault_drill [--rounds 6] [--keep DIR]

What it does, and checks (exit 0 only if every check passes):

1. **A silo host dies mid-run** (every process in its namespace SIGKILLed after round 2): the
   run goes on with M_r < M (rounds logged with a missing silo), the host comes back (same
   state dir, same key), the silo's ledger is reloaded (its releases and eps continue, never
   reset), and the run ends ``completed``.
2. **The server host dies mid-run** (SuperLink, ServerApp and launcher SIGKILLed after round
   3): the SuperLink restarts from its database, the SuperNodes reconnect, and
   ``python -m app.launch --resume`` continues from the checkpoint; the final model equals,
   bit for bit, that of the same run (same seed) that was never interrupted.

Topology: namespaces ``<tag>-sl`` (10.<x>.0.1, the SuperLink and the researcher's launcher) and
``<tag>-n0..n2`` (10.<x>.0.11..13), each joined by a veth pair to a bridge in ``<tag>-hub``. Only
addresses inside these namespaces are used. Everything started is stopped, and the namespaces
are deleted, on exit (also on failure or Ctrl-C), and every wait is bounded.
Needs root (``ip netns``) and the project's .venv.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "scripts" / "deploy"
PY = str(ROOT / ".venv" / "bin" / "python")
NUM = 3


def log(msg: str) -> None:
    print(f"[drill {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(*cmd: str, check: bool = True, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, timeout=timeout, capture_output=True, text=True, **kw)


class Net:
    """The namespaces and links of the drill; ``close`` kills what runs in them and deletes them."""

    def __init__(self, tag: str, subnet: int) -> None:
        self.tag, self.subnet = tag, subnet
        self.hub = f"{tag}-hub"
        self.hosts = {"sl": 1, **{f"n{i}": 11 + i for i in range(NUM)}}
        self.created: list[str] = []

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def ip(self, host: str) -> str:
        return f"10.{self.subnet}.0.{self.hosts[host]}"

    def up(self) -> None:
        for name in [self.hub, *map(self.ns, self.hosts)]:
            sh("ip", "netns", "add", name)
            self.created.append(name)
            sh("ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
        sh("ip", "netns", "exec", self.hub, "ip", "link", "add", "br0", "type", "bridge")
        sh("ip", "netns", "exec", self.hub, "ip", "link", "set", "br0", "up")
        for k, host in enumerate(self.hosts):
            a, b = f"{self.tag[:6]}h{k}", f"{self.tag[:6]}p{k}"
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", self.ns(host))
            sh("ip", "link", "set", b, "netns", self.hub)
            sh("ip", "netns", "exec", self.hub, "ip", "link", "set", b, "master", "br0")
            sh("ip", "netns", "exec", self.hub, "ip", "link", "set", b, "up")
            sh("ip", "netns", "exec", self.ns(host), "ip", "addr", "add", f"{self.ip(host)}/24", "dev", a)
            sh("ip", "netns", "exec", self.ns(host), "ip", "link", "set", a, "up")

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process in the host's namespace (the machine loses power)."""
        out = sh("ip", "netns", "pids", self.ns(host), check=False).stdout.split()
        for pid in map(int, out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sh("ip", "netns", "pids", self.ns(host), check=False).stdout.strip():
            time.sleep(0.1)
        return [int(p) for p in out]

    def close(self) -> None:
        for name in reversed(self.created):
            if name != self.hub:
                self.kill_host(name.removeprefix(f"{self.tag}-"))
            sh("ip", "netns", "del", name, check=False)
        self.created.clear()


class Drill:
    def __init__(self, work: Path, rounds: int, node_rounds: int) -> None:
        self.work, self.rounds, self.node_rounds = work, rounds, node_rounds
        self.net = Net(f"sfl{os.getpid() % 10000}", 100 + os.getpid() % 100)
        self.procs: dict[str, subprocess.Popen] = {}
        self.certs, self.keys = work / "certs", work / "keys"
        self.home = work / "researcher-home"  # the researcher's FLWR_HOME (flwr run, flwr supernode)
        self.outputs = work / "outputs"
        self.env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
                        FLWR_DISABLE_UPDATE_CHECK="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                        PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ.get('PATH', '')}")

    # -- processes --------------------------------------------------------------------------
    def start(self, name: str, host: str, cmd: list[str], home: Path) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        logf = (self.work / f"{name}.log").open("a")
        proc = subprocess.Popen(["ip", "netns", "exec", self.net.ns(host), *cmd], cwd=ROOT, stdout=logf,
                                stderr=subprocess.STDOUT, env=self.env | {"FLWR_HOME": str(home)},
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def crash(self, host: str) -> list[int]:
        """Every process on ``host`` SIGKILLed; the ones this drill started are reaped."""
        killed = self.net.kill_host(host)
        for proc in self.procs.values():
            proc.poll()
        return killed

    def superlink(self) -> None:
        self.start("superlink", "sl", ["bash", str(DEPLOY / "superlink.sh"), "--certs", str(self.certs),
                                       "--database", str(self.work / "superlink" / "superlink.db"),
                                       "--host", self.net.ip("sl"), "--port", "8000"], self.work / "superlink")
        self.wait_port("sl", 8000, 60)

    def supernode(self, i: int) -> None:
        node = f"partition-id={i} num-partitions={NUM} noise-seed='run'"
        self.start(f"node{i}", f"n{i}", ["bash", str(DEPLOY / "supernode.sh"), "--superlink",
                                         f"{self.net.ip('sl')}:8000", "--root-cert", str(self.certs / "ca.crt"),
                                         "--auth-key", str(self.keys / f"silo{i}.key"),
                                         "--state-dir", str(self.state(i)), "--node-config", node],
                   self.work / f"node{i}-home")

    def state(self, i: int) -> Path:
        return self.work / f"node{i}-state"

    def wait_port(self, host: str, port: int, timeout: float) -> None:
        probe = (f"import socket,sys,time\nend=time.time()+{timeout}\n"
                 f"while time.time()<end:\n  try:\n    socket.create_connection(('{self.net.ip(host)}',{port}),1).close();"
                 f" sys.exit(0)\n  except OSError: time.sleep(0.3)\nsys.exit(1)")
        r = subprocess.run(["ip", "netns", "exec", self.net.ns(host), PY, "-c", probe], timeout=timeout + 10)
        if r.returncode:
            raise RuntimeError(f"nothing listens on {self.net.ip(host)}:{port} after {timeout:.0f} s")

    def launch(self, name: str, args: list[str]) -> subprocess.Popen:
        return self.start(name, "sl", [PY, "-m", "app.launch", "--superlink", "drill", *args], self.home)

    def run_config(self, name: str, rounds: int | None = None) -> str:
        return (f"num-silos={NUM} silos-per-round={NUM} partition='iid' num-rounds={rounds or self.rounds} "
                "eval-every=0 round-timeout=60 "
                f"node-wait=60 min-silos=2 run-name='{name}' outputs-dir='{self.outputs}'")

    def rows(self, name: str) -> list[dict]:
        path = self.outputs / name / "rounds.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_rows(self, name: str, n: int, timeout: float, proc: subprocess.Popen | None = None) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.rows(name)
            if len(rows) >= n:
                return rows
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{name}: the launcher exited ({proc.returncode}) after {len(rows)} rounds")
            time.sleep(0.3)
        raise RuntimeError(f"{name}: {n} rounds not done within {timeout:.0f} s")

    def wait_exit(self, proc: subprocess.Popen, timeout: float) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"a launcher did not finish within {timeout:.0f} s") from exc

    def ledger(self, i: int) -> list[dict]:
        """Silo i's ledgers: (file, releases, eps) for each run-scope ledger file."""
        from app.privacy.ledger import PrivacyLedger, read_ledger

        out = []
        for path in sorted(self.state(i).glob("ledger-*.json")):
            data = read_ledger(path)
            ledger = PrivacyLedger.open(path, float(data["epsilon_budget"]), float(data["delta"]))
            out.append({"file": path.name, "releases": len(ledger.releases), "eps": round(ledger.spent(), 4)})
        return out

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.net.close()

    # -- the drill ----------------------------------------------------------------------------
    def setup(self) -> None:
        self.net.up()
        log(f"hosts: SuperLink {self.net.ip('sl')}, silos " + ", ".join(self.net.ip(f"n{i}") for i in range(NUM)))
        sh(PY, "-m", "scripts.deploy.make_certs", "--out", str(self.certs), "--host", self.net.ip("sl"), "--no-loopback",
           cwd=ROOT)
        for i in range(NUM):
            sh(PY, "-m", "scripts.deploy.make_node_key", "--out", str(self.keys), "--name", f"silo{i}", cwd=ROOT)
        self.superlink()
        log("SuperLink up (TLS, node auth, database); registering 3 node keys")
        r = subprocess.run(["ip", "netns", "exec", self.net.ns("sl"), "bash", str(DEPLOY / "register_node.sh"),
                            "--superlink", "drill", "--address", f"{self.net.ip('sl')}:8000", "--root-cert",
                            str(self.certs / "ca.crt"), *[str(self.keys / f"silo{i}.pub") for i in range(NUM)]],
                           cwd=ROOT, env=self.env | {"FLWR_HOME": str(self.home)}, capture_output=True, text=True,
                           timeout=120)
        if r.returncode:
            raise RuntimeError(f"registration failed: {r.stdout[-500:]} {r.stderr[-500:]}")
        for i in range(NUM):
            self.supernode(i)

    def node_fault(self) -> dict[str, Any]:
        name = "drill-node-fault"
        t0 = time.monotonic()
        proc = self.launch(name, ["--run-config", self.run_config(name, self.node_rounds)])
        self.wait_rows(name, 2, 300, proc)
        before = self.ledger(2)
        killed = self.crash("n2")
        log(f"round 2 done; host n2 killed (pids {killed}); silo 2's ledger {before}")
        rows = self.wait_rows(name, 3, 200, proc)
        log(f"round 3: silos {rows[2]['answered']}/{NUM} (missing {rows[2]['missing']}, failed {rows[2]['failed']})")
        # the host comes back; like a service manager (systemd Restart=on-failure), restart the
        # SuperNode until the SuperLink takes it: within Flower's heartbeat window (about 60 s)
        # its old session still counts as online and a new one is refused (Flower exit code 305)
        stop = threading.Event()
        attempts: list[float] = []

        def supervise() -> None:
            while not stop.is_set():
                attempts.append(time.monotonic() - t0)
                self.supernode(2)
                while self.procs["node2"].poll() is None and not stop.is_set():
                    time.sleep(0.5)
                stop.wait(5.0)

        watcher = threading.Thread(target=supervise, daemon=True)
        watcher.start()
        log("host n2 restarted (same state dir, same key); its SuperNode is supervised")
        rc = self.wait_exit(proc, 900)
        stop.set()
        back = next((r["round"] for r in self.rows(name)[3:] if r["answered"] == NUM), None)
        log(f"n2's SuperNode was started {len(attempts)} time(s) (at {', '.join(f'{a:.0f}' for a in attempts)} s); "
            f"all 3 silos answered again from round {back}")
        rows = self.rows(name)
        summary = json.loads((self.outputs / name / "summary.json").read_text())
        after = self.ledger(2)
        log(f"run ended: launcher exit {rc}, status {summary['status']}, rounds "
            + " ".join(f"{r['round']}:{r['answered']}/{NUM}" for r in rows) + f"; {time.monotonic() - t0:.0f} s")
        log(f"silo 2's ledger before the kill {before}, at the end {after}")
        ok = (rc == 0 and summary["status"] == "completed" and min(r["answered"] for r in rows) < NUM
              and all(r["answered"] >= 2 for r in rows) and rows[-1]["answered"] == NUM
              and len(after) == len(before) == 1
              and after[0]["releases"] > before[0]["releases"] and after[0]["eps"] >= before[0]["eps"])
        return {"ok": ok, "exit": rc, "status": summary["status"], "answered": [r["answered"] for r in rows],
                "ledger_before": before, "ledger_after": after}

    def server_fault(self) -> dict[str, Any]:
        ref, cut = "drill-reference", "drill-server-fault"
        proc = self.launch(ref, ["--run-config", self.run_config(ref)])
        rc_ref = self.wait_exit(proc, 600)
        log(f"reference run (never interrupted): launcher exit {rc_ref}")
        proc = self.launch(cut, ["--run-config", self.run_config(cut)])
        self.wait_rows(cut, 3, 300, proc)
        killed = self.crash("sl")
        log(f"round 3 done; server host killed (SuperLink, ServerApp, launcher: pids {killed})")
        self.superlink()
        log("SuperLink restarted from its database; resuming")
        t0 = time.monotonic()
        proc = self.launch(f"{cut}-resume", ["--resume", cut, "--run-config", f"outputs-dir='{self.outputs}'"])
        rc = self.wait_exit(proc, 600)
        summary = json.loads((self.outputs / cut / "summary.json").read_text())
        import numpy as np

        from app.checkpoint import load_checkpoint

        a = load_checkpoint(self.outputs / cut / "checkpoint.npz")
        b = load_checkpoint(self.outputs / ref / "checkpoint.npz")
        same = all(np.array_equal(a["model"][k], b["model"][k]) for k in b["model"])
        rows, ref_rows = self.rows(cut), self.rows(ref)
        log(f"resumed after round {summary.get('resumed_after_round')}: launcher exit {rc}, status {summary['status']}, "
            f"{time.monotonic() - t0:.0f} s; final model == uninterrupted run's: {same}; max |diff| "
            f"{max(float(np.max(np.abs(a['model'][k] - b['model'][k]))) for k in b['model']):.3g}")
        log("eps per round, resumed vs uninterrupted: "
            + " ".join(f"{r['eps_max']:.3f}/{q['eps_max']:.3f}" for r, q in zip(rows, ref_rows, strict=False)))
        ledgers = {i: self.ledger(i) for i in range(NUM)}
        log(f"ledgers: {ledgers}")
        ok = rc == 0 and rc_ref == 0 and summary["status"] == "completed" and same and len(rows) == self.rounds
        return {"ok": ok, "exit": rc, "same_model": same, "resumed_after_round": summary.get("resumed_after_round")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6, help="rounds of the server-fault runs")
    ap.add_argument("--node-rounds", type=int, default=14,
                    help="rounds of the node-fault run (enough for the killed node to be let back in)")
    ap.add_argument("--keep", type=Path, default=None, help="work folder to keep (logs, outputs, ledgers)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("the drill needs root and iproute2 (ip netns)", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="silofl-drill-"))
    work.mkdir(parents=True, exist_ok=True)
    drill = Drill(work, args.rounds, args.node_rounds)
    t0 = time.monotonic()
    try:
        drill.setup()
        node = drill.node_fault()
        log(f"node fault: {'PASS' if node['ok'] else 'FAIL'} {node}")
        server = drill.server_fault()
        log(f"server fault: {'PASS' if server['ok'] else 'FAIL'} {server}")
        ok = node["ok"] and server["ok"]
    except Exception as exc:  # noqa: BLE001 - report, clean up, fail
        log(f"FAIL: {type(exc).__name__}: {exc} (logs in {work})")
        ok = False
    finally:
        drill.stop_all()
    log(f"{'PASS' if ok else 'FAIL'} in {time.monotonic() - t0:.0f} s; logs in {work}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
