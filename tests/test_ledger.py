"""The silo's privacy ledger: persistence, refusal, concurrent writers."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from app.privacy.accounting import PlannedRelease, Release, calibrate_noise_multiplier, epsilon_spent
from app.privacy.ledger import BudgetExceededError, LedgerError, PrivacyLedger, read_ledger

N, DELTA, EPS = 100, 1e-4, 2.0


def _read_lines(path: Path) -> dict:
    """The version-3 file read with nothing but json: a header line, then one entry per line."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    header, entries = lines[0], lines[1:]
    assert header["ledger"] == 3
    return {"epsilon_budget": header["epsilon_budget"], "delta": header["delta"],
            "releases": [e["release"] for e in entries if "release" in e],
            "calibration": [e["calibration"] for e in entries if "calibration" in e]}


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
    data = _read_lines(path)
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


# -- the append-only file (issue 14) ----------------------------------------------------------

def test_a_release_is_one_append_and_one_fsync_not_a_rewrite(tmp_path: Path, monkeypatch) -> None:
    import os

    path = tmp_path / "ledger.json"
    z = _plan_z(5)
    ledger = PrivacyLedger.open(path, EPS, DELTA)
    ledger.set_calibration({"key": "k", "noise_multiplier": z})
    ledger.record([Release("grad", N, N, z)], round_=1)
    inode, before = path.stat().st_ino, path.read_bytes()
    calls = {"fsync": 0, "replace": 0, "rename": 0}
    for name in calls:
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda *a, _real=real, _name=name: (calls.__setitem__(_name, calls[_name] + 1),
                                                                         _real(*a))[1])
    ledger.record([Release("grad", N, N, z)], round_=2)
    assert calls == {"fsync": 1, "replace": 0, "rename": 0}
    after = path.read_bytes()
    assert path.stat().st_ino == inode and after.startswith(before)  # appended, nothing rewritten
    added = after[len(before):]
    assert added.count(b"\n") == 1 and added.endswith(b"\n")
    assert json.loads(added)["release"] | {"time": 0} == {"kind": "grad", "n": N, "batch": N, "noise_multiplier": z,
                                                           "count": 1, "disjoint": False, "round": 2, "seq": 1,
                                                           "time": 0}


def test_calibration_lines_last_one_wins_and_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, EPS, DELTA)
    ledger.set_calibration({"key": "a", "noise_multiplier": 1.0})
    ledger.record([Release("grad", N, N, 50.0)], round_=1)
    ledger.set_calibration({"key": "b", "noise_multiplier": 2.0})
    again = PrivacyLedger.open(path, EPS, DELTA)
    assert again.calibration == {"key": "b", "noise_multiplier": 2.0} and len(again.releases) == 1
    assert _read_lines(path)["calibration"] == [{"key": "a", "noise_multiplier": 1.0},
                                                {"key": "b", "noise_multiplier": 2.0}]
    assert read_ledger(path)["calibration"] == again.calibration


def _append_many(path: str, k: int, tag: str) -> list[int]:
    ledger = PrivacyLedger.open(path, 1e6, DELTA)
    return [ledger.record_release([Release("grad", N, N, 50.0)], round_=i, extra={"by": tag})[1] for i in range(k)]


def test_two_processes_appending_lose_no_row_and_never_share_a_seq(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.json")
    PrivacyLedger.open(path, 1e6, DELTA)
    with mp.get_context("fork").Pool(2) as pool:
        seqs = pool.starmap(_append_many, [(path, 40, "a"), (path, 40, "b")])
    rows = _read_lines(Path(path))["releases"]
    assert len(rows) == 80 and [r["seq"] for r in rows] == list(range(80))  # in file order, no gaps
    assert sorted(seqs[0] + seqs[1]) == list(range(80))  # each process was told its own numbers
    assert [r["seq"] for r in rows if r["by"] == "a"] == seqs[0]
    # a handle opened before the appends catches up by reading only what was added
    final = PrivacyLedger.open(path, 1e6, DELTA)
    assert final.spent() == pytest.approx(epsilon_spent([Release("grad", N, N, 50.0, 80)], DELTA))


def test_a_stale_handle_reads_what_others_appended_and_a_replaced_file_in_full(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    a = PrivacyLedger.open(path, 1e6, DELTA)
    b = PrivacyLedger.open(path, 1e6, DELTA)
    a.record([Release("grad", N, N, 50.0)], round_=1)
    b.record([Release("grad", N, N, 50.0)], round_=2)
    assert a.spent() == b.spent() and len(a.releases) == 2 and [r["seq"] for r in a.releases] == [0, 1]
    # another file put in its place (same size or not): a notices by its identity, re-reads it in
    # full and refuses it: it is not the ledger its high-water mark records (issue 23)
    other = tmp_path / "other.json"
    c = PrivacyLedger.open(other, 1e6, DELTA)
    for r in range(3):
        c.record([Release("grad", N, N, 40.0)], round_=r)
    other.replace(path)
    with pytest.raises(LedgerError, match="recreated or replaced"):
        a.spent()
    with pytest.raises(LedgerError, match="recreated or replaced"):
        a.record([Release("grad", N, N, 40.0)], round_=9)


def test_a_torn_last_line_is_cut_off_with_a_warning(tmp_path: Path, caplog) -> None:
    """A crash in the middle of an append leaves a line without its newline: that release's
    record_release never returned, so nothing was computed or sent from it."""
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, EPS, DELTA)
    z = _plan_z(4)
    ledger.record([Release("grad", N, N, z)], round_=1)
    good = path.read_bytes()
    with path.open("ab") as fh:
        fh.write(b'{"release":{"kind":"grad","n":100,"ba')
    assert read_ledger(path)["releases"] == _read_lines_prefix(good)  # a reader without the lock skips it
    with caplog.at_level("WARNING", logger="app.privacy.ledger"):
        again = PrivacyLedger.open(path, EPS, DELTA)
    assert "incomplete last line" in caplog.text
    assert path.read_bytes() == good and len(again.releases) == 1
    assert again.record_release([Release("grad", N, N, z)], round_=2)[1] == 1  # the next seq, on a clean line
    assert [r["seq"] for r in _read_lines(path)["releases"]] == [0, 1]


def _read_lines_prefix(data: bytes) -> list[dict]:
    return [json.loads(x)["release"] for x in data.splitlines()[1:] if b'"release"' in x]


@pytest.mark.parametrize("bad", [b"{not json}\n", b'{"other": 1}\n', b'{"release": {"kind": "g"}}\n', b"\n",
                                 b'{"release": {"kind": "g", "n": 10, "batch": 11, "noise_multiplier": 1}}\n'])
def test_a_corrupt_line_before_the_end_is_an_error(tmp_path: Path, bad: bytes) -> None:
    path = tmp_path / "ledger.json"
    PrivacyLedger.open(path, EPS, DELTA).record([Release("grad", N, N, 50.0)], round_=1)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + bad + lines[1])
    with pytest.raises(LedgerError, match="unreadable"):
        PrivacyLedger.open(path, EPS, DELTA)
    with pytest.raises(LedgerError, match="unreadable"):
        read_ledger(path)


def test_a_corrupt_line_appended_by_someone_else_is_an_error_for_an_open_handle(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, EPS, DELTA)
    with path.open("ab") as fh:
        fh.write(b"garbage\n")
    with pytest.raises(LedgerError, match="unreadable"):
        ledger.spent()
    with pytest.raises(LedgerError):
        ledger.record([Release("grad", N, N, 50.0)], round_=1)


#: a ledger as version 1 of this module wrote it (json.dumps(payload, indent=1), rewritten whole)
V1 = {"version": 1, "epsilon_budget": EPS, "delta": DELTA,
      "calibration": {"key": {"plan": [["grad", 100, 3, 1.0, False]], "n": 100}, "noise_multiplier": 7.5,
                      "block_seed": 12},
      "releases": [{"kind": "grad", "n": N, "batch": N, "noise_multiplier": 7.5, "count": 1, "disjoint": False,
                    "round": r, "seq": r - 1, "time": 1.5e9 + r} for r in (1, 2)]}


def test_a_version_1_ledger_is_read_and_converted(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(V1, indent=1))
    assert read_ledger(path) | {"version": 0} == {k: V1[k] for k in ("epsilon_budget", "delta", "calibration",
                                                                    "releases")} | {"version": 0}
    ledger = PrivacyLedger.open(path, EPS, DELTA)
    assert ledger.releases == V1["releases"] and ledger.calibration == V1["calibration"]
    assert ledger.spent() == pytest.approx(epsilon_spent([Release("grad", N, N, 7.5, 2)], DELTA))
    converted = _read_lines(path)  # now version 2, the same contents
    assert converted["releases"] == V1["releases"] and converted["calibration"] == [V1["calibration"]]
    assert ledger.record_release([Release("grad", N, N, 7.5)], round_=3)[1] == 2  # seq goes on
    assert not list(tmp_path.glob(".ledger-*"))  # no temporary file left behind


def test_a_version_1_ledger_for_another_budget_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text(json.dumps(V1, indent=1))
    with pytest.raises(LedgerError, match="written for budget"):
        PrivacyLedger.open(path, 2 * EPS, DELTA)
    assert json.loads(path.read_text()) == V1


def _record_then_crash(path: str, z: float) -> None:
    import os

    ledger = PrivacyLedger.open(path, EPS, DELTA)
    ledger.record([Release("grad", N, N, z)], round_=1)
    os._exit(0)  # killed after recording, before computing or replying


def test_a_crash_after_recording_only_over_counts(tmp_path: Path) -> None:
    """The release is on disk before anything is computed from it: a silo killed right after
    recording comes back having spent it (a lost reply costs budget; it never goes uncounted)."""
    path = str(tmp_path / "ledger.json")
    z = _plan_z(2)
    proc = mp.get_context("fork").Process(target=_record_then_crash, args=(path, z))
    proc.start()
    proc.join()
    restarted = PrivacyLedger.open(path, EPS, DELTA)
    assert len(restarted.releases) == 1
    assert restarted.spent() == pytest.approx(epsilon_spent([Release("grad", N, N, z)], DELTA))
    restarted.record([Release("grad", N, N, z)], round_=2)
    with pytest.raises(BudgetExceededError):  # the crashed release still counts against the budget
        restarted.record([Release("grad", N, N, z)], round_=3)


def test_ledger_benchmark_smoke(capsys) -> None:
    from scripts.bench import calibration_grid

    calibration_grid.main(["ledger", "--silos", "3", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "3 silos x 2 rounds = 6 releases" in out and "ms CPU" in out


def test_a_file_rewritten_in_place_is_read_again_in_full(tmp_path: Path) -> None:
    """Same inode, larger size, other contents (an operator restoring another copy over it with
    cp or an editor): a handle must not parse on from its old offset in the middle of a line or,
    worse, at a line boundary of a different history (missing rows = under-counting). It reads
    the file again in full, and refuses it: another ledger than its mark records (issue 23)."""
    path, other = tmp_path / "ledger.json", tmp_path / "other.json"
    a = PrivacyLedger.open(path, 1e6, DELTA)
    a.record([Release("grad", N, N, 50.0)], round_=1, extra={"time": 0.5})
    b = PrivacyLedger.open(other, 1e6, DELTA)
    for r in range(4):  # its first line as long as a's: a's old offset falls on a line boundary
        extra = {"time": 0.5} | ({"pad": "x" * r} if r else {})
        b.record([Release("grad", N, N, 30.0)], round_=max(r, 1), extra=extra)
    inode = path.stat().st_ino
    path.write_bytes(other.read_bytes())  # in place: same inode, more bytes
    assert path.stat().st_ino == inode
    with pytest.raises(LedgerError, match="recreated or replaced"):
        a.spent()
    assert [r["noise_multiplier"] for r in a.releases] == [50.0]  # nothing of the other history taken in
