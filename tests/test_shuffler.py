"""Shuffle-DP transport: sealed envelopes (app/privacy/envelope.py), the contribution wire format
(app/privacy/contribution.py) and the shuffler (clients/shuffler.py).

Expected values are independent facts: hand-written counts and their hand-computed sums, the
envelope's key derivation redone here from the ``cryptography`` primitives, file modes from
``os.stat``."""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from app.privacy.contribution import Contribution, ContributionError
from app.privacy.envelope import EnvelopeError, StaticKeys, open_sealed, parse_public_key, seal
from clients.shuffler import ShuffleRefused, Shuffler

CTX = b"run=7|round=3|exchange=grad"


# -- envelope ---------------------------------------------------------------------------------


def test_seal_open_round_trip():
    shuffler, silo = StaticKeys.generate(), StaticKeys.generate()
    blob = seal(shuffler.public, silo, b"hello counts", CTX)
    sender, plaintext = open_sealed(shuffler, blob, CTX, [silo.public])
    assert sender == silo.public
    assert plaintext == b"hello counts"
    # Layout: magic, ephemeral key, sender key, nonce, ciphertext + 16-byte tag.
    assert blob[:3] == b"SF1"
    assert blob[35:67] == silo.public
    assert len(blob) == 3 + 32 + 32 + 12 + len(b"hello counts") + 16
    # Hex recipient key and no sender list work too; an empty plaintext round-trips.
    blob2 = seal(shuffler.public_hex, silo, b"", CTX)
    assert open_sealed(shuffler, blob2, CTX, None) == (silo.public, b"")
    # Fresh ephemeral key and nonce: sealing twice never gives the same blob.
    assert seal(shuffler.public, silo, b"x", CTX) != seal(shuffler.public, silo, b"x", CTX)


def test_construction_matches_the_spec():
    """Open a blob by redoing the documented derivation from the raw primitives."""
    r_priv = X25519PrivateKey.generate()
    s_priv = X25519PrivateKey.generate()
    raw = lambda k: k.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)  # noqa: E731
    r_pub, s_pub = raw(r_priv), raw(s_priv)
    blob = seal(r_pub, StaticKeys(s_priv), b"payload", CTX)
    e_pub, nonce, ct = blob[3:35], blob[67:79], blob[79:]
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    shared1 = r_priv.exchange(X25519PublicKey.from_public_bytes(e_pub))
    shared2 = r_priv.exchange(X25519PublicKey.from_public_bytes(s_pub))
    assert shared2 == s_priv.exchange(X25519PublicKey.from_public_bytes(r_pub))
    key = HKDF(hashes.SHA256(), 32, None, b"silofl-shuffle-v1" + e_pub + s_pub + r_pub + CTX).derive(shared1 + shared2)
    assert ChaCha20Poly1305(key).decrypt(nonce, ct, CTX) == b"payload"


def test_wrong_recipient_key_is_rejected():
    shuffler, other, silo = StaticKeys.generate(), StaticKeys.generate(), StaticKeys.generate()
    blob = seal(shuffler.public, silo, b"secret", CTX)
    with pytest.raises(EnvelopeError, match="authentication failed"):
        open_sealed(other, blob, CTX, None)


@pytest.mark.parametrize("position", [0, 3, 20, 40, 70, 80, -1])
def test_tampered_byte_is_rejected(position):
    shuffler, silo = StaticKeys.generate(), StaticKeys.generate()
    blob = bytearray(seal(shuffler.public, silo, b"some plaintext bytes", CTX))
    blob[position] ^= 0x01
    with pytest.raises(EnvelopeError):
        open_sealed(shuffler, bytes(blob), CTX, None)


def test_other_context_is_rejected():
    shuffler, silo = StaticKeys.generate(), StaticKeys.generate()
    blob = seal(shuffler.public, silo, b"secret", CTX)
    for other in (b"run=7|round=4|exchange=grad", b"", CTX + b"x"):
        with pytest.raises(EnvelopeError, match="authentication failed"):
            open_sealed(shuffler, blob, other, None)


def test_sender_not_allowed_is_rejected():
    shuffler, silo, stranger = StaticKeys.generate(), StaticKeys.generate(), StaticKeys.generate()
    blob = seal(shuffler.public, stranger, b"x", CTX)
    with pytest.raises(EnvelopeError, match="not an allowed sender"):
        open_sealed(shuffler, blob, CTX, [silo.public])
    with pytest.raises(EnvelopeError, match="not an allowed sender"):
        open_sealed(shuffler, blob, CTX, [])


def test_swapped_sender_key_fails_authentication():
    """The server replaces the sender field of A's blob with B's (allowed) key."""
    shuffler, a, b = StaticKeys.generate(), StaticKeys.generate(), StaticKeys.generate()
    blob = seal(shuffler.public, a, b"x", CTX)
    forged = blob[:35] + b.public + blob[67:]
    with pytest.raises(EnvelopeError, match="authentication failed"):
        open_sealed(shuffler, forged, CTX, [a.public, b.public])


def test_malformed_blobs_and_small_order_keys_are_rejected():
    shuffler, silo = StaticKeys.generate(), StaticKeys.generate()
    blob = seal(shuffler.public, silo, b"x", CTX)
    with pytest.raises(EnvelopeError, match="magic"):
        open_sealed(shuffler, b"XX1" + blob[3:], CTX, None)
    with pytest.raises(EnvelopeError, match="too short"):
        open_sealed(shuffler, blob[:50], CTX, None)
    with pytest.raises(EnvelopeError):
        open_sealed(shuffler, "not bytes", CTX, None)  # type: ignore[arg-type]
    # An all-zero (small-order) ephemeral or sender key gives the all-zero shared secret.
    with pytest.raises(EnvelopeError, match="key agreement"):
        open_sealed(shuffler, blob[:3] + bytes(32) + blob[35:], CTX, None)
    with pytest.raises(EnvelopeError, match="key agreement"):
        open_sealed(shuffler, blob[:35] + bytes(32) + blob[67:], CTX, None)
    with pytest.raises(EnvelopeError, match="key agreement"):
        seal(bytes(32), silo, b"x", CTX)


def test_parse_public_key():
    k = StaticKeys.generate()
    assert parse_public_key(k.public) == k.public
    assert parse_public_key(k.public_hex) == k.public
    assert parse_public_key(k.public_hex.upper()) == k.public
    assert parse_public_key(k.public_hex.encode()) == k.public
    for bad in ("zz" * 32, k.public_hex[:-2], k.public[:31], b"", 12345, k.public_hex + "00"):
        with pytest.raises(EnvelopeError):
            parse_public_key(bad)  # type: ignore[arg-type]


def test_private_key_is_not_a_public_attribute():
    k = StaticKeys.generate()
    public_attrs = {a for a in dir(k) if not a.startswith("_")}
    assert public_attrs == {"public", "public_hex", "generate", "load_or_create", "dh"}
    assert k.public_hex in repr(k)


def test_key_file_created_0600_and_reloaded(tmp_path: Path):
    path = tmp_path / "deep" / "dir" / "shuffler.key"
    old_umask = os.umask(0o022)
    try:
        k1 = StaticKeys.load_or_create(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.path.getsize(path) == 32
    k2 = StaticKeys.load_or_create(path)
    assert k2.public == k1.public
    assert [p.name for p in path.parent.iterdir()] == ["shuffler.key"]  # no temporary file left
    # The reloaded key opens what was sealed to the first.
    silo = StaticKeys.generate()
    assert open_sealed(k2, seal(k1.public, silo, b"m", CTX), CTX, None)[1] == b"m"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_group_or_world_readable_key_file_is_refused(tmp_path: Path, mode):
    path = tmp_path / "k.key"
    StaticKeys.load_or_create(path)
    os.chmod(path, mode)
    with pytest.raises(EnvelopeError, match="0600"):
        StaticKeys.load_or_create(path)


def test_wrong_size_key_file_is_refused(tmp_path: Path):
    path = tmp_path / "k.key"
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"\x01" * 31)
    os.close(fd)
    with pytest.raises(EnvelopeError, match="32 raw bytes"):
        StaticKeys.load_or_create(path)


# -- contribution -----------------------------------------------------------------------------


def test_contribution_round_trip():
    c = Contribution(records=5, trials=50, required_trials=120, levels=4,
                     counts=np.array([0, 7, 70, 3], dtype=np.int64))
    data = c.encode()
    assert len(data) == 44 + 4 * 8
    assert data[:44] == struct.pack("<4sQQQQQ", b"SFC1", 5, 50, 120, 4, 4)
    assert data[44:] == np.array([0, 7, 70, 3], dtype="<i8").tobytes()
    back = Contribution.decode(data, dim=4, levels=4)
    assert (back.records, back.trials, back.required_trials, back.levels) == (5, 50, 120, 4)
    assert back.counts.dtype == np.int64 and back.counts.tolist() == [0, 7, 70, 3]
    assert "counts" not in repr(back)  # an individual contribution's counts never get printed
    # d = 0 round-trips; trials = 0 (no noise of its own) is a valid contribution.
    empty = Contribution(1, 0, 1, 1, np.zeros(0, dtype=np.int64))
    assert Contribution.decode(empty.encode(), dim=0, levels=1).counts.shape == (0,)


def _raw(records=5, trials=50, required=120, levels=4, d=None, counts=(0, 7, 70, 3), magic=b"SFC1"):
    d = len(counts) if d is None else d
    return struct.pack("<4sQQQQQ", magic, records, trials, required, levels, d) + np.array(counts, dtype="<i8").tobytes()


@pytest.mark.parametrize("data, match", [
    (_raw(magic=b"SFC9"), "magic"),
    (_raw()[:-1], "length"),
    (_raw() + b"\x00", "length"),
    (_raw()[:40], "too short"),
    (_raw(d=3), "dimension"),
    (_raw(counts=(1, 2, 3)), "dimension"),
    (_raw(levels=5), "levels"),
    (_raw(records=0), "records"),
    (_raw(records=10**9 + 1), "records"),
    (_raw(required=0), "required_trials"),
    (_raw(counts=(0, -1, 0, 0)), "negative"),
    (_raw(counts=(0, 0, 5 * 4 + 50 + 1, 0)), "exceeds"),
])
def test_invalid_contribution_rejected(data, match):
    with pytest.raises(ContributionError, match=match):
        Contribution.decode(data, dim=4, levels=4)


def test_count_bounds_are_exact_and_overflow_free():
    # K*g + K*b = 5*4 + 50 = 70 is the largest valid count.
    assert Contribution.decode(_raw(counts=(70, 0, 0, 0)), 4, 4).counts[0] == 70
    # A bound beyond int64 (10**9 * 2**40 + 2**63) is computed exactly: int64's maximum passes ...
    big = _raw(records=10**9, trials=2**63, required=1, levels=2**40, counts=(2**63 - 1,))
    assert Contribution.decode(big, 1, 2**40).counts[0] == 2**63 - 1
    # ... and with a small bound, a count just above it fails even though it fits in int64.
    with pytest.raises(ContributionError, match="exceeds"):
        Contribution.decode(_raw(records=1, trials=0, required=1, levels=1, counts=(2,)), 1, 1)


def test_encode_rejects_what_cannot_be_represented():
    with pytest.raises(ContributionError, match="trials"):
        Contribution(1, -1, 1, 1, np.zeros(2, dtype=np.int64)).encode()
    with pytest.raises(ContributionError, match="one-dimensional"):
        Contribution(1, 1, 1, 1, np.zeros((2, 2), dtype=np.int64)).encode()
    with pytest.raises(ContributionError, match="integers"):
        Contribution(1, 1, 1, 1, np.zeros(2)).encode()


# -- shuffler ---------------------------------------------------------------------------------


def _blob(shuffler_keys: StaticKeys, sender: StaticKeys, counts, *, records=3, trials=30, required=60,
          levels=2, context=CTX) -> bytes:
    c = Contribution(records=records, trials=trials, required_trials=required, levels=levels,
                     counts=np.asarray(counts, dtype=np.int64))
    return seal(shuffler_keys.public, sender, c.encode(), context)


@pytest.fixture()
def setup():
    sk = StaticKeys.generate()
    silos = [StaticKeys.generate() for _ in range(3)]
    return sk, silos, Shuffler(sk, [s.public for s in silos])


def test_exact_totals_from_three_senders(setup):
    sk, (a, b, c), shuffler = setup
    blobs = [_blob(sk, a, [1, 0, 5, 9]), _blob(sk, b, [2, 3, 0, 11], records=4, trials=40),
             _blob(sk, c, [0, 7, 1, 36])]
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    assert result.totals.dtype == np.int64
    assert result.totals.tolist() == [3, 10, 6, 56]
    assert (result.trials, result.records, result.accepted, result.dropped) == (100, 10, 3, {})
    assert shuffler.public_hex == sk.public_hex


def test_bad_blobs_are_dropped_and_the_rest_summed(setup):
    sk, (a, b, c), shuffler = setup
    wrong_key = seal(StaticKeys.generate().public, a, b"whatever", CTX)  # sealed to another shuffler
    blobs = [wrong_key, _blob(sk, b, [2, 3, 0, 11]), _blob(sk, c, [0, 7, 1, 37]),  # 37 > 3*2 + 30
             _blob(sk, a, [1, 1, 1, 1])]
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    assert result.totals.tolist() == [3, 4, 1, 12]
    assert (result.accepted, result.trials, result.records) == (2, 60, 6)
    assert set(result.dropped) == {"#0", c.public_hex}
    assert "envelope" in result.dropped["#0"]
    assert "exceeds" in result.dropped[c.public_hex]
    assert "37" not in result.dropped[c.public_hex]  # a reason never shows a count


def test_too_few_trials_is_refused(setup):
    sk, (a, b, _), shuffler = setup
    blobs = [_blob(sk, a, [1, 0, 0, 0], trials=10, required=100), _blob(sk, b, [0, 1, 0, 0], trials=10, required=100)]
    with pytest.raises(ShuffleRefused, match=r"20 noise trials available, at least 100 required") as info:
        shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    assert set(info.value.dropped) == {a.public_hex, b.public_hex}


def test_unsatisfied_contribution_dropped_others_released(setup):
    sk, (a, b, c), shuffler = setup
    blobs = [_blob(sk, a, [1, 2, 3, 4], trials=30, required=60),
             _blob(sk, b, [5, 5, 5, 5], trials=30, required=60),
             _blob(sk, c, [9, 9, 9, 9], trials=30, required=1000)]  # counts on far more noise
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    assert result.totals.tolist() == [6, 7, 8, 9]
    assert (result.accepted, result.trials) == (2, 60)
    assert list(result.dropped) == [c.public_hex]
    assert "1000" in result.dropped[c.public_hex] and "90" in result.dropped[c.public_hex]


def test_privacy_check_iterates_until_stable(setup):
    """Dropping c (needs 1000 of 100) leaves 70 trials, below b's 80: b goes too; a (needs 30) stays."""
    sk, (a, b, c), shuffler = setup
    blobs = [_blob(sk, a, [1, 1, 1, 1], trials=40, required=30),
             _blob(sk, b, [2, 2, 2, 2], trials=30, required=80),
             _blob(sk, c, [4, 4, 4, 4], trials=30, required=1000)]
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    assert result.totals.tolist() == [1, 1, 1, 1]
    assert (result.accepted, result.trials) == (1, 40)
    assert set(result.dropped) == {b.public_hex, c.public_hex}


def test_replayed_context_is_refused(setup):
    sk, (a, b, c), shuffler = setup
    blobs = [_blob(sk, s, [1, 1, 1, 1]) for s in (a, b, c)]
    shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    with pytest.raises(ShuffleRefused, match="already aggregated"):
        shuffler.aggregate(blobs[:2], CTX, dim=4, levels=2)  # a second subset would let the server subtract
    # A refused exchange is consumed as well.
    ctx2 = b"run=7|round=4|exchange=grad"
    with pytest.raises(ShuffleRefused):
        shuffler.aggregate([], ctx2, dim=4, levels=2)
    with pytest.raises(ShuffleRefused, match="already aggregated"):
        shuffler.aggregate([_blob(sk, s, [1, 1, 1, 1], context=ctx2) for s in (a, b, c)], ctx2, dim=4, levels=2)
    # Blobs of one exchange do not open in another.
    ctx3 = b"run=7|round=5|exchange=grad"
    with pytest.raises(ShuffleRefused, match="no valid contribution") as info:
        shuffler.aggregate(blobs, ctx3, dim=4, levels=2)
    assert set(info.value.dropped) == {"#0", "#1", "#2"}


def test_seen_contexts_persist_across_restarts(tmp_path: Path, setup):
    sk, silos, _ = setup
    seen = tmp_path / "state" / "seen.json"
    allowed = [s.public_hex for s in silos]  # hex keys are accepted too
    Shuffler(sk, allowed, seen_path=seen).aggregate([_blob(sk, s, [0, 0, 0, 0]) for s in silos], CTX, 4, 2)
    import hashlib
    import json
    assert json.loads(seen.read_text()) == [hashlib.sha256(CTX).hexdigest()]
    restarted = Shuffler(sk, allowed, seen_path=seen)
    with pytest.raises(ShuffleRefused, match="already aggregated"):
        restarted.aggregate([_blob(sk, s, [0, 0, 0, 0]) for s in silos], CTX, 4, 2)
    other = b"run=8|round=1|exchange=grad"
    restarted.aggregate([_blob(sk, s, [0, 0, 0, 0], context=other) for s in silos], other, 4, 2)
    assert len(json.loads(seen.read_text())) == 2
    seen.write_text("not json")
    with pytest.raises(ShuffleRefused, match="not JSON"):
        Shuffler(sk, allowed, seen_path=seen).aggregate([], b"run=9", 4, 2)


def test_server_sybil_contributions_are_dropped(setup):
    """The server seals zero-noise contributions under its own key pairs, claiming many trials so
    that silo a's calibration looks met and the released sum is a's counts with little noise."""
    sk, (a, _, _), shuffler = setup
    honest = _blob(sk, a, [2, 1, 0, 3], trials=30, required=300)
    sybils = [_blob(sk, StaticKeys.generate(), [0, 0, 0, 0], trials=1000, required=1) for _ in range(3)]
    with pytest.raises(ShuffleRefused, match="30 noise trials available, at least 300 required") as info:
        shuffler.aggregate([honest, *sybils], CTX, dim=4, levels=2)
    assert all("not an allowed sender" in info.value.dropped[f"#{i}"] for i in (1, 2, 3))
    # Without a sender list the attack would work: that is what allowed_senders is for. (Sybils
    # claiming 1000 trials while requiring 1 are outsized for the exchange's median requirement,
    # 1, and dropped; Sybils stating a requirement like a's get through.)
    open_shuffler = Shuffler(sk, None)
    with pytest.raises(ShuffleRefused, match="no plausible contribution"):
        open_shuffler.aggregate([honest, *sybils], CTX, dim=4, levels=2)
    sybils = [_blob(sk, StaticKeys.generate(), [0, 0, 0, 0], trials=1000, required=300) for _ in range(3)]
    leaked = Shuffler(sk, None).aggregate([honest, *sybils], CTX, dim=4, levels=2)
    assert leaked.totals.tolist() == [2, 1, 0, 3] and leaked.accepted == 4


def test_duplicate_sender_keeps_first(setup):
    sk, (a, b, c), shuffler = setup
    first = _blob(sk, a, [1, 1, 1, 1])
    blobs = [first, _blob(sk, b, [2, 2, 2, 2]), first,  # the server replays a's blob
             _blob(sk, a, [5, 5, 5, 5]),  # a equivocates
             _blob(sk, c, [3, 3, 3, 3])]
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    assert result.totals.tolist() == [6, 6, 6, 6]
    assert (result.accepted, result.trials, result.records) == (3, 90, 9)
    assert set(result.dropped) == {"#2", "#3"}
    assert all("duplicate" in r and a.public_hex in r for r in result.dropped.values())


def test_a_claim_beyond_any_calibration_is_dropped_not_the_exchange(setup):
    """2**62 claimed trials (more than 2**54, beyond any calibration) used to refuse the whole
    exchange ("could sum to >= 2**63"): now only those contributions are dropped."""
    sk, (a, b, c), shuffler = setup
    huge = 2**62
    blobs = [_blob(sk, s, [huge, 0], records=1, levels=1, trials=huge, required=1, context=CTX) for s in (a, b)]
    blobs.append(_blob(sk, c, [1, 0], records=1, levels=1, trials=2, required=1))
    result = shuffler.aggregate(blobs, CTX, dim=2, levels=1)
    assert result.totals.tolist() == [1, 0] and (result.accepted, result.trials) == (1, 2)
    assert set(result.dropped) == {a.public_hex, b.public_hex}
    assert all("more than any calibration needs" in r for r in result.dropped.values())


def test_int64_overflow_drops_the_largest_bound_not_the_exchange(setup):
    """Two contributions of bound K*g + K*b = 2**20 * 2**42 + 1 = 2**62 + 1 each could sum to
    2**63 + 2: the one with the largest bound (the first of equals) is dropped, the other summed."""
    sk, (a, b, _), shuffler = setup
    blobs = [_blob(sk, s, [0, 2**62], records=2**20, levels=2**42, trials=1, required=1) for s in (a, b)]
    result = shuffler.aggregate(blobs, CTX, dim=2, levels=2**42)
    assert result.totals.tolist() == [0, 2**62] and result.accepted == 1
    assert list(result.dropped) == [a.public_hex] and "2**63" in result.dropped[a.public_hex]
    alone = [_blob(sk, a, [0, 0], records=2**21, levels=2**42, trials=1, required=1, context=b"run=7|round=9")]
    with pytest.raises(ShuffleRefused, match="overflow"):
        shuffler.aggregate(alone, b"run=7|round=9", dim=2, levels=2**42)


def test_counts_impossible_for_the_claimed_trials_are_dropped(setup):
    """With p: an honest count lies in [pT - t, Kg + pT + t], t = sqrt(T ln(2d/1e-12)/2)
    (Hoeffding); here T = 10**6, d = 4: pT = 250000, t = 3854.25."""
    import math
    sk, (a, b, c), shuffler = setup
    t = math.sqrt(10**6 * math.log(8 / 1e-12) / 2)
    assert abs(t - 3854.25) < 0.01
    ok = [250000 - 3854, 250000, 250000 + 6 + 3854, 250000]
    blobs = [_blob(sk, a, ok, trials=10**6, required=10**6),
             _blob(sk, b, [250000 - 3855, 250000, 250000, 250000], trials=10**6, required=10**6),  # below pT - t
             _blob(sk, c, [250000, 250000 + 6 + 3855, 250000, 250000], trials=10**6, required=10**6)]  # above
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2, p=0.25)
    assert result.totals.tolist() == ok and result.accepted == 1
    assert set(result.dropped) == {b.public_hex, c.public_hex}
    assert all("impossible" in r and "246145" not in r and "253861" not in r for r in result.dropped.values())


def test_wrong_dim_or_levels_dropped(setup):
    sk, (a, b, c), shuffler = setup
    blobs = [_blob(sk, a, [1, 1, 1]), _blob(sk, b, [1, 1, 1, 1], levels=3),
             _blob(sk, c, [1, 1, 1, 1], required=30)]
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2)
    assert result.totals.tolist() == [1, 1, 1, 1]
    assert set(result.dropped) == {a.public_hex, b.public_hex}
    # c alone (30 trials) meets its own requirement of 30.
    assert result.trials == 30


def test_per_exchange_sender_list_only_narrows(setup):
    sk, (a, b, c), shuffler = setup
    stranger = StaticKeys.generate()
    blobs = [_blob(sk, s, [1, 1, 1, 1], trials=40, required=40) for s in (a, b, stranger)]
    # The per-call list cannot add a sender the shuffler was not configured with.
    result = shuffler.aggregate(blobs, CTX, 4, 2, allowed_senders=[a.public, stranger.public])
    assert result.totals.tolist() == [1, 1, 1, 1]
    assert set(result.dropped) == {"#1", "#2"}
    # Without a configured list, the per-call list is the list.
    open_shuffler = Shuffler(sk, None)
    result = open_shuffler.aggregate(blobs, CTX, 4, 2, allowed_senders=[b.public_hex, stranger.public])
    assert result.totals.tolist() == [2, 2, 2, 2] and set(result.dropped) == {"#0"}


def test_a_claim_outsized_for_the_exchanges_requirements_is_dropped(setup):
    """Counts consistent with 10**6 claimed trials (p T each) pass the count test, but the
    claim is more than (1 + 10) x the median requirement (100) + K = 1103: dropped. The honest
    claims (55 <= 1103) stay, and their 110 trials meet their requirement of 100."""
    sk, (a, b, c), shuffler = setup
    blobs = [_blob(sk, a, [14, 15, 13, 14], trials=55, required=100),
             _blob(sk, b, [13, 14, 15, 14], trials=55, required=100),
             _blob(sk, c, [250000] * 4, trials=10**6, required=100)]
    result = shuffler.aggregate(blobs, CTX, dim=4, levels=2, p=0.25)
    assert result.totals.tolist() == [27, 29, 28, 28] and (result.accepted, result.trials) == (2, 110)
    assert list(result.dropped) == [c.public_hex] and "1103" in result.dropped[c.public_hex]
