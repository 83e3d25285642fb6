"""The silo service's protocol: length-prefixed frames over a Unix socket, and the client side
(what the ClientApp calls: :func:`request`, :func:`ping`). The service is app/runtime/silo_service.py.

Wire format (all integers big-endian): ``b"SLFS"``, version (u8), kind (u8: 0 request, 1
reply), header length (u32), body length (u64), a JSON header, a body. A request's header is
``{"type": <Flower message type or "ping">, "run_id": int, "run_config": {key: bool | int |
float | str}}`` and its body the message content, a RecordDict serialised with Flower's protobuf
serde (no pickle). A reply's header is ``{"ok": true}`` with the reply content as body, or
``{"ok": false, "error": "..."}`` (with ``"busy": true`` when the service is at its request
limit, the frame does not fit its memory budget or the node stayed busy, and ``"too-large":
true`` when the frame is over its frame limit; the client raises ServiceUnavailable for both, so
the ClientApp answers with a refusal). The prefix declares the whole frame's size, so the
service refuses an oversized frame, or one that does not fit its budget, before reading the rest
(default limits: :func:`default_frame_bytes`). A malformed frame, or a request that is not
complete by its deadline, gets an error reply and the connection is closed; the service keeps
serving.

This module imports no torch and no silofl module: the ClientApp imports it for :func:`request`.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

MAGIC = b"SLFS"
VERSION = 1
REQUEST, REPLY = 0, 1
PREFIX = struct.Struct(">4sBBIQ")  # magic, version, kind, header length, body length
MAX_HEADER_BYTES = 16 << 20
DEFAULT_MAX_FRAME_BYTES = 1 << 30
PING = "ping"
#: the fields of a request header: nothing else is accepted
REQUEST_KEYS = frozenset({"type", "run_id", "run_config", "node_id"})
CONNECT_TIMEOUT_S = 5.0
#: seconds a connected peer may take to send its whole request (from the accept to its last byte)
REQUEST_TIMEOUT_S = 10.0
#: seconds a request may wait for the node while another one is being handled
BUSY_TIMEOUT_S = 600.0
#: seconds a peer may take to read the whole reply
REPLY_TIMEOUT_S = 10.0
#: connections served at once (each its own thread); one more gets a "busy" reply
MAX_CONNECTIONS = 8
#: seconds a connected peer may take to send its frame's prefix and JSON header (a ClientApp
#: sends its whole frame at once, so this is short: a peer that connects and sends nothing, or
#: trickles, gives up its place within it)
HEADER_TIMEOUT_S = 2.0
#: connections accepted but still sending their header; one more cuts the oldest of them
MAX_PENDING = 64
#: how often a blocked read or write looks at its deadline and at a stop
TICK_S = 0.25

# -- frame limit and memory budget (app/runtime/silo_service.py, docs/silo-service.md) --------------------

#: node config ``max-model-params``: the most parameters of a model this node takes messages for.
#: 16M: the zoo's largest model, ResNet-18 (11.2M), with room to spare
MAX_MODEL_PARAMS = 16_000_000
#: the largest message a silo legitimately receives is a training instruction with two float32
#: points (w_r and the second point of a difference release, app/wire/messages.py Instruction)
POINTS_PER_MESSAGE, BYTES_PER_PARAM = 2, 4
#: record names, .npy headers, the instruction's config and the run config in the header
MESSAGE_SLACK_BYTES = 1 << 20
#: the frame limit is this many times the largest legitimate message
FRAME_HEADROOM = 2
#: the memory budget (bytes of requests read or held at once) is this many frame limits
BUDGET_FRAMES = 2
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 10 ** 3, "mb": 10 ** 6,
          "gb": 10 ** 9}


def parse_bytes(value: Any, what: str) -> int:
    """A byte count: a whole number, or one with a unit ("256MiB", "1GiB", "500MB");
    ValueError (one line naming ``what``) otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        text = str(value).strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits):]
        if not digits.isdigit() or unit not in _UNITS:
            raise ValueError(f"{what} = {value!r} is not a byte count (e.g. 268435456, 256MiB, 1GiB)")
        n = int(digits) * _UNITS[unit]
    if n < 1:
        raise ValueError(f"{what} = {value!r} is out of range; allowed: >= 1")
    return n


def max_model_params(node_config: Mapping[str, Any]) -> int:
    """The node config's ``max-model-params`` (default MAX_MODEL_PARAMS); ValueError if it is
    not a whole number >= 1."""
    value = node_config.get("max-model-params", MAX_MODEL_PARAMS)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"node config max-model-params = {value!r} is not a whole number of parameters")
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"node config max-model-params = {value!r} is not a whole number of parameters") from None
    if not 1 <= n <= 1 << 40:
        raise ValueError(f"node config max-model-params = {value!r} is out of range; allowed: 1..2^40")
    return n


def default_frame_bytes(node_config: Mapping[str, Any]) -> int:
    """The frame limit a service with ``node_config`` starts with when ``--max-frame-bytes`` is
    not given. The service starts before any run, so it cannot know the run's model; what it
    knows is its node config. A silo: FRAME_HEADROOM x the largest legitimate message for a
    model of ``max-model-params`` (POINTS_PER_MESSAGE float32 points + MESSAGE_SLACK_BYTES),
    258 MB (246 MiB) by default. The shuffler receives one sealed contribution per sampled silo, so its
    largest message grows with the number of silos, which its node config does not bound: it
    keeps DEFAULT_MAX_FRAME_BYTES (1 GiB). Either way the memory budget bounds the sum."""
    params = max_model_params(node_config)
    if str(node_config.get("role", "silo")) == "shuffler":
        return DEFAULT_MAX_FRAME_BYTES
    return FRAME_HEADROOM * (POINTS_PER_MESSAGE * BYTES_PER_PARAM * params + MESSAGE_SLACK_BYTES)


class FrameError(ValueError):
    """A frame is malformed, oversized, or its header is not what the protocol allows."""


class ServiceUnavailable(ConnectionError):
    """No silo service answers on the socket (missing, refused, or it went away mid-request)."""


class ServiceError(RuntimeError):
    """The silo service answered with an error (it could not handle the request)."""


class Cut(Exception):
    """A connection ran past its deadline, or the service is stopping."""


# -- framing --------------------------------------------------------------------------------------

def encode_frame(kind: int, header: Mapping[str, Any], body: bytes = b"") -> bytes:
    head = json.dumps(dict(header), allow_nan=True, separators=(",", ":")).encode()
    return PREFIX.pack(MAGIC, VERSION, kind, len(head), len(body)) + head + body


def _wait(sock: socket.socket, deadline: float | None, stopping: Callable[[], bool] | None, what: str) -> None:
    """Set ``sock``'s timeout to the next tick before ``deadline``; Cut if the deadline passed or
    ``stopping()`` says the service stops. No deadline: the socket's own timeout stands."""
    if deadline is None:
        return
    if stopping is not None and stopping():
        raise Cut(f"the service is stopping ({what})")
    left = deadline - time.monotonic()
    if left <= 0:
        raise Cut(f"{what} not complete by its deadline")
    sock.settimeout(min(left, TICK_S))


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None,
                stopping: Callable[[], bool] | None = None, what: str = "request") -> bytearray:
    """``n`` bytes, read as they come into one growing buffer (a frame that announces more than
    it sends costs only what it sent, and what arrived is held once, never twice); with a
    ``deadline`` (time.monotonic()), Cut once it passes, however the bytes trickle in."""
    buf = bytearray()
    while len(buf) < n:
        _wait(sock, deadline, stopping, what)
        try:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
        except TimeoutError:
            if deadline is None:
                raise
            continue
        if not chunk:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk  # grows in place (realloc), not a list of chunks joined at the end
    return buf


def send_all(sock: socket.socket, data: bytes, deadline: float, stopping: Callable[[], bool] | None = None) -> None:
    """``sock.sendall(data)`` that gives up (Cut) at ``deadline``, or when the service stops and
    the peer has not taken anything for a tick."""
    view, sent = memoryview(data), 0
    while sent < len(view):
        _wait(sock, deadline, None, "reply")
        try:
            sent += sock.send(view[sent:sent + (1 << 20)])
        except TimeoutError:
            if stopping is not None and stopping():
                raise Cut("the service is stopping and the peer does not read its reply") from None


class FrameTooLarge(FrameError):
    """A frame declares more bytes than the service accepts (its frame limit)."""


def read_prefix(sock: socket.socket, kind: int, max_bytes: int, deadline: float | None = None,
                stopping: Callable[[], bool] | None = None) -> tuple[int, int]:
    """A frame's fixed prefix: (header length, body length), checked before anything else is
    read. FrameError if it is not a frame of ``kind`` of this version; FrameTooLarge if it
    declares more than ``max_bytes`` (its header and body are never read)."""
    magic, version, got_kind, head_len, body_len = PREFIX.unpack(recv_exact(sock, PREFIX.size, deadline,
                                                                                 stopping, "request header"))
    if magic != MAGIC:
        raise FrameError(f"not a silo-service frame (magic {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise FrameError(f"protocol version {version}; this service speaks version {VERSION}")
    if got_kind != kind:
        raise FrameError(f"frame kind {got_kind}, expected {kind}")
    if head_len > MAX_HEADER_BYTES or head_len + body_len > max_bytes:
        raise FrameTooLarge(f"frame of {head_len + body_len} bytes is over the limit of {max_bytes} bytes")
    return head_len, body_len


def read_header(sock: socket.socket, head_len: int, deadline: float | None = None,
                stopping: Callable[[], bool] | None = None) -> dict[str, Any]:
    """A frame's JSON header of ``head_len`` bytes (after its prefix); FrameError if not an object."""
    try:
        header = json.loads(recv_exact(sock, head_len, deadline, stopping, "request header"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise FrameError("header is not a JSON object")
    return header


def read_frame(sock: socket.socket, kind: int, max_bytes: int, deadline: float | None = None,
               stopping: Callable[[], bool] | None = None) -> tuple[dict[str, Any], bytearray]:
    """One frame of ``kind`` from ``sock``: (header, body). FrameError if malformed or too big;
    EOFError if the peer closed the connection before the frame was complete; Cut if the whole
    frame has not arrived by ``deadline`` (time.monotonic()) or ``stopping()`` turns true."""
    head_len, body_len = read_prefix(sock, kind, max_bytes, deadline, stopping)
    header = read_header(sock, head_len, deadline, stopping)
    return header, recv_exact(sock, body_len, deadline, stopping)


def _scalar(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str))


def parse_request(header: Mapping[str, Any], body: bytes | bytearray, known_types: frozenset[str]) -> tuple[str, int, dict, RecordDict]:
    """(message type, run id, run config, content) of a request; FrameError if malformed."""
    extra = sorted(set(header) - REQUEST_KEYS)
    if extra:  # in particular a node config: the service has its own and takes no other
        raise FrameError(f"unexpected request fields {extra}; a request has only {sorted(REQUEST_KEYS)}")
    mtype = header.get("type")
    if not isinstance(mtype, str) or mtype not in known_types:
        raise FrameError(f"message type {mtype!r} is not served; served: {', '.join(sorted(known_types))}")
    run_id = header.get("run_id")
    if isinstance(run_id, bool) or not isinstance(run_id, int) or not 0 <= run_id < 2**64:
        raise FrameError(f"run_id {run_id!r} is not an integer in [0, 2^64)")
    run_config = header.get("run_config")
    if not isinstance(run_config, dict) or not all(isinstance(k, str) and _scalar(v) for k, v in run_config.items()):
        raise FrameError("run_config is not an object of str -> bool | int | float | str")
    try:
        content = recorddict_from_proto(ProtoRecordDict.FromString(body))
    except Exception as exc:  # protobuf's DecodeError, or a record Flower refuses to build
        raise FrameError(f"body is not a Flower RecordDict: {type(exc).__name__}: {exc}") from None
    return mtype, run_id, run_config, content


# -- client (the ClientApp side) -----------------------------------------------------------------

def _connect(path: str, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise ServiceUnavailable(f"no silo service answers on {path}: {exc.strerror or exc}") from None
    return sock


def _exchange(path: str, frame: bytes, timeout: float | None, max_bytes: int) -> tuple[dict[str, Any], bytes]:
    sock = _connect(path, CONNECT_TIMEOUT_S)
    try:
        sock.settimeout(timeout)
        try:
            try:
                sock.sendall(frame)
            except OSError:  # the service may have refused before reading it all (busy): read why
                sock.settimeout(1.0)
            reply, body = read_frame(sock, REPLY, max_bytes)
        except (OSError, EOFError) as exc:
            raise ServiceUnavailable(f"the silo service on {path} went away mid-request: {exc}") from None
    finally:
        sock.close()
    if reply.get("busy") is True:  # at its connection limit, or the node stayed busy: not a silo error
        raise ServiceUnavailable(f"the silo service on {path} is busy: {reply.get('error')}")
    if reply.get("too-large") is True:  # over the service's frame limit: the node does not take it
        raise ServiceUnavailable(f"the silo service on {path} does not take this message: {reply.get('error')}")
    return reply, body


def request(path: str, message_type: str, content: RecordDict, run_id: int, run_config: Mapping[str, Any], *,
            timeout: float | None = None, max_bytes: int = DEFAULT_MAX_FRAME_BYTES, node_id: int = 0) -> RecordDict:
    """Forward one message to the service on ``path``; its reply content. ServiceUnavailable if
    nothing answers, ServiceError if the service answers with an error."""
    body = recorddict_to_proto(content).SerializeToString()
    header = {"type": message_type, "run_id": int(run_id), "run_config": dict(run_config), "node_id": int(node_id)}
    reply, reply_body = _exchange(path, encode_frame(REQUEST, header, body), timeout, max_bytes)
    if reply.get("ok") is not True:
        raise ServiceError(f"silo service on {path}: {reply.get('error', 'error reply without a reason')}")
    try:
        return recorddict_from_proto(ProtoRecordDict.FromString(reply_body))
    except Exception as exc:
        raise ServiceError(f"silo service on {path} sent a reply that is not a RecordDict: {exc}") from None


def ping(path: str, timeout: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """The service's ping answer (pid, partition, role); ServiceUnavailable if none answers."""
    reply, _ = _exchange(path, encode_frame(REQUEST, {"type": PING, "run_id": 0, "run_config": {}}), timeout,
                         MAX_HEADER_BYTES)
    if reply.get("ok") is not True:
        raise ServiceError(f"silo service on {path}: {reply.get('error')}")
    return reply
