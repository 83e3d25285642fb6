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
5. sums the accepted counts in int64. A contribution that claims more noise trials than any
   calibration could need (:data:`MAX_CLAIMED_TRIALS`) is dropped before the privacy check;
   a contribution claiming more than (1 + 10) times the exchange's median requirement (+ K) is
   dropped too (:func:`_drop_outsized_claims`: no honest one is while at least half are honest);
   if the largest possible total (from the claimed bounds K*g + K*b, never from the data) of
   the accepted ones could still reach 2**63, the contributions with the largest bounds are
   dropped (and the privacy check redone) until it cannot, so one silo's claim never blocks
   the exchange.

With the exchange's bit probability ``p`` (sent by the server, which is trusted to follow the
protocol), a contribution whose counts are statistically impossible for its claimed trials T is
dropped (step 2): an honest count is c_j = r_j + Bin(T, p) with r_j in [0, K*g], so by
Hoeffding's inequality and a union bound over the 2d tails (:func:`count_slack`)

    p T - t  <=  c_j  <=  K g + p T + t,      t = sqrt(T ln(2 d / ALPHA) / 2),

fails for an honest contribution with probability at most ALPHA = 1e-12 whatever its records
(a drop adds at most ALPHA to the delta of that exchange). A silo that claims trials it did not
add (2**62 trials and counts near 0, which would move the debiased mean by -1e14 per coordinate)
fails the lower bound.

Each exchange (``context``) is aggregated at most once: a second call with the same context
raises :class:`ShuffleRefused` ("exchange already aggregated"), so the server cannot obtain two
sums over different subsets of the same contributions and subtract them. The context is consumed
when the call starts, even if the call is then refused. With ``seen_path`` the consumed contexts
(their SHA-256, hex) are kept in a JSON list on disk, read, checked and written under an
exclusive lock, so the rule survives restarts and holds across processes sharing the file; the
node keeps ONE such file per state directory (app/node_runtime.py), across every run, so a
context of an earlier run stays consumed for the state directory's lifetime. With ``run_id`` the
shuffler serves one run only (the run id its node was started for, from Flower, not from the
server's request): a context naming another run is refused before anything is opened, so the
server cannot replay run 1's exchange with a subset of its blobs in run 2 and subtract the sums
(which isolated one silo's contribution exactly before this rule). The run id is a second
line of defence (behind a silo service it is what the forwarding ClientApp says); the state
directory's memory is the first and holds whatever run id a request arrives with.

A contribution may carry a binding (app/privacy/contribution.py, format SFC2): the SHA-256 of
the context it was sealed for and the silo's ledger sequence number of the release. A
contribution whose binding names another context is dropped (the AEAD already binds the
context; the binding keeps it bound should the envelope ever change).

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
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.filelock import exclusive_lock, write_json_atomically
from app.privacy.contribution import Contribution, ContributionError
from app.privacy.envelope import EnvelopeError, StaticKeys, open_sealed, parse_public_key
from app.privacy.shuffle import HONEST_ALPHA, MAX_HEADROOM, count_slack
from app.privacy.silo_sampling import kept_senders, os_generator, tag_mismatch

_INT64_LIMIT = 2**63
#: The most noise trials one contribution may claim. A silo carries (1 + headroom) / count-on of
#: its calibration's trials (headroom <= 10, app/config.py) and the calibration's trial-scale
#: search stops at 2**50 (app/privacy/accounting.py; the binomial accountant gains nothing past
#: ~1e11 trials, MAX_WINDOW), so no honest contribution claims 2**54 trials: a claim above is
#: dropped, and up to 2**63 / (2**54 + K g) >= 500 contributions still sum without overflow.
MAX_CLAIMED_TRIALS = 2**54
#: The probability that an honest contribution fails the count test (:func:`count_slack`).
ALPHA = HONEST_ALPHA
_RUN_IN_CONTEXT = re.compile(rb"\|run=(-?\d+)\|")


def context_run(context: bytes) -> int | None:
    """The run id a context names (``...|run=<id>|...``, app/wire/queries.py's shuffle_context), or None."""
    match = _RUN_IN_CONTEXT.search(bytes(context))
    return None if match is None else int(match.group(1))


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
    ``seen_path``: where consumed exchange contexts are persisted (optional). ``run_id``: the
    run this shuffler serves (its own view, from Flower); a context naming another run is
    refused (optional: None accepts any context, as in unit tests). ``silo_sample`` = M > 0:
    each exchange sums only a uniformly random M of the N ``allowed_senders`` (drawn from OS
    randomness, app/privacy/silo_sampling.py); a contribution sealed for another M of N (or for
    silo sampling when M = 0) is dropped, since its silo's accounting would not hold."""

    def __init__(self, keys: StaticKeys, allowed_senders: Collection[bytes] | None,
                 seen_path: str | Path | None = None, *, run_id: int | None = None,
                 legacy_seen: Sequence[str | Path] = (), silo_sample: int = 0) -> None:
        self.keys = keys
        self.allowed_senders: frozenset[bytes] | None = (
            None if allowed_senders is None else frozenset(parse_public_key(k) for k in allowed_senders)
        )
        self.seen_path = None if seen_path is None else Path(seen_path)
        self.run_id = None if run_id is None else int(run_id)
        #: older per-run files of consumed contexts, read (never written) with seen_path's
        self.legacy_seen = tuple(Path(x) for x in legacy_seen)
        self._seen: set[str] = set()
        self.silo_sample = int(silo_sample)
        if self.silo_sample and not (self.allowed_senders and self.silo_sample <= len(self.allowed_senders)):
            raise ValueError(f"silo sampling of M={self.silo_sample} needs a list of at least M allowed senders")
        self._sampler = os_generator()

    @property
    def public_hex(self) -> str:
        """The key the silos seal to."""
        return self.keys.public_hex

    # -- exchanges already aggregated ------------------------------------------------------------

    def _read_seen(self) -> set[str]:
        assert self.seen_path is not None
        seen: set[str] = set()
        for path in (*self.legacy_seen, self.seen_path):
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise ShuffleRefused(f"cannot read the aggregated-exchanges file {path}: {exc}") from None
            try:
                data = json.loads(text)
            except ValueError:
                raise ShuffleRefused(f"aggregated-exchanges file {path} is not JSON") from None
            if not isinstance(data, list) or not all(isinstance(h, str) for h in data):
                raise ShuffleRefused(f"aggregated-exchanges file {path} is not a list of hashes")
            seen.update(data)
        return seen

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
                  allowed_senders: Collection[bytes] | None = None, p: float | None = None) -> ShuffleResult:
        """Per-coordinate totals of the valid, allowed, privacy-satisfied contributions in
        ``blobs`` for the exchange ``context``; :class:`ShuffleRefused` if none qualifies or the
        exchange was already aggregated.

        ``allowed_senders`` (optional) can only *narrow* the senders of this exchange: with a
        list given to ``__init__`` the two are intersected; without one it is the only list. A
        list that comes from the server itself does not stop the server's own Sybil keys (the
        server can name them); it still enforces one contribution per listed sender. ``p``: the
        exchange's bit probability; with it, contributions whose counts are impossible for their
        claimed trials are dropped (module docstring)."""
        if not isinstance(context, (bytes, bytearray, memoryview)) or len(context) == 0:
            raise ValueError("context must be non-empty bytes naming the run, round and exchange")
        context = bytes(context)
        if int(dim) < 0 or int(levels) < 1:
            raise ValueError(f"need dim >= 0 and levels >= 1, got dim={dim}, levels={levels}")
        if p is not None and not 0.0 < float(p) < 1.0:
            raise ValueError(f"need 0 < p < 1, got p={p}")
        named = context_run(context)
        if self.run_id is not None and named != self.run_id:
            raise ShuffleRefused(f"the exchange's context names run {'none' if named is None else named}, but this "
                                 f"shuffler serves run {self.run_id}: a context of another run is never aggregated")
        allowed = self.allowed_senders
        if allowed_senders is not None:
            narrowed = frozenset(parse_public_key(k) for k in allowed_senders)
            allowed = narrowed if allowed is None else allowed & narrowed
        self._consume(context)
        population = len(self.allowed_senders or ())
        kept = kept_senders(sorted(self.allowed_senders or ()), self.silo_sample, self._sampler) \
            if self.silo_sample else None

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
                contribution = Contribution.decode(plaintext, dim, levels)
            except ContributionError as exc:
                dropped[sender.hex()] = f"invalid contribution: {exc}"
                continue
            reason = _implausible(contribution, context, p) or tag_mismatch(contribution.binding, self.silo_sample,
                                                                            population)
            if reason is not None:
                dropped[sender.hex()] = reason
                continue
            if kept is not None and sender not in kept:
                continue  # not in this exchange's sample: discarded, never summed
            accepted[sender] = contribution

        if not accepted:
            raise ShuffleRefused(f"no valid contribution among {len(blobs)} blob(s)", dropped)
        _drop_outsized_claims(accepted, dropped)
        if not accepted:
            raise ShuffleRefused(f"no plausible contribution among {len(blobs)} blob(s)", dropped)

        while True:
            self._privacy_check(accepted, dropped)
            bound = sum(c.max_count() for c in accepted.values())
            if bound < _INT64_LIMIT:
                break
            # one silo's claim must not block the exchange: drop the largest bounds until it fits
            largest = max(accepted, key=lambda s: accepted[s].max_count())
            dropped[largest.hex()] = (f"its claimed bound K*g + K*b = {accepted[largest].max_count()} would let the "
                                      f"sum reach {bound} >= 2**63")
            del accepted[largest]
            if not accepted:
                raise ShuffleRefused("no contribution left whose counts sum without overflow", dropped)
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

    @staticmethod
    def _privacy_check(accepted: dict[bytes, Contribution], dropped: dict[str, str]) -> None:
        """Drop the contributions whose calibration the exchange cannot meet, until stable;
        :class:`ShuffleRefused` if none is left."""
        while True:
            available = sum(c.trials for c in accepted.values())
            short = [s for s, c in accepted.items() if c.required_trials > available]
            if not short:
                return
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


def _drop_outsized_claims(accepted: dict[bytes, Contribution], dropped: dict[str, str]) -> None:
    """Drop every contribution claiming more trials than (1 + MAX_HEADROOM) m + K, m the upper
    median of the exchange's required trials. An honest silo claims K ceil((1 + h) m_i / (c K))
    <= (1 + h) m_i + K trials (h <= MAX_HEADROOM, c >= 1), and honest calibrations of one run
    differ by a few percent (delta = 1/n^2), so while at least half the contributions are honest
    none of them is dropped, and a lying claim is held to about (1 + MAX_HEADROOM) times theirs
    (the mean shift it can cause, (2R/g) t / N, to about sqrt(11) times the honest noise's scale)."""
    required = sorted(c.required_trials for c in accepted.values())
    typical = required[len(required) // 2]
    for sender, c in list(accepted.items()):
        limit = (1 + MAX_HEADROOM) * typical + c.records
        if c.trials > limit:
            dropped[sender.hex()] = (f"it claims {c.trials} noise trials, more than any calibration of this exchange "
                                     f"needs ((1 + {MAX_HEADROOM}) x the median requirement {typical} + K = {limit})")
            del accepted[sender]


def _implausible(c: Contribution, context: bytes, p: float | None) -> str | None:
    """Why a decoded contribution cannot be an honest one (or None): a binding to another
    context, a claim of more trials than any calibration needs, or (with ``p``) counts outside
    [p T - t, K g + p T + t] (module docstring). Reasons state bounds, never a count."""
    if c.binding and c.binding[:32] != hashlib.sha256(context).digest():
        return "its binding names another exchange's context"
    if c.trials > MAX_CLAIMED_TRIALS:
        return (f"it claims {c.trials} noise trials, more than any calibration needs "
                f"(at most {MAX_CLAIMED_TRIALS} = 2**54)")
    if p is None or c.dim == 0:
        return None
    t = count_slack(c.trials, c.dim)
    lo = float(p) * c.trials - t
    hi = c.records * c.levels + float(p) * c.trials + t
    if float(c.counts.min()) < lo or float(c.counts.max()) > hi:
        return (f"its counts are impossible for its claimed {c.trials} noise trials at p={float(p):g}: an honest "
                f"count lies in [{lo:.6g}, {hi:.6g}] except with probability {ALPHA:g}")
    return None
