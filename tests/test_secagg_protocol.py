"""SecAgg / SecAgg+ core (app/secagg): sums, dropouts, Shamir secrecy, and scripted attacks.

Every check is against an independent fact: the sum computed directly from the inputs, a
polynomial solved here by Gaussian elimination, AES-ECB on counter blocks, graph properties
counted by brute force, a chi-square bound with a fixed seed, or an attack played against the
real silo and server classes.
"""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy.stats import chi2

from app.privacy.envelope import StaticKeys, seal
from app.secagg import graph, prg, shamir
from app.secagg.protocol import (
    Advert,
    SecAggAborted,
    SecAggError,
    SecAggServer,
    SecAggSilo,
    SharePayload,
    UnmaskReply,
    default_threshold,
)

P = 2**521 - 1
CTX = b"run=7|round=3|exchange=0"


# --------------------------------------------------------------------------------------------
# A federation of real silos and a real server, step by step so that tests can intervene.
# --------------------------------------------------------------------------------------------
class Fed:
    def __init__(self, n: int, t: int, bits: int, dim: int, degree: int | None = None,
                 seed: int = 0, context: bytes = CTX, keys: dict | None = None) -> None:
        self.rng = random.Random(seed)
        self.n, self.t, self.bits, self.dim, self.ctx = n, t, bits, dim, context
        self.keys = keys or {i: StaticKeys.generate() for i in range(1, n + 1)}
        self.statics = {i: k.public for i, k in self.keys.items()}
        self.silos = {i: SecAggSilo(i, self.keys[i], context, t, bits, dim, self.rng.randrange)
                      for i in self.keys}
        self.server = SecAggServer(context, t, bits, dim, degree, b"graph-seed-%d" % seed)
        self.x = {i: np.array([self.rng.randrange(2**bits) for _ in range(dim)], dtype=np.uint64)
                  for i in self.keys}

    def advertise(self) -> None:
        self.server.adverts({i: s.advertise() for i, s in self.silos.items()})

    def rosters(self) -> dict[int, dict[int, Advert]]:
        return {i: self.server.roster_for(i) for i in self.silos}

    def share(self, rosters: dict | None = None) -> dict[int, dict[int, bytes]]:
        rosters = rosters or self.rosters()
        self.sent = {i: s.share(rosters[i], {j: self.statics[j] for j in rosters[i]}, b"claim-%d" % i)
                     for i, s in self.silos.items()}
        return self.sent

    def route(self) -> dict[int, dict[int, bytes]]:
        self.routed = self.server.route(self.sent)
        return self.routed

    def mask(self, skip=(), routed=None) -> dict[int, np.ndarray]:
        routed = routed or self.routed
        self.y = {}
        for i in routed:
            if i in skip:
                continue
            try:
                self.y[i] = self.silos[i].masked(routed[i], self.x[i])
            except SecAggError:
                pass
        return self.y

    def collect(self, y=None) -> frozenset[int]:
        y = self.y if y is None else y
        return self.server.collect(y, {i: self.silos[i].u2 for i in y})

    def unmask(self) -> dict[int, UnmaskReply]:
        replies = {}
        for v, (s, d) in self.server.unmask_requests().items():
            try:
                replies[v] = self.silos[v].unmask(s, d)
            except SecAggError:
                pass
        return replies

    def run(self) -> np.ndarray:
        self.advertise()
        self.share()
        self.route()
        self.mask()
        self.collect()
        return self.server.finish(self.unmask())

    def direct_sum(self, nodes) -> list[int]:
        return [sum(int(self.x[i][k]) for i in nodes) % 2**self.bits for k in range(self.dim)]


# --------------------------------------------------------------------------------------------
# Shamir
# --------------------------------------------------------------------------------------------
def _solve_mod_p(rows: list[list[int]], rhs: list[int]) -> list[int]:
    """Gaussian elimination over GF(p) (independent of shamir.py's Lagrange code)."""
    m = [row[:] + [b] for row, b in zip(rows, rhs)]
    n = len(m)
    for c in range(n):
        piv = next(r for r in range(c, n) if m[r][c] % P)
        m[c], m[piv] = m[piv], m[c]
        inv = pow(m[c][c], P - 2, P)
        m[c] = [v * inv % P for v in m[c]]
        for r in range(n):
            if r != c and m[r][c]:
                f = m[r][c]
                m[r] = [(a - f * b) % P for a, b in zip(m[r], m[c])]
    return [m[r][n] for r in range(n)]


def test_shamir_any_t_shares_reconstruct_and_fewer_do_not():
    rng = random.Random(1)
    secret = rng.randbytes(32)
    t, xs = 3, [1, 2, 3, 5, 8, 13]
    shares = shamir.split(secret, t, xs, rng.randrange)
    assert all(len(s) == shamir.SHARE_BYTES == 66 for s in shares.values())
    for k in range(t, len(xs) + 1):
        for subset in itertools.combinations(xs, k):
            assert shamir.combine({x: shares[x] for x in subset}, t) == secret
    for subset in itertools.combinations(xs, t - 1):
        with pytest.raises(shamir.ShamirError):
            shamir.combine({x: shares[x] for x in subset}, t)
    bad = dict(shares)
    bad[13] = shamir.encode_share((int.from_bytes(bad[13], "big") + 1) % P)
    with pytest.raises(shamir.ShamirError, match="inconsistent"):
        shamir.combine(bad, t)
    for broken in ({1: shares[1][:-1], 2: shares[2], 3: shares[3]},        # short share
                   {1: P.to_bytes(66, "big"), 2: shares[2], 3: shares[3]},  # value >= p
                   {0: shares[1], 2: shares[2], 3: shares[3]}):            # point 0
        with pytest.raises(shamir.ShamirError):
            shamir.combine(broken, t)


def test_shamir_t_minus_1_shares_are_consistent_with_every_secret():
    """Perfect secrecy by construction: for the t - 1 shares an adversary sees and ANY candidate
    secret s', solving the Vandermonde system here gives the unique coefficients (a_1..a_{t-1})
    with f(0) = s' through those shares, and the real split() fed exactly those coefficients
    produces the same t - 1 shares. One coefficient vector per candidate, all equally likely
    under uniform coefficients: the seen shares do not depend on the secret."""
    rng = random.Random(2)
    t = 4
    seen_xs = [2, 5, 11]
    real = rng.randbytes(32)
    seen = {x: s for x, s in shamir.split(real, t, [1, 2, 5, 7, 11], rng.randrange).items() if x in seen_xs}
    candidates = [real, bytes(32), b"\xff" * 32] + [rng.randbytes(32) for _ in range(17)]
    found = set()
    for cand in candidates:
        s0 = int.from_bytes(cand, "big")
        rows = [[pow(x, k, P) for k in range(1, t)] for x in seen_xs]
        rhs = [(int.from_bytes(seen[x], "big") - s0) % P for x in seen_xs]
        coeffs = _solve_mod_p(rows, rhs)
        assert all(0 <= a < P for a in coeffs)
        feed = iter(coeffs)
        again = shamir.split(cand, t, [1, 2, 5, 7, 11], lambda bound: next(feed))
        assert {x: again[x] for x in seen_xs} == seen
        found.add(tuple(coeffs))
    assert len(found) == len(set(candidates))  # distinct secrets need distinct coefficients


# --------------------------------------------------------------------------------------------
# PRG and graph
# --------------------------------------------------------------------------------------------
def test_prg_is_aes_ctr_from_zero_counter_and_pair_seeds_agree():
    seed = bytes(range(32))
    ecb = Cipher(algorithms.AES(seed), modes.ECB()).encryptor()
    blocks = b"".join(ecb.update(i.to_bytes(16, "big")) for i in range(4))  # counter blocks 0..3
    words = [int.from_bytes(blocks[8 * k: 8 * k + 8], "little") for k in range(8)]
    for bits in (1, 16, 62):
        assert prg.mask(seed, 8, bits).tolist() == [w % 2**bits for w in words]
    counts = np.bincount(prg.mask(b"\x07" * 32, 16000, 4).astype(np.int64), minlength=16)
    assert ((counts - 1000) ** 2 / 1000).sum() < chi2.ppf(0.999, 15)
    a, b = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    s_ab = prg.pair_seed(a, prg.public_bytes(b), CTX)
    assert s_ab == prg.pair_seed(b, prg.public_bytes(a), CTX)
    assert s_ab != prg.pair_seed(b, prg.public_bytes(a), CTX + b"x")
    with pytest.raises(ValueError):
        prg.pair_seed(a, bytes(32), CTX)  # small-order point


@pytest.mark.parametrize("n,k", [(10, 4), (10, 3), (9, 3), (12, 6), (7, 6), (7, 20)])
def test_graph_is_symmetric_regular_connected_and_seeded(n, k):
    nodes = [3 * i + 1 for i in range(n)]
    g = graph.neighbours(nodes, k, b"s1")
    want = n - 1 if k >= n - 1 else (k + 1 if k % 2 and n % 2 else k)
    assert set(g) == set(nodes)
    for v, nb in g.items():
        assert v not in nb and len(nb) == want
        assert all(v in g[w] for w in nb)
    seen, stack = {nodes[0]}, [nodes[0]]
    while stack:
        for w in g[stack.pop()] - seen:
            seen.add(w)
            stack.append(w)
    assert seen == set(nodes)
    assert graph.neighbours(list(reversed(nodes)), k, b"s1") == g
    if k < n - 1:
        assert any(graph.neighbours(nodes, k, b"s%d" % s) != g for s in range(2, 6))


# --------------------------------------------------------------------------------------------
# Correctness and dropouts
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [16, 32])
@pytest.mark.parametrize("degree", [None, 4])
def test_sum_is_correct(bits, degree):
    n = 9
    t = default_threshold(n if degree is None else degree + 1)
    fed = Fed(n, t, bits, dim=50, degree=degree, seed=bits + (degree or 0))
    out = fed.run()
    assert out.dtype == np.uint64
    assert fed.server.u3 == frozenset(range(1, n + 1))
    assert out.tolist() == fed.direct_sum(range(1, n + 1))
    if degree is not None:
        assert all(len(fed.server.neighbours_of(i)) == degree for i in range(1, n + 1))
        assert all(len(s.u2) == degree for s in fed.silos.values())
    assert fed.silos[1].claims == {j: b"claim-%d" % j for j in fed.silos[1].u2}


def test_dropouts_after_sharing():
    n, t = 7, 4
    fed = Fed(n, t, 16, dim=20, seed=3)
    fed.advertise(), fed.share(), fed.route()
    fed.mask(skip={2, 5, 6})                       # three silos vanish after sharing
    assert fed.collect() == frozenset({1, 3, 4, 7})
    out = fed.server.finish(fed.unmask())
    assert out.tolist() == fed.direct_sum({1, 3, 4, 7})

    fed = Fed(n, t, 16, dim=20, seed=4)
    fed.advertise(), fed.share(), fed.route()
    fed.mask(skip={1, 2, 5, 6})                    # |U3| = 3 < t
    assert fed.collect() == frozenset({3, 4, 7})
    for v, (s, d) in fed.server.unmask_requests().items():
        with pytest.raises(SecAggError, match="survivors < threshold"):
            fed.silos[v].unmask(s, d)
    with pytest.raises(SecAggAborted):
        fed.server.finish(fed.unmask())


# --------------------------------------------------------------------------------------------
# A hostile server
# --------------------------------------------------------------------------------------------
def _masked_fed(n=5, t=3, seed=5) -> Fed:
    fed = Fed(n, t, 16, dim=8, seed=seed)
    fed.advertise(), fed.share(), fed.route(), fed.mask(), fed.collect()
    return fed


def test_unmask_refuses_both_kinds_and_a_second_different_request():
    fed = _masked_fed()
    silo = fed.silos[1]
    with pytest.raises(SecAggError, match="both survived and dropped"):
        silo.unmask({1, 2, 3, 4}, {4, 5})
    with pytest.raises(SecAggError, match="not named among the survivors"):
        silo.unmask({2, 3, 4}, {1})
    with pytest.raises(SecAggError, match="survivors < threshold"):
        silo.unmask({1, 2}, {3, 4, 5})
    with pytest.raises(SecAggError, match="not among my verified neighbours"):
        silo.unmask({1, 2, 3, 99}, set())
    first = silo.unmask({1, 2, 3}, {4, 5})
    assert set(first.b_shares) == {1, 2, 3} and set(first.ssk_shares) == {4, 5}
    assert silo.unmask([3, 2, 1], [5, 4]) == first           # same lists, same reply
    with pytest.raises(SecAggError, match="already answered"):
        silo.unmask({1, 4, 5}, {2, 3})                        # now the other kind for 2..5
    restored = SecAggSilo.from_state(json.loads(json.dumps(silo.state_dict())), fed.keys[1], random.randrange)
    with pytest.raises(SecAggError, match="already answered"):
        restored.unmask({1, 4, 5}, {2, 3})                    # a restart does not forget


def test_server_substituting_an_s_pk_is_caught_by_the_payload_check():
    fed = Fed(6, 4, 16, dim=8, seed=6)
    fed.advertise()
    evil = X25519PrivateKey.generate()                   # the server knows this private key
    evil_pk = prg.public_bytes(evil)
    rosters = fed.rosters()
    victim = 1
    rosters[victim][2] = Advert(2, evil_pk, rosters[victim][2].b_commit)
    secrets_before = {i: s.state_dict() for i, s in fed.silos.items()}
    fed.share(rosters)
    fed.route()
    fed.mask()
    assert 2 not in fed.silos[victim].u2
    assert "substituted" in fed.silos[victim].rejected[2]
    # The victim's y holds exactly x + PRG(b) + the masks of its VERIFIED peers (recomputed here
    # from every silo's secrets): no mask under the server's key, which it could have removed.
    st = secrets_before[victim]
    sk = X25519PrivateKey.from_private_bytes(bytes.fromhex(st["s_sk"]))
    expect = fed.x[victim] + prg.mask(bytes.fromhex(st["b"]), 8, 16)
    for j in fed.silos[victim].u2:
        pk_j = Advert.decode(bytes.fromhex(secrets_before[j]["advert"])).s_pk
        m = prg.mask(prg.pair_seed(sk, pk_j, CTX), 8, 16)
        expect = expect + m if j > victim else expect - m
    assert fed.y[victim].tolist() == (expect & np.uint64(0xFFFF)).tolist()
    u3 = fed.collect()
    out = fed.server.finish(fed.unmask())
    assert out.tolist() == fed.direct_sum(u3) and len(u3) == 5

    # Substituting every peer's key: the victim verifies nobody and refuses to send anything.
    fed = Fed(6, 4, 16, dim=8, seed=7)
    fed.advertise()
    rosters = fed.rosters()
    for j in range(2, 7):
        rosters[victim][j] = Advert(j, prg.public_bytes(X25519PrivateKey.generate()), rosters[victim][j].b_commit)
    fed.share(rosters)
    fed.route()
    with pytest.raises(SecAggError, match="verified neighbours"):
        fed.silos[victim].masked(fed.routed[victim], fed.x[victim])


def test_forged_replayed_tampered_blobs_are_dropped_never_a_crash():
    keys = {i: StaticKeys.generate() for i in range(1, 8)}
    old = Fed(7, 4, 16, dim=6, seed=8, context=CTX + b"-previous", keys=keys)
    old.advertise(), old.share()
    fed = Fed(7, 4, 16, dim=6, seed=9, keys=keys)
    fed.advertise(), fed.share(), fed.route()
    routed = {r: dict(b) for r, b in fed.routed.items()}
    routed[1][2] = old.sent[2][1]                                  # replay: another exchange
    routed[1][3] = fed.sent[4][1]                                  # 4's blob presented as 3's
    tampered = bytearray(fed.sent[4][1])
    tampered[-5] ^= 1
    routed[1][4] = bytes(tampered)                                 # one flipped bit
    forged = SharePayload(2, 3, fed.silos[5].advertise().s_pk, shamir.encode_share(1),
                          shamir.encode_share(2), b"").encode()
    routed[3][5] = seal(keys[3].public, keys[5], forged, CTX)      # 5 claims to be 2
    routed[3][6], routed[3][7] = None, "text"                      # not even bytes
    routed[1][99] = b"from a stranger"                             # not a neighbour
    fed.mask(routed=routed)
    assert fed.silos[1].u2 == frozenset({5, 6, 7})
    assert fed.silos[3].u2 == frozenset({1, 2, 4})
    assert set(fed.silos[1].rejected) == {2, 3, 4}
    u3 = fed.collect()                 # 1 and 3 masked with fewer peers than masked with them
    assert u3 == frozenset({2, 4, 5, 6, 7})
    out = fed.server.finish(fed.unmask())
    assert out.tolist() == fed.direct_sum(u3)
    # The server side: garbage in route() drops the sender, never crashes.
    srv = SecAggServer(CTX, 4, 16, 6, None, b"g")
    srv.adverts({i: s.advertise() for i, s in fed.silos.items()})
    shares = dict(fed.sent)
    shares[1] = "junk"
    shares[2] = {**fed.sent[2], 3: b"short"}
    assert set(srv.route(shares)) == {3, 4, 5, 6, 7}
    srv = SecAggServer(CTX, 4, 16, 6, None, b"g")
    adverts = {i: s.advertise() for i, s in fed.silos.items()}
    adverts[1] = Advert(1, bytes(32), adverts[1].b_commit)         # small-order key
    adverts[2] = Advert(2, adverts[3].s_pk, adverts[2].b_commit)   # copies 3's key
    adverts[4] = adverts[5]                                        # answers for another node
    adverts[6] = b"junk"
    with pytest.raises(SecAggAborted, match="2 adverts < threshold 4"):
        srv.adverts(adverts)
    assert set(SecAggServer(CTX, 2, 16, 6, None, b"g").adverts(adverts)) == {5, 7}


def test_malformed_masked_vectors_count_as_dropped():
    fed = Fed(9, 5, 16, dim=10, seed=10)
    fed.advertise(), fed.share(), fed.route(), fed.mask()
    y = dict(fed.y)
    y[1] = y[1][:-1]                                               # wrong length
    y[2] = y[2].astype(np.int64)                                   # wrong dtype
    y[3] = y[3].copy()
    y[3][0] = 2**16                                                # out of range
    y[4] = np.full(10, np.nan)                                     # NaN floats
    y[5] = y[5].tolist()                                           # not an array
    y[6] = y[6].reshape(2, 5)                                      # wrong shape
    y[99] = y[7]                                                   # not a member
    bad_views = {i: fed.silos[i].u2 for i in fed.y}
    assert fed.server.collect(y, bad_views) == frozenset({7, 8, 9})
    fed = Fed(9, 5, 16, dim=10, seed=11)
    fed.advertise(), fed.share(), fed.route(), fed.mask()
    y = dict(fed.y)
    y[1] = y[1][:-1]
    y[2] = np.full(10, np.nan)
    y[3] = y[3].astype(np.float64)
    views = {i: fed.silos[i].u2 for i in fed.y}
    views[4] = {1, 2, 3, 99}                                       # a view naming a stranger
    u3 = fed.server.collect(y, views)
    assert u3 == frozenset({5, 6, 7, 8, 9})
    assert fed.server.finish(fed.unmask()).tolist() == fed.direct_sum(u3)


def test_finish_survives_a_lying_share_and_rejects_a_short_or_foreign_reply():
    """A Byzantine responder shifts its b-shares by delta / lambda_2, lambda_2 being its Lagrange
    coefficient at 0 in the responder set {1, 2, 5, 6} (x's are public): that set then
    interpolates to b + delta, a valid-looking 32-byte secret. The advert's commitment exposes
    it; with a fifth reply the server finds an honest subset, with exactly t it aborts instead of
    returning a wrong sum."""
    fed = _masked_fed(n=7, t=4, seed=12)
    replies = fed.unmask()
    honest = dict(replies)
    lam = 1
    for xj in (1, 5, 6):
        lam = lam * xj * pow(xj - 2, P - 2, P) % P
    shift = pow(lam, P - 2, P)                                     # delta = 1
    liar = replies[2]
    lying = UnmaskReply(2, {k: shamir.encode_share((int.from_bytes(v, "big") + shift) % P)
                            for k, v in liar.b_shares.items()}, liar.ssk_shares)
    owner = 3
    pts = {r: honest[r].b_shares[owner] for r in (1, 2, 5, 6)}
    b_true = int.from_bytes(shamir.combine(pts, 4), "big")
    assert int.from_bytes(shamir.combine({**pts, 2: lying.b_shares[owner]}, 4), "big") == b_true + 1
    replies[2] = lying
    replies[3] = b"garbage"
    replies[4] = UnmaskReply(5, {}, {})                            # answers for another node
    out = fed.server.finish(replies)
    assert out.tolist() == fed.direct_sum(range(1, 8))
    with pytest.raises(SecAggAborted, match="no threshold subset"):
        fed.server.finish({r: replies[r] for r in (1, 2, 5, 6)})
    with pytest.raises(SecAggAborted, match="replies < threshold"):
        fed.server.finish({k: replies[k] for k in (1, 2, 5)})
    assert fed.server.finish({r: honest[r] for r in (1, 2, 5, 6)}).tolist() == out.tolist()


# --------------------------------------------------------------------------------------------
# Collusion
# --------------------------------------------------------------------------------------------
def _coalition_residue(fed: Fed, h: int, colluders, states) -> int:
    """y_h minus every mask the server and the colluders can compute (their own s_sk give the
    pairwise seeds with h); the colluders' t - 1 shares of b_h and s_sk_h give nothing."""
    s_pk_h = fed.server.roster[h].s_pk
    z = int(fed.y[h][0])
    for c in colluders:
        sk_c = X25519PrivateKey.from_private_bytes(bytes.fromhex(states[c]["s_sk"]))
        m = int(prg.mask(prg.pair_seed(sk_c, s_pk_h, CTX), 1, fed.bits)[0])
        z = z - m if c > h else z + m                    # h added +m for c > h, -m for c < h
    held = [fed.silos[c].state_dict()["held"][str(h)] for c in colluders]
    for kind in (0, 1):
        with pytest.raises(shamir.ShamirError):
            shamir.combine({c: bytes.fromhex(s[kind]) for c, s in zip(colluders, held)}, fed.t)
    return z % 2**fed.bits


def test_collusion_below_threshold_sees_uniform_and_at_threshold_unmasks():
    """n = 4, t = 3, bits = 4, dim = 1. The server plus t - 1 = 2 colluding silos (full states,
    s_sk included) see y_h minus their masks; over 300 exchanges each for x_h = 0 and x_h = 9,
    that residue is uniform on 16 values and has the same distribution for both inputs
    (chi-square, 15 df, alpha = 0.001, fixed seed). With t colluders the same view gives x_h."""
    h, colluders = 1, (3, 4)
    residues = {0: [], 9: []}
    for x_h in residues:
        for rep in range(300):
            fed = Fed(4, 3, 4, dim=1, seed=100_000 * (x_h + 1) + rep)
            fed.x[h] = np.array([x_h], dtype=np.uint64)
            fed.advertise(), fed.share()
            states = {c: fed.silos[c].state_dict() for c in colluders}
            fed.route(), fed.mask()
            residues[x_h].append(_coalition_residue(fed, h, colluders, states))
    counts = {x: np.bincount(r, minlength=16) for x, r in residues.items()}
    crit = chi2.ppf(0.999, 15)
    for c in counts.values():
        assert ((c - 300 / 16) ** 2 / (300 / 16)).sum() < crit
    total = counts[0] + counts[9]
    homog = sum(((counts[x] - total / 2) ** 2 / (total / 2)).sum() for x in counts)
    assert homog < crit

    for rep in range(5):                                    # t colluders: x_h comes out exactly
        fed = Fed(4, 3, 4, dim=1, seed=7_000 + rep)
        fed.advertise(), fed.share(), fed.route(), fed.mask()
        held = {c: fed.silos[c].state_dict()["held"][str(h)] for c in (2, 3, 4)}
        b_h = shamir.combine({c: bytes.fromhex(v[0]) for c, v in held.items()}, 3)
        sk_h = X25519PrivateKey.from_private_bytes(
            shamir.combine({c: bytes.fromhex(v[1]) for c, v in held.items()}, 3))
        z = int(fed.y[h][0]) - int(prg.mask(b_h, 1, 4)[0])
        for j in (2, 3, 4):
            m = int(prg.mask(prg.pair_seed(sk_h, fed.server.roster[j].s_pk, CTX), 1, 4)[0])
            z = z - m if j > h else z + m
        assert z % 16 == int(fed.x[h][0])


def _accepted_requests(fed: Fed, w: int):
    """Every (survivors, dropped) the real silo w answers, with its reply (state cloned per try)."""
    state = json.dumps(fed.silos[w].state_dict())
    nodes = sorted(fed.silos)
    out = []
    for labels in itertools.product("SDN", repeat=len(nodes)):
        s = {v for v, lab in zip(nodes, labels) if lab == "S"}
        d = {v for v, lab in zip(nodes, labels) if lab == "D"}
        silo = SecAggSilo.from_state(json.loads(state), fed.keys[w], random.randrange)
        try:
            out.append(silo.unmask(s, d))
        except SecAggError:
            continue
    return out


def _best_attack(fed: Fed, honest, colluders):
    """Search every combination of accepted requests to the honest silos (or none) for one that
    gives t shares of b_v and of s_sk_h for each honest h != v (the colluders hand over all
    their held shares): then the server removes every mask from y_v. Returns such a v or None."""
    t = fed.t
    options = {w: [None] + _accepted_requests(fed, w) for w in honest}
    for choice in itertools.product(*(options[w] for w in honest)):
        b_count = {v: len(colluders) for v in fed.silos}
        s_count = {v: len(colluders) for v in fed.silos}
        for reply in choice:
            if reply is not None:
                for o in reply.b_shares:
                    b_count[o] += 1
                for o in reply.ssk_shares:
                    s_count[o] += 1
        for v in honest:
            if b_count[v] >= t and all(s_count[h] >= t for h in honest if h != v):
                return v
    return None


def test_active_server_with_inconsistent_lists_cannot_unmask_without_enough_colluders():
    """n = 4, t = 3: the server may send each honest silo ANY lists it likes (all 3**4 label
    assignments tried against the real silo). With no colluder, or one (t - 2), no combination of
    accepted requests reveals b_v and every s_sk_h of some honest v. With t - 1 = 2 colluders it
    does: the documented limit of a protocol without a consistency round (module docstring)."""
    fed = _masked_fed(n=4, t=3, seed=13)
    assert _best_attack(fed, honest=(1, 2, 3, 4), colluders=()) is None
    assert _best_attack(fed, honest=(1, 2, 3), colluders=(4,)) is None
    assert _best_attack(fed, honest=(1, 2), colluders=(3, 4)) is not None


# --------------------------------------------------------------------------------------------
# Persistence, messages, refusals
# --------------------------------------------------------------------------------------------
def test_state_round_trip_mid_exchange_gives_the_same_result():
    def through_json(fed):
        fed.silos = {i: SecAggSilo.from_state(json.loads(json.dumps(s.state_dict())), fed.keys[i],
                                              fed.rng.randrange) for i, s in fed.silos.items()}

    keys = {i: StaticKeys.generate() for i in range(1, 6)}
    plain = Fed(5, 3, 32, dim=12, degree=None, seed=14, keys=keys)
    expected = plain.run()
    fed = Fed(5, 3, 32, dim=12, degree=None, seed=14, keys=keys)
    fed.advertise()
    through_json(fed)
    fed.share()
    through_json(fed)
    assert fed.silos[1].share(fed.server.roster_for(1), fed.statics, b"claim-1") == fed.sent[1]
    fed.route(), fed.mask()
    through_json(fed)
    fed.collect()
    replies = fed.unmask()
    through_json(fed)
    assert fed.unmask() == replies
    out = fed.server.finish(replies)
    assert out.tolist() == expected.tolist() == fed.direct_sum(range(1, 6))
    state = fed.silos[1].state_dict()
    with pytest.raises(SecAggError, match="another static key"):
        SecAggSilo.from_state(state, keys[2], random.randrange)
    with pytest.raises(SecAggError):
        SecAggSilo.from_state({**state, "version": 99}, keys[1], random.randrange)
    early = Fed(5, 3, 32, dim=12, seed=15, keys=keys)
    early.advertise()
    st = early.silos[1].state_dict()
    with pytest.raises(SecAggError, match="does not match"):
        SecAggSilo.from_state({**st, "s_sk": "11" * 32}, keys[1], random.randrange)


def test_messages_are_strict():
    adv = Advert(5, bytes(range(32)), bytes(32))
    assert Advert.decode(adv.encode()) == adv
    pay = SharePayload(1, 2, bytes(32), shamir.encode_share(3), shamir.encode_share(4), b"eps=1")
    assert SharePayload.decode(pay.encode()) == pay
    rep = UnmaskReply(3, {1: shamir.encode_share(5)}, {2: shamir.encode_share(6)})
    assert UnmaskReply.decode(rep.encode()) == rep
    for cls, blob in ((Advert, adv.encode()), (SharePayload, pay.encode()), (UnmaskReply, rep.encode())):
        for broken in (blob[:-1], blob + b"\0", b"XXXX" + blob[4:], b"", 42):
            with pytest.raises(SecAggError):
                cls.decode(broken)
    with pytest.raises(SecAggError):
        UnmaskReply(3, {1: shamir.encode_share(5)}, {1: shamir.encode_share(6)})
    with pytest.raises(SecAggError):
        SharePayload(1, 2, bytes(32), shamir.encode_share(3), P.to_bytes(66, "big"), b"")
    with pytest.raises(SecAggError):
        Advert(0, bytes(32), bytes(32))
    assert [default_threshold(n) for n in (1, 2, 3, 4, 5, 10)] == [1, 2, 2, 3, 3, 6]


def test_silo_refuses_bad_rosters_and_inputs():
    fed = Fed(6, 3, 8, dim=4, seed=16)
    silo = fed.silos[1]
    full = {i: s.advertise() for i, s in fed.silos.items()}
    small = {j: full[j] for j in (1, 2, 3, 4, 5)}
    statics = lambda r: {j: fed.statics[j] for j in r}  # noqa: E731
    with pytest.raises(SecAggError, match="lacks me"):
        silo.share({j: full[j] for j in (2, 3, 4)}, statics((2, 3, 4)), b"")
    with pytest.raises(SecAggError, match=">= 2 \\* threshold"):
        silo.share(full, statics(full), b"")
    with pytest.raises(SecAggError, match="< threshold"):
        silo.share({j: full[j] for j in (1, 2)}, statics((1, 2)), b"")
    with pytest.raises(SecAggError, match="differ"):
        silo.share(small, statics((1, 2, 3, 4, 6)), b"")
    with pytest.raises(SecAggError, match="another advert for me"):
        silo.share({**small, 1: Advert(1, bytes(range(32)), bytes(32))}, statics(small), b"")
    sent = silo.share(small, statics(small), b"")
    assert set(sent) == {2, 3, 4, 5}
    with pytest.raises(SecAggError, match="other arguments"):
        silo.share(small, statics(small), b"different claim")
    for x in (np.zeros(4, dtype=np.int64), np.zeros(3, dtype=np.uint64), np.full(4, 256, dtype=np.uint64)):
        with pytest.raises(SecAggError):
            silo.masked({}, x)
    with pytest.raises(SecAggError, match="verified neighbours"):
        silo.masked({}, np.zeros(4, dtype=np.uint64))
    with pytest.raises(SecAggError, match="before masked"):
        silo.unmask({1, 2, 3}, set())
