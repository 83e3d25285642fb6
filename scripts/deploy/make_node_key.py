#!/usr/bin/env python3
"""Make a SuperNode authentication key pair in the format Flower 1.42 reads.

    python -m scripts.deploy.make_node_key --out keys --name silo0

writes ``keys/silo0.key`` (mode 0600: the private key, for the silo's
``flower-supernode --auth-supernode-private-key``) and ``keys/silo0.pub`` (the public key, for
``flwr supernode register`` on the federation operator's side). The key is ECDSA on NIST P-384
(``ec.SECP384R1``, the curve Flower's own ``generate_key_pairs`` uses); the private key is in
OpenSSH format (``flower-supernode`` loads it with ``load_ssh_private_key``) and the public key
is one OpenSSH line, ``ecdsa-sha2-nistp384 AAAA... silo0`` (``flwr supernode register`` loads it
with ``load_ssh_public_key`` and accepts only NIST curves). Equivalent to
``ssh-keygen -t ecdsa -b 384 -N "" -C silo0 -f keys/silo0`` (then rename ``silo0`` to ``silo0.key``).

The private key never needs to leave the silo: send only the ``.pub`` file and compare the
printed fingerprint out of band. An existing key is not replaced without ``--force``.
Exit codes: 0 written, 2 bad arguments or refused.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from scripts.deploy.make_certs import write_file


def fingerprint(public_line: bytes) -> str:
    """``ssh-keygen -l`` style SHA256 fingerprint of an OpenSSH public key line."""
    blob = base64.b64decode(public_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make_node_key.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="output directory (created, mode 0700)")
    ap.add_argument("--name", required=True, help="file stem and key comment, e.g. silo0 or shuffler")
    ap.add_argument("--force", action="store_true", help="replace an existing key pair")
    args = ap.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", args.name):
        print(f"make_node_key: error: --name {args.name!r} must be letters, digits, '.', '_' or '-'", file=sys.stderr)
        return 2
    out: Path = args.out
    priv_p, pub_p = out / f"{args.name}.key", out / f"{args.name}.pub"
    if (priv_p.exists() or pub_p.exists()) and not args.force:
        print(f"make_node_key: error: {priv_p} or {pub_p} exists; use --force to replace it (then register "
              "the new public key and unregister the old node)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True, mode=0o700)

    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    public += b" " + args.name.encode() + b"\n"

    write_file(priv_p, private, 0o600)
    write_file(pub_p, public, 0o644)
    print(f"private key: {priv_p} (mode 0600, stays on the silo)")
    print(f"public key:  {pub_p} (register it: scripts/deploy/register_node.sh --superlink NAME {pub_p})")
    print(f"fingerprint: {fingerprint(public)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
