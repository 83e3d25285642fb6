"""The silo's privacy ledger: a file on the silo's own disk recording every release.

The ledger is the silo's source of truth for what it has spent. Several processes may serve
the same silo (a simulation engine runs silos in a pool of workers; a restarted SuperNode), so
every read-check-write happens under an exclusive file lock on ``<ledger>.lock`` and starts by
re-reading the file: an in-memory copy is never trusted. A release is checked and written to
disk (atomically) in one step, :meth:`PrivacyLedger.record_release`, *before* the silo computes
it; one that would take epsilon above the budget is refused with :class:`BudgetExceededError`.
A crash can only over-count, never under-count.
A silo that restarts reloads the file and continues from what it has already spent.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.filelock import exclusive_lock, write_json_atomically
from app.privacy.accounting import Release, epsilon_spent

LEDGER_VERSION = 1
#: Relative slack for floating-point noise when comparing epsilon with the budget.
BUDGET_RTOL = 1e-9


class BudgetExceededError(RuntimeError):
    """A requested release would exceed the silo's privacy budget."""


class LedgerError(RuntimeError):
    """The ledger file is unreadable or belongs to a different budget."""


@dataclass
class PrivacyLedger:
    """Budget (epsilon, delta), the calibrated noise plan, and every release made."""

    path: Path
    epsilon_budget: float
    delta: float
    releases: list[dict[str, Any]] = field(default_factory=list)
    calibration: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path, epsilon_budget: float, delta: float) -> PrivacyLedger:
        """Load the ledger at ``path`` or create an empty one. An existing ledger written for a
        different budget is an error: a silo's budget cannot be changed after spending."""
        ledger = cls(Path(path), float(epsilon_budget), float(delta))
        with ledger._locked():
            if ledger.path.exists():
                ledger._reload()
            else:
                ledger._save()
        return ledger

    def _reload(self) -> None:
        """Re-read the file (caller holds the lock) and check it is for this budget."""
        try:
            data = json.loads(self.path.read_text())
            stored_eps = _decode_float(data["epsilon_budget"])
            stored_delta = float(data["delta"])
            releases = list(data["releases"])
            calibration = dict(data.get("calibration", {}))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"privacy ledger {self.path} is unreadable: {exc}") from exc
        same_eps = stored_eps == self.epsilon_budget or math.isclose(stored_eps, self.epsilon_budget)
        if not same_eps or not math.isclose(stored_delta, self.delta):
            raise LedgerError(
                f"privacy ledger {self.path} was written for budget (epsilon={stored_eps}, delta={stored_delta}) "
                f"but this run asks for (epsilon={self.epsilon_budget}, delta={self.delta}); "
                "use a new state dir or ledger scope"
            )
        self.releases, self.calibration = releases, calibration

    def _locked(self) -> contextlib.AbstractContextManager[None]:
        return exclusive_lock(self.path.with_suffix(self.path.suffix + ".lock"))

    # -- accounting ---------------------------------------------------------------------
    def recorded(self) -> list[Release]:
        """The recorded releases as accountant events."""
        return [Release(r["kind"], int(r["n"]), int(r["batch"]), float(r["noise_multiplier"]), int(r.get("count", 1)),
                        bool(r.get("disjoint", False)), str(r.get("mechanism", "gaussian")), int(r.get("trials", 0)),
                        int(r.get("levels", 0)), float(r.get("p", 0.0)), int(r.get("dim", 0)))
                for r in self.releases]

    def spent(self) -> float:
        """Epsilon spent so far at the ledger's delta (0 when nothing was released)."""
        with self._locked():
            self._reload()
        return epsilon_spent(self.recorded(), self.delta)

    def _check_loaded(self, new: list[Release], exclusive_round: int | None = None) -> float:
        if exclusive_round is not None:
            kinds = {r.kind for r in new}
            if any(row["kind"] in kinds and int(row.get("round", -1)) == exclusive_round for row in self.releases):
                raise BudgetExceededError(f"release refused: round {exclusive_round}'s block of records was already "
                                          f"released ({', '.join(sorted(kinds))}); each block may be released once")
        try:
            after = epsilon_spent(self.recorded() + list(new), self.delta)
        except ValueError as exc:  # e.g. more disjoint releases than disjoint blocks
            raise BudgetExceededError(f"release refused: {exc}") from exc
        if not math.isinf(self.epsilon_budget) and after > self.epsilon_budget * (1 + BUDGET_RTOL):
            kinds = ", ".join(f"{r.count}x {r.kind} (K={r.batch} of n={r.n}, z={r.noise_multiplier:.4g})" for r in new)
            raise BudgetExceededError(
                f"privacy budget exceeded: budget epsilon={self.epsilon_budget:g} at delta={self.delta:.3g}, "
                f"spent {epsilon_spent(self.recorded(), self.delta):.4f}, this request ({kinds}) would bring it to {after:.4f}"
            )
        return after

    def record(self, new: list[Release], *, round_: int, extra: dict[str, Any] | None = None,
               exclusive: bool = False) -> float:
        """Check, then append ``new`` to the file (atomically, under the lock). Returns epsilon
        spent after. ``exclusive``: refuse if ``new``'s kind was already released in ``round_``."""
        return self.record_release(new, round_=round_, extra=extra, exclusive=exclusive)[0]

    def record_release(self, new: list[Release], *, round_: int, extra: dict[str, Any] | None = None,
                       exclusive: bool = False) -> tuple[float, int]:
        """:meth:`record`, also returning the release's sequence number: the number of rows the
        ledger held before it. Rows are only ever appended under the lock, so every release of
        this ledger gets its own number, whatever round the server says it is, even when
        several processes serve the silo; the silo keys its noise and batch draws to it
        (a release's randomness never repeats)."""
        with self._locked():
            self._reload()
            after = self._check_loaded(new, round_ if exclusive else None)
            seq = len(self.releases)
            stamp = time.time()
            for i, r in enumerate(new):
                row = _row(r) | {"round": int(round_), "seq": seq + i, "time": stamp}
                if extra:
                    row |= extra
                self.releases.append(row)
            self._save()
        return after, seq

    def set_calibration(self, calibration: dict[str, Any]) -> None:
        """Store the noise plan so a restarted silo keeps the same noise multiplier."""
        with self._locked():
            self._reload()
            self.calibration = dict(calibration)
            self._save()

    # -- persistence --------------------------------------------------------------------
    def _save(self) -> None:
        payload = {
            "version": LEDGER_VERSION,
            "epsilon_budget": _encode_float(self.epsilon_budget),
            "delta": self.delta,
            "calibration": self.calibration,
            "releases": self.releases,
        }
        write_json_atomically(self.path, payload, indent=1)


def _row(r: Release) -> dict[str, Any]:
    """A release as a ledger row; a Gaussian one without the binomial fields (unused there)."""
    row = asdict(r)
    if not r.binomial:
        for key in ("mechanism", "trials", "levels", "p", "dim"):
            row.pop(key)
    return row


def _encode_float(x: float) -> float | str:
    return "inf" if math.isinf(x) else x


def _decode_float(x: float | str) -> float:
    return math.inf if x == "inf" else float(x)
