"""Slow, silent and surplus peers next to real requests on the silo service (app/runtime/silo_service.py).

Before this version the service answered one connection at a time with a 60 s timeout per
read: a peer sending one byte a second held every other request forever, a silent one for 60 s,
and SIGTERM waited for them. Now every connection has its own thread, the request must arrive
whole within ``--request-timeout`` of the connection, the reply must be taken within
``--reply-timeout``, at most ``--max-connections`` are served, and handling stays one request at
a time.

Two halves: the real service as a subprocess (the real ClientApp's training request, timed next
to a trickler and a silent peer; SIGTERM with stuck peers), and an in-process service with a
stub node (torch-free) for the limits: the reply deadline, the connection limit, serialised
handling.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from flwr.app import Context, Message, MessageType, RecordDict

from app.runtime import silo_protocol, silo_service
from scripts.bench.service_abuse import spawn_hostile
from scripts.bench.service_slow_clients import Peer
from tests.helpers import service_env, service_node_config, wait_for_service

ROOT = Path(__file__).resolve().parent.parent
REQUEST_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 4
PROMPT_S = 5.0  # a real request next to stuck peers is answered within this


def _prefix() -> bytes:
    """A valid request frame's first bytes: what a slow peer dribbles."""
    return silo_protocol.encode_frame(silo_protocol.REQUEST, {"type": "train", "run_id": 1,
                                                            "run_config": {"pad": "x" * 64}})


def SlowPeer(path: Path | str, every: float | None) -> Peer:  # noqa: N802 (reads as the peer it makes)
    """A same-uid peer dribbling a valid request frame one byte every ``every`` s (never, if None)."""
    return Peer(path, _prefix(), every)


# -- the real service, as the operator starts it ----------------------------------------------

@pytest.fixture(scope="module")
def service():
    tmp = Path(tempfile.mkdtemp(prefix="siloslow"))  # short: a Unix socket path has at most 107 bytes
    sock = tmp / "svc.sock"
    log = (tmp / "service.log").open("w")
    node = service_node_config(tmp / 'state')
    proc = subprocess.Popen([sys.executable, "-m", "app.runtime.silo_service", "--socket", str(sock), "--node-config", node,
                             "--request-timeout", str(REQUEST_TIMEOUT_S), "--reply-timeout", "2",
                             "--max-connections", str(MAX_CONNECTIONS)],
                            cwd=ROOT, env=service_env(tmp), stdout=log, stderr=subprocess.STDOUT)
    try:
        from flwr.supercore.task_identity import TaskIdentity

        from app.config import parse_settings
        from app.data.federated import dataset_meta
        from app.launch import merged_run_config
        from app.models import build_model
        from app.seeding import torch_gen

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0  # as the in-process grid does
        run_config = merged_run_config([]) | {"num-rounds": 6, "privacy.epsilon": 3.0}
        s = parse_settings(run_config)
        shape, classes = dataset_meta(s)
        model = build_model(s.model, shape, classes, hidden=s.model_hidden, generator=torch_gen(s.seed, "init"))
        w = {k: v.detach().numpy() for k, v in model.named_parameters()}
        wait_for_service(proc, sock, tmp / "service.log", 120)
        yield {"tmp": tmp, "sock": sock, "proc": proc, "run_config": run_config, "w": w,
               "log": tmp / "service.log"}
    finally:
        if proc.poll() is None:
            proc.kill()  # by pid: this test's own process
            proc.wait(10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _train(service, rnd: int, bound: float | None = None) -> tuple[float, RecordDict]:
    """(seconds, reply content) of one training message: through the real ClientApp, or with a
    ``bound`` (seconds without a byte of reply) straight through what the ClientApp calls."""
    from app import wire
    from app.algorithms import Phase
    from app.client_app import app

    msg = Message(wire.Instruction(rnd, Phase.GRAD, service["w"]).encode(), dst_node_id=1000,
                  message_type=MessageType.TRAIN)
    context = Context(run_id=1, node_id=1000, node_config={"silo-service": str(service["sock"]), "partition-id": 0,
                                                           "num-partitions": 2},
                      state=RecordDict(), run_config=dict(service["run_config"]))
    t0 = time.monotonic()
    if bound is None:
        content = app(msg, context).content
    else:
        content = silo_protocol.request(str(service["sock"]), MessageType.TRAIN, msg.content, 1,
                                       service["run_config"], timeout=bound)
    return time.monotonic() - t0, content


def test_a_training_request_next_to_a_trickler_and_a_silent_peer_is_answered_promptly(service) -> None:
    """Before: the first peer in line held the service (a trickler forever, a silent peer 60 s),
    so the training reply came after > 60 s. Now it comes as fast as without them, and both slow
    peers are cut at the whole-request deadline although each read is short."""
    from app import wire

    warm, first = _train(service, 1)  # builds the silo: the reference
    assert wire.Refusal.decode(first) is None, wire.Refusal.decode(first)
    trickler, silent = SlowPeer(service["sock"], every=1.0), SlowPeer(service["sock"], every=None)
    try:
        time.sleep(0.3)  # both are first in line
        try:
            took, reply = _train(service, 2, bound=20.0)  # before: no reply byte in 20 s
        except silo_protocol.ServiceUnavailable as exc:
            pytest.fail(f"no training reply next to slow peers: {exc}")
        assert wire.Refusal.decode(reply) is None, wire.Refusal.decode(reply)
        assert took < PROMPT_S, f"training reply after {took:.1f} s next to slow peers (alone: {warm:.1f} s)"
        t0 = time.monotonic()
        assert silo_protocol.ping(str(service["sock"]), timeout=PROMPT_S)["ok"] is True
        assert time.monotonic() - t0 < 1.0
        for peer in (trickler, silent):
            cut = peer.wait_cut(REQUEST_TIMEOUT_S + 10)
            assert cut is not None and REQUEST_TIMEOUT_S - 0.2 <= cut <= REQUEST_TIMEOUT_S + 2.0, cut
            assert b"deadline" in peer.said, peer.said  # told why, in an error reply
    finally:
        trickler.close()
        silent.close()
    log = service["log"].read_text()
    assert log.count("connection cut after") >= 2 and "run 1 train" in log


def test_over_the_request_limit_a_request_gets_busy_and_the_clientapp_a_refusal(service) -> None:
    """Two peer processes each send a request header and then nothing: together they hold the
    MAX_CONNECTIONS request slots (each its half) until the request deadline. A ping is still
    answered (pings take no slot); a request gets 'busy', which the ClientApp turns into a refusal."""
    from app import wire

    per = MAX_CONNECTIONS // 2
    hostile = [spawn_hostile(service["sock"], "--mode", "stall", "--connections", str(per), "--once",
                             "--seconds", str(REQUEST_TIMEOUT_S + 10)) for _ in range(2)]
    try:
        time.sleep(0.8)
        t0 = time.monotonic()
        assert silo_protocol.ping(str(service["sock"]), timeout=PROMPT_S)["ok"] is True
        _, reply = _train(service, 3)  # the server sees a dropped silo, not a crash
        refusal = wire.Refusal.decode(reply)
        assert refusal is not None and refusal.code == wire.REFUSED_CONFIG and "busy" in refusal.reason, refusal
        assert time.monotonic() - t0 < PROMPT_S
        for proc in hostile:  # cut at their request deadline: the service serves again
            stats = json.loads(proc.communicate(timeout=REQUEST_TIMEOUT_S + 30)[0])
            assert stats["opened"] == per and stats.get("busy", 0) == 0, stats
    finally:
        for proc in hostile:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert silo_protocol.ping(str(service["sock"]))["ok"] is True


def test_sigterm_with_stuck_peers_stops_within_seconds(service) -> None:
    """Before: SIGTERM waited for the connection in progress (up to 60 s a read). Now it closes
    the socket, cuts the stuck peers and exits 0 within a tick or two."""
    proc, sock = service["proc"], service["sock"]
    peers = [SlowPeer(sock, every=1.0), SlowPeer(sock, every=None), SlowPeer(sock, every=None)]
    try:
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the service did not stop within 30 s of SIGTERM with stuck peers")
        took = time.monotonic() - t0
    finally:
        for peer in peers:
            peer.close()
    assert rc == 0 and took < 3.0, (rc, took)
    assert not sock.exists()


# -- an in-process service with a stub node: the limits, torch-free ----------------------------

class StubRuntime:
    """A node whose handler sleeps ``hold`` s and records how many handlers ran at once."""

    HANDLERS = {"train": None, "evaluate": None}

    def __init__(self, hold: float = 0.0, reply_bytes: int = 0) -> None:
        self.hold, self.reply_bytes = hold, reply_bytes
        self.running = self.most = self.calls = 0
        self.lock = threading.Lock()

    def handle(self, mtype: str, content: RecordDict, context: Context, deployed: bool) -> RecordDict:
        import numpy as np
        from flwr.app import ArrayRecord

        with self.lock:
            self.running += 1
            self.calls += 1
            self.most = max(self.most, self.running)
        time.sleep(self.hold)
        with self.lock:
            self.running -= 1
        reply = RecordDict()
        if self.reply_bytes:
            reply["big"] = ArrayRecord([np.zeros(self.reply_bytes, dtype=np.uint8)])
        return reply


@pytest.fixture
def stub_service():
    from tests.helpers import stub_services

    with stub_services() as start:
        yield start


def test_requests_are_read_concurrently_but_handled_one_at_a_time(stub_service) -> None:
    node = StubRuntime(hold=0.3)
    svc = stub_service(node, request_timeout=5.0)
    results: list[float] = []

    def one() -> None:
        t0 = time.monotonic()
        silo_protocol.request(svc.path, "train", RecordDict(), 1, {}, timeout=10)
        results.append(time.monotonic() - t0)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 4 and node.calls == 4
    assert node.most == 1  # the ledger, model and calibration are never touched concurrently
    assert max(results) >= 4 * 0.3 - 0.05  # the last waited for the three before it


def test_a_peer_that_does_not_take_its_reply_is_cut_at_the_reply_deadline(stub_service) -> None:
    svc = stub_service(StubRuntime(reply_bytes=64 << 20), reply_timeout=1.0)  # far over a socket buffer
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(svc.path)
        sock.sendall(silo_protocol.encode_frame(silo_protocol.REQUEST, {"type": "train", "run_id": 1, "run_config": {}},
                                               b""))
        time.sleep(3.0)  # read nothing
        t0 = time.monotonic()
        assert silo_protocol.ping(svc.path, timeout=PROMPT_S)["ok"] is True  # never blocked meanwhile
        assert time.monotonic() - t0 < 1.0
        sock.settimeout(5)
        data = b""
        try:
            while chunk := sock.recv(1 << 20):
                data += chunk
        except OSError:
            pass
    _, _, _, head_len, body_len = silo_protocol.PREFIX.unpack(data[:silo_protocol.PREFIX.size])
    assert data[silo_protocol.PREFIX.size:][:head_len] == b'{"ok":true}' and body_len > (64 << 20)
    assert len(data) < body_len  # the reply was cut part way (at the deadline), not waited on


def test_a_request_waiting_for_a_busy_node_gets_busy_after_the_busy_timeout(stub_service) -> None:
    node = StubRuntime(hold=3.0)
    svc = stub_service(node, busy_timeout=0.5)
    first = threading.Thread(target=silo_protocol.request, args=(svc.path, "train", RecordDict(), 1, {}), daemon=True)
    first.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    with pytest.raises(silo_protocol.ServiceUnavailable, match="busy"):
        silo_protocol.request(svc.path, "train", RecordDict(), 1, {}, timeout=10)
    assert 0.4 <= time.monotonic() - t0 < 2.0
    first.join(10)
    assert node.calls == 1


def test_the_cli_refuses_out_of_range_limits() -> None:
    for bad in (["--request-timeout", "0"], ["--reply-timeout", "nan"], ["--busy-timeout", "-1"],
                ["--max-connections", "0"]):
        assert silo_service.main(["--socket", "/nonexistent/x.sock", *bad]) == 2, bad


def test_sigterm_lets_the_request_being_handled_finish_and_turns_away_the_waiting_one(stub_service) -> None:
    """A stop never interrupts a handler (its ledger entry is being written): the request being
    handled gets its reply; one waiting for the node gets 'stopping' (busy), not a hang."""
    node = StubRuntime(hold=1.0)
    svc = stub_service(node)
    outcome: dict[str, object] = {}

    def ask(name: str) -> None:
        try:
            outcome[name] = silo_protocol.request(svc.path, "train", RecordDict(), 1, {}, timeout=10)
        except Exception as exc:  # noqa: BLE001  (the outcome is what the test checks)
            outcome[name] = exc

    first = threading.Thread(target=ask, args=("handled",))
    first.start()
    time.sleep(0.3)
    second = threading.Thread(target=ask, args=("waiting",))
    second.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    svc.drain()  # what SIGTERM leads to
    took = time.monotonic() - t0
    first.join(5)
    second.join(5)
    assert isinstance(outcome["handled"], RecordDict), outcome
    assert isinstance(outcome["waiting"], silo_protocol.ServiceUnavailable) and "stopping" in str(outcome["waiting"])
    assert node.calls == 1 and 0.2 <= took < 2.0  # it waited for the handler, and only for it
    assert not Path(svc.path).exists()


def test_a_request_over_the_size_limit_gets_an_error_and_is_closed(stub_service) -> None:
    svc = stub_service(StubRuntime(), max_frame_bytes=1024)
    frame = silo_protocol.encode_frame(silo_protocol.REQUEST, {"type": "train", "run_id": 1, "run_config": {}},
                                      b"\0" * 4096)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(svc.path)
        try:
            sock.sendall(frame)
        except OSError:
            pass  # it may close before taking it all: its answer is already queued
        header, _ = silo_protocol.read_frame(sock, silo_protocol.REPLY, 1 << 16)
        assert header["ok"] is False and "over the limit of 1024 bytes" in header["error"]
        try:
            assert sock.recv(1) == b""  # and closed
        except ConnectionResetError:
            pass  # closed with the rest of the frame unread
