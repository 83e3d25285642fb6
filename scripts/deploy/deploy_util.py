#!/usr/bin/env python3
"""Small helpers for the deployment scripts (one subcommand each; errors are one line, exit 2).

    deploy_util.py free-ports N
        N distinct TCP ports that are free on 127.0.0.1 right now, one a line.
    deploy_util.py node-config [--base "k=v ..."] [--set k=v ...] [--get KEY]
        The node config with the --set entries added, as one --node-config string; a --set key
        that the base already has with another value is an error (Flower rejects duplicate keys).
        With --get: only KEY's value (empty when absent).
    deploy_util.py connection --name NAME --address HOST:PORT (--root-certificates CA | --insecure) [--default]
        Add or replace ``[superlink.NAME]`` in ``$FLWR_HOME/config.toml`` with Flower's own writer.
    deploy_util.py check-cert --ca CA --cert CERT --key KEY [--host HOST]
        The server certificate parses, matches KEY, is signed by CA, is valid now, and (with
        --host) names HOST in its subjectAltName (0.0.0.0 / :: are checked as 127.0.0.1 / ::1,
        the address the SuperLink's own SuperExec connects to).
    deploy_util.py wait HOST:PORT [--ca CA] [--server-name NAME] [--timeout S] [--pid PID]
        Wait until HOST:PORT accepts TCP (and, with --ca, completes a TLS handshake that verifies
        against CA); exit 1 on timeout or when process PID has exited.
    deploy_util.py wait-silo-service PATH --pid PID [--timeout S]
        Wait until the silo service with process id PID answers a ping on PATH (app.runtime.silo_service);
        exit 1 on timeout, when PID has exited, or when another process answers there.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import sys
import time
from pathlib import Path


def _fail(msg: str) -> None:
    print(f"deploy_util: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _node_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    return f"'{s}'" if "'" not in s and "\n" not in s else json.dumps(s)


def node_config(base: str, sets: list[str]) -> str:
    from flwr.common.config import parse_config_args

    try:
        cfg = parse_config_args([base]) if base.strip() else {}
    except Exception as exc:  # click.ClickException on bad TOML values
        _fail(f"--node-config {base!r} does not parse: {getattr(exc, 'message', exc)}")
    for item in sets:
        try:
            new = parse_config_args([item])
        except Exception as exc:
            _fail(f"node config entry {item!r} does not parse: {getattr(exc, 'message', exc)}")
        for k, v in new.items():
            if k in cfg and cfg[k] != v:
                _fail(f"node config sets {k}={cfg[k]!r} but the launcher sets {k}={v!r}; give it once")
            cfg[k] = v
    return " ".join(f"{k}={_node_value(v)}" for k, v in cfg.items())


def write_connection(name: str, address: str, root: str | None, insecure: bool, default: bool) -> Path:
    from flwr.cli.flower_config import set_default_superlink_connection, write_superlink_connection
    from flwr.cli.typing import SuperLinkConnection
    from flwr.supercore.address import parse_address

    if "FLWR_HOME" not in os.environ:
        _fail("FLWR_HOME is not set (the connection would go to ~/.flwr)")
    if not parse_address(address):
        _fail(f"--address {address!r} is not HOST:PORT")
    if root is not None:
        root_p = Path(root).expanduser().resolve()
        if not root_p.is_file():
            _fail(f"--root-certificates {root} is not a file")
        root = str(root_p)
    conn = SuperLinkConnection(name=name, address=address, root_certificates=root, insecure=True if insecure else None)
    write_superlink_connection(conn)
    if default:
        set_default_superlink_connection(name)
    return Path(os.environ["FLWR_HOME"]) / "config.toml"


def wait(address: str, ca: str | None, server_name: str | None, timeout: float, pid: int | None) -> bool:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    ctx = None
    if ca:
        ctx = ssl.create_default_context(cafile=ca)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pid is not None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                print(f"deploy_util: process {pid} exited before {address} was ready", file=sys.stderr)
                return False
        try:
            with socket.create_connection((host, int(port)), timeout=2) as raw:
                if ctx is None:
                    return True
                with ctx.wrap_socket(raw, server_hostname=server_name or host):
                    return True
        except ssl.SSLCertVerificationError as exc:
            print(f"deploy_util: TLS verification of {address} failed: {exc.verify_message}", file=sys.stderr)
            return False
        except OSError:
            time.sleep(0.3)
    print(f"deploy_util: {address} not ready after {timeout:.0f}s", file=sys.stderr)
    return False


def wait_silo_service(path: str, pid: int, timeout: float) -> bool:
    from app.runtime.silo_protocol import ServiceError, ServiceUnavailable, ping

    deadline = time.monotonic() + timeout
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            print(f"deploy_util: the silo service (pid {pid}) exited before answering on {path}", file=sys.stderr)
            return False
        if os.path.exists(path):
            try:
                who = ping(path, timeout=5.0).get("pid")
            except (ServiceUnavailable, ServiceError, OSError, ValueError):
                who = None
            if who is not None:
                if int(who) == pid:
                    return True
                print(f"deploy_util: another silo service (pid {who}) answers on {path}", file=sys.stderr)
                return False
        if time.monotonic() >= deadline:
            print(f"deploy_util: the silo service did not answer on {path} within {timeout:.0f}s", file=sys.stderr)
            return False
        time.sleep(0.3)


def check_cert(ca: str, cert: str, key: str, host: str | None) -> str:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        ca_c = x509.load_pem_x509_certificate(Path(ca).read_bytes())
    except ValueError:
        _fail(f"{ca} is not a PEM certificate")
    try:
        c = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except ValueError:
        _fail(f"{cert} is not a PEM certificate")
    try:
        k = serialization.load_pem_private_key(Path(key).read_bytes(), None)
    except (ValueError, TypeError) as exc:
        _fail(f"{key} is not an unencrypted PEM private key ({exc})")
    if k.public_key() != c.public_key():
        _fail(f"{key} is not the private key of {cert}")
    try:
        c.verify_directly_issued_by(ca_c)
    except Exception:  # ValueError, TypeError or InvalidSignature
        _fail(f"{cert} is not signed by the CA in {ca}")
    now = dt.datetime.now(dt.timezone.utc)
    if not (c.not_valid_before_utc <= now <= c.not_valid_after_utc):
        _fail(f"{cert} is valid only {c.not_valid_before_utc:%Y-%m-%d} to {c.not_valid_after_utc:%Y-%m-%d}")
    if not (ca_c.not_valid_before_utc <= now <= ca_c.not_valid_after_utc):
        _fail(f"the CA {ca} is valid only {ca_c.not_valid_before_utc:%Y-%m-%d} to {ca_c.not_valid_after_utc:%Y-%m-%d}")
    try:
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        _fail(f"{cert} has no subjectAltName")
    names = [str(n) for n in san.get_values_for_type(x509.DNSName)]
    ips = san.get_values_for_type(x509.IPAddress)
    if host:
        h = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(host, host).strip("[]")
        try:
            ok = ipaddress.ip_address(h) in ips
        except ValueError:
            ok = h.lower() in [n.lower() for n in names]
        if not ok:
            _fail(f"{cert} does not name {h} in its subjectAltName ({', '.join(names + [str(i) for i in ips])}); "
                  f"the SuperLink's SuperExec connects to {h}: reissue it with make_certs.py --reuse-ca --host ...")
    days = (c.not_valid_after_utc - now).days
    return f"certificate OK: {', '.join(names + [str(i) for i in ips])}; expires in {days} days"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="deploy_util.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("free-ports")
    p.add_argument("n", type=int)
    p = sub.add_parser("node-config")
    p.add_argument("--base", default="")
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--get")
    p = sub.add_parser("connection")
    p.add_argument("--name", required=True)
    p.add_argument("--address", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--root-certificates")
    g.add_argument("--insecure", action="store_true")
    p.add_argument("--default", action="store_true")
    p = sub.add_parser("check-cert")
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--host")
    p = sub.add_parser("wait")
    p.add_argument("address")
    p.add_argument("--ca")
    p.add_argument("--server-name")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--pid", type=int)
    p = sub.add_parser("wait-silo-service")
    p.add_argument("path")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--timeout", type=float, default=180.0)
    args = ap.parse_args(argv)

    if args.cmd == "free-ports":
        print("\n".join(map(str, free_ports(args.n))))
    elif args.cmd == "node-config":
        merged = node_config(args.base, args.set)
        if args.get:
            from flwr.common.config import parse_config_args

            print(parse_config_args([merged]).get(args.get, "") if merged else "")
        else:
            print(merged)
    elif args.cmd == "connection":
        path = write_connection(args.name, args.address, args.root_certificates, args.insecure, args.default)
        print(f"wrote [superlink.{args.name}] to {path}")
    elif args.cmd == "check-cert":
        print(check_cert(args.ca, args.cert, args.key, args.host))
    elif args.cmd == "wait-silo-service":
        return 0 if wait_silo_service(args.path, args.pid, args.timeout) else 1
    elif args.cmd == "wait":
        return 0 if wait(args.address, args.ca, args.server_name, args.timeout, args.pid) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
