"""SecAgg / SecAgg+ secure aggregation: typed messages and the silo's and server's state machines.

Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning" (CCS 2017,
Fig. 4, rounds AdvertiseKeys, ShareKeys, MaskedInputCollection, Unmasking) on the sparse graph of
Bell et al., "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead" (CCS 2020,
SecAgg+): every silo shares its secrets with, and masks against, only its neighbours in a
k-regular graph (:mod:`app.secagg.graph`; the complete graph is classic SecAgg).

One exchange, with context C (run, round, exchange; built by the caller and bound into every
seal, seed and commitment)::

    silo i                                         server
    advertise(): fresh X25519 (s_sk_i, s_pk_i),    adverts(): U1 = well-formed adverts (>= t)
      self-mask seed b_i; Advert(i, s_pk_i,        roster_for(i): i's neighbours' adverts
      H(C, i, b_i))
    share(roster, peers_static, claim): Shamir    route(): sender -> receiver blobs along graph
      t-of-|roster| shares of b_i and s_sk_i,       edges; U2 = senders with a blob for every
      sealed to each neighbour's static key         neighbour
    masked(received, x): open + verify each       collect(y, views): U3 = U2 members with a
      payload; U2_i = verified neighbours;          well-formed y (others are dropped)
      y_i = x_i + PRG(b_i) + sum_{j>i} PRG(s_ij)
                         - sum_{j<i} PRG(s_ij)
    unmask(S, D): shares of b_j (j in S) and of   unmask_requests(): per silo (S, D) restricted
      s_sk_j (j in D), each node one kind only      to its view; finish(): Shamir-recover
                                                    b_j, s_sk_j, remove masks, sum mod 2**bits

Where this deviates from the papers, and why:

* The channel between two silos is :mod:`app.privacy.envelope` (sealed to the receiver's static
  X25519 key, authenticated by the sender's static key) instead of a per-exchange encryption key
  c_pk plus signatures: the static keys are known out of band, so a server that substitutes a
  silo's s_pk in a roster is caught when the sender's authenticated payload carries the real
  s_pk (the receiver then drops that sender).
* The self-mask seed b_i is drawn at :meth:`SecAggSilo.advertise` and its commitment
  H(C, i, b_i) (SHA-256, domain-separated) is published in the Advert. The server checks every
  reconstructed b_j against it (and every reconstructed s_sk_j against the advertised s_pk_j), so
  a wrong share is found and another threshold subset tried (:meth:`SecAggServer.finish`). b_i is
  256 uniform bits, so the hash reveals nothing usable about it.
* A silo reports the set of neighbours it verified (``silo.u2``) with its masked vector; the
  server (:meth:`SecAggServer.collect`) drops silos until the views are symmetric, so one bad
  blob (forged, replayed, substituted key) costs one silo and never corrupts the sum.
* There is no ConsistencyCheck round (Bonawitz's round 3 with signatures on U3).

Threat model and limits. Honest silos are protected against the server together with fewer than
t colluding silos when the server follows the protocol (semi-honest server): any t - 1 shares of
b_i or s_sk_i are independent of them (:mod:`app.secagg.shamir`), and y_i is uniform to the
coalition unless it learns b_i and all pairwise seeds of i with honest peers. Against an active
server a silo enforces what it can see: it answers one unmask request only (a repeat with the same
lists gets the same reply), never both kinds of share of one node, and only if at least t
survivors are named; and it refuses a roster whose size is >= 2t (see :func:`default_threshold`).
Without a consistency round an active server may tell different silos different survivor
lists. To unmask an honest v (complete graph, n_C colluding silos that hand over all their
shares) it needs, for each of the n - 1 - n_C honest peers h, t - n_C honest holders that name
h dropped, while each of the n - n_C honest silos names at least t survivors, hence at most
n - t dropped nodes. So it needs (n - 1 - n_C)(t - n_C) <= (n - n_C)(n - t): impossible with
n_C = 0 and t = n // 2 + 1, possible with n_C = t - 1 (as in Bonawitz et al., who need
t > (n + n_C) / 2 even with their consistency round). tests/test_secagg_protocol.py checks
every accepted request combination for n = 4, t = 3 with 0, 1 and 2 colluders.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from app.privacy.envelope import MIN_BLOB_BYTES, StaticKeys, open_sealed, seal
from app.secagg import graph as graph_mod
from app.secagg.prg import check_bits, mask, pair_seed, public_bytes
from app.secagg.shamir import SHARE_BYTES, ShamirError, combine, decode_share, split

MAX_NODE = 2**64 - 1
KEY_BYTES = 32
COMMIT_BYTES = 32
MAX_CLAIM_BYTES = 4096
MAX_ENTRIES = 1 << 16
#: Threshold subsets tried per secret when all shares together are inconsistent.
MAX_RECOVERY_TRIES = 2000
COMMIT_DOMAIN = b"silofl-secagg-b-v1"
STATE_VERSION = 1


class SecAggError(ValueError):
    """A malformed message or argument, or a request the silo refuses (the reason names only
    public facts: list sizes, node ids, the protocol step)."""


class SecAggAborted(SecAggError):
    """The server cannot finish the exchange (too few silos, shares or replies)."""


def default_threshold(n: int) -> int:
    """t = n // 2 + 1 for n share holders (a node's closed neighbourhood: degree + 1, or all n
    silos in the complete graph).

    Why: a silo reveals, per node, either its share of b (node survived) or of s_sk (node
    dropped), never both. To unmask one silo the server needs t holders to reveal b and t
    holders to reveal s_sk of the same node, i.e. two disjoint sets of t holders; with 2t > n
    there are no two such sets. It is also the largest t that still tolerates the most dropouts
    under that constraint (n - t = ceil(n / 2) - 1)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SecAggError(f"n must be an int >= 1, got {n!r}")
    return n // 2 + 1


def b_commitment(context: bytes, node: int, b: bytes) -> bytes:
    """SHA-256(COMMIT_DOMAIN || len(C) (8 bytes) || C || node (8 bytes) || b)."""
    return hashlib.sha256(COMMIT_DOMAIN + len(context).to_bytes(8, "big") + bytes(context)
                          + node.to_bytes(8, "big") + bytes(b)).digest()


def _node(value: object, what: str = "node") -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise SecAggError(f"{what} must be an int, got {type(value).__name__}")
    value = int(value)
    if not 1 <= value <= MAX_NODE:
        raise SecAggError(f"{what} {value} outside [1, 2**64)")
    return value


def _fixed(value: object, size: int, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)) or len(value) != size:
        raise SecAggError(f"{what} must be {size} bytes")
    return bytes(value)


def _share(value: object, what: str) -> bytes:
    try:
        decode_share(value)
    except ShamirError as exc:
        raise SecAggError(f"{what}: {exc}") from None
    return bytes(value)  # type: ignore[arg-type]


def _context(value: object) -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        raise SecAggError(f"context must be bytes, got {type(value).__name__}")
    return bytes(value)


def _positive(value: object, what: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise SecAggError(f"{what} must be an int >= {low}, got {value!r}")
    return value


class _Reader:
    """Strict reader of an encoded message: every read is bounds-checked."""

    def __init__(self, blob: object, magic: bytes, what: str) -> None:
        if not isinstance(blob, (bytes, bytearray, memoryview)):
            raise SecAggError(f"{what} must be bytes, got {type(blob).__name__}")
        self.blob, self.at, self.what = bytes(blob), 0, what
        if self.take(len(magic)) != magic:
            raise SecAggError(f"{what}: wrong magic")

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.blob):
            raise SecAggError(f"{self.what}: truncated")
        out = self.blob[self.at: self.at + n]
        self.at += n
        return out

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def end(self) -> None:
        if self.at != len(self.blob):
            raise SecAggError(f"{self.what}: {len(self.blob) - self.at} trailing bytes")


@dataclass(frozen=True)
class Advert:
    """Round 0 (AdvertiseKeys): the silo's fresh mask public key and its commitment to b."""

    node: int
    s_pk: bytes
    b_commit: bytes

    MAGIC: ClassVar[bytes] = b"SAA1"
    SIZE: ClassVar[int] = 4 + 8 + KEY_BYTES + COMMIT_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "node", _node(self.node))
        object.__setattr__(self, "s_pk", _fixed(self.s_pk, KEY_BYTES, "s_pk"))
        object.__setattr__(self, "b_commit", _fixed(self.b_commit, COMMIT_BYTES, "b_commit"))

    def encode(self) -> bytes:
        return self.MAGIC + self.node.to_bytes(8, "big") + self.s_pk + self.b_commit

    @classmethod
    def decode(cls, blob: bytes) -> Advert:
        r = _Reader(blob, cls.MAGIC, "advert")
        node, s_pk, commit = r.uint(8), r.take(KEY_BYTES), r.take(COMMIT_BYTES)
        r.end()
        return cls(node, s_pk, commit)


@dataclass(frozen=True)
class SharePayload:
    """Round 1 (ShareKeys), sealed from ``sender`` to ``receiver``: the sender's s_pk, the
    receiver's shares of the sender's b and s_sk, and the sender's opaque noise claim."""

    sender: int
    receiver: int
    s_pk: bytes
    b_share: bytes
    ssk_share: bytes
    noise_claim: bytes

    MAGIC: ClassVar[bytes] = b"SAS1"
    FIXED: ClassVar[int] = 4 + 8 + 8 + KEY_BYTES + 2 * SHARE_BYTES + 4

    def __post_init__(self) -> None:
        object.__setattr__(self, "sender", _node(self.sender, "sender"))
        object.__setattr__(self, "receiver", _node(self.receiver, "receiver"))
        object.__setattr__(self, "s_pk", _fixed(self.s_pk, KEY_BYTES, "s_pk"))
        object.__setattr__(self, "b_share", _share(self.b_share, "b_share"))
        object.__setattr__(self, "ssk_share", _share(self.ssk_share, "ssk_share"))
        claim = self.noise_claim
        if not isinstance(claim, (bytes, bytearray)) or len(claim) > MAX_CLAIM_BYTES:
            raise SecAggError(f"noise_claim must be bytes of at most {MAX_CLAIM_BYTES}")
        object.__setattr__(self, "noise_claim", bytes(claim))

    def encode(self) -> bytes:
        return (self.MAGIC + self.sender.to_bytes(8, "big") + self.receiver.to_bytes(8, "big")
                + self.s_pk + self.b_share + self.ssk_share
                + len(self.noise_claim).to_bytes(4, "big") + self.noise_claim)

    @classmethod
    def decode(cls, blob: bytes) -> SharePayload:
        r = _Reader(blob, cls.MAGIC, "share payload")
        sender, receiver = r.uint(8), r.uint(8)
        s_pk, b_share, ssk_share = r.take(KEY_BYTES), r.take(SHARE_BYTES), r.take(SHARE_BYTES)
        n = r.uint(4)
        if n > MAX_CLAIM_BYTES:
            raise SecAggError(f"share payload: noise claim of {n} bytes > {MAX_CLAIM_BYTES}")
        claim = r.take(n)
        r.end()
        return cls(sender, receiver, s_pk, b_share, ssk_share, claim)


def _share_map(value: object, what: str) -> Mapping[int, bytes]:
    if not isinstance(value, Mapping):
        raise SecAggError(f"{what} must be a mapping node -> share")
    if len(value) > MAX_ENTRIES:
        raise SecAggError(f"{what}: more than {MAX_ENTRIES} entries")
    return MappingProxyType({_node(k, f"{what} owner"): _share(v, what) for k, v in sorted(value.items())})


@dataclass(frozen=True)
class UnmaskReply:
    """Round 4 (Unmasking): the responder's shares of b_j (survivors) and of s_sk_j (dropped)."""

    node: int
    b_shares: Mapping[int, bytes]
    ssk_shares: Mapping[int, bytes]

    MAGIC: ClassVar[bytes] = b"SAU1"

    def __post_init__(self) -> None:
        object.__setattr__(self, "node", _node(self.node))
        object.__setattr__(self, "b_shares", _share_map(self.b_shares, "b_shares"))
        object.__setattr__(self, "ssk_shares", _share_map(self.ssk_shares, "ssk_shares"))
        if set(self.b_shares) & set(self.ssk_shares):
            raise SecAggError("unmask reply has both kinds of share for one node")

    def encode(self) -> bytes:
        out = [self.MAGIC, self.node.to_bytes(8, "big"),
               len(self.b_shares).to_bytes(4, "big"), len(self.ssk_shares).to_bytes(4, "big")]
        for shares in (self.b_shares, self.ssk_shares):
            for owner, share in shares.items():
                out += [owner.to_bytes(8, "big"), share]
        return b"".join(out)

    @classmethod
    def decode(cls, blob: bytes) -> UnmaskReply:
        r = _Reader(blob, cls.MAGIC, "unmask reply")
        node, nb, ns = r.uint(8), r.uint(4), r.uint(4)
        if nb > MAX_ENTRIES or ns > MAX_ENTRIES:
            raise SecAggError("unmask reply: too many entries")
        maps: list[dict[int, bytes]] = [{}, {}]
        for kind, count in enumerate((nb, ns)):
            for _ in range(count):
                owner, share = r.uint(8), r.take(SHARE_BYTES)
                if owner in maps[kind]:
                    raise SecAggError("unmask reply: an owner twice")
                maps[kind][owner] = share
        r.end()
        return cls(node, maps[0], maps[1])


def _check_vector(x: object, dim: int, bits: int) -> np.ndarray:
    """A copy of ``x`` if it is a uint64 vector of length ``dim`` in [0, 2**bits); else SecAggError."""
    if not isinstance(x, np.ndarray):
        raise SecAggError(f"vector must be a numpy array, got {type(x).__name__}")
    if x.dtype != np.uint64:
        raise SecAggError(f"vector must have dtype uint64, got {x.dtype}")
    if x.shape != (dim,):
        raise SecAggError(f"vector must have shape ({dim},), got {x.shape}")
    if dim and int(x.max()) >> bits:
        raise SecAggError(f"vector has values outside [0, 2**{bits})")
    return np.array(x, dtype=np.uint64, copy=True)


def _id_set(values: object, what: str) -> frozenset[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Collection):
        raise SecAggError(f"{what} must be a collection of node ids")
    if len(values) > MAX_ENTRIES:
        raise SecAggError(f"{what}: more than {MAX_ENTRIES} nodes")
    return frozenset(_node(v, what) for v in values)


def _exchange_terms(context: object, threshold: object, bits: object, dim: object) -> tuple[bytes, int, int, int]:
    """(context, t, bits, dim) of an exchange, checked as both sides need them (SecAggError)."""
    checked_context, t = _context(context), _positive(threshold, "threshold", 2)
    try:
        checked_bits = check_bits(bits)
    except ValueError as exc:
        raise SecAggError(str(exc)) from None
    return checked_context, t, checked_bits, _positive(dim, "dim")


def _draw_bytes(randbelow: Callable[[int], int]) -> bytes:
    value = randbelow(2 ** (8 * KEY_BYTES))
    if not isinstance(value, int) or not 0 <= value < 2 ** (8 * KEY_BYTES):
        raise SecAggError("randbelow(2**256) returned a value out of range")
    return value.to_bytes(KEY_BYTES, "big")


_PROBE = X25519PrivateKey.from_private_bytes(hashlib.sha256(b"silofl-secagg-probe").digest())


def _usable_key(s_pk: bytes) -> bool:
    """False for an X25519 public key that gives the all-zero secret (small order)."""
    try:
        pair_seed(_PROBE, s_pk, b"")
    except ValueError:
        return False
    return True


_PHASES = ("new", "advertised", "shared", "masked", "unmasked")


class SecAggSilo:
    """The silo's side of one exchange (Bonawitz et al. Fig. 4, the user's rounds).

    ``randbelow`` is the silo's randomness (``secrets.randbelow`` in a deployment; a seeded
    function only in tests): it draws s_sk, b and the Shamir coefficients.

    :meth:`state_dict` holds the exchange's PRIVATE values (the ephemeral mask key s_sk and the
    self-mask seed b until :meth:`masked` erases them; the shares of the neighbours' secrets
    after it): persist it only on the silo's own disk with owner-only permissions. Persist it
    after :meth:`unmask` and before sending the reply, so that a restart cannot answer twice."""

    def __init__(self, me: int, keys: StaticKeys, context: bytes, threshold: int, bits: int,
                 dim: int, randbelow: Callable[[int], int]) -> None:
        self.me = _node(me, "me")
        if not isinstance(keys, StaticKeys):
            raise SecAggError("keys must be StaticKeys")
        self.keys = keys
        self.context, self.threshold, self.bits, self.dim = _exchange_terms(context, threshold, bits, dim)
        if not callable(randbelow):
            raise SecAggError("randbelow must be callable")
        self._randbelow = randbelow
        self._phase = "new"
        self._s_sk: bytes | None = None
        self._b: bytes | None = None
        self._advert: Advert | None = None
        self._roster: dict[int, Advert] = {}
        self._peers_static: dict[int, bytes] = {}
        self._share_digest: bytes | None = None
        self._share_out: dict[int, bytes] = {}
        self._own_shares: tuple[bytes, bytes] | None = None
        self._held: dict[int, tuple[bytes, bytes]] = {}
        self.claims: dict[int, bytes] = {}
        self.u2: frozenset[int] = frozenset()
        self.rejected: dict[int, str] = {}
        self._answered: tuple[frozenset[int], frozenset[int]] | None = None
        self._reply: UnmaskReply | None = None
        #: (the payloads' digest, what opening them gave): verify() then masked() open them once
        self._opened: tuple[tuple, tuple] | None = None

    @property
    def phase(self) -> str:
        return self._phase

    # -- round 0 -----------------------------------------------------------------------------
    def advertise(self) -> Advert:
        """Draw s_sk (X25519) and b, and publish (me, s_pk, H(C, me, b)). A repeat returns the
        same advert (no new secret is drawn)."""
        if self._advert is not None:
            return self._advert
        self._s_sk = _draw_bytes(self._randbelow)
        self._b = _draw_bytes(self._randbelow)
        s_pk = public_bytes(X25519PrivateKey.from_private_bytes(self._s_sk))
        self._advert = Advert(self.me, s_pk, b_commitment(self.context, self.me, self._b))
        self._phase = "advertised"
        return self._advert

    # -- round 1 -----------------------------------------------------------------------------
    def _share_inputs_digest(self, roster: Mapping[int, Advert], peers: Mapping[int, bytes],
                             claim: bytes) -> bytes:
        h = hashlib.sha256(b"share-inputs")
        for node in sorted(roster):
            h.update(node.to_bytes(8, "big") + roster[node].encode() + peers[node])
        h.update(len(claim).to_bytes(4, "big") + claim)
        return h.digest()

    def share(self, roster: Mapping[int, Advert], peers_static: Mapping[int, bytes],
              noise_claim: bytes) -> dict[int, bytes]:
        """Shamir-share b and s_sk among ``roster`` (my neighbours and me; t = threshold) and seal
        each neighbour's pair of shares to its static key: {neighbour: blob}.

        Refused (SecAggError) if the roster lacks me or carries another advert for me, has fewer
        than t or at least 2t nodes, names other nodes than ``peers_static``, pins another static
        key for me, or repeats an s_pk; or on a second call with other arguments (a repeat with
        the same ones returns the same blobs)."""
        if self._phase == "new":
            raise SecAggError("share() before advertise()")
        if not isinstance(roster, Mapping) or not isinstance(peers_static, Mapping):
            raise SecAggError("roster and peers_static must be mappings node -> value")
        adverts: dict[int, Advert] = {}
        for node, advert in roster.items():
            node = _node(node, "roster node")
            if not isinstance(advert, Advert) or advert.node != node:
                raise SecAggError(f"roster entry {node} is not an Advert for node {node}")
            adverts[node] = advert
        peers = {_node(k, "peer"): _fixed(v, KEY_BYTES, f"static key of {k}")
                 for k, v in peers_static.items()}
        if not isinstance(noise_claim, (bytes, bytearray)) or len(noise_claim) > MAX_CLAIM_BYTES:
            raise SecAggError(f"noise_claim must be bytes of at most {MAX_CLAIM_BYTES}")
        claim = bytes(noise_claim)
        if self.me not in adverts:
            raise SecAggError(f"roster lacks me ({self.me})")
        if adverts[self.me] != self._advert:
            raise SecAggError("roster carries another advert for me")
        if set(adverts) != set(peers):
            raise SecAggError("roster nodes differ from the nodes with a static key")
        if peers[self.me] != self.keys.public:
            raise SecAggError("peers_static pins another static key for me")
        if len(adverts) < self.threshold:
            raise SecAggError(f"roster of {len(adverts)} nodes < threshold {self.threshold}")
        if len(adverts) >= 2 * self.threshold:
            raise SecAggError(f"roster of {len(adverts)} nodes >= 2 * threshold {self.threshold}: "
                              "two disjoint threshold sets could reveal both secrets of a node")
        if len({a.s_pk for a in adverts.values()}) != len(adverts):
            raise SecAggError("roster repeats an s_pk")
        digest = self._share_inputs_digest(adverts, peers, claim)
        if self._share_digest is not None:
            if digest != self._share_digest:
                raise SecAggError("share() already ran with other arguments")
            return dict(self._share_out)
        assert self._s_sk is not None and self._b is not None and self._advert is not None
        xs = sorted(adverts)
        try:
            b_shares = split(self._b, self.threshold, xs, self._randbelow)
            ssk_shares = split(self._s_sk, self.threshold, xs, self._randbelow)
        except ShamirError as exc:
            raise SecAggError(f"sharing failed: {exc}") from None
        out = {}
        for j in xs:
            if j == self.me:
                continue
            payload = SharePayload(self.me, j, self._advert.s_pk, b_shares[j], ssk_shares[j], claim)
            out[j] = seal(peers[j], self.keys, payload.encode(), self.context)
        self._roster, self._peers_static = adverts, peers
        self._own_shares = (b_shares[self.me], ssk_shares[self.me])
        self._share_digest, self._share_out = digest, out
        self._phase = "shared"
        return dict(out)

    # -- round 2 -----------------------------------------------------------------------------
    def _verify(self, j: int, blob: object, sk: X25519PrivateKey) -> tuple[SharePayload, bytes]:
        if not isinstance(blob, (bytes, bytearray)):
            raise SecAggError(f"blob is {type(blob).__name__}, not bytes")
        _, plaintext = open_sealed(self.keys, bytes(blob), self.context,
                                   allowed_senders=[self._peers_static[j]])
        payload = SharePayload.decode(plaintext)
        if payload.sender != j or payload.receiver != self.me:
            raise SecAggError("payload names another sender or receiver")
        if payload.s_pk != self._roster[j].s_pk:
            raise SecAggError("payload's s_pk differs from the roster's advert (substituted key)")
        return payload, pair_seed(sk, payload.s_pk, self.context)

    def _open_all(self, received: Mapping[int, bytes]) -> tuple[dict[int, tuple[bytes, bytes]], dict[int, bytes],
                                                                dict[int, bytes], dict[int, str]]:
        """(held shares, claims, pair seeds, rejected) of the neighbours' sealed payloads (kept for
        the same payloads: :meth:`verify` then :meth:`masked` open them once)."""
        assert self._s_sk is not None and self._own_shares is not None
        key = tuple(sorted((int(j), hashlib.sha256(bytes(b)).digest() if isinstance(b, (bytes, bytearray)) else b"?")
                           for j, b in received.items()))
        cached = self._opened
        if cached is not None and cached[0] == key:
            held, claims, seeds, rejected = cached[1]
            return dict(held), dict(claims), dict(seeds), dict(rejected)
        result = self._open_uncached(received)
        self._opened = (key, result)
        held, claims, seeds, rejected = result
        return dict(held), dict(claims), dict(seeds), dict(rejected)

    def _open_uncached(self, received: Mapping[int, bytes]) -> tuple[dict[int, tuple[bytes, bytes]], dict[int, bytes],
                                                                     dict[int, bytes], dict[int, str]]:
        assert self._s_sk is not None and self._own_shares is not None
        sk = X25519PrivateKey.from_private_bytes(self._s_sk)
        held = {self.me: self._own_shares}
        claims, seeds, rejected = {}, {}, {}
        for j in sorted(self._roster):
            if j == self.me:
                continue
            if j not in received:
                rejected[j] = "no blob"
                continue
            try:
                payload, seeds[j] = self._verify(j, received[j], sk)
            except (ValueError, TypeError) as exc:  # EnvelopeError, SecAggError, ShamirError
                rejected[j] = str(exc)
                continue
            held[j] = (payload.b_share, payload.ssk_share)
            claims[j] = payload.noise_claim
        return held, claims, seeds, rejected

    def verify(self, received: Mapping[int, bytes]) -> dict[int, bytes]:
        """The noise claims of the neighbours whose payloads in ``received`` verify, without
        changing any state (what :meth:`masked` will count, so the caller can check them before it
        records its release). Refused as :meth:`masked` is, but for the vector."""
        if self._phase != "shared":
            raise SecAggError("verify() outside the masked-input round")
        if not isinstance(received, Mapping):
            raise SecAggError("received must be a mapping sender -> blob")
        _, claims, seeds, _ = self._open_all(received)
        if len(seeds) + 1 < self.threshold:
            raise SecAggError(f"only {len(seeds)} verified neighbours + me < threshold {self.threshold}")
        return claims

    def masked(self, received: Mapping[int, bytes], x: np.ndarray) -> np.ndarray:
        """Verify the neighbours' sealed shares and return the masked input

            y = x + PRG(b) + sum_{j in U2, j > me} PRG(s_{me,j}) - sum_{j in U2, j < me} PRG(s_{me,j})

        mod 2**bits (uint64). A neighbour whose blob is missing, malformed, unauthentic, from
        another exchange, or whose s_pk differs from the roster is left out of U2 (reason in
        ``rejected``). Refused if x is not a uint64 vector of length dim in [0, 2**bits), if
        |U2| + 1 < t, or on a second call."""
        if self._phase in ("new", "advertised"):
            raise SecAggError("masked() before share()")
        if self._phase != "shared":
            raise SecAggError("masked() already ran in this exchange")
        x = _check_vector(x, self.dim, self.bits)
        if not isinstance(received, Mapping):
            raise SecAggError("received must be a mapping sender -> blob")
        assert self._s_sk is not None and self._b is not None and self._own_shares is not None
        held, claims, seeds, rejected = self._open_all(received)
        u2 = frozenset(seeds)
        if len(u2) + 1 < self.threshold:
            raise SecAggError(f"only {len(u2)} verified neighbours + me < threshold {self.threshold}")
        modmask = np.uint64((1 << self.bits) - 1)
        y = x + mask(self._b, self.dim, self.bits)
        for j in sorted(u2):
            m = mask(seeds[j], self.dim, self.bits)
            y = y + m if j > self.me else y - m
        y &= modmask
        self._held, self.claims, self.u2, self.rejected = held, claims, u2, rejected
        self._s_sk = self._b = None  # no longer needed: only the held shares are
        self._opened = None  # nor the pair seeds the payloads were opened with
        self._phase = "masked"
        return y

    # -- round 4 -----------------------------------------------------------------------------
    def unmask(self, survivors: Collection[int], dropped: Collection[int]) -> UnmaskReply:
        """Shares of b_j for j in ``survivors`` and of s_sk_j for j in ``dropped`` (those held).

        Refused if the lists overlap, omit me from the survivors, name fewer than t survivors or
        a node outside my verified neighbours (me only as a survivor), or differ from the lists
        already answered (the same lists get the same reply)."""
        if self._phase not in ("masked", "unmasked"):
            raise SecAggError("unmask() before masked()")
        s = _id_set(survivors, "survivors")
        d = _id_set(dropped, "dropped")
        if self._answered is not None:
            if (s, d) == self._answered:
                assert self._reply is not None
                return self._reply
            raise SecAggError("unmask already answered for other lists")
        if s & d:
            raise SecAggError(f"nodes {sorted(s & d)} named both survived and dropped")
        if self.me not in s:
            raise SecAggError("I am not named among the survivors")
        if len(s) < self.threshold:
            raise SecAggError(f"{len(s)} survivors < threshold {self.threshold}")
        unknown = (s - self.u2 - {self.me}) | (d - self.u2)
        if unknown:
            raise SecAggError(f"nodes {sorted(unknown)} are not among my verified neighbours")
        reply = UnmaskReply(self.me,
                            {j: self._held[j][0] for j in s if j in self._held},
                            {j: self._held[j][1] for j in d if j in self._held})
        self._answered, self._reply = (s, d), reply
        self._phase = "unmasked"
        return reply

    # -- persistence ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the exchange's state (bytes as hex). Holds private keys and shares."""
        hx = (lambda b: None if b is None else b.hex())
        return {
            "version": STATE_VERSION,
            "me": self.me,
            "static_public": self.keys.public.hex(),
            "context": self.context.hex(),
            "threshold": self.threshold,
            "bits": self.bits,
            "dim": self.dim,
            "phase": self._phase,
            "s_sk": hx(self._s_sk),
            "b": hx(self._b),
            "advert": hx(self._advert.encode() if self._advert else None),
            "roster": {str(k): v.encode().hex() for k, v in sorted(self._roster.items())},
            "peers_static": {str(k): v.hex() for k, v in sorted(self._peers_static.items())},
            "share_digest": hx(self._share_digest),
            "share_out": {str(k): v.hex() for k, v in sorted(self._share_out.items())},
            "own_shares": [s.hex() for s in self._own_shares] if self._own_shares else None,
            "held": {str(k): [v[0].hex(), v[1].hex()] for k, v in sorted(self._held.items())},
            "claims": {str(k): v.hex() for k, v in sorted(self.claims.items())},
            "u2": sorted(self.u2),
            "rejected": {str(k): v for k, v in sorted(self.rejected.items())},
            "answered": [sorted(self._answered[0]), sorted(self._answered[1])] if self._answered else None,
            "reply": hx(self._reply.encode() if self._reply else None),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], keys: StaticKeys,
                   randbelow: Callable[[int], int]) -> SecAggSilo:
        """The silo back from :meth:`state_dict` (SecAggError on a malformed or foreign state)."""
        try:
            return cls._from_state(state, keys, randbelow)
        except SecAggError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SecAggError(f"malformed secagg state: {type(exc).__name__}: {exc}") from None

    @classmethod
    def _from_state(cls, state: Mapping[str, Any], keys: StaticKeys,
                    randbelow: Callable[[int], int]) -> SecAggSilo:
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise SecAggError("secagg state: unknown version")
        silo = cls(state["me"], keys, bytes.fromhex(state["context"]), state["threshold"],
                   state["bits"], state["dim"], randbelow)
        if bytes.fromhex(state["static_public"]) != keys.public:
            raise SecAggError("secagg state belongs to another static key")
        phase = state["phase"]
        if phase not in _PHASES:
            raise SecAggError(f"secagg state: unknown phase {phase!r}")
        unhex = (lambda v: None if v is None else bytes.fromhex(v))
        silo._phase = phase
        silo._s_sk = unhex(state["s_sk"])
        silo._b = unhex(state["b"])
        silo._advert = Advert.decode(unhex(state["advert"])) if state["advert"] else None
        silo._roster = {_node(int(k)): Advert.decode(bytes.fromhex(v)) for k, v in state["roster"].items()}
        silo._peers_static = {_node(int(k)): _fixed(bytes.fromhex(v), KEY_BYTES, "static key")
                              for k, v in state["peers_static"].items()}
        silo._share_digest = unhex(state["share_digest"])
        silo._share_out = {_node(int(k)): bytes.fromhex(v) for k, v in state["share_out"].items()}
        own = state["own_shares"]
        silo._own_shares = (_share(bytes.fromhex(own[0]), "own b share"),
                            _share(bytes.fromhex(own[1]), "own s_sk share")) if own else None
        silo._held = {_node(int(k)): (_share(bytes.fromhex(v[0]), "held share"),
                                      _share(bytes.fromhex(v[1]), "held share"))
                      for k, v in state["held"].items()}
        silo.claims = {_node(int(k)): bytes.fromhex(v) for k, v in state["claims"].items()}
        silo.u2 = frozenset(_node(v) for v in state["u2"])
        silo.rejected = {_node(int(k)): str(v) for k, v in state["rejected"].items()}
        answered = state["answered"]
        silo._answered = (frozenset(_node(v) for v in answered[0]),
                          frozenset(_node(v) for v in answered[1])) if answered else None
        silo._reply = UnmaskReply.decode(unhex(state["reply"])) if state["reply"] else None
        needs = {"advertised": ("_s_sk", "_b", "_advert"),
                 "shared": ("_s_sk", "_b", "_advert", "_own_shares", "_share_digest"),
                 "unmasked": ("_answered", "_reply")}
        for attr in needs.get(phase, ()):
            if getattr(silo, attr) is None:
                raise SecAggError(f"secagg state: phase {phase} without {attr.strip('_')}")
        if silo._s_sk is not None and silo._advert is not None:
            if public_bytes(X25519PrivateKey.from_private_bytes(silo._s_sk)) != silo._advert.s_pk:
                raise SecAggError("secagg state: s_sk does not match the advert")
        return silo


class SecAggServer:
    """The server's side of one exchange (Bonawitz et al. Fig. 4, the server's rounds; Bell et
    al.'s graph with ``degree`` k, None = complete graph, from the public ``graph_seed``).

    Sets after each step: ``u1`` (adverts), ``u2`` (shares routed), ``u3`` (masked inputs kept),
    ``dropped`` = U2 \\ U3. Every reply is validated; a malformed one drops its sender."""

    def __init__(self, context: bytes, threshold: int, bits: int, dim: int, degree: int | None,
                 graph_seed: bytes) -> None:
        self.context, self.threshold, self.bits, self.dim = _exchange_terms(context, threshold, bits, dim)
        self.degree = None if degree is None else _positive(degree, "degree")
        if not isinstance(graph_seed, (bytes, bytearray)):
            raise SecAggError("graph_seed must be bytes")
        self.graph_seed = bytes(graph_seed)
        self.roster: dict[int, Advert] = {}
        self.graph: dict[int, frozenset[int]] = {}
        self.u1: frozenset[int] = frozenset()
        self.u2: frozenset[int] = frozenset()
        self.u3: frozenset[int] = frozenset()
        self.dropped: frozenset[int] = frozenset()
        self.views: dict[int, frozenset[int]] = {}
        self._y: dict[int, np.ndarray] = {}
        self._phase = "new"

    def _expect(self, *phases: str) -> None:
        if self._phase not in phases:
            raise SecAggError(f"server step out of order (at {self._phase})")

    def adverts(self, replies: Mapping[int, Advert | bytes]) -> dict[int, Advert]:
        """U1: the well-formed adverts (Advert or its encoding, for the node it answers for,
        s_pk not of small order and not repeated). SecAggAborted if fewer than t, or if a node's closed neighbourhood
        has fewer than t or at least 2t nodes."""
        self._expect("new")
        accepted: dict[int, Advert] = {}
        for node, reply in replies.items():
            try:
                node = _node(node)
                advert = Advert.decode(reply) if isinstance(reply, (bytes, bytearray)) else reply
            except SecAggError:
                continue
            if isinstance(advert, Advert) and advert.node == node and _usable_key(advert.s_pk):
                accepted[node] = advert
        counts: dict[bytes, int] = {}
        for a in accepted.values():
            counts[a.s_pk] = counts.get(a.s_pk, 0) + 1
        accepted = {k: a for k, a in accepted.items() if counts[a.s_pk] == 1}
        if len(accepted) < self.threshold:
            raise SecAggAborted(f"{len(accepted)} adverts < threshold {self.threshold}")
        nodes = sorted(accepted)
        degree = len(nodes) - 1 if self.degree is None else self.degree
        self.graph = graph_mod.neighbours(nodes, degree, self.graph_seed)
        sizes = {len(nb) + 1 for nb in self.graph.values()}
        if min(sizes) < self.threshold or max(sizes) >= 2 * self.threshold:
            raise SecAggAborted(f"neighbourhoods of {sorted(sizes)} nodes do not fit threshold "
                                f"{self.threshold} (need t <= size < 2t)")
        self.roster, self.u1 = accepted, frozenset(accepted)
        self._phase = "advertised"
        return dict(accepted)

    def neighbours_of(self, node: int) -> frozenset[int]:
        """The graph neighbours of ``node`` in U1 (not itself)."""
        return self.graph[node]

    def roster_for(self, node: int) -> dict[int, Advert]:
        """What to send silo ``node`` for share(): the adverts of its neighbours and its own."""
        self._expect("advertised", "routed", "collected", "finished")
        return {j: self.roster[j] for j in sorted(self.graph[node] | {node})}

    def route(self, shares: Mapping[int, Mapping[int, bytes]]) -> dict[int, dict[int, bytes]]:
        """sender -> (receiver -> blob) into receiver -> (sender -> blob), along graph edges only.

        U2 = senders in U1 with a plausible blob (bytes of an envelope's size) for every one of
        their neighbours; only U2's blobs are delivered, and only to U2 members."""
        self._expect("advertised")
        max_blob = MIN_BLOB_BYTES + SharePayload.FIXED + MAX_CLAIM_BYTES
        u2 = set()
        for sender, blobs in shares.items():
            if sender not in self.u1 or not isinstance(blobs, Mapping):
                continue
            if all(isinstance(blobs.get(r), (bytes, bytearray))
                   and MIN_BLOB_BYTES <= len(blobs[r]) <= max_blob for r in self.graph[sender]):
                u2.add(sender)
        if len(u2) < self.threshold:
            raise SecAggAborted(f"{len(u2)} silos shared < threshold {self.threshold}")
        self.u2 = frozenset(u2)
        self._phase = "routed"
        return {r: {s: bytes(shares[s][r]) for s in sorted(self.graph[r] & self.u2)}
                for r in sorted(self.u2)}

    def collect(self, masked: Mapping[int, np.ndarray],
                views: Mapping[int, Collection[int]] | None = None) -> frozenset[int]:
        """U3: the U2 members whose masked vector is a uint64 array of shape (dim,) in
        [0, 2**bits); every other one counts as dropped.

        ``views`` (optional): each silo's ``u2`` (the neighbours whose masks it added). Without
        it the server assumes each silo verified every blob routed to it. A view that names a
        node not routed to that silo drops the silo. Then, while two survivors disagree about
        their pair (one masked against the other, which left it out), the silo in most such
        pairs is dropped (ties: the one that left others out, so that the dropped silo's s_sk
        has every other holder; then the larger id): every pairwise mask left in the sum cancels,
        and a silo that claims to reject others can only get itself dropped."""
        self._expect("routed")
        ys: dict[int, np.ndarray] = {}
        for node, y in masked.items():
            if node in self.u2:
                try:
                    ys[node] = _check_vector(y, self.dim, self.bits)
                except SecAggError:
                    continue
        view_of: dict[int, frozenset[int]] = {}
        for node in self.u2:
            routed = self.graph[node] & self.u2
            view = routed
            if views is not None and node in views:
                try:
                    view = _id_set(views[node], "view")
                except SecAggError:
                    ys.pop(node, None)
                    continue
                if not view <= routed:
                    ys.pop(node, None)
                    continue
            view_of[node] = view
        u3 = set(ys)
        while True:  # greedy vertex cover of the disagreeing pairs
            pairs: dict[int, int] = {}
            left_out: dict[int, int] = {}
            for v in u3:
                for w in view_of[v] & u3:
                    if v not in view_of[w]:  # v masked against w; w left v out
                        pairs[v] = pairs.get(v, 0) + 1
                        pairs[w] = pairs.get(w, 0) + 1
                        left_out[w] = left_out.get(w, 0) + 1
            if not pairs:
                break
            u3.discard(max(pairs, key=lambda v: (pairs[v], left_out.get(v, 0), v)))
        self.u3 = frozenset(u3)
        self.dropped = self.u2 - self.u3
        self.views = {v: view_of.get(v, self.graph[v] & self.u2) for v in self.u2}
        self._y = {v: ys[v] for v in self.u3}
        self._phase = "collected"
        return self.u3

    def unmask_request(self) -> tuple[frozenset[int], frozenset[int]]:
        """(survivors U3, dropped U2 \\ U3): the request for every silo in the complete graph
        when every silo verified every blob; use :meth:`unmask_requests` in general."""
        self._expect("collected", "finished")
        return self.u3, self.dropped

    def unmask_requests(self) -> dict[int, tuple[frozenset[int], frozenset[int]]]:
        """Per survivor v: (U3 within its view, plus v; dropped within its view)."""
        self._expect("collected", "finished")
        return {v: (frozenset((self.views[v] & self.u3) | {v}), frozenset(self.views[v] & self.dropped))
                for v in sorted(self.u3)}

    def _recover(self, shares: Mapping[int, bytes], check: Callable[[bytes], bool], what: str) -> bytes:
        valid = {}
        for x, share in shares.items():
            try:
                decode_share(share)
            except ShamirError:
                continue
            valid[x] = share
        if len(valid) < self.threshold:
            raise SecAggAborted(f"{what}: {len(valid)} shares < threshold {self.threshold}")
        try:
            secret = combine(valid, self.threshold)
            if check(secret):
                return secret
        except ShamirError:
            pass
        subsets = itertools.combinations(sorted(valid), self.threshold)
        for subset in itertools.islice(subsets, MAX_RECOVERY_TRIES):
            try:
                secret = combine({x: valid[x] for x in subset}, self.threshold)
            except ShamirError:
                continue
            if check(secret):
                return secret
        raise SecAggAborted(f"{what}: no threshold subset of the shares reconstructs it")

    def finish(self, replies: Mapping[int, UnmaskReply | bytes]) -> np.ndarray:
        """sum_{j in U3} x_j mod 2**bits (uint64).

        Reads the shares each survivor was asked for (others are ignored), rebuilds b_j for
        j in U3 (checked against the advert's commitment) and s_sk_j for the dropped j that a
        survivor masked against (checked against the advertised s_pk): all shares together if
        they agree, else the first threshold subset whose result passes the check (at most
        MAX_RECOVERY_TRIES subsets). SecAggAborted with fewer than t valid replies or if a
        secret cannot be rebuilt."""
        self._expect("collected", "finished")
        requests = self.unmask_requests()
        b_pts: dict[int, dict[int, bytes]] = {j: {} for j in self.u3}
        ssk_pts: dict[int, dict[int, bytes]] = {j: {} for j in self.dropped}
        answered = 0
        for node, reply in replies.items():
            if node not in requests:
                continue
            try:
                if isinstance(reply, (bytes, bytearray)):
                    reply = UnmaskReply.decode(reply)
            except SecAggError:
                continue
            if not isinstance(reply, UnmaskReply) or reply.node != node:
                continue
            answered += 1
            asked_s, asked_d = requests[node]
            for owner, share in reply.b_shares.items():
                if owner in asked_s:
                    b_pts[owner][node] = share
            for owner, share in reply.ssk_shares.items():
                if owner in asked_d:
                    ssk_pts[owner][node] = share
        if answered < self.threshold:
            raise SecAggAborted(f"{answered} unmask replies < threshold {self.threshold}")
        total = np.zeros(self.dim, dtype=np.uint64)
        for v in sorted(self.u3):
            commit = self.roster[v].b_commit
            b = self._recover(b_pts[v], lambda s, v=v, c=commit: b_commitment(self.context, v, s) == c,
                              f"b of {v}")
            total = total + self._y[v] - mask(b, self.dim, self.bits)
        for j in sorted(self.dropped):
            maskers = [v for v in sorted(self.u3) if j in self.views[v]]
            if not maskers:
                continue
            s_pk = self.roster[j].s_pk
            ssk = self._recover(ssk_pts[j], lambda s, p=s_pk: public_bytes(X25519PrivateKey.from_private_bytes(s)) == p,
                                f"s_sk of {j}")
            sk = X25519PrivateKey.from_private_bytes(ssk)
            for v in maskers:
                m = mask(pair_seed(sk, self.roster[v].s_pk, self.context), self.dim, self.bits)
                total = total - m if j > v else total + m  # v added +m if j > v, -m if j < v
        self._phase = "finished"
        return total & np.uint64((1 << self.bits) - 1)
