"""Sealed, sender-authenticated envelopes from a silo to the shuffler (shuffle-DP mode).

The server relays every silo's contribution to the shuffler, so the server must neither read a
contribution nor forge one. Each contribution is therefore sealed with a one-pass authenticated
ECIES construction, the same shape as the Noise protocol's one-way ``K`` pattern
(``-> e, es, ss``): the sender knows the recipient's static X25519 key R in advance and the
recipient knows the allowed senders' static keys.

Construction (:func:`seal`), with a fresh ephemeral X25519 key pair ``e`` per message and the
sender's static key pair ``s``::

    shared1 = X25519(e, R)            # ephemeral-static: confidentiality, fresh key per message
    shared2 = X25519(s, R)            # static-static: authenticates the sender
    key     = HKDF-SHA256(ikm=shared1 || shared2, salt=None, length=32,
                          info=b"silofl-shuffle-v1" || e_pub || s_pub || R || context)
    blob    = b"SF1" || e_pub (32) || s_pub (32) || nonce (12) || ChaCha20Poly1305(key, nonce,
                                                                   plaintext, aad=context)

What it guarantees:

* **Confidentiality** to the holder of R's private key: without it (or ``e``'s private key,
  which is discarded after sealing) ``shared1`` cannot be computed, so neither can the key.
  The server, which only relays blobs, learns nothing about the plaintext beyond its length.
* **Sender authenticity** to the recipient: ``shared2`` can only be computed by a holder of the
  sender's or the recipient's private key, and the AEAD tag fails under any other key. A
  blob that opens under an allowed ``s_pub`` was therefore sealed by that sender (or by the
  recipient itself: like every static-static scheme this is not *key-compromise-impersonation*
  resistant, which is irrelevant here because the recipient is the party being protected).
  A fresh key pair made by the server, or a sender key swapped into someone else's blob,
  fails authentication (the header is bound into the key through HKDF's ``info``).
* **Binding to one exchange**: ``context`` (run, round and exchange identifiers, chosen by the
  caller) is both in the key derivation and the AEAD's associated data, so a ciphertext made
  for one exchange does not open in another; a replay *within* the same exchange yields the
  same sender twice, which the shuffler handles (clients/shuffler.py).

Not provided: forward secrecy against a later compromise of R's private key (every blob sent
to R can then be opened), and hiding who sent a blob (``s_pub`` travels in clear: the server
knows which silo it relays for anyway).

Only the ``cryptography`` package is used: X25519, HKDF(SHA256), ChaCha20Poly1305. An all-zero
X25519 output (a small-order public key) is refused by ``cryptography``; it is mapped to
:class:`EnvelopeError` like every other failure.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Collection
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC = b"SF1"
INFO_PREFIX = b"silofl-shuffle-v1"
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
HEADER_BYTES = len(MAGIC) + KEY_BYTES + KEY_BYTES + NONCE_BYTES
#: The shortest blob: header plus the AEAD tag of an empty plaintext.
MIN_BLOB_BYTES = HEADER_BYTES + TAG_BYTES


class EnvelopeError(ValueError):
    """A key or a sealed blob is malformed, unauthentic, or from a sender that is not allowed."""


def _raw_public(key: X25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _dh(private: X25519PrivateKey, peer_public: bytes) -> bytes:
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except Exception as exc:  # small-order point (all-zero output), malformed key, ...
        raise EnvelopeError(f"X25519 key agreement failed: {exc}") from None
    if shared == bytes(len(shared)):  # cryptography already refuses this; never rely on it alone
        raise EnvelopeError("X25519 key agreement gave the all-zero secret (small-order key)")
    return shared


class StaticKeys:
    """A static X25519 key pair. The private key stays inside: it is only used through
    :meth:`dh`; ``public`` (raw 32 bytes) and ``public_hex`` are what gets published."""

    __slots__ = ("_private", "public")

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private
        self.public: bytes = _raw_public(private.public_key())

    @property
    def public_hex(self) -> str:
        return self.public.hex()

    def __repr__(self) -> str:
        return f"StaticKeys(public={self.public_hex})"

    @classmethod
    def generate(cls) -> StaticKeys:
        """A fresh key pair in memory (tests, ephemeral nodes)."""
        return cls(X25519PrivateKey.generate())

    @classmethod
    def _from_raw(cls, raw: bytes, where: object) -> StaticKeys:
        if len(raw) != KEY_BYTES:
            raise EnvelopeError(f"key file {where}: expected {KEY_BYTES} raw bytes, got {len(raw)}")
        try:
            return cls(X25519PrivateKey.from_private_bytes(raw))
        except Exception as exc:
            raise EnvelopeError(f"key file {where}: not an X25519 private key ({exc})") from None

    @classmethod
    def _load(cls, path: Path) -> StaticKeys:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise EnvelopeError(f"key file {path}: cannot open ({exc})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise EnvelopeError(f"key file {path}: not a regular file")
            if st.st_mode & 0o077:
                raise EnvelopeError(
                    f"key file {path}: mode {stat.S_IMODE(st.st_mode):04o} lets the group or others "
                    "read it; it must be 0600 (chmod 600, or delete it to make a new key)"
                )
            with os.fdopen(fd, "rb", closefd=False) as fh:
                raw = fh.read(KEY_BYTES + 1)
        except OSError as exc:
            raise EnvelopeError(f"key file {path}: cannot read ({exc})") from None
        finally:
            os.close(fd)
        return cls._from_raw(raw, path)

    @classmethod
    def load_or_create(cls, path: str | Path) -> StaticKeys:
        """Load the raw 32-byte private key at ``path``, or make one there.

        An existing file is refused (:class:`EnvelopeError`) if it is unreadable, not 32 bytes,
        or readable by the group or others. A new key is written to a temporary file created
        with ``O_CREAT | O_EXCL`` and mode 0600 next to ``path``, then moved into place without
        overwriting: if another process created ``path`` in the meantime, its key is loaded.
        """
        path = Path(path)
        if path.exists() or path.is_symlink():
            return cls._load(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = cls.generate()
        raw = keys._private.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(raw)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # an atomic rename that never replaces an existing key
            except FileExistsError:
                return cls._load(path)  # another process won the race: use its key
            except OSError:
                os.replace(tmp, path)  # a filesystem without hard links
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        with contextlib.suppress(OSError):
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return keys

    def dh(self, peer_public: bytes) -> bytes:
        """X25519(own private, peer_public); :class:`EnvelopeError` on a small-order peer key."""
        return _dh(self._private, parse_public_key(peer_public))


def parse_public_key(text_or_bytes: str | bytes | bytearray | memoryview) -> bytes:
    """A raw 32-byte X25519 public key from 64 hex characters (str or ASCII bytes) or 32 raw
    bytes; :class:`EnvelopeError` otherwise."""
    value = text_or_bytes
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    if isinstance(value, bytes):
        if len(value) == KEY_BYTES:
            return value
        if len(value) == 2 * KEY_BYTES:
            try:
                value = value.decode("ascii")
            except UnicodeDecodeError:
                raise EnvelopeError("public key: 64 bytes that are not hex text") from None
        else:
            raise EnvelopeError(f"public key: expected 32 raw bytes or 64 hex characters, got {len(value)} bytes")
    if not isinstance(value, str):
        raise EnvelopeError(f"public key: expected str or bytes, got {type(text_or_bytes).__name__}")
    text = value.strip()
    if len(text) != 2 * KEY_BYTES:
        raise EnvelopeError(f"public key: expected 64 hex characters, got {len(text)}")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise EnvelopeError("public key: not hexadecimal") from None


def _check_context(context: object) -> bytes:
    if not isinstance(context, (bytes, bytearray, memoryview)):
        raise EnvelopeError(f"context must be bytes, got {type(context).__name__}")
    return bytes(context)


def _derive_key(shared1: bytes, shared2: bytes, e_pub: bytes, s_pub: bytes, r_pub: bytes, context: bytes) -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=INFO_PREFIX + e_pub + s_pub + r_pub + context)
    return hkdf.derive(shared1 + shared2)


def seal(recipient_public: bytes, sender: StaticKeys, plaintext: bytes, context: bytes) -> bytes:
    """Encrypt ``plaintext`` to ``recipient_public`` and authenticate it as ``sender``'s, bound to
    ``context`` (see the module docstring for the construction)."""
    r_pub = parse_public_key(recipient_public)
    context = _check_context(context)
    if not isinstance(plaintext, (bytes, bytearray, memoryview)):
        raise EnvelopeError(f"plaintext must be bytes, got {type(plaintext).__name__}")
    ephemeral = X25519PrivateKey.generate()
    e_pub = _raw_public(ephemeral.public_key())
    shared1 = _dh(ephemeral, r_pub)
    shared2 = sender.dh(r_pub)
    key = _derive_key(shared1, shared2, e_pub, sender.public, r_pub, context)
    nonce = os.urandom(NONCE_BYTES)
    try:
        ciphertext = ChaCha20Poly1305(key).encrypt(nonce, bytes(plaintext), context)
    except Exception as exc:
        raise EnvelopeError(f"encryption failed: {exc}") from None
    return MAGIC + e_pub + sender.public + nonce + ciphertext


def open_sealed(recipient: StaticKeys, blob: bytes, context: bytes,
                allowed_senders: Collection[bytes] | None) -> tuple[bytes, bytes]:
    """Open a blob made by :func:`seal`: ``(sender_public, plaintext)``.

    :class:`EnvelopeError` if the blob is not bytes, too short, has the wrong magic, comes from a
    sender outside ``allowed_senders`` (when given; ``None`` accepts any sender, which proves
    nothing about who the sender is), or fails authentication (another recipient key, a
    tampered byte, another context)."""
    context = _check_context(context)
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise EnvelopeError(f"blob must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) < MIN_BLOB_BYTES:
        raise EnvelopeError(f"blob too short: {len(blob)} bytes < {MIN_BLOB_BYTES}")
    if blob[: len(MAGIC)] != MAGIC:
        raise EnvelopeError("blob has the wrong magic (not an SF1 envelope)")
    at = len(MAGIC)
    e_pub = blob[at: at + KEY_BYTES]
    at += KEY_BYTES
    s_pub = blob[at: at + KEY_BYTES]
    at += KEY_BYTES
    nonce = blob[at: at + NONCE_BYTES]
    ciphertext = blob[at + NONCE_BYTES:]
    if allowed_senders is not None:
        allowed = {parse_public_key(k) for k in allowed_senders}
        if s_pub not in allowed:
            raise EnvelopeError(f"sender {s_pub.hex()} is not an allowed sender")
    shared1 = recipient.dh(e_pub)
    shared2 = recipient.dh(s_pub)
    key = _derive_key(shared1, shared2, e_pub, s_pub, recipient.public, context)
    try:
        plaintext = ChaCha20Poly1305(key).decrypt(nonce, ciphertext, context)
    except InvalidTag:
        raise EnvelopeError(
            "authentication failed (another recipient key, a tampered blob, a forged sender or "
            "another exchange's context)"
        ) from None
    except Exception as exc:
        raise EnvelopeError(f"decryption failed: {exc}") from None
    return s_pub, plaintext
