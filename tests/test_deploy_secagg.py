"""Secure aggregation in a real deployment on loopback: a SuperLink with TLS, node authentication
and a database, three registered SuperNodes (each silo behind its silo service, with its peers'
static keys pinned in its node config), and one SuperNode killed with SIGKILL while the run is
under way. The sum still opens with the two silos left (t = 2), the run completes, and every
silo's ledger is on its own disk. Every process started here is stopped by its pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_deploy_tls import DEPLOY, ROOT, Processes, env_for, free_ports, py, tls_ready, wait_for

pytestmark = pytest.mark.e2e


def test_secagg_over_tls_survives_a_supernode_killed_mid_run(tmp_path: Path) -> None:
    from app.privacy.envelope import StaticKeys
    from app.privacy.ledger import read_ledger

    pki = tmp_path / "pki"
    py("make_certs.py", "--out", str(pki / "certs"), "--host", "127.0.0.1")
    for i in range(3):
        py("make_node_key.py", "--out", str(pki / "keys"), "--name", f"silo{i}")
    ca = pki / "certs" / "ca.crt"
    # each silo's static key is made on its own disk; the operators exchange the public halves
    keys = [StaticKeys.load_or_create(tmp_path / f"state{i}" / f"secagg-silo{i}.key").public_hex for i in range(3)]
    peers = tmp_path / "peers.txt"
    peers.write_text("# the federation's silos\n" + "\n".join(keys) + "\n")

    sl_port, *runtime_ports = free_ports(4)
    procs = Processes()
    try:
        link_log = tmp_path / "superlink.log"
        link = procs.start("superlink", ["bash", str(DEPLOY / "superlink.sh"), "--certs", str(pki / "certs"),
                                         "--database", str(tmp_path / "superlink" / "state.db"),
                                         "--host", "127.0.0.1", "--port", str(sl_port)],
                           env_for(tmp_path / "superlink" / "home"), link_log)
        wait_for(lambda: tls_ready(sl_port, ca), 120, "the SuperLink did not come up", link, link_log)
        home = tmp_path / "researcher"
        reg = subprocess.run(["bash", str(DEPLOY / "register_node.sh"), "--superlink", "tls", "--address",
                              f"127.0.0.1:{sl_port}", "--root-cert", str(ca), "--record", str(tmp_path / "nodes"),
                              *(str(pki / "keys" / f"silo{i}.pub") for i in range(3))],
                             env=env_for(home), capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert reg.returncode == 0, reg.stdout + reg.stderr
        nodes = []
        for i, rt in enumerate(runtime_ports):
            log = tmp_path / f"supernode{i}.log"
            config = (f"partition-id={i} num-partitions=3 noise-seed='os' epsilon-cap=8.0 "
                      f"secagg-peer-keys='{peers}'")
            p = procs.start(f"supernode{i}", [
                "bash", str(DEPLOY / "supernode.sh"), "--superlink", f"127.0.0.1:{sl_port}", "--root-cert", str(ca),
                "--auth-key", str(pki / "keys" / f"silo{i}.key"), "--state-dir", str(tmp_path / f"state{i}"),
                "--runtime-port", str(rt), "--node-config", config], env_for(tmp_path / f"state{i}" / "home"), log)
            nodes.append((p, log))
        for p, log in nodes:
            wait_for(lambda log=log: "SuperNode ID:" in log.read_text(errors="replace"), 120,
                     f"{log.name}: no node id", p, log)

        out = tmp_path / "outputs"
        run_config = (f'num-rounds=3 privacy.mode="secagg" secagg.count-on=1 model="logistic" partition="iid" '
                      f'num-silos=3 silos-per-round=3 min-silos=2 round-timeout=30 privacy.epsilon=8.0 '
                      f'privacy.delta=1e-5 outputs-dir="{out}" run-name="secagg"')
        launcher_log = tmp_path / "launch.log"
        with launcher_log.open("wb") as fh:
            launcher = subprocess.Popen([sys.executable, "-m", "app.launch", "--superlink", "tls", "--run-config",
                                         run_config], cwd=ROOT, env=env_for(home), stdout=fh,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        procs.procs.append(("launcher", launcher))
        wait_for(lambda: "[silofl] round   1/3" in launcher_log.read_text(errors="replace"), 300,
                 "round 1 did not finish", launcher, launcher_log)
        victim, _ = nodes[2]
        # round 2's exchange is already under way: the whole node dies at once, no goodbye (flower-supernode
        # runs in a session of its own, so it is killed by its pid, with its silo service and launcher)
        for pid in _node_pids(tmp_path / "state2"):
            _kill(pid)
        os.killpg(victim.pid, signal.SIGKILL)
        t0 = time.monotonic()
        rc = launcher.wait(timeout=600)
        text = launcher_log.read_text(errors="replace")
        assert rc == 0, text[-4000:]
        assert "status finished:completed" in text, text[-3000:]
        rows = [json.loads(x) for x in (out / "secagg" / "rounds.jsonl").read_text().splitlines()]
        assert len(rows) == 3 and rows[0]["answered"] == 3, rows
        assert rows[2]["answered"] == 2, rows  # the sum opened with the two silos left
        summary = json.loads((out / "secagg" / "summary.json").read_text())
        assert summary["status"] == "completed"
        for i in (0, 1):  # the survivors' ledgers, on their own disks, hold Skellam releases of every round
            (ledger,) = (tmp_path / f"state{i}").glob("ledger-*.json")
            releases = read_ledger(ledger)["releases"]
            assert {r["round"] for r in releases} == {1, 2, 3}
            assert all(r["mechanism"] == "skellam" for r in releases)
        print(f"secagg over TLS: rounds 2-3 after the kill took {time.monotonic() - t0:.1f}s")
    finally:
        procs.stop_all()
        for i in range(3):  # a node whose launcher died first leaves its processes: they are ours, by pid
            for pid in _node_pids(tmp_path / f"state{i}"):
                _kill(pid)


def _node_pids(state: Path) -> list[int]:
    """The pids supernode.sh recorded in a node's state dir (flower-supernode, its silo service)."""
    pids = []
    for name in ("supernode.pid", "silo-service.pid", "executor.pid"):
        try:
            pids.append(int((state / name).read_text().strip()))
        except (OSError, ValueError):
            continue
    return pids


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` and its process group if it leads one, if it still is one of the node's
    processes this test started (a recorded pid that has since gone is never reused blindly)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if not any(name in cmd for name in (b"flower-supernode", b"silo_service", b"app.runtime.executor")):
        return
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except (ProcessLookupError, PermissionError):
            pass
