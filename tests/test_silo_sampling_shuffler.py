"""The shuffler's silo sampling against the real Shuffler: a server that asks silos to claim
silo sampling the shuffler does not apply (or applies at another rate) gets their contributions
dropped; a sampling shuffler sums exactly M of its N senders, each kept with frequency M/N."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pytest

from app.privacy.contribution import Contribution
from app.privacy.envelope import StaticKeys, seal
from clients.shuffler import ShuffleRefused, Shuffler

DIM, LEVELS, TRIALS = 3, 4, 1000


def _tag(keep: int, of: int) -> bytes:
    """The documented tag, written out here: b"SSMP" + "<II" (M, N)."""
    return struct.pack("<4sII", b"SSMP", keep, of)


def _federation(n: int = 5):
    shuffler_keys = StaticKeys.generate()
    silos = [StaticKeys.generate() for _ in range(n)]
    counts = [np.array([1, 2, 3], dtype=np.int64) * 2**i for i in range(n)]  # every pair sums differently
    return shuffler_keys, silos, counts


def _blobs(shuffler_keys, silos, counts, ctx: bytes, tag: bytes) -> list[bytes]:
    out = []
    for seq, (keys, c) in enumerate(zip(silos, counts)):
        contribution = Contribution(records=1, trials=TRIALS, required_trials=TRIALS, levels=LEVELS, counts=c,
                                    binding=Contribution.bind(ctx, seq) + tag)
        out.append(seal(shuffler_keys.public, keys, contribution.encode(), ctx))
    return out


def test_claimed_silo_sampling_refused_by_a_shuffler_that_does_not_sample() -> None:
    """Attack: the server's run config asks the silos to claim q = 2/5; the shuffler sums all."""
    shuffler_keys, silos, counts = _federation()
    shuffler = Shuffler(shuffler_keys, [k.public for k in silos])
    ctx = b"run=1|round=1|exchange=grad"
    with pytest.raises(ShuffleRefused) as err:
        shuffler.aggregate(_blobs(shuffler_keys, silos, counts, ctx, _tag(2, 5)), ctx, DIM, LEVELS)
    assert len(err.value.dropped) == 5
    assert all("does not sample silos" in r for r in err.value.dropped.values())


def test_claimed_rate_other_than_the_shufflers_is_refused() -> None:
    shuffler_keys, silos, counts = _federation()
    shuffler = Shuffler(shuffler_keys, [k.public for k in silos], silo_sample=3)
    ctx = b"run=1|round=1|exchange=grad"
    with pytest.raises(ShuffleRefused) as err:
        shuffler.aggregate(_blobs(shuffler_keys, silos, counts, ctx, _tag(2, 5)), ctx, DIM, LEVELS)
    assert all("keeps 3 of 5" in r for r in err.value.dropped.values())


def test_sampling_shuffler_sums_exactly_m_of_n_uniformly() -> None:
    shuffler_keys, silos, counts = _federation()
    shuffler = Shuffler(shuffler_keys, [k.public for k in silos], silo_sample=2)
    subset_sums = {tuple(sum(counts[i] for i in pair)): pair for pair in itertools.combinations(range(5), 2)}
    hits = np.zeros(5)
    runs = 400
    for r in range(runs):
        ctx = f"run=1|round={r}|exchange=grad".encode()
        # untagged contributions (no claim) are summed by a sampling shuffler too
        res = shuffler.aggregate(_blobs(shuffler_keys, silos, counts, ctx, _tag(2, 5) if r % 2 else b""), ctx,
                                 DIM, LEVELS)
        assert res.accepted == 2 and res.trials == 2 * TRIALS and not res.dropped
        pair = subset_sums[tuple(res.totals)]  # the sum of exactly one pair of silos
        hits[list(pair)] += 1
    # each silo kept with probability 2/5: 160 of 400 expected, sd ~ 9.8
    assert np.all(np.abs(hits - 0.4 * runs) < 45)


def test_withheld_blobs_do_not_raise_the_rate() -> None:
    """The sample is drawn from the shuffler's own list: relaying only silo 0's blob keeps it with
    frequency 2/5, not 1."""
    shuffler_keys, silos, counts = _federation()
    shuffler = Shuffler(shuffler_keys, [k.public for k in silos], silo_sample=2)
    kept = 0
    runs = 400
    for r in range(runs):
        ctx = f"run=1|round={r}|exchange=grad".encode()
        try:
            shuffler.aggregate(_blobs(shuffler_keys, silos, counts, ctx, _tag(2, 5))[:1], ctx, DIM, LEVELS)
            kept += 1
        except ShuffleRefused:
            pass
    assert abs(kept - 0.4 * runs) < 45


def test_sampling_needs_a_sender_list() -> None:
    with pytest.raises(ValueError, match="allowed senders"):
        Shuffler(StaticKeys.generate(), None, silo_sample=2)
