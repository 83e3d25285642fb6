"""Deployment security tooling (scripts/deploy/): certificates, SuperNode keys, the launchers.

Fast tests: the CA and SuperLink certificate that make_certs.py writes verify (SAN, chain, a real
TLS handshake on loopback), the node keys are in the formats flower-supernode and
``flwr supernode register`` load, and the launchers refuse to start without certificates unless
``--insecure``. The ``e2e`` tests start a real federation on loopback (free ports, temporary
FLWR_HOMEs): a SuperLink with TLS, node authentication and a database, two registered SuperNodes,
a 2-round run of the embedded default through the launcher, and a SuperNode whose key was never
registered, which the SuperLink refuses. Every process started here is stopped by its pid.
"""

from __future__ import annotations

import importlib.util
import json
import re
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "scripts" / "deploy"
BIN = Path(sys.executable).parent


def env_for(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env |= {"FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "PATH": str(BIN) + os.pathsep + env.get("PATH", "")}
    return env


def py(script: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    module = f"scripts.deploy.{script.removesuffix('.py')}"  # run as a module, from the repository root
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    py("make_certs.py", "--out", str(d / "certs"), "--host", "127.0.0.1", "--host", "superlink.example.org",
       "--host", "10.0.0.1")
    for name in ("silo0", "silo1", "rogue"):
        py("make_node_key.py", "--out", str(d / "keys"), "--name", name)
    return {"dir": d, "certs": d / "certs", "keys": d / "keys", "ca": d / "certs" / "ca.crt"}


# ----------------------------------------------------------------------------------------------
# (a) certificates and keys


def test_certificates_verify_and_chain_to_the_ca(pki, tmp_path) -> None:
    import ipaddress

    from cryptography import x509

    certs = pki["certs"]
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((certs / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)  # raises unless signed by the CA
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("127.0.0.1"),
                                                             ipaddress.ip_address("10.0.0.1")}
    assert set(san.get_values_for_type(x509.DNSName)) == {"superlink.example.org", "localhost"}
    for key in ("ca.key", "server.key"):
        assert stat.S_IMODE((certs / key).stat().st_mode) == 0o600

    # A real TLS handshake on loopback: a client that trusts only ca.crt accepts the server at
    # 127.0.0.1, and one that trusts another CA refuses it.
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs / "server.pem", certs / "server.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve(n: int) -> None:
        for _ in range(n):
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass

    thread = threading.Thread(target=serve, args=(2,), daemon=True)
    thread.start()
    try:
        client = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with client.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert tls.recv(2) == b"ok"
        py("make_certs.py", "--out", str(tmp_path / "other"), "--host", "127.0.0.1")
        stranger = ssl.create_default_context(cafile=str(tmp_path / "other" / "ca.crt"))
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with pytest.raises(ssl.SSLCertVerificationError):
                stranger.wrap_socket(raw, server_hostname="127.0.0.1")
    finally:
        thread.join(timeout=10)
        listener.close()

    # The launcher's own check agrees, and refuses a host the certificate does not name.
    ok = py("deploy_util.py", "check-cert", "--ca", str(certs / "ca.crt"), "--cert", str(certs / "server.pem"),
            "--key", str(certs / "server.key"), "--host", "0.0.0.0")
    assert "certificate OK" in ok.stdout
    bad = py("deploy_util.py", "check-cert", "--ca", str(certs / "ca.crt"), "--cert", str(certs / "server.pem"),
             "--key", str(certs / "server.key"), "--host", "10.9.9.9", check=False)
    assert bad.returncode == 2 and "does not name 10.9.9.9" in bad.stderr


def test_make_certs_keeps_an_existing_ca(tmp_path) -> None:
    from cryptography import x509

    out = tmp_path / "certs"
    py("make_certs.py", "--out", str(out), "--host", "127.0.0.1")
    ca_before = (out / "ca.crt").read_bytes()
    refused = py("make_certs.py", "--out", str(out), "--host", "127.0.0.1", check=False)
    assert refused.returncode == 2 and "already exists" in refused.stderr
    assert (out / "ca.crt").read_bytes() == ca_before
    server_before = (out / "server.pem").read_bytes()
    py("make_certs.py", "--out", str(out), "--host", "127.0.0.1", "--host", "new.example.org", "--reuse-ca")
    assert (out / "ca.crt").read_bytes() == ca_before and (out / "server.pem").read_bytes() != server_before
    x509.load_pem_x509_certificate((out / "server.pem").read_bytes()).verify_directly_issued_by(
        x509.load_pem_x509_certificate(ca_before))
    py("make_certs.py", "--out", str(out), "--host", "127.0.0.1", "--force")
    assert (out / "ca.crt").read_bytes() != ca_before
    assert py("make_certs.py", "--out", str(tmp_path / "x"), "--host", "bad_host!", check=False).returncode == 2


def test_node_keys_load_as_flower_loads_them(pki) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    from flwr.cli.supernode.register import try_load_public_key

    keys = pki["keys"]
    private = load_ssh_private_key((keys / "silo0.key").read_bytes(), None)  # as flower-supernode does
    assert isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(private.curve, ec.SECP384R1)
    assert stat.S_IMODE((keys / "silo0.key").stat().st_mode) == 0o600
    assert (keys / "silo0.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    registered = try_load_public_key(keys / "silo0.pub")  # as `flwr supernode register` does
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    assert registered == public_key_to_bytes(private.public_key())
    again = py("make_node_key.py", "--out", str(keys), "--name", "silo0", check=False)
    assert again.returncode == 2 and "exists" in again.stderr


# ----------------------------------------------------------------------------------------------
# (d) launchers refuse to start insecurely by accident


def test_launchers_without_certificates_refuse_to_start(pki, tmp_path) -> None:
    env = env_for(tmp_path / "home")
    port = free_ports(1)[0]

    def sh(script: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(DEPLOY / script), *args], capture_output=True, text=True, timeout=60,
                              env=env, cwd=tmp_path)

    link = sh("superlink.sh", "--database", str(tmp_path / "db" / "s.db"), "--host", "127.0.0.1", "--port", str(port))
    assert link.returncode == 2
    assert link.stderr.strip().splitlines() == [
        "superlink.sh: error: no TLS certificates: give --certs DIR (make them with make_certs.py), "
        "or --insecure for a loopback test"]
    assert not (tmp_path / "db").exists()  # refused before anything was created or started

    node = sh("supernode.sh", "--superlink", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "s0"),
              "--node-config", "partition-id=0 num-partitions=2")
    assert node.returncode == 2 and len(node.stderr.strip().splitlines()) == 1
    assert "--root-cert is required" in node.stderr and "--insecure" in node.stderr
    no_key = sh("supernode.sh", "--superlink", f"127.0.0.1:{port}", "--root-cert", str(pki["ca"]),
                "--state-dir", str(tmp_path / "s0"), "--node-config", "partition-id=0 num-partitions=2")
    assert no_key.returncode == 2 and "--auth-key is required" in no_key.stderr
    mixed = sh("supernode.sh", "--superlink", f"127.0.0.1:{port}", "--insecure", "--auth-key",
               str(pki["keys"] / "silo0.key"), "--state-dir", str(tmp_path / "s0"))
    assert mixed.returncode == 2 and "--insecure excludes" in mixed.stderr
    clash = sh("supernode.sh", "--superlink", f"127.0.0.1:{port}", "--root-cert", str(pki["ca"]), "--auth-key",
               str(pki["keys"] / "silo0.key"), "--state-dir", str(tmp_path / "a"),
               "--node-config", f"partition-id=0 num-partitions=2 state-dir='{tmp_path / 'b'}'")
    assert clash.returncode == 2 and "give it once" in clash.stderr
    assert not (tmp_path / "s0").exists() and not (tmp_path / "a").exists()
    reg = sh("register_node.sh", "--superlink", "x", str(pki["keys"] / "silo0.key"))
    assert reg.returncode == 2 and "not an OpenSSH ECDSA public key" in reg.stderr


# ----------------------------------------------------------------------------------------------
# (b), (c) a real federation on loopback: TLS + node authentication


class Processes:
    """Processes started by the tests, each in its own session; stopped by pid (SIGTERM to the
    launcher script, whose trap stops its children; SIGKILL to its process group after 20 s)."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        with log.open("ab") as fh:
            p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, p))
        return p

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGTERM)
                p.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the group is this process's own (start_new_session)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop_all(self) -> None:
        for _, p in reversed(self.procs):
            self.stop(p)


def wait_for(pred, timeout: float, what: str, alive: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if alive is not None and alive.poll() is not None:
            break
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"{what} (waited up to {timeout:.0f}s)\n{tail}")


def tls_ready(port: int, ca: Path) -> bool:
    try:
        ctx = ssl.create_default_context(cafile=str(ca))
        with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                return True
    except OSError:
        return False


def node_config(i: int) -> str:
    return f"partition-id={i} num-partitions=2 noise-seed='os' epsilon-cap=3.0"


@pytest.fixture(scope="module")
def federation(pki, tmp_path_factory):
    work = tmp_path_factory.mktemp("fed")
    sl_port, rt0, rt1 = free_ports(3)
    procs = Processes()
    try:
        link_log = work / "superlink.log"
        link = procs.start("superlink", ["bash", str(DEPLOY / "superlink.sh"), "--certs", str(pki["certs"]),
                                         "--database", str(work / "superlink" / "state.db"),
                                         "--host", "127.0.0.1", "--port", str(sl_port)],
                           env_for(work / "superlink" / "home"), link_log)
        wait_for(lambda: tls_ready(sl_port, pki["ca"]), 120, "the SuperLink did not come up", link, link_log)

        home = work / "researcher"
        reg = subprocess.run(["bash", str(DEPLOY / "register_node.sh"), "--superlink", "tls", "--address",
                              f"127.0.0.1:{sl_port}", "--root-cert", str(pki["ca"]), "--record", str(work / "nodes"),
                              str(pki["keys"] / "silo0.pub"), str(pki["keys"] / "silo1.pub")],
                             env=env_for(home), capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert reg.returncode == 0, reg.stdout + reg.stderr
        assert reg.stdout.count("registered ") == 2, reg.stdout

        logs = []
        for i, rt in enumerate((rt0, rt1)):
            log = work / f"supernode{i}.log"
            p = procs.start(f"supernode{i}", [
                "bash", str(DEPLOY / "supernode.sh"), "--superlink", f"127.0.0.1:{sl_port}",
                "--root-cert", str(pki["ca"]), "--auth-key", str(pki["keys"] / f"silo{i}.key"),
                "--state-dir", str(work / f"state{i}"), "--runtime-port", str(rt), "--node-config", node_config(i),
                # silo 0 answers through its silo service, silo 1 through the long-lived executor
                *(["--executor"] if i == 1 else [])],
                env_for(work / f"state{i}" / "home"), log)
            logs.append((p, log))
        for p, log in logs:
            wait_for(lambda log=log: "SuperNode ID:" in log.read_text(errors="replace"), 120,
                     f"{log.name}: no node id", p, log)
        yield {"work": work, "port": sl_port, "home": home, "procs": procs, "link_log": link_log}
    finally:
        procs.stop_all()


@pytest.mark.e2e
def test_unregistered_node_key_is_refused(federation, pki) -> None:
    work, procs = federation["work"], federation["procs"]
    log = work / "rogue.log"
    p = procs.start("rogue", [
        "bash", str(DEPLOY / "supernode.sh"), "--superlink", f"127.0.0.1:{federation['port']}",
        "--root-cert", str(pki["ca"]), "--auth-key", str(pki["keys"] / "rogue.key"),
        "--state-dir", str(work / "rogue"), "--runtime-port", str(free_ports(1)[0]), "--no-silo-service",
        "--node-config", node_config(0)], env_for(work / "rogue" / "home"), log)
    try:
        rc = p.wait(timeout=90)
    except subprocess.TimeoutExpired:
        procs.stop(p)
        pytest.fail(f"the unregistered SuperNode was still running after 90 s\n{log.read_text()[-3000:]}")
    text = log.read_text(errors="replace")
    assert rc != 0, text
    assert "Exit Code: 305" in text and "Flower exit code 305" in text, text
    assert "SuperNode ID:" not in text


@pytest.mark.e2e
def test_two_round_run_over_tls_with_registered_nodes(federation) -> None:
    work = federation["work"]
    out = work / "outputs"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "app.launch", "--superlink", "tls", "--run-config",
                           f"num-rounds=2 outputs-dir='{out}'"], cwd=ROOT, env=env_for(federation["home"]),
                          capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "status finished:completed" in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.count("[silofl] round ") == 2
    (summary_path,) = out.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "completed" and len(summary["silos"]) == 2
    from app.privacy.ledger import read_ledger

    for i in (0, 1):  # each silo's own ledger, on its side, records both rounds
        (ledger,) = (work / f"state{i}").glob("ledger-*.json")
        assert sorted(r["round"] for r in read_ledger(ledger)["releases"]) == [1, 2]
    if importlib.util.find_spec("app.runtime.silo_service") is not None:  # supernode.sh's default path
        assert "[silo-service] listening on" in (work / "supernode0.log").read_text(errors="replace")
    executor_log = (work / "supernode1.log").read_text(errors="replace")  # supernode.sh --executor
    trained = re.findall(r"\[silofl-executor\] run \d+ train \d+ ms \(completed\)", executor_log)
    assert "[silofl-executor] ready" in executor_log and len(trained) == 2, executor_log[-3000:]
    link_log = federation["link_log"].read_text(errors="replace")
    assert "Uvicorn running on https://127.0.0.1" in link_log and "--enable-supernode-auth" in link_log
    print(f"2-round TLS run: {wall:.1f}s wall")


def _processes_naming(*needles: str) -> dict[int, str]:
    """pid -> command line of every process whose command line holds one of ``needles``."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(n in cmd for n in needles):
                out[int(d.name)] = cmd
    return out


@pytest.mark.slow
def test_supernode_sh_leaves_no_process_after_sigterm(tmp_path: Path) -> None:
    """supernode.sh (no TLS, a SuperLink port where nothing listens: flower-supernode keeps trying)
    stopped with SIGTERM: nothing it started is left, not flower-supernode's flower-superexec
    child nor the tee of its log. Before: both outlived the script (the child held the log's
    pipe open, so its tee did too; issue 35 saw two tee processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    rt, = free_ports(1)
    state = tmp_path / "state"
    needles = (str(state / "supernode.log"), f"127.0.0.1:{rt}")
    env = env_for(tmp_path / "home") | {"PYTHON": sys.executable}
    script = subprocess.Popen(["bash", str(DEPLOY / "supernode.sh"), "--insecure", "--superlink",
                               f"127.0.0.1:{closed}", "--runtime-port", str(rt), "--state-dir", str(state),
                               "--no-silo-service", "--node-config", "partition-id=0 num-partitions=2"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 90
        while not any("flower-superexec" in c for c in _processes_naming(*needles).values()):
            assert script.poll() is None and time.monotonic() < deadline, "flower-superexec never started"
            time.sleep(0.2)
        script.send_signal(signal.SIGTERM)
        script.wait(timeout=30)
        assert script.returncode == 143
        assert _processes_naming(*needles) == {}
    finally:
        if script.poll() is None:
            script.kill()
        for pid in _processes_naming(*needles):  # only this test's, by their unique port and path
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
