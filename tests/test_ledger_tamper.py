"""A privacy ledger that loses data is noticed (issue 23, section 1).

Each tampering (a truncated file, a cut line, deleted rows, an edited noise multiplier, a deleted
or replaced file, an older copy restored) is scripted against the real ledger and against the
real silo path (the ServerApp and ClientApp on the in-process grid): the silo refuses with the
reason and writes nothing. What a crash leaves (a torn last line the high-water mark does not
record, a mark one entry behind) is repaired. The epsilon every test expects comes from the
accountant on the releases it made (app/privacy/accounting.py), never from the ledger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import pytest

from app.privacy.accounting import Release, epsilon_spent
from app.privacy.ledger import LedgerError, PrivacyLedger, read_ledger

N, K, Z, DELTA, BUDGET, ROWS = 1000, 50, 2.2, 1e-5, 3.0, 20
NAME = "ledger-node-silo0.json"


def _eps(k: int, z: float = Z) -> float:
    """The accountant's epsilon for k of the test's releases (the independent fact)."""
    return epsilon_spent([Release("grad", N, K, z, k)], DELTA) if k else 0.0


def _ledger(tmp_path: Path, rows: int = ROWS) -> Path:
    path = tmp_path / "state" / NAME
    ledger = PrivacyLedger.open(path, BUDGET, DELTA)
    ledger.set_calibration({"key": "plan", "noise_multiplier": Z})
    for r in range(rows):
        ledger.record([Release("grad", N, K, Z)], round_=r + 1)
    return path


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _keep(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def _cut_in_middle_line(path: Path) -> None:
    lines = _lines(path)
    path.write_bytes(b"".join(lines[:11]) + lines[11][:40])  # 10 releases and half of the 11th


def _edit_noise(path: Path) -> None:
    lines = _lines(path)
    assert b'"noise_multiplier":2.2' in lines[6]
    lines[6] = lines[6].replace(b'"noise_multiplier":2.2', b'"noise_multiplier":9.9')
    _keep(path, lines)


def _older_copy(path: Path) -> None:
    """An operator restores last week's backup (10 releases) over the ledger."""
    lines = _lines(path)
    _keep(path, lines[:12])


def _torn_recorded_row(path: Path) -> None:
    """The last line loses its end (a disk fault), though it was complete and the mark says so."""
    path.write_bytes(path.read_bytes()[:-25])


#: tampering -> what the refusal must say
TAMPERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated-to-its-header": (lambda p: _keep(p, _lines(p)[:1]), "entries were lost"),
    "cut-inside-a-middle-line": (_cut_in_middle_line, "entries were lost"),
    "middle-rows-deleted": (lambda p: _keep(p, _lines(p)[:6] + _lines(p)[11:]), "does not match its hash"),
    "noise-multiplier-edited": (_edit_noise, "does not match its hash"),
    "deleted-while-history-exists": (lambda p: p.unlink(), "is missing"),
    "older-copy-restored": (_older_copy, "entries were lost"),
    "torn-last-line-the-mark-records": (_torn_recorded_row, "last line is torn"),
}


@pytest.mark.parametrize("name", list(TAMPERS))
def test_a_tampered_ledger_is_refused_with_its_reason_and_left_alone(tmp_path: Path, name: str) -> None:
    """Before: each was accepted, and the next release charged against a smaller total
    (truncated to the header: epsilon 0.944 read as 0)."""
    path = _ledger(tmp_path)
    assert PrivacyLedger.open(path, BUDGET, DELTA).spent() == pytest.approx(_eps(ROWS))
    tamper, reason = TAMPERS[name]
    tamper(path)
    before = path.read_bytes() if path.exists() else None
    marks = {p: p.read_bytes() for p in (tmp_path / "state").rglob("*.mark")}
    with pytest.raises(LedgerError, match=reason) as err:
        PrivacyLedger.open(path, BUDGET, DELTA)
    assert "\n" not in str(err.value) and "python -m app.ledger verify" in str(err.value)
    assert (path.read_bytes() if path.exists() else None) == before  # nothing written, nothing "repaired"
    assert {p: p.read_bytes() for p in (tmp_path / "state").rglob("*.mark")} == marks


def _re_hash(path: Path, key: bytes | None) -> None:
    """Recompute every hash of the ledger at ``path`` (with ``key``: as its own key chains it)."""
    from app.privacy.ledger.chain import canonical, chain_hash, genesis

    lines = [json.loads(x) for x in _lines(path)]
    head = genesis(canonical(lines[0]), key)
    out = [canonical(lines[0]) + b"\n"]
    for entry in lines[1:]:
        body = {k: v for k, v in entry.items() if k != "hash"}
        head = chain_hash(head, canonical(body), key)
        out.append(canonical(body | {"hash": head}) + b"\n")
    path.write_bytes(b"".join(out))


def test_an_edit_re_hashed_into_a_valid_chain_still_differs_from_the_mark(tmp_path: Path) -> None:
    """Someone who edits a row and recomputes every hash after it (with the ledger key) gets a
    chain that holds, but not the head the mark recorded."""
    from app.privacy.ledger.witness import key_path_for, read_key

    path = _ledger(tmp_path)
    _edit_noise(path)
    _re_hash(path, read_key(key_path_for(path)))
    assert len(read_ledger(path)["releases"]) == ROWS  # the chain itself holds
    with pytest.raises(LedgerError, match="history was rewritten"):
        PrivacyLedger.open(path, BUDGET, DELTA)


@pytest.mark.parametrize("mark_too", [False, True])
def test_a_chain_rewritten_without_the_key_is_detected(tmp_path: Path, mark_too: bool) -> None:
    """Issue 34 section 3: a writer with access to the ledger (and its mark) but not to the key
    drops rows, re-hashes the chain with SHA-256 and (``mark_too``) writes a mark that matches:
    before the keyed chain the silo took the forged ledger (epsilon of 5 releases instead of 20);
    now every entry fails its hash."""
    from app.privacy.ledger import mark_path_for, read_mark, write_mark
    from app.privacy.ledger.chain import canonical, genesis

    path = _ledger(tmp_path)
    header = json.loads(_lines(path)[0])
    assert "key" in header  # the ledger is chained with the node's key
    _keep(path, _lines(path)[:7])  # the calibration and 5 releases left
    _re_hash(path, None)
    if mark_too:  # forge the mark the re-hashed chain would have
        lines = [json.loads(x) for x in _lines(path)]
        mark = read_mark(mark_path_for(path)) | {"entries": 6, "releases": 5, "head": lines[-1]["hash"],
                                                  "eps_spent": _eps(5), "gen": 999}
        write_mark(mark_path_for(path), mark, fresh=True)
        assert genesis(canonical(header)) != ""  # (unkeyed genesis, as the forger computed it)
    with pytest.raises(LedgerError, match="does not match its hash") as err:
        PrivacyLedger.open(path, BUDGET, DELTA)
    assert "\n" not in str(err.value)
    with pytest.raises(LedgerError, match="does not match its hash"):
        read_ledger(path)


def test_a_ledger_chained_before_keys_stays_readable_and_unkeyed(tmp_path: Path) -> None:
    """A version-3 ledger written before the key (no ``key`` in its header, SHA-256 chain) is
    read and appended to as it was; a new ledger beside it is keyed."""
    path = _ledger(tmp_path, rows=3)
    key_file = path.parent / "ledger.key"
    _unkey(path)
    key_file.unlink()
    ledger = PrivacyLedger.open(path, BUDGET, DELTA)
    assert ledger.spent() == pytest.approx(_eps(3))
    ledger.record([Release("grad", N, K, Z)], round_=9)
    assert "key" not in json.loads(_lines(path)[0]) and len(read_ledger(path)["releases"]) == 4
    assert PrivacyLedger.open(path, BUDGET, DELTA).spent() == pytest.approx(_eps(4))
    assert key_file.exists() and oct(key_file.stat().st_mode & 0o777) == "0o600"


def _unkey(path: Path) -> None:
    """The ledger at ``path`` as it was written before keys: no ``key`` in its header, a SHA-256
    chain, and a mark that records that chain."""
    from app.privacy.ledger import mark_path_for, read_mark, write_mark

    lines = [json.loads(x) for x in _lines(path)]
    del lines[0]["key"]
    path.write_bytes(b"".join(json.dumps(x, sort_keys=True, separators=(",", ":")).encode() + b"\n" for x in lines))
    _re_hash(path, None)
    mark = read_mark(mark_path_for(path)) | {"head": json.loads(_lines(path)[-1])["hash"]}
    write_mark(mark_path_for(path), mark, fresh=True)


def test_a_torn_last_line_the_mark_does_not_record_is_dropped(tmp_path: Path, caplog) -> None:
    """A crash in the middle of an append (before the mark's write): the release never
    returned, nothing was computed from it; the line is cut off and the ledger goes on."""
    path = _ledger(tmp_path)
    good = path.read_bytes()
    with path.open("ab") as fh:
        fh.write(b'{"hash":"00","release":{"batch":50,"count":1,"kind":"gr')
    with caplog.at_level("WARNING", logger="app.privacy.ledger"):
        again = PrivacyLedger.open(path, BUDGET, DELTA)
    assert "incomplete last line" in caplog.text
    assert path.read_bytes() == good and again.spent() == pytest.approx(_eps(ROWS))
    assert again.record_release([Release("grad", N, K, Z)], round_=99)[1] == ROWS  # the next seq, chained on


def test_a_mark_behind_the_file_is_rolled_forward(tmp_path: Path, caplog) -> None:
    """A crash between the row's append (fsynced) and the mark's write leaves the mark one entry
    behind; a power loss before the kernel wrote the mark, several. The rows beyond it chain from
    its head and record more spending, not less: the mark is moved forward."""
    from app.privacy.ledger import mark_path_for, read_mark

    path = _ledger(tmp_path, rows=ROWS - 3)
    mark = mark_path_for(path)
    saved = mark.read_bytes()
    ledger = PrivacyLedger.open(path, BUDGET, DELTA)
    for r in range(3):
        ledger.record([Release("grad", N, K, Z)], round_=100 + r)
    mark.write_bytes(saved)  # the mark as it was three releases ago
    assert read_mark(mark)["releases"] == ROWS - 3
    with caplog.at_level("WARNING", logger="app.privacy.ledger"):
        again = PrivacyLedger.open(path, BUDGET, DELTA)
    assert "behind the file" in caplog.text
    assert again.spent() == pytest.approx(_eps(ROWS))
    assert read_mark(mark)["releases"] == ROWS and read_mark(mark)["eps_spent"] == pytest.approx(_eps(ROWS))


def test_the_mark_lives_where_the_node_config_says(tmp_path: Path) -> None:
    from app.privacy.ledger import read_mark

    path = tmp_path / "state" / NAME
    ledger = PrivacyLedger.open(path, BUDGET, DELTA, mark_dir=tmp_path / "other-volume")
    ledger.record([Release("grad", N, K, Z)], round_=1)
    assert read_mark(tmp_path / "other-volume" / f"{NAME}.mark")["releases"] == 1
    assert not (tmp_path / "state" / "ledger-marks").exists()
    # a node that forgets its mark dir (its default then) finds no mark for a ledger with history
    with pytest.raises(LedgerError, match="no high-water mark"):
        PrivacyLedger.open(path, BUDGET, DELTA)


def test_a_ledger_replaced_by_a_new_one_is_refused(tmp_path: Path) -> None:
    """The ledger deleted and created again (an empty, valid ledger with another id)."""
    path = _ledger(tmp_path, rows=3)
    (tmp_path / "b" / "state").mkdir(parents=True)
    shutil.copy(path.parent / "ledger.key", tmp_path / "b" / "state")  # on the same node: the same key
    other = _ledger(tmp_path / "b", rows=0)
    shutil.copy(other, path)
    with pytest.raises(LedgerError, match="recreated or replaced"):
        PrivacyLedger.open(path, BUDGET, DELTA)


def test_a_running_handle_notices_the_file_changing_under_it(tmp_path: Path) -> None:
    """A silo process keeps its handle open across rounds: an in-place edit of the same size, a
    truncation and a replacement are all noticed before the next release."""
    path = _ledger(tmp_path, rows=ROWS)
    handle = PrivacyLedger.open(path, BUDGET, DELTA)
    good = path.read_bytes()
    with path.open("r+b") as fh:  # the same inode, the same size, one byte changed
        fh.write(good.replace(b'"noise_multiplier":2.2', b'"noise_multiplier":9.9', 1))
    with pytest.raises(LedgerError, match="does not match its hash"):
        handle.record([Release("grad", N, K, Z)], round_=99)
    path.write_bytes(good)
    assert handle.spent() == pytest.approx(_eps(ROWS))  # the file back as it was: usable again
    _keep(path, _lines(path)[:5])
    with pytest.raises(LedgerError, match="entries were lost"):
        handle.record([Release("grad", N, K, Z)], round_=99)
    assert len(_lines(path)) == 5


# -- the legacy format --------------------------------------------------------------------------

def _v2(path: Path, seqs: list[int]) -> None:
    """A version-2 ledger as the previous module wrote it (no hashes, no mark)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"ledger": 2, "epsilon_budget": BUDGET, "delta": DELTA},
             {"calibration": {"key": "plan", "noise_multiplier": Z}}]
    lines += [{"release": {"kind": "grad", "n": N, "batch": K, "noise_multiplier": Z, "count": 1, "disjoint": False,
                           "round": s + 1, "seq": s, "time": 1.7e9 + s}} for s in seqs]
    path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))


def test_a_version_2_ledger_is_adopted_once_and_protected_from_then_on(tmp_path: Path, caplog) -> None:
    path = tmp_path / "state" / NAME
    _v2(path, list(range(5)))
    with caplog.at_level("WARNING", logger="app.privacy.ledger"):
        ledger = PrivacyLedger.open(path, BUDGET, DELTA)
    assert "converting version 2" in caplog.text
    assert ledger.spent() == pytest.approx(_eps(5)) and [r["seq"] for r in ledger.releases] == list(range(5))
    data = read_ledger(path)
    assert data["version"] == 3 and data["calibration"] == {"key": "plan", "noise_multiplier": Z}
    assert [a["from_version"] for a in data["adoptions"]] == [2]
    ledger.record([Release("grad", N, K, Z)], round_=6)
    _keep(path, _lines(path)[:1])  # from now on, a loss is noticed
    with pytest.raises(LedgerError, match="entries were lost"):
        PrivacyLedger.open(path, BUDGET, DELTA)


def test_a_version_2_ledger_next_to_a_mark_or_with_gaps_is_refused(tmp_path: Path) -> None:
    path = _ledger(tmp_path, rows=3)
    _v2(path, list(range(2)))  # an old copy put in the chained ledger's place
    with pytest.raises(LedgerError, match="old version-2 format"):
        PrivacyLedger.open(path, BUDGET, DELTA)
    gap = tmp_path / "gap" / NAME
    _v2(gap, [0, 1, 4, 5])  # rows 2 and 3 deleted before the upgrade
    with pytest.raises(LedgerError, match="gaps in its sequence numbers"):
        PrivacyLedger.open(gap, BUDGET, DELTA)


# -- the operator's tools: python -m app.ledger verify | show | adopt ----------------------------

def test_verify_show_and_the_documented_recovery_of_a_restored_backup(tmp_path: Path, capsys) -> None:
    from app.ledger import main
    from app.privacy.ledger import read_mark, mark_path_for

    path = _ledger(tmp_path)
    state = str(tmp_path / "state")
    assert main(["verify", state]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK {path}: {ROWS} releases, epsilon {_eps(ROWS):.4f}")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("grad x1") == ROWS and f"epsilon spent {_eps(ROWS):.4f}" in out

    _older_copy(path)  # the disk died; last week's backup (10 releases) is restored
    assert main(["verify", state]) == 1
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and "entries were lost" in out and f"epsilon {_eps(ROWS):.4g}" in out
    # adopting it forgets spending: refused without --accept-loss, and without a reason
    assert main(["adopt", str(path), "--reason", "restored from backup 2026-11-25"]) == 1
    assert "--accept-loss" in capsys.readouterr().err
    assert main(["adopt", str(path), "--reason", " ", "--accept-loss"]) == 1
    assert main(["adopt", str(path), "--reason", "restored from backup 2026-11-25", "--accept-loss"]) == 0
    capsys.readouterr()
    assert main(["verify", state]) == 0
    ledger = PrivacyLedger.open(path, BUDGET, DELTA)
    assert ledger.spent() == pytest.approx(_eps(10))
    (adopted,) = ledger.adoptions  # the decision and what was lost stay in the chain
    assert adopted["reason"] == "restored from backup 2026-11-25" and adopted["accept_loss"]
    assert adopted["mark"]["releases"] == ROWS and adopted["mark"]["eps_spent"] == pytest.approx(_eps(ROWS))
    assert read_mark(mark_path_for(path))["releases"] == 10
    assert main(["show", str(path)]) == 0
    assert f"the mark had recorded {ROWS} releases" in capsys.readouterr().out


def test_a_lost_mark_is_adopted_with_a_reason_and_a_deleted_ledger_is_reported(tmp_path: Path, capsys) -> None:
    from app.ledger import main
    from app.privacy.ledger import mark_path_for

    path = _ledger(tmp_path, rows=4)
    mark_path_for(path).unlink()
    assert main(["verify", str(path)]) == 1
    assert "no high-water mark" in capsys.readouterr().out
    # nothing vouches for the ledger being the whole record (issue 34): adopting it takes --accept-loss
    assert main(["adopt", str(path), "--reason", "mark volume replaced"]) == 1
    assert "--accept-loss" in capsys.readouterr().err
    assert main(["adopt", str(path), "--reason", "mark volume replaced", "--accept-loss"]) == 0
    assert PrivacyLedger.open(path, BUDGET, DELTA).spent() == pytest.approx(_eps(4))
    capsys.readouterr()
    path.unlink()  # verify of the state dir still finds it through its mark
    assert main(["verify", str(tmp_path / "state")]) == 1
    assert "is missing but its high-water mark" in capsys.readouterr().out
    assert main(["adopt", str(path), "--reason", "x", "--accept-loss"]) == 1  # restore it first
    assert main(["verify", str(tmp_path / "typo.json")]) == 1  # a path with nothing there is no "OK"


# -- the real silo path -------------------------------------------------------------------------

CAPPED = {"epsilon-cap": 3.0, "delta-cap": 1e-5}
RUN = {"num-rounds": 3, "privacy.epsilon": 1.0, "privacy.delta": 1e-5, "eval-every": 0}


@pytest.fixture(scope="module")
def served_state(tmp_path_factory) -> Path:
    """Two silos (node-scope lifetime ledgers) after a 3-round federation."""
    from tests.helpers import run

    where = tmp_path_factory.mktemp("served")
    _, rows, _ = run(where, RUN, node_config=CAPPED, run_id=1, name="a")
    assert [r["answered"] for r in rows] == [2, 2, 2]
    return where / "state"


SILO_TAMPERS = ["truncated-to-its-header", "cut-inside-a-middle-line", "middle-rows-deleted", "noise-multiplier-edited",
                "deleted-while-history-exists", "torn-last-line-the-mark-records"]


def _silo_tamper(name: str, path: Path) -> None:
    if name == "cut-inside-a-middle-line":
        lines = _lines(path)
        path.write_bytes(b"".join(lines[:3]) + lines[3][:40])
    elif name == "middle-rows-deleted":
        _keep(path, _lines(path)[:2] + _lines(path)[3:])
    elif name == "noise-multiplier-edited":
        lines = _lines(path)
        row = json.loads(lines[2])["release"]
        z = json.dumps(row["noise_multiplier"])
        edited = lines[2].replace(f'"noise_multiplier":{z}'.encode(), f'"noise_multiplier":{float(z) * 2}'.encode())
        assert edited != lines[2]
        _keep(path, lines[:2] + [edited] + lines[3:])
    else:
        TAMPERS[name][0](path)


@pytest.mark.parametrize("name", SILO_TAMPERS)
def test_a_silo_with_a_tampered_ledger_refuses_to_train_and_writes_nothing(tmp_path: Path, served_state: Path,
                                                                           name: str) -> None:
    """The next run on the node: before, silo 0 trained on (a ledger truncated to its header
    read as epsilon 0, the run's releases charged against a fresh budget)."""
    from tests.helpers import run

    shutil.copytree(served_state, tmp_path / "state")
    ledger = tmp_path / "state" / NAME
    _silo_tamper(name, ledger)
    before = {p: p.read_bytes() for p in (tmp_path / "state").rglob("*") if p.is_file() and "silo0" in p.name}
    summary, rows, _ = run(tmp_path, {**RUN, "num-rounds": 1}, node_config=CAPPED, run_id=2, name="b")
    assert [r["refused"] for r in rows] == [1] and [r["answered"] for r in rows] == [1]  # silo 1 is fine
    silo0 = next(s for s in summary["silos"] if s.get("silo") == 0)
    assert "privacy ledger" in silo0["error"] and "python -m app.ledger verify" in silo0["error"]
    after = {p: p.read_bytes() for p in (tmp_path / "state").rglob("*") if p.is_file() and "silo0" in p.name}
    assert after == before


def test_a_silo_serving_a_run_refuses_once_its_ledger_is_cut(tmp_path: Path) -> None:
    """The ledger is cut while a warm process serves the silo: its next instruction is refused
    (a refusal reply, not a client error)."""
    from tests.helpers import run

    run(tmp_path, RUN, node_config=CAPPED, run_id=7, name="a")
    ledger = tmp_path / "state" / NAME
    _keep(ledger, _lines(ledger)[:1])
    summary, rows, _ = run(tmp_path, {**RUN, "num-rounds": 1, "seed": 5}, node_config=CAPPED, run_id=7, name="b")
    assert not summary["client_errors"] and [r["refused"] for r in rows] == [1]
    assert len(_lines(ledger)) == 1


def test_a_torn_last_line_left_by_a_crash_does_not_stop_the_silo(tmp_path: Path, served_state: Path) -> None:
    from tests.helpers import run

    shutil.copytree(served_state, tmp_path / "state")
    ledger = tmp_path / "state" / NAME
    with ledger.open("ab") as fh:
        fh.write(b'{"hash":"ab","release":{"ba')
    _, rows, _ = run(tmp_path, {**RUN, "num-rounds": 1}, node_config=CAPPED, run_id=2, name="b")
    assert [r["answered"] for r in rows] == [2]
    assert len(read_ledger(ledger)["releases"]) == 4


def test_the_append_benchmark_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
    import ledger_append

    rows = ledger_append.main(["--releases", "6", "--dir", str(tmp_path)])
    assert {r["scheme"] for r in rows} >= {"append+fsync (before)", "chained, mark in place (now)", "sqlite WAL FULL",
                                          "record_release, mark in place"}
    assert all(r["median_ms"] > 0 for r in rows) and "median ms" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []  # it cleans up


def test_a_torn_mark_slot_falls_back_to_the_other_and_two_are_refused(tmp_path: Path) -> None:
    """A power loss in the middle of the mark's in-place write spoils at most the slot being
    written: the other (one entry older) is read and moved forward. Both spoiled: refused."""
    from app.privacy.ledger import MARK_STRIDE, mark_path_for, read_mark

    path = _ledger(tmp_path, rows=5)
    mark = mark_path_for(path)
    newest = read_mark(mark)["gen"] % 2
    with mark.open("r+b") as fh:
        fh.seek(newest * MARK_STRIDE + 30)
        fh.write(b"\x00" * 40)
    assert read_mark(mark)["releases"] == 4
    assert PrivacyLedger.open(path, BUDGET, DELTA).spent() == pytest.approx(_eps(5))
    assert read_mark(mark)["releases"] == 5
    mark.write_bytes(b"\x00" * 2 * MARK_STRIDE)
    with pytest.raises(LedgerError, match="high-water mark .* is unreadable"):
        PrivacyLedger.open(path, BUDGET, DELTA)


def _append_many(path: str, k: int) -> None:
    ledger = PrivacyLedger.open(path, 1e6, DELTA)
    for i in range(k):
        ledger.record([Release("grad", N, K, Z)], round_=i)


def test_two_processes_appending_leave_the_mark_on_the_last_entry(tmp_path: Path) -> None:
    import multiprocessing as mp

    from app.privacy.ledger import inspect, mark_path_for, read_mark

    path = tmp_path / NAME
    PrivacyLedger.open(path, 1e6, DELTA)
    with mp.get_context("fork").Pool(2) as pool:
        pool.starmap(_append_many, [(str(path), 30), (str(path), 30)])
    insp = inspect(path, mark_path_for(path))
    assert insp.problem is None and insp.action == "ok" and len(insp.releases) == 60
    assert read_mark(mark_path_for(path))["releases"] == 60 and read_mark(mark_path_for(path))["head"] == insp.head


def test_an_old_format_copy_put_back_is_adopted_only_with_accept_loss(tmp_path: Path, capsys) -> None:
    from app.ledger import main

    path = _ledger(tmp_path, rows=6)
    _v2(path, list(range(3)))  # last month's copy, from before the upgrade
    assert main(["adopt", str(path), "--reason", "old copy"]) == 1
    assert "old version-2 format" in capsys.readouterr().err
    assert main(["adopt", str(path), "--reason", "the only copy left", "--accept-loss"]) == 0
    ledger = PrivacyLedger.open(path, BUDGET, DELTA)
    assert ledger.spent() == pytest.approx(_eps(3))
    assert ledger.adoptions[-1]["from_version"] == 2 and ledger.adoptions[-1]["mark"]["releases"] == 6


def test_an_adopted_loss_is_in_the_run_summary(tmp_path: Path, served_state: Path) -> None:
    """After `adopt --accept-loss` the silo trains again, and summary.json says what its ledger
    forgot (the mark's releases and epsilon), next to the epsilon it counts now."""
    from app.ledger import main
    from tests.helpers import run

    shutil.copytree(served_state, tmp_path / "state")
    ledger = tmp_path / "state" / NAME
    _keep(ledger, _lines(ledger)[:3])  # an old copy: the calibration and the first release
    assert main(["adopt", str(ledger), "--reason", "restored", "--accept-loss"]) == 0
    summary, rows, _ = run(tmp_path, {**RUN, "num-rounds": 1}, node_config=CAPPED, run_id=2, name="b")
    assert [r["answered"] for r in rows] == [2]
    silo0 = next(s for s in summary["silos"] if s.get("silo") == 0)
    (adopted,) = silo0["ledger_adoptions"]
    assert adopted["accept_loss"] and adopted["mark"]["releases"] == 3 and adopted["ledger"]["releases"] == 1
    assert "reason" not in adopted  # the operator's words stay on the node
    assert "ledger_adoptions" not in next(s for s in summary["silos"] if s.get("silo") == 1)
