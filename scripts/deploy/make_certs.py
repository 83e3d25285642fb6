#!/usr/bin/env python3
"""Make a private CA and a TLS server certificate for the SuperLink (``cryptography`` only).

    python -m scripts.deploy.make_certs --out certs --host superlink.example.org --host 10.0.0.1

writes into ``--out``:

* ``ca.key`` (mode 0600) and ``ca.crt``: the federation's CA. Keep ``ca.key`` offline; hand
  ``ca.crt`` to every silo and to the researcher (``--root-certificates``, ``root-certificates``).
* ``server.key`` (mode 0600) and ``server.pem``: the SuperLink's key and certificate, signed by
  the CA, with a subjectAltName for every ``--host`` (DNS names and IPv4/IPv6 addresses).
  ``127.0.0.1`` and ``localhost`` are always added: the SuperLink's own SuperExec connects to
  its Runtime API over loopback when the SuperLink listens on 0.0.0.0 (``--no-loopback`` omits
  them).

An existing CA is never replaced without ``--force`` (which makes a new CA and a new server
certificate: every party then needs the new ``ca.crt``). ``--reuse-ca`` keeps the CA and issues a
new server key and certificate (rotation, or a changed hostname): nothing to redistribute.

Exit codes: 0 written, 2 bad arguments or refused.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_KEY, CA_CERT, SERVER_KEY, SERVER_CERT = "ca.key", "ca.crt", "server.key", "server.pem"
LOOPBACK = ("127.0.0.1", "localhost")


def _fail(msg: str) -> None:
    print(f"make_certs: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def parse_host(host: str) -> x509.GeneralName:
    """A DNS name or an IP address as a subjectAltName entry."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        pass
    name = host.rstrip(".").lower()
    labels = name.split(".")
    ok = name and all(
        0 < len(lab) <= 63 and all(c.isalnum() or c == "-" for c in lab) and not lab.startswith("-")
        and not lab.endswith("-") for lab in (labels[1:] if labels[0] == "*" else labels)
    )
    if not ok or ":" in host or "/" in host:
        _fail(f"--host {host!r} is neither an IP address nor a DNS name")
    return x509.DNSName(name)


def write_file(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` through a temporary file created with ``mode`` (a private key
    is never readable by others, not even for a moment) and renamed over ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_private(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_file(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()), 0o600)


def write_public(path: Path, cert: x509.Certificate) -> None:
    write_file(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def make_ca(name: str, days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP384R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "silofl federation")])
    now = dt.datetime.now(dt.timezone.utc)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def make_server(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, sans: list[x509.GeneralName],
                days: int) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP384R1())
    first = sans[0]
    cn = str(first.value) if isinstance(first, x509.DNSName) else str(first.value.compressed)
    now = dt.datetime.now(dt.timezone.utc)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    return key, cert


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make_certs.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output directory (created, mode 0700)")
    ap.add_argument("--host", action="append", default=[], metavar="NAME_OR_IP",
                    help="a name or address the SuperNodes and flwr use to reach the SuperLink (repeat)")
    ap.add_argument("--no-loopback", action="store_true", help="do not add 127.0.0.1 and localhost")
    ap.add_argument("--ca-name", default="silofl federation CA", help="the CA's common name")
    ap.add_argument("--ca-days", type=int, default=3650, help="CA validity in days (default 3650)")
    ap.add_argument("--days", type=int, default=397, help="server certificate validity in days (default 397)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--force", action="store_true", help="replace an existing CA (and server certificate)")
    mode.add_argument("--reuse-ca", action="store_true", help="keep the existing CA, issue a new server cert")
    args = ap.parse_args(argv)

    hosts = list(args.host) + ([] if args.no_loopback else [h for h in LOOPBACK if h not in args.host])
    if not hosts:
        _fail("give at least one --host (the SuperLink's DNS name or IP address)")
    if args.days < 1 or args.ca_days < 1:
        _fail("--days and --ca-days must be >= 1")
    sans: list[x509.GeneralName] = []
    for h in hosts:
        san = parse_host(h)
        if san not in sans:
            sans.append(san)

    out: Path = args.out
    if out.exists() and not out.is_dir():
        _fail(f"--out {out} exists and is not a directory")
    ca_key_p, ca_cert_p = out / CA_KEY, out / CA_CERT
    have_ca = ca_key_p.exists() or ca_cert_p.exists()
    if args.reuse_ca:
        if not (ca_key_p.exists() and ca_cert_p.exists()):
            _fail(f"--reuse-ca: {ca_key_p} and {ca_cert_p} must both exist")
        ca_key = serialization.load_pem_private_key(ca_key_p.read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_p.read_bytes())
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or ca_key.public_key() != ca_cert.public_key():
            _fail(f"{ca_key_p} does not match {ca_cert_p}")
    elif have_ca and not args.force:
        _fail(f"a CA already exists in {out} (replacing it invalidates every issued ca.crt); "
              "use --reuse-ca to issue a new server certificate with it, or --force to replace it")
    else:
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        ca_key, ca_cert = make_ca(args.ca_name, args.ca_days)
        write_private(ca_key_p, ca_key)
        write_public(ca_cert_p, ca_cert)
        print(f"CA:     {ca_cert_p} (key {ca_key_p}, mode 0600), valid {args.ca_days} days")

    if ca_cert.not_valid_after_utc < dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=args.days):
        print(f"make_certs: note: the CA expires {ca_cert.not_valid_after_utc:%Y-%m-%d}, before the server "
              "certificate would; verification stops at the CA's expiry", file=sys.stderr)
    key, cert = make_server(ca_key, ca_cert, sans, args.days)
    write_private(out / SERVER_KEY, key)
    write_public(out / SERVER_CERT, cert)
    names = ", ".join(str(s.value) for s in sans)
    print(f"server: {out / SERVER_CERT} (key {out / SERVER_KEY}, mode 0600), valid {args.days} days")
    print(f"        subjectAltName: {names}")
    print(f"        SHA-256 fingerprint: {cert.fingerprint(hashes.SHA256()).hex(':')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
