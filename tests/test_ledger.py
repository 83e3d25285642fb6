"""The silo's privacy ledger: persistence, refusal, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from app.privacy.accounting import PlannedRelease, Release, calibrate_noise_multiplier, epsilon_spent
from app.privacy.ledger import BudgetExceededError, LedgerError, PrivacyLedger

N, DELTA, EPS = 100, 1e-4, 2.0


def _plan_z(rounds: int) -> float:
    return calibrate_noise_multiplier([PlannedRelease("grad", N, N, rounds)], EPS, DELTA)


def test_ledger_survives_restart_and_refuses_over_budget(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    z = _plan_z(3)
    ledger = PrivacyLedger.open(path, EPS, DELTA)
    for r in (1, 2):
        ledger.record([Release("grad", N, N, z)], round_=r)
    spent_before = ledger.spent()

    restarted = PrivacyLedger.open(path, EPS, DELTA)  # a new process reading the file
    assert len(restarted.releases) == 2
    assert restarted.spent() == pytest.approx(spent_before)
    restarted.record([Release("grad", N, N, z)], round_=3)
    assert restarted.spent() <= EPS
    with pytest.raises(BudgetExceededError) as err:
        restarted.record([Release("grad", N, N, z)], round_=4)
    assert "budget epsilon=2" in str(err.value) and "would bring it to" in str(err.value)
    # the refusal recorded nothing, and the file recomputes to the same epsilon independently
    data = json.loads(path.read_text())
    assert len(data["releases"]) == 3
    recomputed = epsilon_spent([Release(r["kind"], r["n"], r["batch"], r["noise_multiplier"]) for r in data["releases"]],
                               data["delta"])
    assert recomputed == pytest.approx(restarted.spent()) and recomputed <= EPS


def test_stale_copies_do_not_lose_releases(tmp_path: Path) -> None:
    """Two handles on one ledger (two worker processes serving one silo) must both see every release."""
    path = tmp_path / "ledger.json"
    z = _plan_z(2)
    a = PrivacyLedger.open(path, EPS, DELTA)
    b = PrivacyLedger.open(path, EPS, DELTA)
    a.record([Release("grad", N, N, z)], round_=1)
    b.record([Release("grad", N, N, z)], round_=2)  # b's in-memory copy was stale
    with pytest.raises(BudgetExceededError):
        a.record([Release("grad", N, N, z)], round_=3)
    assert len(PrivacyLedger.open(path, EPS, DELTA).releases) == 2


def _spend(path: str, z: float, k: int) -> int:
    ledger = PrivacyLedger.open(path, EPS, DELTA)
    ok = 0
    for i in range(k):
        try:
            ledger.record([Release("grad", N, N, z)], round_=i)
            ok += 1
        except BudgetExceededError:
            pass
    return ok


def test_concurrent_processes_never_exceed_budget(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.json")
    z = _plan_z(10)
    PrivacyLedger.open(path, EPS, DELTA)
    with mp.get_context("fork").Pool(2) as pool:
        accepted = sum(pool.starmap(_spend, [(path, z, 8), (path, z, 8)]))
    assert accepted == 10
    final = PrivacyLedger.open(path, EPS, DELTA)
    assert len(final.releases) == 10 and final.spent() <= EPS


def test_budget_mismatch_and_corrupt_file_are_errors(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    PrivacyLedger.open(path, EPS, DELTA)
    with pytest.raises(LedgerError, match="written for budget"):
        PrivacyLedger.open(path, 2 * EPS, DELTA)
    path.write_text("{not json")
    with pytest.raises(LedgerError, match="unreadable"):
        PrivacyLedger.open(path, EPS, DELTA)
