"""The masks of SecAgg: a PRG from 32-byte seeds, and the pairwise seeds from X25519.

Bonawitz et al. (CCS 2017), Sec. 4 / Fig. 4: user u masks its input as

    y_u = x_u + PRG(b_u) + sum_{v in U2, u < v} PRG(s_{u,v}) - sum_{v in U2, u > v} PRG(s_{u,v})  (mod R)

with a self-mask seed b_u and pairwise seeds s_{u,v} = KA.agree(s_u^SK, s_v^PK) (then hashed).

:func:`mask` is the PRG: the AES-256-CTR keystream under ``seed`` (32 bytes), read as
little-endian uint64 words, each reduced to its low ``bits`` bits. The low bits of a uniform
64-bit word are uniform in [0, 2**bits), so the mask is uniform given a uniform key (AES as a
PRF). The counter block starts at zero (a fixed, all-zero nonce). That is safe here because
every seed is used for ONE mask: b_u is drawn fresh for each exchange, and s_{u,v} is derived
from per-exchange ephemeral keys and the exchange's context (:func:`pair_seed`), so no
(key, counter) pair ever encrypts two different things. (Recomputing the same mask, as the
server does when it removes it, regenerates the same stream; that is not a reuse.)

:func:`pair_seed` = HKDF-SHA256(ikm = X25519(my_sk, their_pk), salt = none, length = 32,
info = b"silofl-secagg-pair-v1" || context || min(pk_a, pk_b) || max(pk_a, pk_b)): symmetric
in the two parties, bound to the exchange (``context``) and to both public keys.
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

SEED_BYTES = 32
MIN_BITS, MAX_BITS = 1, 62
PAIR_INFO = b"silofl-secagg-pair-v1"
_ZERO_NONCE = bytes(16)


def check_bits(bits: object) -> int:
    """``bits`` as an int in [MIN_BITS, MAX_BITS]; ValueError otherwise."""
    if not isinstance(bits, int) or isinstance(bits, bool) or not MIN_BITS <= bits <= MAX_BITS:
        raise ValueError(f"bits must be an int in [{MIN_BITS}, {MAX_BITS}], got {bits!r}")
    return bits


def mask(seed: bytes, dim: int, bits: int) -> np.ndarray:
    """``dim`` uint64 values uniform in [0, 2**bits) from the AES-256-CTR keystream of ``seed``."""
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SEED_BYTES:
        raise ValueError(f"seed must be {SEED_BYTES} bytes")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
        raise ValueError(f"dim must be an int >= 0, got {dim!r}")
    bits = check_bits(bits)
    encryptor = Cipher(algorithms.AES(bytes(seed)), modes.CTR(_ZERO_NONCE)).encryptor()
    stream = encryptor.update(bytes(8 * dim)) + encryptor.finalize()
    words = np.frombuffer(stream, dtype="<u8").astype(np.uint64)
    return words & np.uint64((1 << bits) - 1)


def public_bytes(private: X25519PrivateKey) -> bytes:
    """The raw 32-byte public key of ``private``."""
    return private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def pair_seed(my: X25519PrivateKey, their_public: bytes, context: bytes) -> bytes:
    """s_{a,b}: HKDF-SHA256 of X25519(my, their_public), bound to ``context`` and both keys.

    ValueError for a malformed or small-order ``their_public`` (all-zero shared secret)."""
    if not isinstance(their_public, (bytes, bytearray)) or len(their_public) != 32:
        raise ValueError("their_public must be 32 raw bytes")
    if not isinstance(context, (bytes, bytearray)):
        raise ValueError("context must be bytes")
    try:
        shared = my.exchange(X25519PublicKey.from_public_bytes(bytes(their_public)))
    except Exception as exc:  # small-order point, malformed key
        raise ValueError(f"X25519 key agreement failed: {exc}") from None
    if shared == bytes(len(shared)):
        raise ValueError("X25519 key agreement gave the all-zero secret (small-order key)")
    mine = public_bytes(my)
    low, high = sorted((mine, bytes(their_public)))
    hkdf = HKDF(algorithm=hashes.SHA256(), length=SEED_BYTES, salt=None,
                info=PAIR_INFO + bytes(context) + low + high)
    return hkdf.derive(shared)
