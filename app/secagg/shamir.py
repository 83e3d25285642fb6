"""Shamir t-of-n secret sharing of 32-byte secrets over GF(p), p = 2**521 - 1.

Shamir (1979), "How to share a secret"; the form used by SecAgg (Bonawitz et al., CCS 2017,
Sec. 3.1: ``SS.share(s, t, U)`` / ``SS.recon``). A secret s (32 bytes, read big-endian as an
integer < 2**256 < p) is the constant term of a random polynomial of degree t - 1::

    f(z) = s + a_1 z + ... + a_{t-1} z^{t-1}  (mod p),   a_k uniform in [0, p), drawn in order k = 1..t-1

and the share of point x (a nonzero field element; SecAgg uses the node id) is f(x). Any t shares
give s back by Lagrange interpolation at 0::

    s = sum_i y_i * prod_{j != i} x_j / (x_j - x_i)   (mod p)

(computed in barycentric form with one batched modular inversion per evaluation point).

Perfect secrecy: for t - 1 shares and ANY candidate secret s' there is exactly one coefficient
vector (a_1..a_{t-1}) that gives those shares (t points fix a degree t - 1 polynomial), so with
uniform coefficients the t - 1 shares have the same distribution whatever the secret.

p = 2**521 - 1 is a Mersenne prime, far above 2**256, so every 32-byte secret is a field element
and an interpolation from an inconsistent share set lands below 2**256 only with probability
about 2**-265 (:func:`combine` reports it). A share is encoded as f(x) in exactly
:data:`SHARE_BYTES` = 66 bytes, big-endian (ceil(521 / 8) = 66).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

PRIME = 2**521 - 1
SECRET_BYTES = 32
SHARE_BYTES = 66


class ShamirError(ValueError):
    """Too few shares, a malformed share or point, or shares that do not lie on one polynomial."""


def _check_point(x: object) -> int:
    if not isinstance(x, int) or isinstance(x, bool):
        raise ShamirError(f"share point must be an int, got {type(x).__name__}")
    if not 0 < x < PRIME:
        raise ShamirError(f"share point {x} outside [1, p)")
    return x


def encode_share(y: int) -> bytes:
    """A field element as :data:`SHARE_BYTES` big-endian bytes."""
    if not 0 <= y < PRIME:
        raise ShamirError("share value outside [0, p)")
    return y.to_bytes(SHARE_BYTES, "big")


def decode_share(blob: object) -> int:
    """The field element of a share; :class:`ShamirError` unless it is 66 bytes below p."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise ShamirError(f"share must be bytes, got {type(blob).__name__}")
    blob = bytes(blob)
    if len(blob) != SHARE_BYTES:
        raise ShamirError(f"share must be {SHARE_BYTES} bytes, got {len(blob)}")
    y = int.from_bytes(blob, "big")
    if y >= PRIME:
        raise ShamirError("share value is not below p")
    return y


def _check_threshold(threshold: object) -> int:
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
        raise ShamirError(f"threshold must be an int >= 1, got {threshold!r}")
    return threshold


def split(secret: bytes, threshold: int, xs: Sequence[int],
          randbelow: Callable[[int], int]) -> dict[int, bytes]:
    """Shares {x: f(x)} of ``secret`` for the distinct nonzero points ``xs``, t = ``threshold``.

    ``randbelow(p)`` draws a_1, ..., a_{t-1} in that order (``secrets.randbelow`` in a deployment;
    a seeded function in tests). Needs len(xs) >= t."""
    if not isinstance(secret, (bytes, bytearray)) or len(secret) != SECRET_BYTES:
        raise ShamirError(f"secret must be {SECRET_BYTES} bytes")
    t = _check_threshold(threshold)
    points = [_check_point(x) for x in xs]
    if len(set(points)) != len(points):
        raise ShamirError("share points must be distinct")
    if len(points) < t:
        raise ShamirError(f"{len(points)} share points < threshold {t}")
    coefficients = [int.from_bytes(bytes(secret), "big")]
    for _ in range(t - 1):
        a = randbelow(PRIME)
        if not isinstance(a, int) or not 0 <= a < PRIME:
            raise ShamirError("randbelow(p) returned a value outside [0, p)")
        coefficients.append(a)
    shares = {}
    for x in points:
        y = 0
        for a in reversed(coefficients):  # Horner
            y = (y * x + a) % PRIME
        shares[x] = encode_share(y)
    return shares


def _batch_inverse(values: Sequence[int]) -> list[int]:
    """Inverses mod p of nonzero ``values`` with one modular inversion (Montgomery's trick)."""
    prefix, acc = [], 1
    for v in values:
        prefix.append(acc)
        acc = acc * v % PRIME
    inv = pow(acc, -1, PRIME)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = prefix[i] * inv % PRIME
        inv = inv * values[i] % PRIME
    return out


class _Interpolant:
    """The polynomial of degree < t through t points, in barycentric Lagrange form:
    f(z) = l(z) * sum_i w_i y_i / (z - x_i), l(z) = prod_i (z - x_i), w_i = 1 / prod_{j != i} (x_i - x_j)."""

    def __init__(self, points: Sequence[tuple[int, int]]) -> None:
        self.xs = [x for x, _ in points]
        dens = []
        for i, xi in enumerate(self.xs):
            d = 1
            for j, xj in enumerate(self.xs):
                if j != i:
                    d = d * (xi - xj) % PRIME
            dens.append(d)
        self.wy = [w * y % PRIME for w, (_, y) in zip(_batch_inverse(dens), points)]

    def __call__(self, z: int) -> int:
        diffs = [(z - x) % PRIME for x in self.xs]
        if 0 in diffs:
            raise ShamirError("evaluation at a base point")
        total, ell = 0, 1
        for wy, inv, d in zip(self.wy, _batch_inverse(diffs), diffs):
            total = (total + wy * inv) % PRIME
            ell = ell * d % PRIME
        return total * ell % PRIME


def combine(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """The secret from >= t shares {x: share}: Lagrange interpolation at 0.

    The t shares of smallest x define the polynomial; every further share must lie on it, else
    :class:`ShamirError` ("inconsistent"). Also raised with fewer than t shares, a malformed
    share or point, or a result that is not a 32-byte secret (>= 2**256: wrong shares)."""
    t = _check_threshold(threshold)
    if not isinstance(shares, Mapping):
        raise ShamirError(f"shares must be a mapping point -> share, got {type(shares).__name__}")
    if len(shares) < t:
        raise ShamirError(f"{len(shares)} shares < threshold {t}")
    points = sorted((_check_point(x), decode_share(y)) for x, y in shares.items())
    f = _Interpolant(points[:t])
    for x, y in points[t:]:
        if f(x) != y:
            raise ShamirError("inconsistent shares: they do not lie on one polynomial of degree t - 1")
    secret = f(0)
    if secret >= 2 ** (8 * SECRET_BYTES):
        raise ShamirError("reconstructed value is not a 32-byte secret (wrong or inconsistent shares)")
    return secret.to_bytes(SECRET_BYTES, "big")
