"""The silo service (app/runtime/silo_service.py) driven through the real ClientApp (app/client_app.py).

One service process on a temporary socket and state dir, with its own node config (a cap of
epsilon 3 and a per-run ledger, run-seeded noise so that its replies can be compared with the
in-process path's): the same reply as in process, bit for bit; a ledger that persists across
requests and a restart; a forwarded node config that changes nothing; malformed frames that get
an error and leave it serving; a missing service that gives a refusal.
"""

from __future__ import annotations

import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.common.serde import recorddict_to_proto

from app.runtime import silo_protocol
from tests.helpers import service_env, service_node_config

ROOT = Path(__file__).resolve().parent.parent
RUN_CONFIG_OVERRIDES = {"num-rounds": 6, "privacy.epsilon": 3.0}


class Service:
    def __init__(self, sock: Path, node_config: str, home: Path) -> None:
        self.sock = sock
        self.log = home / f"service-{time.monotonic_ns()}.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "app.runtime.silo_service", "--socket", str(sock),
                                      "--node-config", node_config], cwd=ROOT, env=service_env(home),
                                     stdout=self._out, stderr=subprocess.STDOUT)

    def ready(self) -> Service:
        sock = self.sock
        deadline = time.monotonic() + 90
        while True:
            assert self.proc.poll() is None, f"the service exited: {self.log.read_text()}"
            try:
                silo_protocol.ping(str(sock), timeout=1.0)
                return self
            except silo_protocol.ServiceUnavailable:
                assert time.monotonic() < deadline, f"the service did not come up: {self.log.read_text()}"
                time.sleep(0.1)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=30)
        finally:
            self._out.close()
        return rc

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text()


@pytest.fixture(scope="module")
def setup():
    tmp = Path(tempfile.mkdtemp(prefix="silosvc"))  # short: a Unix socket path has at most 107 bytes
    sock = tmp / "run" / "svc.sock"  # run/ does not exist yet: the service creates it 0700
    service = Service(sock, service_node_config(tmp / "state-service"), tmp)  # it loads while this process does

    from flwr.supercore.task_identity import TaskIdentity

    from app.config import parse_settings
    from app.data.federated import dataset_meta
    from app.launch import merged_run_config
    from app.models import build_model
    from app.seeding import torch_gen

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0  # as the in-process grid does
    run_config = merged_run_config([]) | RUN_CONFIG_OVERRIDES
    s = parse_settings(run_config)
    shape, classes = dataset_meta(s)
    model = build_model(s.model, shape, classes, hidden=s.model_hidden, generator=torch_gen(s.seed, "init"))
    w = {k: v.detach().numpy() for k, v in model.named_parameters()}
    state = {"tmp": tmp, "run_config": run_config, "w": w, "sock": sock, "service": service.ready()}
    yield state
    state["service"].stop()
    shutil.rmtree(tmp, ignore_errors=True)


def _train_message(w, rnd: int) -> Message:
    from app import wire
    from app.algorithms import Phase

    return Message(wire.Instruction(rnd, Phase.GRAD, w).encode(), dst_node_id=1000, message_type=MessageType.TRAIN)


def _context(run_config, node_config: dict, run_id: int = 1) -> Context:
    return Context(run_id=run_id, node_id=1000, node_config=node_config, state=RecordDict(),
                   run_config=dict(run_config))


def _via_service(setup, msg: Message, run_id: int = 1, run_config=None, **node) -> RecordDict:
    """What the ClientApp answers on a node whose config names the service (plus ``node``)."""
    from app.client_app import app

    config = {"silo-service": str(setup["sock"]), "partition-id": 0, "num-partitions": 2} | node
    return app(msg, _context(run_config or setup["run_config"], config, run_id)).content


def _eps(content: RecordDict) -> float:
    from app import wire

    return float(content.metric_records[wire.METRICS][wire.EPS_SPENT])


def _ledger(setup, run_id: int = 1) -> dict:
    from app import wire

    msg = Message(RecordDict(), dst_node_id=1000, message_type=wire.LEDGER_QUERY)
    return wire.read_ledger(_via_service(setup, msg, run_id))


def test_socket_is_private_and_a_second_service_refuses(setup) -> None:
    sock = setup["sock"]
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    second = subprocess.run([sys.executable, "-m", "app.runtime.silo_service", "--socket", str(sock), "--node-config",
                             service_node_config(setup["tmp"] / "other")], cwd=ROOT, env=service_env(setup["tmp"]),
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 1 and "another silo service" in second.stderr
    silo_protocol.ping(str(sock))  # the first one is untouched


def test_train_matches_the_in_process_path_bit_for_bit(setup) -> None:
    from flwr.common.config import parse_config_args

    from app import wire
    from app.client_app import app

    msg = _train_message(setup["w"], 1)
    remote = _via_service(setup, msg)
    local_node = parse_config_args([service_node_config(setup["tmp"] / "state-local")])
    local = app(msg, _context(setup["run_config"], local_node)).content
    assert wire.Refusal.decode(remote) is None, wire.Refusal.decode(remote)
    for key in local.array_records[wire.UPDATE]:
        a = local.array_records[wire.UPDATE][key].numpy()
        b = remote.array_records[wire.UPDATE][key].numpy()
        assert a.dtype == b.dtype and np.array_equal(a, b) and a.tobytes() == b.tobytes()
    # each carries the witness of its own ledger (two state dirs: two ledgers, two keys); the rest is the same bytes
    assert wire.witnesses_of(remote) and wire.witnesses_of(local)
    assert wire.witnesses_of(remote) != wire.witnesses_of(local)
    remote, local = (RecordDict({k: v for k, v in c.items() if k != wire.WITNESS}) for c in (remote, local))
    assert recorddict_to_proto(remote).SerializeToString() == recorddict_to_proto(local).SerializeToString()
    assert "run 1 train" in setup["service"].output() and " ms" in setup["service"].output()


def test_ledger_persists_across_requests_and_a_restart(setup) -> None:
    first = _eps(_via_service(setup, _train_message(setup["w"], 2)))
    second = _eps(_via_service(setup, _train_message(setup["w"], 3)))
    assert 0 < first < second
    before = _ledger(setup)
    assert before["eps_spent"] == second
    assert setup["service"].stop() == 0
    assert not setup["sock"].exists()  # a clean SIGTERM removes its socket
    setup["service"] = Service(setup["sock"], service_node_config(setup["tmp"] / "state-service"), setup["tmp"]).ready()
    after = _ledger(setup)
    assert after["eps_spent"] == second and after["releases"] == before["releases"]
    assert _eps(_via_service(setup, _train_message(setup["w"], 4))) > second


def test_a_forwarded_node_config_changes_nothing(setup) -> None:
    """The run asks epsilon 5; the service's own cap is 3. A ClientApp whose node config says
    epsilon-cap = 100 (and noise-seed run, ledger elsewhere) gets the service's refusal, and a
    request that carries a node config is malformed."""
    from app import wire

    greedy = setup["run_config"] | {"privacy.epsilon": 5.0}
    reply = _via_service(setup, _train_message(setup["w"], 1), run_id=2, run_config=greedy,
                         **{"epsilon-cap": 100.0, "state-dir": str(setup["tmp"] / "elsewhere")})
    refusal = wire.Refusal.decode(reply)
    assert refusal is not None and refusal.code == wire.REFUSED_POLICY and "caps epsilon at 3" in refusal.reason
    header = {"type": "train", "run_id": 2, "run_config": greedy, "node_config": {"epsilon-cap": 100.0}}
    body = recorddict_to_proto(_train_message(setup["w"], 1).content).SerializeToString()
    answer, _ = _raw(setup["sock"], silo_protocol.encode_frame(silo_protocol.REQUEST, header, body))
    assert answer["ok"] is False and "node_config" in answer["error"]
    assert not (setup["tmp"] / "elsewhere").exists()


def _raw(sock_path: Path, data: bytes) -> tuple[dict, bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(sock_path))
        sock.sendall(data)
        return silo_protocol.read_frame(sock, silo_protocol.REPLY, 1 << 20)


def test_malformed_frames_get_an_error_and_the_service_keeps_serving(setup) -> None:
    import struct

    ok = {"type": "train", "run_id": 1, "run_config": setup["run_config"]}
    bad = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # not a frame
        struct.pack(">4sBBIQ", b"SLFS", 99, 0, 2, 0) + b"{}",  # another protocol version
        struct.pack(">4sBBIQ", b"SLFS", 1, 0, 2, 1 << 40) + b"{}",  # 1 TiB body: over the limit
        struct.pack(">4sBBIQ", b"SLFS", 1, 0, 5, 0) + b"{nope",  # header not JSON
        silo_protocol.encode_frame(silo_protocol.REQUEST, ok, b"\xff\x00garbage"),  # body not a RecordDict
        silo_protocol.encode_frame(silo_protocol.REQUEST, ok | {"type": "train.evil"}),  # no such handler
        silo_protocol.encode_frame(silo_protocol.REQUEST, ok | {"run_id": -1}),
        silo_protocol.encode_frame(silo_protocol.REQUEST, ok | {"run_config": {"lr": [1, 2]}}),
    ]
    for data in bad:
        answer, _ = _raw(setup["sock"], data)
        assert answer["ok"] is False and answer["error"], (data[:40], answer)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:  # a peer that hangs up mid-frame
        sock.connect(str(setup["sock"]))
        sock.sendall(b"SLF")
    # an instruction the silo cannot read is a refusal from the silo, not a service error
    from app import wire

    junk = Message(RecordDict(), dst_node_id=1000, message_type=MessageType.TRAIN)
    refusal = wire.Refusal.decode(_via_service(setup, junk))
    assert refusal is not None and refusal.code == wire.REFUSED_CONFIG
    assert silo_protocol.ping(str(setup["sock"]))["ok"] is True
    assert wire.Refusal.decode(_via_service(setup, _train_message(setup["w"], 5))) is None


def test_a_missing_service_is_a_refusal_not_a_crash(setup) -> None:
    from app import wire
    from app.client_app import app

    missing = setup["tmp"] / "nobody-here.sock"
    node = {"silo-service": str(missing), "partition-id": 0, "num-partitions": 2}
    for msg in (_train_message(setup["w"], 1),
                Message(RecordDict(), dst_node_id=1000, message_type=wire.LEDGER_QUERY)):
        reply = app(msg, _context(setup["run_config"], node))
        refusal = wire.Refusal.decode(reply.content)
        assert refusal is not None and refusal.code == wire.REFUSED_CONFIG and str(missing) in refusal.reason


def test_deployed_defaults(setup) -> None:
    """A deployed node (the service, or a flwr-clientapp process) without caps: OS noise, no
    evaluation, no run without privacy unless its node config allows it."""
    from app.privacy.policy import PolicyError, node_policy, policy_violation

    sim, dep = node_policy({}), node_policy({}, deployed=True)
    assert (sim.noise_seed, sim.evaluation, sim.allow_non_private) == (None, "open", True)
    assert (dep.noise_seed, dep.evaluation, dep.allow_non_private) == ("os", "off", False)
    assert policy_violation(sim, False, 0.0, 0.0, "auto") is None
    assert "allow-non-private = true" in policy_violation(dep, False, 0.0, 0.0, "auto")
    opted = node_policy({"allow-non-private": True, "noise-seed": "run", "evaluation": "private"}, deployed=True)
    assert policy_violation(opted, False, 0.0, 0.0, "auto") is None
    assert (opted.noise_seed, opted.evaluation) == ("run", "private")
    with pytest.raises(PolicyError, match="allow-non-private"):
        node_policy({"allow-non-private": "yes"})
    with pytest.raises(PolicyError, match="contradicts"):
        node_policy({"allow-non-private": True, "epsilon-cap": 1.0})
