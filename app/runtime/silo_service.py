"""The silo service: one long-lived process per SuperNode that owns the silo's state.

Flower 1.42's SuperNode starts a fresh ``flwr-clientapp`` process for every message, so
anything a ClientApp keeps in memory (the data, the model, the calibration, PowerSGD's warm
start) is rebuilt every time, and importing torch alone costs seconds. The operator starts this
service next to the SuperNode, with the node's own config, and adds ``silo-service='<socket>'``
to the SuperNode's node config::

    python -m app.runtime.silo_service --socket /srv/silofl/state/silo-service.sock \\
        --node-config "partition-id=0 num-partitions=2 state-dir='/srv/silofl/state' epsilon-cap=3.0"

The ClientApp (app/client_app.py) then imports no torch and forwards each message here over a
Unix socket; the service answers it with app/node_runtime.py, the same code a ClientApp runs in
process, and keeps the silo between messages and runs.

Security. The ClientApp's code comes from the server (the FAB that ``flwr run`` ships), so the
service takes from a request only what the server decides anyway: the message type, its
content, the run id and the run config. Everything that protects the silo's records (privacy
caps, ledger scope and location, noise seed, evaluation policy, role, keys, data-dir) comes from
its own ``--node-config``; a request cannot carry a node config. The service is always a
deployment (app/privacy/policy.py): OS randomness, no evaluation and no runs without privacy
unless its node config says otherwise. The socket is created 0600 in a directory created 0700,
and only a peer with the service's own uid (or root) is served.

Slow or stuck peers. Each connection has its own thread and every request has deadlines that
cover the whole of it, not one read: its header must arrive within ``--header-timeout`` seconds
of the connection (2 by default; until then it waits in a pending pool of 64 where one more cuts
the oldest, and a ping is answered there), the whole request within ``--request-timeout`` (10;
at most ``--max-connections`` requests, 8 by default, are read or handled at once, a peer
process at most half of them; one more is answered ``busy``), a handler waits at most ``--busy-timeout`` seconds for the node
(600), and the reply must be taken within ``--reply-timeout`` seconds (10). Handling itself (the
node's own computation: training, the ledger) runs one request at a time under one lock, so the
ledger, the model and the calibration are never touched concurrently; a ping needs no lock.
SIGTERM closes the socket at once, cuts every connection still sending its request or waiting,
lets a request being handled finish (its ledger entry is already being written) and exits; a
second SIGTERM exits without waiting.

Memory. A frame's prefix declares its size: over ``--max-frame-bytes`` (by default derived from
the node config's ``max-model-params``, app/runtime/silo_protocol.py :func:`default_frame_bytes`) it is
refused; otherwise its size is reserved from ``--memory-budget`` (2 x the frame limit by
default; a peer process at most half) or it is refused ``busy``, in both cases before its body
is read. Requests read or held at once never take more than the budget.

The wire format and the client side are in app/runtime/silo_protocol.py.

This module's top level imports no torch: the ClientApp imports it for :func:`request`.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict
from flwr.common.serde import recorddict_to_proto

from app.runtime.silo_protocol import (BUDGET_FRAMES, BUSY_TIMEOUT_S, HEADER_TIMEOUT_S, MAX_CONNECTIONS, MAX_PENDING,
                                       PING, REPLY, REPLY_TIMEOUT_S, REQUEST, REQUEST_TIMEOUT_S, TICK_S, Cut,
                                       FrameError, FrameTooLarge, ServiceError, ServiceUnavailable, default_frame_bytes,
                                       encode_frame, parse_bytes, parse_request, ping, read_header, read_prefix,
                                       recv_exact, send_all)


# -- the service ----------------------------------------------------------------------------------

def _listening(path: str) -> bool:
    """Whether a process listens on the Unix socket ``path`` (connection refused: a stale file)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True  # e.g. a full backlog: someone is there
    finally:
        sock.close()
    return True


_LOG_LOCK = threading.Lock()


def _log(msg: str) -> None:
    with _LOG_LOCK:
        print(f"[silo-service] {msg}", flush=True)



def request_node_id(header: dict[str, Any]) -> int:
    """The Flower node id a request's header carries (0 when absent or not a 64-bit unsigned integer)."""
    value = header.get("node_id", 0)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64 else 0

class _Conn:
    """One accepted connection: its socket, its peer's pid, when it was accepted, and what it
    holds (a request slot, bytes of the memory budget)."""

    __slots__ = ("sock", "pid", "t0", "slot", "reserved", "evicted")

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid, self.t0 = sock, pid, time.monotonic()
        self.slot, self.reserved, self.evicted = False, 0, False


def _peer_pid(conn: socket.socket) -> int:
    if not hasattr(socket, "SO_PEERCRED"):
        return 0
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
    except OSError:
        return 0
    return struct.unpack("iII", creds)[0]  # struct ucred: pid, uid, gid


class SiloService:
    """Serves a listening Unix socket with this node's config: one thread per connection,
    whole-request deadlines, one request handled at a time.

    Admission, in the order a frame arrives (docs/silo-service.md "Memory and fairness"):

    * every connection is accepted into the *pending* pool (at most ``max_pending``; one more
      cuts the oldest pending one) and must send its frame's prefix and header within
      ``header_timeout`` of the accept;
    * the prefix declares the frame's size: over ``max_frame_bytes`` it is refused at once;
      otherwise the size is reserved from the ``memory_budget`` (bytes of requests being read or
      held at once), or, if it does not fit (or its peer already holds its share), the frame is
      refused ``busy`` at once, before its header or body is read;
    * a ping is answered from the pending pool: it never takes a request slot;
    * a request takes one of ``max_connections`` slots (a peer process at most half of them) to
      read its body within ``request_timeout`` of the accept and be handled; none free: ``busy``.
    The reservation is released when the request's reply is sent (its content lives until then)."""

    def __init__(self, socket_path: str | Path, node_config: Mapping[str, Any],
                 max_frame_bytes: int | None = None, *,
                 request_timeout: float = REQUEST_TIMEOUT_S, reply_timeout: float = REPLY_TIMEOUT_S,
                 busy_timeout: float = BUSY_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
                 header_timeout: float = HEADER_TIMEOUT_S, memory_budget: int | None = None,
                 max_pending: int = MAX_PENDING) -> None:
        from app.privacy.policy import PolicyError, node_policy

        self.path = str(socket_path)
        self.node_config = dict(node_config)
        self.node_config.pop("silo-service", None)  # the service is the silo: it forwards nothing
        node_policy(self.node_config, deployed=True)  # a bad policy value stops the service here
        try:
            derived = default_frame_bytes(self.node_config)
        except ValueError as exc:
            raise PolicyError(str(exc)) from None
        self.max_frame_bytes = int(max_frame_bytes) if max_frame_bytes is not None else derived
        self.memory_budget = (int(memory_budget) if memory_budget is not None
                              else BUDGET_FRAMES * self.max_frame_bytes)
        if self.memory_budget < self.max_frame_bytes:
            raise PolicyError(f"the memory budget ({self.memory_budget} bytes) is below the frame limit "
                              f"({self.max_frame_bytes} bytes): a frame the limit allows could never be read")
        self.request_timeout = float(request_timeout)
        self.reply_timeout = float(reply_timeout)
        self.busy_timeout = float(busy_timeout)
        self.header_timeout = min(float(header_timeout), self.request_timeout)
        self.max_connections = int(max_connections)
        self.max_pending = int(max_pending)
        #: what one peer process may hold: half the request slots; half the budget, or one
        #: frame of the largest size if that is more (a peer with one request is never refused)
        self.peer_slots = max(1, (self.max_connections + 1) // 2)
        self.peer_budget = max(self.memory_budget // 2, self.max_frame_bytes)
        self.stopping = False
        self.sock: socket.socket | None = None
        self.runtime: Any = None
        self.types: frozenset[str] = frozenset({PING})
        self._ino: int | None = None
        self._node = threading.Lock()  # held while a request is handled: the ledger, model, calibration
        self._threads: set[threading.Thread] = set()
        self._threads_lock = threading.Lock()  # also guards the pools and the budget below
        self._pending: dict[_Conn, None] = {}  # accept order: the first is the oldest
        self._slots: dict[int, int] = {}  # peer pid -> request slots held
        self._reserved: dict[int, int] = {}  # peer pid -> budget bytes held
        #: bytes of the memory budget held now, and the most ever held at once
        self.budget_used = 0
        self.budget_peak = 0
        self._handling: str | None = None  # "run <id> <type>" of the request being handled

    # socket lifecycle
    def check_path(self) -> None:
        """SystemExit unless the socket path is free: too long, not a socket, or another service
        listening there stops this one; a stale socket (nobody listening) is removed."""
        path = Path(self.path)
        if len(os.fsencode(self.path)) > 107:
            raise SystemExit(f"silo service: socket path {self.path} is too long for a Unix socket (max 107 bytes)")
        if path.exists() or path.is_symlink():
            if not stat.S_ISSOCK(path.lstat().st_mode):
                raise SystemExit(f"silo service: {self.path} exists and is not a socket; refusing to replace it")
            if _listening(self.path):  # a busy service still accepts: never judge by a timed-out ping
                try:
                    who = f" (pid {ping(self.path, timeout=2.0).get('pid')})"
                except (ServiceUnavailable, ServiceError, FrameError, struct.error):
                    who = ""
                raise SystemExit(f"silo service: another silo service{who} answers on {self.path}; "
                                 "refusing to start a second one")
            path.unlink(missing_ok=True)  # a stale socket left by a service that died
            _log(f"removed the stale socket {self.path}")

    def load(self) -> None:
        """Import the node runtime (torch, the data pipeline, the accountant) once, before the
        socket exists, so that the first request does not pay for it."""
        from app import node_runtime

        self.runtime = node_runtime
        self.types = frozenset(node_runtime.HANDLERS) | {PING}

    def bind(self) -> None:
        """Listen on the socket (0600, its directory created 0700): from now on it serves."""
        self.check_path()
        path = Path(self.path)
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True)
            os.chmod(path.parent, 0o700)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # the socket is 0600 from the moment it exists
        try:
            sock.bind(self.path)
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        sock.settimeout(TICK_S)  # wake up to notice SIGTERM
        self._ino = os.stat(self.path).st_ino
        self.sock = sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        try:
            if self._ino is not None and os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)  # ours, not a successor's
        except FileNotFoundError:
            pass

    def _stopping(self) -> bool:
        return self.stopping

    def serve_forever(self) -> None:
        """Accept until SIGTERM; then close the socket and drain the connections (see drain)."""
        listener = self.sock
        assert listener is not None
        try:
            while not self.stopping:
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    if self.stopping:
                        break
                    raise
                self._start_connection(conn)
        finally:
            self.drain()

    def _start_connection(self, conn: socket.socket) -> None:
        """Admit ``conn`` to the pending pool (cutting the oldest pending connection when the pool
        is full: a peer that keeps connections open without sending keeps no one out) and start
        its thread."""
        c = _Conn(conn, _peer_pid(conn))
        with self._threads_lock:
            self._threads = {t for t in self._threads if t.is_alive()}
            victim = None
            if len(self._pending) >= self.max_pending:
                victim = next(iter(self._pending))
                del self._pending[victim]
                victim.evicted = True
                self._refuse(victim.sock, f"busy: {self.max_pending} connections are waiting to send their request; "
                             "the oldest is cut", busy=True)
                try:
                    victim.sock.shutdown(socket.SHUT_RDWR)  # its thread's read ends at once; it closes it
                except OSError:
                    pass
            self._pending[c] = None
            thread = threading.Thread(target=self._connection, args=(c,), daemon=True,
                                      name="silo-service-connection")
            self._threads.add(thread)
        if victim is not None:
            _log(f"cut the oldest of {self.max_pending} connections waiting to send a request (peer pid {victim.pid}, "
                 f"{time.monotonic() - victim.t0:.1f} s)")
        thread.start()

    def _connection(self, c: _Conn) -> None:
        try:
            with c.sock:
                self.serve_connection(c)
        finally:
            with self._threads_lock:
                self._pending.pop(c, None)
                self._release(c)

    # the pools and the budget (under _threads_lock)
    def _reserve(self, c: _Conn, n: int) -> str | None:
        """Reserve ``n`` bytes of the budget for ``c``; None, or why they do not fit."""
        with self._threads_lock:
            held = self._reserved.get(c.pid, 0)
            if self.budget_used + n > self.memory_budget:
                return (f"busy: {self.budget_used} bytes of requests are being read or handled; this frame's {n} "
                        f"bytes do not fit the memory budget of {self.memory_budget} bytes")
            if c.pid and held + n > self.peer_budget:  # pid 0: no peer credentials, no shares
                return (f"busy: this peer process holds {held} bytes of the memory budget; this frame's {n} bytes "
                        f"would take it over its share of {self.peer_budget} bytes")
            self._reserved[c.pid] = held + n
            c.reserved += n
            self.budget_used += n
            self.budget_peak = max(self.budget_peak, self.budget_used)
            return None

    def _release(self, c: _Conn) -> None:
        """Give back what ``c`` holds (the caller holds _threads_lock)."""
        if c.reserved:
            self.budget_used -= c.reserved
            left = self._reserved.pop(c.pid, 0) - c.reserved
            if left > 0:
                self._reserved[c.pid] = left
            c.reserved = 0
        if c.slot:
            left = self._slots.pop(c.pid, 0) - 1
            if left > 0:
                self._slots[c.pid] = left
            c.slot = False

    def _leave_pending(self, c: _Conn, slot: bool) -> str | None:
        """Take ``c`` out of the pending pool, with a request slot when ``slot``; None, or why
        not (cut as the oldest pending connection, or no slot free)."""
        with self._threads_lock:
            if c.evicted:
                return "cut"
            self._pending.pop(c, None)
            if not slot:
                return None
            used = sum(self._slots.values())
            if used >= self.max_connections:
                return f"busy: {self.max_connections} requests are being read or handled; try again"
            if c.pid and self._slots.get(c.pid, 0) >= self.peer_slots:
                return (f"busy: this peer process has {self.peer_slots} of the {self.max_connections} requests "
                        "being read or handled; try again")
            self._slots[c.pid] = self._slots.get(c.pid, 0) + 1
            c.slot = True
            return None

    def drain(self, grace: float = 5.0) -> None:
        """Stop: close the socket (new peers get 'connection refused'), let the connections see
        ``stopping`` (each within a tick) and the request being handled finish, then return."""
        self.stopping = True
        self.close()
        with self._threads_lock:
            threads = list(self._threads)
        end = time.monotonic() + grace
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))
        while True:  # a request still being handled is finished, however long it takes
            with self._threads_lock:
                alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                break
            _log(f"stopping: waiting for the request being handled ({self._handling or '?'})")
            for thread in alive:
                thread.join(30.0)

    # one connection, one request
    def _peer_allowed(self, conn: socket.socket) -> bool:
        if not hasattr(socket, "SO_PEERCRED"):
            return True
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
        _, uid, _ = struct.unpack("iII", creds)  # struct ucred: pid, uid, gid
        return uid in (os.getuid(), 0)

    def serve_connection(self, c: _Conn) -> None:
        """Read one request by its deadlines, handle it under the node's lock, send the reply by
        its deadline. A peer that is too slow, or a stop, cuts the connection (never the service)."""
        conn, t0 = c.sock, c.t0
        run_id: Any = "-"
        mtype = "?"
        try:
            if not self._peer_allowed(conn):
                self._send(conn, {"ok": False, "error": "peer uid not allowed"})
                _log("refused a peer with another uid")
                return
            header_deadline = t0 + self.header_timeout
            head_len, body_len = read_prefix(conn, REQUEST, self.max_frame_bytes, header_deadline, self._stopping)
            refused = self._reserve(c, head_len + body_len)
            if refused:  # before its header or body is read
                _log(f"refused a frame of {head_len + body_len} bytes from peer pid {c.pid}: {refused}")
                self._refuse(conn, refused, busy=True)
                return
            header = read_header(conn, head_len, header_deadline, self._stopping)
            mtype = "".join(ch if ch.isprintable() else "?" for ch in str(header.get("type", "?"))[:40])
            if header.get("type") == PING:  # no slot and no lock: answered while requests are handled
                recv_exact(conn, body_len, header_deadline, self._stopping)
                if self._leave_pending(c, slot=False):
                    return
                self._send(conn, {"ok": True, "pid": os.getpid(), "partition-id": self.node_config.get("partition-id"),
                                  "role": self.node_config.get("role", "silo")})
                return
            refused = self._leave_pending(c, slot=True)
            if refused:
                if refused != "cut":
                    _log(f"run {header.get('run_id', '-')} {mtype} refused: {refused}")
                    self._refuse(conn, refused, busy=True)
                return
            body = recv_exact(conn, body_len, t0 + self.request_timeout, self._stopping)
            mtype, run_id, run_config, content = parse_request(header, body, self.types)
            del body
            if not self._acquire_node(conn, run_id, mtype):
                return
            try:
                self._handling = f"run {run_id} {mtype}"
                reply = self.handle(mtype, run_id, run_config, content, node_id=request_node_id(header))
            finally:
                self._handling = None
                self._node.release()
            del content
            sent = self._send(conn, {"ok": True}, recorddict_to_proto(reply).SerializeToString())
            _log(f"run {run_id} {mtype} {1000 * (time.monotonic() - t0):.1f} ms" + ("" if sent else " (reply lost)"))
        except FrameTooLarge as exc:
            _log(f"run {run_id} {mtype} refused: {exc}")
            self._send(conn, {"ok": False, "too-large": True,
                              "error": f"{exc} (this node's frame limit: --max-frame-bytes, or node config "
                                       "max-model-params)"})
        except (FrameError, struct.error, UnicodeDecodeError) as exc:
            _log(f"run {run_id} {mtype} malformed request: {exc}")
            self._send(conn, {"ok": False, "error": f"malformed request: {exc}"})
        except Cut as exc:
            if c.evicted:
                return
            limit = (f"header timeout {self.header_timeout:g} s" if "header" in str(exc)
                     else f"request timeout {self.request_timeout:g} s")
            _log(f"run {run_id} {mtype} connection cut after {time.monotonic() - t0:.1f} s: {exc}")
            self._refuse(conn, str(exc) if self.stopping else f"{exc} ({limit})")
        except (EOFError, TimeoutError, ConnectionError, BrokenPipeError) as exc:
            if not c.evicted:
                _log(f"run {run_id} {mtype} connection dropped: {exc}")
        except Exception as exc:  # the handler raised: say why, keep serving
            traceback.print_exc(file=sys.stderr)
            _log(f"run {run_id} {mtype} failed after {1000 * (time.monotonic() - t0):.1f} ms: "
                 f"{type(exc).__name__}: {exc}")
            self._send(conn, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})

    def _acquire_node(self, conn: socket.socket, run_id: Any, mtype: str) -> bool:
        """Wait for the node (another request may be handled) up to busy_timeout or a stop;
        False (the peer told why) if it did not come free."""
        end = time.monotonic() + self.busy_timeout
        while not self._node.acquire(timeout=TICK_S):
            if self.stopping:
                self._refuse(conn, "the service is stopping", busy=True)
                return False
            if time.monotonic() >= end:
                _log(f"run {run_id} {mtype} refused: the node stayed busy for {self.busy_timeout:g} s "
                     f"({self._handling or '?'})")
                self._refuse(conn, f"busy: the node is handling another request for over {self.busy_timeout:g} s",
                             busy=True)
                return False
        return True

    def _refuse(self, conn: socket.socket, error: str, busy: bool = False) -> None:
        """A small error reply, sent only if it goes at once (a refused or cut peer gets no time)."""
        header: dict[str, Any] = {"ok": False, "error": error} | ({"busy": True} if busy else {})
        try:  # MSG_DONTWAIT: the socket's own mode is left alone (another thread may be reading it)
            conn.send(encode_frame(REPLY, header), socket.MSG_DONTWAIT)
        except OSError:
            pass

    def handle(self, mtype: str, run_id: int, run_config: dict[str, Any], content: RecordDict,
               node_id: int = 0) -> RecordDict:
        """The reply to one request: this node's own config, the request's run and content, and the
        Flower node id the forwarding ClientApp was given (secure aggregation names silos by it)."""
        context = Context(run_id=run_id, node_id=node_id, node_config=dict(self.node_config), state=RecordDict(),
                          run_config=run_config)
        return self.runtime.handle(mtype, content, context, deployed=True)

    def _send(self, conn: socket.socket, header: Mapping[str, Any], body: bytes = b"") -> bool:
        """Whether the peer took the reply within reply_timeout (else the connection is cut)."""
        try:
            send_all(conn, encode_frame(REPLY, header, body), time.monotonic() + self.reply_timeout,
                      self._stopping)
            return True
        except Cut as exc:
            _log(f"reply not delivered: {exc} (reply timeout {self.reply_timeout:g} s)")
        except OSError:
            pass  # the peer left; nothing to tell it
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.runtime.silo_service", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="the Unix socket to listen on (its directory is created 0700)")
    ap.add_argument("--node-config", default="", help="this node's config, the same string as the SuperNode's "
                    "--node-config (Flower's format: \"partition-id=0 num-partitions=2 state-dir='/state' ...\")")
    ap.add_argument("--max-frame-bytes", default=None, metavar="BYTES",
                    help="the largest request accepted, e.g. 268435456 or 256MiB (default: derived from the node "
                    "config's max-model-params, 258 MB for a silo by default; 1 GiB for the shuffler)")
    ap.add_argument("--memory-budget", default=None, metavar="BYTES",
                    help=f"bytes of requests read or held at once, over all connections; a frame that does not fit "
                    f"is refused 'busy' before it is read (default {BUDGET_FRAMES} x the frame limit)")
    ap.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S, metavar="S",
                    help="seconds a peer has to send its request's header, from its connection "
                    f"(default {HEADER_TIMEOUT_S:g})")
    ap.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="S",
                    help="seconds a peer has to send its whole request, from its connection "
                    f"(default {REQUEST_TIMEOUT_S:g})")
    ap.add_argument("--reply-timeout", type=float, default=REPLY_TIMEOUT_S, metavar="S",
                    help=f"seconds a peer has to take the whole reply (default {REPLY_TIMEOUT_S:g})")
    ap.add_argument("--busy-timeout", type=float, default=BUSY_TIMEOUT_S, metavar="S",
                    help=f"seconds a request waits while another one is handled (default {BUSY_TIMEOUT_S:g})")
    ap.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                    help=f"connections served at once; one more gets a 'busy' reply (default {MAX_CONNECTIONS})")
    args = ap.parse_args(argv)
    from flwr.common.config import parse_config_args

    from app.privacy.policy import PolicyError

    try:
        node_config = parse_config_args([args.node_config]) if args.node_config.strip() else {}
    except Exception as exc:
        print(f"silo service: --node-config cannot be parsed: {exc}", file=sys.stderr)
        return 2
    sizes: dict[str, int | None] = {}
    for name in ("max_frame_bytes", "memory_budget"):
        flag, value = f"--{name.replace('_', '-')}", getattr(args, name)
        try:
            sizes[name] = None if value is None or not str(value).strip() else parse_bytes(value, flag)
        except ValueError as exc:
            print(f"silo service: {exc}", file=sys.stderr)
            return 2
        if sizes[name] is not None and sizes[name] < 1024:  # type: ignore[operator]
            print(f"silo service: {flag} {value} is out of range; allowed: >= 1024", file=sys.stderr)
            return 2
    for name in ("request_timeout", "reply_timeout", "busy_timeout", "header_timeout"):
        value = getattr(args, name)
        if not 0 < value < 1e6:  # NaN too
            print(f"silo service: --{name.replace('_', '-')} {value} is out of range; allowed: (0, 1e6) seconds",
                  file=sys.stderr)
            return 2
    if not 1 <= args.max_connections <= 1024:
        print(f"silo service: --max-connections {args.max_connections} is out of range; allowed: 1..1024",
              file=sys.stderr)
        return 2
    try:
        service = SiloService(args.socket, node_config, sizes["max_frame_bytes"], request_timeout=args.request_timeout,
                              reply_timeout=args.reply_timeout, busy_timeout=args.busy_timeout,
                              max_connections=args.max_connections, header_timeout=args.header_timeout,
                              memory_budget=sizes["memory_budget"])
    except PolicyError as exc:
        print(f"silo service: {exc}", file=sys.stderr)
        return 2

    def stop(signum: int, _frame: Any) -> None:
        if service.stopping and service.sock is None:  # a second signal while draining: exit now
            raise SystemExit(f"silo service: stopped by a second {signal.Signals(signum).name}")
        service.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        service.check_path()  # fail fast, before the seconds of imports
        service.load()
        if service.stopping:
            return 0
        service.bind()
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 1
    who = (f"role {node_config['role']}" if node_config.get("role")
           else f"partition-id {node_config.get('partition-id', '?')}")
    _log(f"listening on {service.path} (pid {os.getpid()}, {who}, max frame {service.max_frame_bytes} bytes, "
         f"memory budget {service.memory_budget} bytes, {service.max_connections} requests at once, "
         f"header/request/reply timeout {service.header_timeout:g}/{service.request_timeout:g}/"
         f"{service.reply_timeout:g} s)")
    try:
        service.serve_forever()
    finally:
        service.close()
        _log("stopped")
    return 0


if __name__ == "__main__":
    code = main()
    # Every connection thread has ended and every ledger write is on disk (drain waited for the
    # handler): skip the interpreter's teardown of torch and the data stack, 2-3 s on a loaded
    # machine, so that SIGTERM stops the service in well under a second.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
