"""How long a silo service (app/runtime/silo_service.py) keeps a real request waiting next to slow peers.

Starts ``python -m app.runtime.silo_service`` of the checkout it runs from (PYTHONPATH) on a temporary
socket, warms it with one ledger query (which builds the silo), then measures, each scenario
bounded by ``--bound`` seconds:

* ``trickler``: a same-uid peer sends a valid frame prefix one byte every ``--trickle-s``
  seconds; the latency of a ledger query sent next to it, and when the peer was cut (if within
  15 s);
* ``silent``:   a peer connects and sends nothing; the same latency;
* ``sigterm``:  a trickler and a silent peer are connected; seconds from SIGTERM to the exit.

    python -m scripts.bench.service_slow_clients [--scenarios trickler,silent,sigterm]
        [--bound 75] [--trickle-s 1] [--service-args "--request-timeout 10"]

It only uses what the service has always had (``--socket``, ``--node-config``), so it measures
any commit; ``--service-args`` adds options of the version under test. One JSON line per scenario.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def start_service(root: Path, path: str, tmp: Path, env: dict[str, str], node_config: str, service_args: str,
                  wait_s: float) -> subprocess.Popen:
    """``python -m app.runtime.silo_service`` of the checkout ``root`` on socket ``path`` (its log
    ``tmp/service.log``), once it answers a ping; SystemExit when it exits or does not come up
    within ``wait_s`` seconds (then it is killed, by pid)."""
    from app.runtime import silo_protocol

    proc = subprocess.Popen([sys.executable, "-m", "app.runtime.silo_service", "--socket", path, "--node-config", node_config,
                             *shlex.split(service_args)],
                            cwd=root, env=env, stdout=open(tmp / "service.log", "a"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + wait_s
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the service exited: {(tmp / 'service.log').read_text()[-2000:]}")
        try:
            silo_protocol.ping(path, timeout=1.0)
            return proc
        except (silo_protocol.ServiceUnavailable, silo_protocol.ServiceError):
            if time.monotonic() > deadline:
                proc.kill()
                raise SystemExit("the service did not come up") from None
            time.sleep(0.1)


def node_config(state: Path) -> str:
    return (f"partition-id=0 num-partitions=2 state-dir='{state}' noise-seed='run' evaluation='open' "
            "epsilon-cap=3.0 ledger-scope='run'")


class Peer:
    """A same-uid peer that sends ``prefix`` one byte every ``every`` s (never, if None) and
    records when the service cut it (EOF, an error reply, or a reset: ``cut_after`` seconds after
    connecting) and what it said (``said``); it gives up after ``cap_s``."""

    def __init__(self, path: Path | str, prefix: bytes, every: float | None, cap_s: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.t0 = time.monotonic()
        self.cut_after: float | None = None
        self.said = b""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(prefix, every, cap_s), daemon=True)
        self._thread.start()

    def _run(self, prefix: bytes, every: float | None, cap_s: float) -> None:
        self.sock.settimeout(every or 0.1)
        sent = 0
        while not self._stop.is_set() and time.monotonic() - self.t0 < cap_s:
            try:
                if every and sent < len(prefix):
                    sent += self.sock.send(prefix[sent:sent + 1])
                self.said = self.sock.recv(1 << 16)
                break  # a reply (the service's error) or EOF: it cut us
            except TimeoutError:
                continue
            except OSError:
                break
        if not self._stop.is_set():
            self.cut_after = time.monotonic() - self.t0

    def wait_cut(self, timeout: float) -> float | None:
        """Seconds after connecting at which the service cut this peer; None if not within ``timeout``."""
        self._thread.join(timeout)
        return self.cut_after

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        self._thread.join(5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="trickler,silent,sigterm")
    ap.add_argument("--bound", type=float, default=75.0, help="seconds a scenario may take at most")
    ap.add_argument("--trickle-s", type=float, default=1.0)
    ap.add_argument("--service-args", default="")
    args = ap.parse_args()

    from flwr.app import RecordDict

    from app import wire
    from app.runtime import silo_protocol, silo_service
    from app.launch import merged_run_config

    root = Path(silo_service.__file__).resolve().parents[2]  # the checkout under test (PYTHONPATH)
    print(json.dumps({"checkout": str(root)}), flush=True)
    run_config = merged_run_config([]) | {"num-rounds": 6, "privacy.epsilon": 3.0}
    tmp = Path(tempfile.mkdtemp(prefix="svcbench"))
    path = str(tmp / "svc.sock")
    env = dict(os.environ) | {"FLWR_HOME": str(tmp), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    prefix = silo_protocol.encode_frame(silo_protocol.REQUEST, {"type": "train", "run_id": 1,
                                                              "run_config": {"pad": "x" * 64}})

    def start() -> subprocess.Popen:
        return start_service(root, path, tmp, env, node_config(tmp / "state"), args.service_args, 120)

    def query(bound: float) -> tuple[float, str]:
        t0 = time.monotonic()
        try:
            silo_protocol.request(path, wire.LEDGER_QUERY, RecordDict(), 1, run_config, timeout=bound)
            return time.monotonic() - t0, "answered"
        except Exception as exc:  # noqa: BLE001  (a bench: report what happened)
            return time.monotonic() - t0, f"{type(exc).__name__}: {str(exc)[:120]}"

    proc = start()
    try:
        warm, how = query(120.0)
        print(json.dumps({"scenario": "warm-up", "latency_s": round(warm, 3), "result": how}), flush=True)
        for name in args.scenarios.split(","):
            if name in ("trickler", "silent"):
                peer = Peer(path, prefix, args.trickle_s if name == "trickler" else None, cap_s=args.bound)
                time.sleep(0.5)  # the slow peer is first in line
                latency, how = query(args.bound)
                # None: not cut within 15 s (or the bound)
                peer_cut = peer.wait_cut(max(0.0, min(args.bound, 15.0) - (time.monotonic() - peer.t0)))
                peer.close()
                print(json.dumps({"scenario": name, "latency_s": round(latency, 3), "result": how,
                                  "peer_cut_after_s": None if peer_cut is None else round(peer_cut, 2)}), flush=True)
                time.sleep(0.5)
            elif name == "sigterm":
                peers = [Peer(path, prefix, args.trickle_s, cap_s=args.bound), Peer(path, prefix, None, cap_s=args.bound)]
                time.sleep(1.0)
                t0 = time.monotonic()
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=args.bound)
                    took = time.monotonic() - t0
                except subprocess.TimeoutExpired:
                    rc, took = None, None
                for peer in peers:
                    peer.close()
                print(json.dumps({"scenario": "sigterm", "exit_s": None if took is None else round(took, 3),
                                  "rc": rc, "bound_s": args.bound}), flush=True)
            else:
                raise SystemExit(f"unknown scenario {name!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
