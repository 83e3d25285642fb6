"""A restored backup does not reset a silo's lifetime budget (issue 34, section 3).

Against the real federation (ServerApp and ClientApp on the in-process grid, app/node_runtime.py's
silo, its ledger, and the server's witness store in its outputs-dir): a silo capped at epsilon 3
serves runs until it refuses; its operator then restores the state dir from a backup taken after
the first run. Before the witness, the silo answered 30 more releases (epsilon 4.21 really spent
against a cap of 3, its ledger reading 2.95) and ``python -m app.ledger verify`` said OK. Now it
refuses, in one line naming the recovery, and verify says why. The epsilon every test expects
comes from the accountant on the releases the silo made, never from the ledger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.refusal import LEDGER_REASON

from app.privacy.accounting import epsilon_spent
from app.privacy.ledger import LedgerError, PrivacyLedger, read_ledger
from app.privacy.ledger.chain import release_of_row
from app.privacy.ledger.witness import (WITNESS_FILE, WitnessStore, key_path_for, load_or_create_key, make_witness,
                                        parse_witness, verified, witness_problem)

CAP, DELTA = 3.0, 1e-5
CAPPED = {"epsilon-cap": CAP, "delta-cap": DELTA}
RUN = {"num-rounds": 5, "privacy.epsilon": 1.0, "privacy.delta": DELTA, "eval-every": 0}
NAME = "ledger-node-silo0.json"


class Node:
    """Runs of the real federation against one server outputs-dir (its witness store) and one
    silo state dir, counting what silo 0 released."""

    def __init__(self, tmp_path: Path, node_config: dict | None = None) -> None:
        self.tmp, self.node_config, self.run_id = tmp_path, dict(CAPPED) | (node_config or {}), 0
        self.released: list[dict] = []  # every release silo 0 made, across restores

    @property
    def ledger(self) -> Path:
        return self.tmp / "state" / NAME

    def _rows(self) -> list[dict]:
        if not self.ledger.exists():
            return []
        return read_ledger(self.ledger, self.node_config.get("ledger-key-file"))["releases"]

    def run(self) -> tuple[int, dict]:
        """One run; (releases silo 0 answered in it, its entry in summary.json)."""
        from tests.helpers import run

        self.run_id += 1
        before = self._rows()
        summary, rows, _ = run(self.tmp, RUN, node_config=self.node_config, run_id=self.run_id,
                               name=f"r{self.run_id}")
        after = self._rows()
        new = after[len(before):] if after[:len(before)] == before else after
        self.released += new
        return len(new), next(s for s in summary["silos"] if s.get("silo") == 0)

    def until_refused(self, most: int = 30) -> int:
        """Runs until silo 0 answers nothing; the releases it answered meanwhile."""
        total = 0
        for _ in range(most):
            n, _ = self.run()
            if n == 0:
                return total
            total += n
        raise AssertionError("silo 0 never refused")

    def real_epsilon(self) -> float:
        return epsilon_spent([release_of_row(r) for r in self.released], DELTA)


def _restore(tmp_path: Path, backup: Path) -> None:
    shutil.rmtree(tmp_path / "state")
    shutil.copytree(backup, tmp_path / "state")


def test_a_restored_state_dir_makes_a_capped_silo_refuse(tmp_path: Path, capsys, caplog) -> None:
    """Before the witness: 30 releases answered after the restore, epsilon 4.2074 spent against
    a cap of 3 (the ledger read 2.9527). Now: none, epsilon 2.9527, verify says why, and the
    documented recovery (adopt --accept-loss) records the witness it forgets."""
    from app.ledger import main

    node = Node(tmp_path)
    assert node.run()[0] == 5
    shutil.copytree(tmp_path / "state", tmp_path / "backup")  # the operator's backup after release 5
    served = 5 + node.until_refused()
    assert served == 35 and node.real_epsilon() <= CAP
    spent = node.real_epsilon()

    _restore(tmp_path, tmp_path / "backup")
    answered = node.until_refused()
    assert answered == 0  # before: 30
    assert node.real_epsilon() == pytest.approx(spent)  # before: 4.2074 against the cap of 3
    caplog.clear()
    _, silo0 = node.run()
    # the server reads the fixed reason (app/refusal.py); the detail is in the node's log
    assert silo0["error"] == LEDGER_REASON and "python -m app.ledger verify" in silo0["error"]
    assert "its witness records 36 entries (35 releases" in caplog.text

    capsys.readouterr()
    assert main(["verify", str(node.ledger)]) == 1  # before: OK
    out = capsys.readouterr().out.strip()
    assert "\n" not in out and "restored from an older backup" in out
    # the guardian's decision: adopt the backup, forgetting 30 releases, recorded with the witness
    assert main(["adopt", str(node.ledger), "--reason", "restored the backup of release 5"]) == 1
    assert "--accept-loss" in capsys.readouterr().err
    assert main(["adopt", str(node.ledger), "--reason", "restored the backup of release 5", "--accept-loss"]) == 0
    (adopted,) = read_ledger(node.ledger)["adoptions"]
    assert adopted["witness"]["releases"] == 35 and adopted["witness"]["eps_spent"] == pytest.approx(spent)
    assert node.run()[0] == 5  # the silo serves again, counting from what it adopted


@pytest.mark.parametrize("key_apart", [False, True])
def test_a_wiped_state_dir_with_its_marks_still_refuses(tmp_path: Path, key_apart: bool, caplog) -> None:
    """The state dir and the marks in it deleted (before: a fresh silo, the cap spent again).
    With the key in the state dir (the default) the server's witness no longer verifies; with
    the key apart (node config ledger-key-file) the witness names a ledger that is gone."""
    node = Node(tmp_path, {"ledger-key-file": str(tmp_path / "keys" / "ledger.key")} if key_apart else None)
    assert node.run()[0] == 5 and node.run()[0] == 5
    shutil.rmtree(tmp_path / "state")
    assert node.run()[0] == 0
    caplog.clear()
    _, silo0 = node.run()
    why = "another ledger" if key_apart else "does not verify"
    assert silo0["error"] == LEDGER_REASON and why in caplog.text


def test_a_second_witness_place_holds_when_the_server_withholds(tmp_path: Path, caplog) -> None:
    """Node config ledger-witness-dir (another volume): the server's store lost (or withheld),
    the state dir restored, the silo still refuses."""
    node = Node(tmp_path, {"ledger-witness-dir": str(tmp_path / "other-volume")})
    assert node.run()[0] == 5
    shutil.copytree(tmp_path / "state", tmp_path / "backup")
    assert node.run()[0] == 5
    assert (tmp_path / "other-volume" / f"{NAME}.witness").exists()
    (tmp_path / "out" / WITNESS_FILE).unlink()  # the server withholds
    _restore(tmp_path, tmp_path / "backup")
    caplog.clear()
    n, silo0 = node.run()
    assert n == 0 and silo0["error"] == LEDGER_REASON and "its witness records" in caplog.text


def test_adopt_needs_accept_loss_whenever_the_mark_cannot_vouch(tmp_path: Path, capsys) -> None:
    """An older copy of the ledger with its mark missing: before, adopt took it without
    --accept-loss (epsilon of 20 releases -> of 6). Now it is refused and the file is unchanged."""
    from app.ledger import main
    from app.privacy.accounting import Release
    from app.privacy.ledger import mark_path_for

    path = tmp_path / "state" / NAME
    ledger = PrivacyLedger.open(path, CAP, DELTA)
    ledger.set_calibration({"key": "plan", "noise_multiplier": 2.2})
    for r in range(20):
        ledger.record([Release("grad", 1000, 50, 2.2)], round_=r + 1)
    old = b"".join(path.read_bytes().splitlines(keepends=True)[:8])  # a copy at 6 releases
    path.write_bytes(old)
    mark_path_for(path).unlink()
    assert main(["adopt", str(path), "--reason", "mark lost"]) == 1
    assert "--accept-loss" in capsys.readouterr().err
    assert path.read_bytes() == old
    with pytest.raises(LedgerError, match="no high-water mark"):
        PrivacyLedger.open(path, CAP, DELTA)


# -- the witness's pure functions --------------------------------------------------------------------

def _w(key: bytes, **kw) -> str:
    fields = {"ledger": NAME, "ledger_id": "a" * 32, "entries": 10, "releases": 9, "eps_spent": 1.5,
              "head": "h10"} | kw
    return make_witness(key, **fields)


def _problem(text: str, key: bytes, **kw) -> str | None:
    heads = {k: f"h{k}" for k in range(1, 21)}
    state = {"ledger": NAME, "ledger_id": "a" * 32, "entries": 10, "head_at": heads.get, "adoptions": [],
             "eps_here": 1.5} | kw
    return witness_problem(text, key, **state)


def test_a_witness_is_checked_against_the_ledger_and_its_key(tmp_path: Path) -> None:
    key = load_or_create_key(key_path_for(tmp_path / NAME))
    assert oct((tmp_path / "ledger.key").stat().st_mode & 0o777) == "0o600"
    assert load_or_create_key(tmp_path / "ledger.key") == key  # created once
    text = _w(key)
    assert verified(key, text) is not None and verified(b"k" * 32, text) is None
    assert _problem(text, key) is None  # the ledger is where the witness says
    assert _problem(text, key, entries=15) is None  # or further
    assert "older backup" in _problem(text, key, entries=6)
    assert "another ledger" in _problem(text, key, ledger_id="b" * 32)
    assert "is missing" in _problem(text, key, ledger_id="", entries=0)
    assert "rewritten" in _problem(text, key, entries=15, head_at=lambda k: "x")
    assert "does not verify" in _problem(text, b"k" * 32)  # a lost key, or a forged witness
    forged = json.loads(text) | {"entries": 3}
    assert "does not verify" in _problem(json.dumps(forged), key)
    assert _problem(_w(key, ledger="ledger-run7-silo0.json"), key, entries=1) is None  # another ledger's
    assert _problem("not a witness", key) is None
    assert _problem(text, key, entries=6, adoptions=[{"reason": "restored"}]) is None  # adopted with --accept-loss
    later = _w(key, entries=12, epoch=1)  # made after that adoption: a backup from before it is behind
    assert "older backup" in _problem(later, key, entries=11, adoptions=[{"reason": "restored"}])


def test_the_server_keeps_the_latest_witness_per_node_and_ledger(tmp_path: Path) -> None:
    key = b"k" * 32
    store = WitnessStore(tmp_path / WITNESS_FILE)
    assert store.get(1000) == []
    assert store.put(1000, _w(key, entries=5)) and store.put(1000, _w(key, entries=6))
    assert not store.put(1000, "junk") and not store.put(1000, "x" * 5000)
    assert store.put(1001, _w(key, ledger="ledger-node-silo1.json"))  # another node: its own slot
    store.flush()
    again = WitnessStore(tmp_path / WITNESS_FILE)  # across runs
    assert [parse_witness(t)["entries"] for t in again.get(1000)] == [6]
    assert [parse_witness(t)["ledger"] for t in again.get(1001)] == ["ledger-node-silo1.json"]
