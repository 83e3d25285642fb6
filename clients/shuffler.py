"""The trusted shuffler of shuffle-DP mode: open sealed contributions, validate, sum.

Each silo seals its contribution (app/privacy/contribution.py) to the shuffler's static X25519
key with app/privacy/envelope.py; the untrusted server relays the blobs to the shuffler, which
returns only the per-coordinate totals. The shuffler:

1. opens each blob under the exchange's ``context`` and accepts only ``allowed_senders`` (the
   silos' published static keys). A blob that fails (another key, tampering, another exchange,
   a sender outside the list, such as a key pair the server made to inject Sybil
   contributions) is dropped with a reason; :meth:`Shuffler.aggregate` never raises for one bad
   blob;
2. decodes and validates each contribution for the exchange's ``dim`` and ``levels``
   (dropped on :class:`~app.privacy.contribution.ContributionError`);
3. keeps at most one blob per sender: the *first* authenticated blob of a sender (by position)
   takes the sender's slot, and every later one from the same sender is dropped
   ("keep-first-drop-rest"), whether it is a replay of the same blob or a different
   contribution. Only the sender itself can make a second valid blob, so the choice matters
   only for a misbehaving silo; if the first blob is invalid, the sender has no contribution;
4. runs the privacy check: every contribution whose ``required_trials`` exceeds the total
   ``trials`` of the contributions still accepted is dropped, repeatedly, until stable. This
   finds the largest set in which every member's calibration is met (a contribution dropped at
   some step cannot belong to any feasible subset of the remaining ones, since their trials only
   shrink). If nothing remains, the exchange is refused (:class:`ShuffleRefused`);
5. sums the accepted counts in int64, refusing if the largest possible total (from the claimed
   bounds K*g + K*b, never from the data) could reach 2**63.

Each exchange (``context``) is aggregated at most once per :class:`Shuffler`: a second call with
the same context raises :class:`ShuffleRefused` ("exchange already aggregated"), so the server
cannot obtain two sums over different subsets of the same contributions and subtract them.
The context is consumed when the call starts, even if the call is then refused. With
``seen_path`` the consumed contexts (their SHA-256, hex) are kept in a JSON list on disk, read,
checked and written under an exclusive lock, so the rule survives restarts and holds across
processes sharing the file.

Nothing here returns or logs an individual contribution: the result holds the totals, the sums
of accepted trials and records, the number accepted and the reasons for the dropped blobs (keyed
by sender hex, or ``#i`` for the i-th blob when no sender can be attributed or for a duplicate);
reasons state metadata and bounds, never a count.

NOTE: the shuffler *sums* instead of shuffling unary bits. The multiset of bits a shuffler would
shuffle (for each coordinate, its count of ones) reveals exactly these per-coordinate totals,
so releasing the totals is the same release as releasing the shuffled bits. The shuffler cannot
verify that a sender actually added the Binomial noise it claims in ``trials``: trust that the
other silos are honest about their noise is part of the shuffle model. What the shuffler does
enforce is that only the allowed silos count, once each, so the server cannot inflate the trial
total with contributions of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.filelock import exclusive_lock, write_json_atomically
from app.privacy.contribution import Contribution, ContributionError
from app.privacy.envelope import EnvelopeError, StaticKeys, open_sealed, parse_public_key

_INT64_LIMIT = 2**63


@dataclass(eq=False)
class ShuffleResult:
    """What the shuffler releases for one exchange."""

    totals: np.ndarray
    trials: int
    records: int
    accepted: int
    dropped: dict[str, str] = field(default_factory=dict)


class ShuffleRefused(RuntimeError):
    """The shuffler releases nothing for this exchange; ``dropped`` lists why blobs were dropped."""

    def __init__(self, message: str, dropped: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.dropped: dict[str, str] = dict(dropped or {})


class Shuffler:
    """Open, validate and sum sealed contributions; see the module docstring.

    ``allowed_senders``: the silos' static public keys (raw or hex). ``None`` accepts any sender,
    which gives no protection against injected contributions; use it only in tests.
    ``seen_path``: where consumed exchange contexts are persisted (optional)."""

    def __init__(self, keys: StaticKeys, allowed_senders: Collection[bytes] | None,
                 seen_path: str | Path | None = None) -> None:
        self.keys = keys
        self.allowed_senders: frozenset[bytes] | None = (
            None if allowed_senders is None else frozenset(parse_public_key(k) for k in allowed_senders)
        )
        self.seen_path = None if seen_path is None else Path(seen_path)
        self._seen: set[str] = set()

    @property
    def public_hex(self) -> str:
        """The key the silos seal to."""
        return self.keys.public_hex

    # -- exchanges already aggregated ------------------------------------------------------------

    def _read_seen(self) -> set[str]:
        assert self.seen_path is not None
        try:
            text = self.seen_path.read_text()
        except FileNotFoundError:
            return set()
        except OSError as exc:
            raise ShuffleRefused(f"cannot read the aggregated-exchanges file {self.seen_path}: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError:
            raise ShuffleRefused(f"aggregated-exchanges file {self.seen_path} is not JSON") from None
        if not isinstance(data, list) or not all(isinstance(h, str) for h in data):
            raise ShuffleRefused(f"aggregated-exchanges file {self.seen_path} is not a list of hashes")
        return set(data)

    def _write_seen(self, seen: set[str]) -> None:
        assert self.seen_path is not None
        write_json_atomically(self.seen_path, sorted(seen))

    def _consume(self, context: bytes) -> None:
        """Mark ``context`` as aggregated, or refuse if it already was."""
        digest = hashlib.sha256(context).hexdigest()
        if digest in self._seen:
            raise ShuffleRefused("exchange already aggregated")
        if self.seen_path is not None:
            with exclusive_lock(self.seen_path.with_name(self.seen_path.name + ".lock")):
                seen = self._read_seen()
                if digest in seen:
                    self._seen.add(digest)
                    raise ShuffleRefused("exchange already aggregated")
                seen.add(digest)
                self._write_seen(seen)
        self._seen.add(digest)

    # -- aggregation -----------------------------------------------------------------------------

    def aggregate(self, blobs: Sequence[bytes], context: bytes, dim: int, levels: int, *,
                  allowed_senders: Collection[bytes] | None = None) -> ShuffleResult:
        """Per-coordinate totals of the valid, allowed, privacy-satisfied contributions in
        ``blobs`` for the exchange ``context``; :class:`ShuffleRefused` if none qualifies or the
        exchange was already aggregated.

        ``allowed_senders`` (optional) can only *narrow* the senders of this exchange: with a
        list given to ``__init__`` the two are intersected; without one it is the only list. A
        list that comes from the server itself does not stop the server's own Sybil keys (the
        server can name them); it still enforces one contribution per listed sender."""
        if not isinstance(context, (bytes, bytearray, memoryview)) or len(context) == 0:
            raise ValueError("context must be non-empty bytes naming the run, round and exchange")
        context = bytes(context)
        if int(dim) < 0 or int(levels) < 1:
            raise ValueError(f"need dim >= 0 and levels >= 1, got dim={dim}, levels={levels}")
        allowed = self.allowed_senders
        if allowed_senders is not None:
            narrowed = frozenset(parse_public_key(k) for k in allowed_senders)
            allowed = narrowed if allowed is None else allowed & narrowed
        self._consume(context)

        dropped: dict[str, str] = {}
        accepted: dict[bytes, Contribution] = {}  # insertion order = blob order
        claimed: set[bytes] = set()
        for i, blob in enumerate(blobs):
            try:
                sender, plaintext = open_sealed(self.keys, blob, context, allowed)
            except EnvelopeError as exc:
                dropped[f"#{i}"] = f"envelope rejected: {exc}"
                continue
            if sender in claimed:
                dropped[f"#{i}"] = (f"duplicate contribution from sender {sender.hex()} in this exchange; "
                                    "the first one was kept")
                continue
            claimed.add(sender)
            try:
                accepted[sender] = Contribution.decode(plaintext, dim, levels)
            except ContributionError as exc:
                dropped[sender.hex()] = f"invalid contribution: {exc}"

        if not accepted:
            raise ShuffleRefused(f"no valid contribution among {len(blobs)} blob(s)", dropped)

        # The privacy check: drop the contributions whose calibration the exchange cannot meet.
        while True:
            available = sum(c.trials for c in accepted.values())
            short = [s for s, c in accepted.items() if c.required_trials > available]
            if not short:
                break
            least_required = min(accepted[s].required_trials for s in short)
            for s in short:
                dropped[s.hex()] = (f"its calibration counts on at least {accepted[s].required_trials} noise "
                                    f"trials, but the exchange holds only {available}")
                del accepted[s]
            if not accepted:
                raise ShuffleRefused(
                    f"no contribution's privacy calibration is met: {available} noise trials "
                    f"available, at least {least_required} required",
                    dropped,
                )

        bound = sum(c.max_count() for c in accepted.values())
        if bound >= _INT64_LIMIT:
            raise ShuffleRefused(
                f"the accepted contributions could sum to {bound} >= 2**63; refusing rather than overflow",
                dropped,
            )
        totals = np.zeros(int(dim), dtype=np.int64)
        for c in accepted.values():
            totals += c.counts
        return ShuffleResult(
            totals=totals,
            trials=sum(c.trials for c in accepted.values()),
            records=sum(c.records for c in accepted.values()),
            accepted=len(accepted),
            dropped=dropped,
        )
