"""A same-uid peer that abuses the silo service (app/runtime/silo_service.py): what legitimate traffic gets.

Starts ``python -m app.runtime.silo_service`` of the checkout it runs from (PYTHONPATH) on a temporary
socket, warms it with one ledger query (which builds the silo), then runs, one JSON line each:

* ``starvation``: a hostile process (this file, ``hostile`` mode, its own pid) keeps
  ``--connections`` connections open, each silent (``--hostile-mode silent``) or sending a valid
  request header and then nothing (``stall``), and reopens each as soon as the service cuts it;
  meanwhile ``--pings`` pings spread over ``--seconds`` seconds and a ledger query every 2 s:
  how many of each were answered (the rest: busy or no answer within 5 s);
* ``memory``: ``--frames`` peers send one request of ``--frame-mib`` MiB of garbage each, all at
  once (from ``--frame-procs`` processes, threads within each); the service's peak RSS
  (VmHWM) before and after, and what each peer was answered.

    python -m scripts.bench.service_abuse [--scenarios starvation,memory] [--service-args "..."]

It only uses what every version of the service has had (``--socket``, ``--node-config``, the
wire format), so it measures any commit; ``--service-args`` adds options of the version under test.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from scripts.bench.service_slow_clients import node_config, start_service

PREFIX = struct.Struct(">4sBBIQ")  # the wire format of app/runtime/silo_protocol.py, spelled out: any version


def frame_head(body_len: int, mtype: str = "train") -> bytes:
    """A request frame's prefix and JSON header announcing ``body_len`` body bytes."""
    head = json.dumps({"type": mtype, "run_id": 1, "run_config": {}}, separators=(",", ":")).encode()
    return PREFIX.pack(b"SLFS", 1, 0, len(head), body_len) + head


# -- the hostile peer, as its own process ---------------------------------------------------------

def _one(path: str, mode: str, body_len: int, once: bool, end: float, stats: dict, lock: threading.Lock) -> None:
    garbage = memoryview(bytes(body_len)) if mode == "garbage" else None
    while time.monotonic() < end:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            time.sleep(0.01)
            continue
        with lock:
            stats["opened"] += 1
        answer = b""
        try:
            sock.settimeout(max(0.05, end - time.monotonic()))
            if mode == "stall":
                sock.sendall(frame_head(body_len))
            elif mode == "garbage":
                sock.sendall(frame_head(body_len))
                try:
                    sock.sendall(garbage)  # the service may refuse before reading it: then read why
                except OSError:
                    pass
            answer = sock.recv(1 << 16)  # held until the service answers or cuts us
        except (TimeoutError, OSError):
            pass
        finally:
            sock.close()
        with lock:
            key = "busy" if b'"busy":true' in answer else ("error" if answer else "cut")
            stats[key] = stats.get(key, 0) + 1
            if answer and mode == "garbage":
                stats.setdefault("said", []).append(answer[PREFIX.size:PREFIX.size + 160].decode(errors="replace"))
        if once:
            return


def hostile(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="service_abuse hostile")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--mode", choices=("silent", "stall", "garbage"), default="silent")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--body-bytes", type=int, default=1 << 20)
    ap.add_argument("--once", action="store_true", help="each connection sends once (no reopening)")
    args = ap.parse_args(argv)
    stats: dict = {"opened": 0}
    lock = threading.Lock()
    end = time.monotonic() + args.seconds
    threads = [threading.Thread(target=_one, args=(args.socket, args.mode, args.body_bytes, args.once, end, stats,
                                                   lock), daemon=True) for _ in range(args.connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(args.seconds + 30)
    print(json.dumps(stats), flush=True)
    return 0


def spawn_hostile(path: str | Path, *args: str) -> subprocess.Popen:
    """This file's hostile mode as a process of its own (its own pid, the same uid)."""
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "hostile", "--socket", str(path), *args],
                            stdout=subprocess.PIPE, text=True)


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def count_pings(path: str, n: int, seconds: float, ping, unavailable) -> dict:
    """``n`` pings spread over ``seconds``: how many were answered, and how the others failed."""
    out = {"pings": n, "answered": 0, "busy": 0, "other": 0}
    for i in range(n):
        t = time.monotonic()
        try:
            ping(path, timeout=5.0)
            out["answered"] += 1
        except unavailable as exc:
            out["busy" if "busy" in str(exc) else "other"] += 1
        except Exception:  # noqa: BLE001  (a bench: count it)
            out["other"] += 1
        time.sleep(max(0.0, seconds / n - (time.monotonic() - t)))
    return out


# -- the bench ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["hostile"]:
        return hostile(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="starvation,memory")
    ap.add_argument("--service-args", default="")
    ap.add_argument("--node-extra", default="", help="appended to the service's node config")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--hostile-mode", choices=("silent", "stall"), default="silent")
    ap.add_argument("--pings", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--frames", type=int, default=3)
    ap.add_argument("--frame-mib", type=int, default=200)
    ap.add_argument("--frame-procs", type=int, default=1)
    args = ap.parse_args(argv)

    from flwr.app import RecordDict

    from app import wire
    from app.runtime import silo_protocol, silo_service
    from app.launch import merged_run_config

    root = Path(silo_service.__file__).resolve().parents[2]  # the checkout under test (PYTHONPATH)
    print(json.dumps({"checkout": str(root)}), flush=True)
    run_config = merged_run_config([]) | {"num-rounds": 6, "privacy.epsilon": 3.0}
    tmp = Path(tempfile.mkdtemp(prefix="svcabuse"))
    path = str(tmp / "svc.sock")
    env = dict(os.environ) | {"FLWR_HOME": str(tmp), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    proc = start_service(root, path, tmp, env, f"{node_config(tmp / 'state')} {args.node_extra}".strip(),
                         args.service_args, 180)

    def query() -> str:
        try:
            silo_protocol.request(path, wire.LEDGER_QUERY, RecordDict(), 1, run_config, timeout=5.0)
            return "answered"
        except silo_protocol.ServiceUnavailable as exc:
            return "busy" if "busy" in str(exc) else "unavailable"
        except Exception:  # noqa: BLE001
            return "error"

    try:
        print(json.dumps({"scenario": "warm-up", "ledger_query": query()}), flush=True)
        for name in args.scenarios.split(","):
            if name == "starvation":
                bad = spawn_hostile(path, "--mode", args.hostile_mode, "--connections", str(args.connections),
                                    "--seconds", str(args.seconds + 3))
                time.sleep(1.0)  # it holds its connections
                queries: list[str] = []
                stop = threading.Event()

                def ask() -> None:
                    while not stop.wait(2.0):
                        queries.append(query())

                asker = threading.Thread(target=ask, daemon=True)
                asker.start()
                pings = count_pings(path, args.pings, args.seconds, silo_protocol.ping, silo_protocol.ServiceUnavailable)
                stop.set()
                asker.join(10)
                out, _ = bad.communicate(timeout=60)
                print(json.dumps({"scenario": "starvation", "hostile_mode": args.hostile_mode,
                                  "hostile_connections": args.connections, **pings,
                                  "ledger_queries": len(queries), "queries_answered": queries.count("answered"),
                                  "hostile": json.loads(out or "{}")}), flush=True)
            elif name == "memory":
                before = peak_rss(proc.pid)
                per = [args.frames // args.frame_procs + (i < args.frames % args.frame_procs)
                       for i in range(args.frame_procs)]
                senders = [spawn_hostile(path, "--mode", "garbage", "--connections", str(k), "--once", "--seconds", "60",
                                         "--body-bytes", str(args.frame_mib << 20)) for k in per if k]
                results = [json.loads(s.communicate(timeout=120)[0] or "{}") for s in senders]
                time.sleep(0.5)
                after = peak_rss(proc.pid)
                print(json.dumps({"scenario": "memory", "frames": args.frames, "frame_mib": args.frame_mib,
                                  "processes": len(senders), "peak_rss_before_gb": round(before / 1e9, 3),
                                  "peak_rss_after_gb": round(after / 1e9, 3),
                                  "growth_mib": round((after - before) / 2**20, 1), "answers": results,
                                  "still_serving": query()}), flush=True)
            else:
                raise SystemExit(f"unknown scenario {name!r}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
