"""A silo's shuffle-DP contribution: per-coordinate integer counts and the noise they carry.

In shuffle-DP mode a silo encodes each of its K records' clipped gradient coordinates as a level
in {0..g}; coordinate j of the contribution is ``sum_i level_ij + Binomial(K*b, p)``, so every
count lies in [0, K*g + K*b]. The silo seals the encoded contribution to the shuffler
(app/privacy/envelope.py); the shuffler (clients/shuffler.py) decodes it here, validates it and
sums it with the others.

Wire format (little-endian)::

    struct "<4sQQQQQ": b"SFC1", records (K), trials (K*b), required_trials, levels (g), d
    then d counts as "<i8"

``required_trials`` is the smallest total number of noise trials of the *whole exchange* that
the silo calibrated its privacy for: the shuffler releases a sum that contains this contribution
only if the accepted contributions together carry at least that many.

Format SFC2 is SFC1 with a binding after the counts::

    struct "<H": binding length, then the binding bytes (at most MAX_BINDING)

A silo's binding is SHA-256(context) (32 bytes) followed by its ledger sequence number of the
release ("<Q"): inside the sealed payload, it ties the contribution to the one exchange and the
one ledger release it was made for (the shuffler drops one whose binding names another context).
A contribution without a binding is encoded as SFC1.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"SFC1"
MAGIC_BOUND = b"SFC2"
HEADER = struct.Struct("<4sQQQQQ")
BINDING_LEN = struct.Struct("<H")
#: The longest binding a contribution may carry.
MAX_BINDING = 256
#: The most records one contribution may claim.
MAX_RECORDS = 10**9
_U64_MAX = 2**64 - 1


class ContributionError(ValueError):
    """An encoded contribution is malformed or out of range for its exchange."""


@dataclass(frozen=True, eq=False)
class Contribution:
    """One silo's counts for one exchange. ``counts`` is never shown in ``repr``."""

    records: int
    trials: int
    required_trials: int
    levels: int
    counts: np.ndarray = field(repr=False)
    #: SHA-256(context) + ledger sequence number (see the module docstring); empty: none
    binding: bytes = b""

    @staticmethod
    def bind(context: bytes, seq: int) -> bytes:
        """The binding of the release ``seq`` sealed for ``context``."""
        return hashlib.sha256(bytes(context)).digest() + struct.pack("<Q", int(seq))

    @property
    def dim(self) -> int:
        return int(np.asarray(self.counts).shape[0])

    def max_count(self) -> int:
        """The largest value a valid count may take: K*g + K*b (a Python int, no overflow)."""
        return int(self.records) * int(self.levels) + int(self.trials)

    def encode(self) -> bytes:
        counts = np.asarray(self.counts)
        if counts.ndim != 1:
            raise ContributionError(f"counts must be one-dimensional, got shape {counts.shape}")
        if counts.size and not np.issubdtype(counts.dtype, np.integer):
            raise ContributionError(f"counts must be integers, got dtype {counts.dtype}")
        for name in ("records", "trials", "required_trials", "levels"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 <= int(value) <= _U64_MAX:
                raise ContributionError(f"{name} must be an integer in [0, 2**64), got {value!r}")
        if counts.size and (int(counts.min()) < np.iinfo(np.int64).min or int(counts.max()) > np.iinfo(np.int64).max):
            raise ContributionError("counts do not fit in int64")
        binding = bytes(self.binding)
        if len(binding) > MAX_BINDING:
            raise ContributionError(f"binding of {len(binding)} bytes exceeds {MAX_BINDING}")
        header = HEADER.pack(MAGIC_BOUND if binding else MAGIC, int(self.records), int(self.trials),
                             int(self.required_trials), int(self.levels), counts.shape[0])
        body = header + counts.astype("<i8").tobytes()
        return body + BINDING_LEN.pack(len(binding)) + binding if binding else body

    @classmethod
    def decode(cls, data: bytes, dim: int, levels: int) -> Contribution:
        """Parse and validate an encoded contribution for an exchange of ``dim`` coordinates and
        ``levels`` quantisation levels; :class:`ContributionError` says what was wrong."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ContributionError(f"contribution must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < HEADER.size:
            raise ContributionError(f"contribution too short: {len(data)} bytes < {HEADER.size}-byte header")
        magic, records, trials, required, got_levels, d = HEADER.unpack_from(data)
        if magic not in (MAGIC, MAGIC_BOUND):
            raise ContributionError(f"bad magic {magic!r}, expected {MAGIC!r} or {MAGIC_BOUND!r}")
        if d != dim:
            raise ContributionError(f"dimension {d} != the exchange's dimension {dim}")
        expected = HEADER.size + 8 * d
        binding = b""
        if magic == MAGIC_BOUND:
            if len(data) < expected + BINDING_LEN.size:
                raise ContributionError(f"wrong length: {len(data)} bytes, too short for an SFC2 binding with d={d}")
            (size,) = BINDING_LEN.unpack_from(data, expected)
            if not 0 < size <= MAX_BINDING:
                raise ContributionError(f"binding length {size} outside [1, {MAX_BINDING}]")
            binding = data[expected + BINDING_LEN.size: expected + BINDING_LEN.size + size]
            expected += BINDING_LEN.size + size
        if len(data) != expected:
            raise ContributionError(f"wrong length: {len(data)} bytes, expected {expected} for d={d}")
        if got_levels != levels:
            raise ContributionError(f"levels {got_levels} != the exchange's levels {levels}")
        if not 1 <= records <= MAX_RECORDS:
            raise ContributionError(f"records {records} outside [1, {MAX_RECORDS}]")
        if trials < 0:  # unreachable through the unsigned header; kept for clarity
            raise ContributionError(f"trials {trials} < 0")
        if required < 1:
            raise ContributionError(f"required_trials {required} < 1")
        counts = np.frombuffer(data, dtype="<i8", offset=HEADER.size, count=d).astype(np.int64)
        bound = int(records) * int(got_levels) + int(trials)
        # The messages name the bound, never a count: a reason may travel back to the server.
        if d and int(counts.min()) < 0:
            raise ContributionError("a count is negative; counts lie in [0, K*g + K*b]")
        if d and int(counts.max()) > bound:
            raise ContributionError(
                f"a count exceeds K*g + K*b = {records}*{got_levels} + {trials} = {bound}"
            )
        return cls(records=int(records), trials=int(trials), required_trials=int(required),
                   levels=int(got_levels), counts=counts, binding=binding)
