"""The silo service's memory budget, frame limit and fairness (app/runtime/silo_service.py; issue 35 §3).

Before this version a same-uid process that reopened 8 silent connections as soon as each was
cut kept every legitimate ping and request ``busy`` (0 of 40 pings answered in 20 s, measured
with scripts/bench/service_abuse.py), and 3 concurrent 200 MiB garbage frames took the service's
peak RSS from 0.74 to 1.87 GB (each frame read whole, twice over: 8 x 1 GiB frames allowed ~16 GB).

Three halves: the real service as a subprocess next to a hostile process (its own pid) that
reopens its connections; the real service's peak RSS (VmHWM) under concurrent huge frames from
several processes; an in-process service with a stub node (torch-free) for the budget counter,
the refusal before the body, the pending pool and the CLI.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from flwr.app import RecordDict

from app.runtime import silo_protocol, silo_service
from scripts.bench.service_abuse import count_pings, frame_head, peak_rss, spawn_hostile
from tests.helpers import service_env, service_node_config, wait_for_service

ROOT = Path(__file__).resolve().parent.parent
SMALL_MODEL = 2_000_000  # max-model-params of the memory test's service: a 34 MB frame limit


def _start(tmp: Path, node: str, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    sock, log = tmp / "svc.sock", tmp / "service.log"
    proc = subprocess.Popen([sys.executable, "-m", "app.runtime.silo_service", "--socket", str(sock), "--node-config", node,
                             *extra], cwd=ROOT, env=service_env(tmp), stdout=log.open("w"), stderr=subprocess.STDOUT)
    return proc, sock, log


def _ready(proc: subprocess.Popen, sock: Path, log: Path) -> None:
    wait_for_service(proc, sock, log, 150)


@pytest.fixture(scope="module")
def services():
    """Two real services, loading side by side: ``fair`` with the operator's defaults, ``mem``
    with a small ``max-model-params`` (its frame limit and budget derived from it)."""
    tmps = [Path(tempfile.mkdtemp(prefix="silolim")) for _ in range(2)]  # short: a socket path <= 107 bytes
    fair = _start(tmps[0], service_node_config(tmps[0] / "state"))
    mem = _start(tmps[1], service_node_config(tmps[1] / "state") + f" max-model-params={SMALL_MODEL}")
    try:
        for proc, sock, log in (fair, mem):
            _ready(proc, sock, log)
        yield {"fair": fair, "mem": mem}
    finally:
        for proc, _, _ in (fair, mem):
            if proc.poll() is None:
                proc.kill()  # by pid: this test's own processes
                proc.wait(10)
        for tmp in tmps:
            shutil.rmtree(tmp, ignore_errors=True)


def _ledger_query(sock: Path) -> str:
    from app import wire
    from app.launch import merged_run_config

    try:
        silo_protocol.request(str(sock), wire.LEDGER_QUERY, RecordDict(), 1,
                             merged_run_config([]) | {"privacy.epsilon": 3.0}, timeout=30.0)
        return "answered"
    except silo_protocol.ServiceUnavailable as exc:
        return f"unavailable: {exc}"


@pytest.mark.parametrize("mode", ["silent", "stall"])
def test_pings_and_requests_are_answered_while_a_hostile_peer_reopens_its_connections(services, mode) -> None:
    """A same-uid process keeps 8 connections (the default request pool) open, each silent or
    sending a request header and then nothing, and reopens each as soon as it is cut. Before:
    every ping and request got 'busy' (0 of 40 pings in 20 s). Now silent peers never hold a
    request slot (they wait in the pending pool and are cut after the 2 s header timeout) and a
    peer process holds at most half the slots, so every ping and request is answered."""
    proc, sock, log = services["fair"]
    assert _ledger_query(sock) == "answered"  # warm: the silo is built
    hostile = spawn_hostile(sock, "--mode", mode, "--connections", "8", "--seconds", "9")
    try:
        time.sleep(1.0)  # it holds its connections
        pings = count_pings(str(sock), 16, 6.0, silo_protocol.ping, silo_protocol.ServiceUnavailable)
        queries = [_ledger_query(sock) for _ in range(3)]
        stats = json.loads(hostile.communicate(timeout=60)[0])
    finally:
        if hostile.poll() is None:
            hostile.kill()
            hostile.wait(10)
    assert pings["answered"] == pings["pings"], pings
    assert queries == ["answered"] * 3, queries
    if mode == "silent":  # it was cut and reopened, not left alone
        assert stats["opened"] > 8, stats
    assert proc.poll() is None and silo_protocol.ping(str(sock))["ok"] is True


def test_concurrent_huge_frames_stay_within_the_memory_budget(services) -> None:
    """Four processes send a 30 MiB garbage request each, all at once, to a service whose node
    config says max-model-params = 2M: a 34 MB frame limit and a 68 MB budget. Before: every
    frame was read whole (twice: chunks, then joined), +240 MiB of peak RSS. Now the frames
    that do not fit the budget are refused 'busy' before their body is read, and the service's
    peak RSS grows by at most the budget (plus a buffer's slack)."""
    proc, sock, log = services["mem"]
    limit = silo_protocol.default_frame_bytes({"max-model-params": SMALL_MODEL})
    budget = silo_protocol.BUDGET_FRAMES * limit
    assert limit == 2 * (2 * 4 * SMALL_MODEL + (1 << 20))
    time.sleep(0.5)
    before = peak_rss(proc.pid)
    senders = [spawn_hostile(sock, "--mode", "garbage", "--connections", "1", "--once", "--seconds", "60",
                             "--body-bytes", str(30 << 20)) for _ in range(4)]
    answers = [json.loads(s.communicate(timeout=120)[0]) for s in senders]
    time.sleep(0.3)
    growth = peak_rss(proc.pid) - before
    assert growth <= budget * 1.2 + (16 << 20), f"peak RSS grew by {growth / 2**20:.0f} MiB; budget {budget / 2**20:.0f} MiB"
    said = [line for a in answers for line in a.get("said", [])]
    assert len(said) == 4, answers
    assert any("memory budget" in line for line in said), said  # refused, not read
    assert silo_protocol.ping(str(sock))["ok"] is True
    assert f"memory budget {budget} bytes" in log.read_text()


def test_an_operator_limit_over_the_cli_and_a_bad_node_config_value(tmp_path) -> None:
    for bad in (["--max-frame-bytes", "lots"], ["--memory-budget", "0"], ["--max-frame-bytes", "1000"],
                ["--header-timeout", "0"], ["--max-frame-bytes", "4MiB", "--memory-budget", "1MiB"],
                ["--node-config", "max-model-params='many'"], ["--node-config", "max-model-params=0"]):
        assert silo_service.main(["--socket", str(tmp_path / "x.sock"), *bad]) == 2, bad


# -- an in-process service with a stub node: the budget counter, torch-free ---------------------

class StubRuntime:
    HANDLERS = {"train": None}

    def __init__(self) -> None:
        self.calls = 0

    def handle(self, mtype, content, context, deployed):
        self.calls += 1
        return RecordDict()


@pytest.fixture
def stub_service():
    from tests.helpers import stub_services

    with stub_services() as start:
        yield lambda **limits: start(StubRuntime(), **limits)


def _stall(path: str, body_len: int) -> socket.socket:
    """A peer that sends a request header announcing ``body_len`` body bytes, then nothing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(path)
    sock.sendall(frame_head(body_len))
    return sock


def _answer(sock: socket.socket) -> dict:
    header, _ = silo_protocol.read_frame(sock, silo_protocol.REPLY, 1 << 16)
    return header


def test_a_frame_that_does_not_fit_the_budget_is_refused_before_its_body_is_read(stub_service) -> None:
    svc = stub_service(max_frame_bytes=64 << 10, memory_budget=100 << 10, request_timeout=3.0)
    svc.peer_budget = svc.memory_budget  # one process plays several peers: the global budget alone
    first = _stall(svc.path, 60 << 10)  # holds 60 KiB of the budget until it is cut
    time.sleep(0.2)
    assert svc.budget_used > 60 << 10
    with _stall(svc.path, 60 << 10) as second:  # its body never sent: the answer comes anyway
        t0 = time.monotonic()
        answer = _answer(second)
        assert time.monotonic() - t0 < 2.0  # long before the first one's request deadline
    assert answer["ok"] is False and answer.get("busy") is True and "memory budget" in answer["error"], answer
    assert svc.budget_peak <= svc.memory_budget
    with first:
        assert "deadline" in _answer(first)["error"]  # cut at its request deadline
    deadline = time.monotonic() + 5
    while svc.budget_used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.budget_used == 0  # given back
    silo_protocol.request(svc.path, "train", RecordDict(), 1, {}, timeout=10)  # serves again
    assert svc.runtime.calls == 1


def test_one_peer_process_holds_at_most_half_the_budget_and_half_the_slots(stub_service) -> None:
    svc = stub_service(max_frame_bytes=16 << 10, memory_budget=64 << 10, max_connections=4, request_timeout=2.0)
    assert (svc.peer_budget, svc.peer_slots) == (32 << 10, 2)
    held = [_stall(svc.path, 12 << 10) for _ in range(2)]  # two slots, 24 KiB
    try:
        time.sleep(0.2)
        with _stall(svc.path, 12 << 10) as third:  # 36 KiB > its share of 32 KiB
            answer = _answer(third)
        assert answer.get("busy") is True and "share" in answer["error"], answer
        with _stall(svc.path, 10) as fourth:  # fits the budget, but no third slot for this process
            answer = _answer(fourth)
        assert answer.get("busy") is True and "requests being read or handled" in answer["error"], answer
        assert silo_protocol.ping(svc.path, timeout=2.0)["ok"] is True  # a ping needs no slot
    finally:
        for sock in held:
            sock.close()


def test_a_full_pending_pool_cuts_its_oldest_connection(stub_service) -> None:
    """Connections that send nothing wait in the pending pool; one more cuts the oldest, so a
    peer that holds connections open keeps no newcomer out."""
    svc = stub_service(max_pending=4, header_timeout=30.0, request_timeout=30.0)
    silent = []
    for _ in range(4):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(svc.path)
        silent.append(sock)
        time.sleep(0.05)
    try:
        t0 = time.monotonic()
        assert silo_protocol.ping(svc.path, timeout=5.0)["ok"] is True
        assert time.monotonic() - t0 < 3.0  # not after the pending connections' 30 s header timeout
        answer = _answer(silent[0])  # the oldest: cut, and told why
        assert answer.get("busy") is True and "oldest is cut" in answer["error"], answer
        silo_protocol.request(svc.path, "train", RecordDict(), 1, {}, timeout=10)
    finally:
        for sock in silent:
            sock.close()


def test_a_frame_over_the_limit_is_a_refusal_for_the_clientapp_not_a_crash(stub_service) -> None:
    """An oversized message (a run whose model is over the node's max-model-params) makes the
    ClientApp answer with a refusal (ServiceUnavailable), not raise (ServiceError): with
    fail-on-client-error a raise would stop the whole federation."""
    import numpy as np
    from flwr.app import ArrayRecord

    svc = stub_service(max_frame_bytes=64 << 10)
    big = RecordDict({"w": ArrayRecord([np.zeros(32 << 10, dtype=np.float32)])})  # 128 KiB
    with pytest.raises(silo_protocol.ServiceUnavailable, match="max-model-params"):
        silo_protocol.request(svc.path, "train", big, 1, {}, timeout=10)
    assert svc.runtime.calls == 0 and svc.budget_used == 0


def test_the_default_frame_limit_follows_max_model_params() -> None:
    mib = 1 << 20
    assert silo_protocol.default_frame_bytes({}) == 2 * (2 * 4 * 16_000_000 + mib)  # 258 MB (246 MiB): ResNet-18 fits
    assert silo_protocol.default_frame_bytes({"max-model-params": 1000}) == 2 * (8000 + mib)
    assert silo_protocol.default_frame_bytes({"role": "shuffler"}) == 1 << 30
    assert silo_protocol.parse_bytes("256MiB", "x") == 256 * mib and silo_protocol.parse_bytes(4096, "x") == 4096
    for bad in ("", "12 parsecs", "-5", "1.5GiB"):
        with pytest.raises(ValueError):
            silo_protocol.parse_bytes(bad, "x")
    svc = silo_service.SiloService("/nonexistent/s.sock", {"partition-id": 0})
    assert (svc.max_frame_bytes, svc.memory_budget) == (silo_protocol.default_frame_bytes({}),
                                                        2 * silo_protocol.default_frame_bytes({}))


# -- the launchers pass the limits ---------------------------------------------------------------

def _fake_supernode(bin_dir: Path) -> None:
    """A ``flower-supernode`` that says what it was given and exits: the launcher then stops the
    silo service it started."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    fake = bin_dir / "flower-supernode"
    fake.write_text("#!/bin/sh\necho \"fake-supernode $*\"\nexit 0\n")
    fake.chmod(0o755)


def _launcher_env(tmp: Path) -> dict[str, str]:
    env = service_env(tmp / "home")
    env["PATH"] = f"{tmp / 'bin'}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_supernode_sh_passes_the_limits_to_the_silo_service() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="silosh"))  # short: the socket lives in the state dir
    try:
        _fake_supernode(tmp / "bin")
        out = subprocess.run(["bash", str(ROOT / "scripts" / "deploy" / "supernode.sh"), "--superlink", "127.0.0.1:9",
                              "--insecure", "--state-dir", str(tmp / "s"), "--node-config",
                              "partition-id=0 num-partitions=2 max-model-params=1000",
                              "--service-max-frame-bytes", "2MiB", "--service-memory-budget", "8MiB"],
                             capture_output=True, text=True, timeout=180, env=_launcher_env(tmp), cwd=tmp)
        log = out.stdout + out.stderr
        assert out.returncode == 0, log
        assert "max frame 2097152 bytes, memory budget 8388608 bytes" in log, log
        assert "fake-supernode" in log and "max-model-params" in log  # the node config reaches the SuperNode too
        bad = subprocess.run(["bash", str(ROOT / "scripts" / "deploy" / "supernode.sh"), "--superlink", "127.0.0.1:9",
                              "--insecure", "--state-dir", str(tmp / "s"), "--service-memory-budget", "lots"],
                             capture_output=True, text=True, timeout=60, env=_launcher_env(tmp), cwd=tmp)
        assert bad.returncode == 2 and "not a byte count" in bad.stderr, bad.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_docker_entrypoint_passes_the_limits_to_the_silo_service() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="silodk"))
    try:
        _fake_supernode(tmp / "bin")
        env = _launcher_env(tmp) | {"SILOFL_SILO_SERVICE_MEMORY_BUDGET": "16MiB",
                                    "SILOFL_HEALTH_FILE": str(tmp / "health.json"), "SILOFL_CERTS_DIR": str(tmp)}
        out = subprocess.run(["bash", str(ROOT / "docker" / "entrypoint.sh"), "supernode", "--insecure",
                              "--superlink", "127.0.0.1:9", "--node-config",
                              f"partition-id=0 num-partitions=2 state-dir='{tmp / 's'}' max-model-params=1000"],
                             capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
        log = out.stdout + out.stderr
        frame = silo_protocol.default_frame_bytes({"max-model-params": 1000})
        assert f"max frame {frame} bytes, memory budget {16 << 20} bytes" in log, log  # derived, and the env's
        assert "fake-supernode" in log
        bad = subprocess.run(["bash", str(ROOT / "docker" / "entrypoint.sh"), "supernode", "--insecure",
                              "--node-config", f"partition-id=0 state-dir='{tmp / 's'}'"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env=env | {"SILOFL_SILO_SERVICE_MAX_CONNECTIONS": "8MiB"})
        assert bad.returncode == 2 and "not a whole number" in bad.stderr, bad.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
