"""Durable server state: the checkpoint file, and a run resumed after a crash of the server.

The reference for "resumed correctly" is independent of the checkpoint code: the same run
without the crash. A resumed run must end with the same model, the same rounds.jsonl (but the
wall times) and the same silo ledgers (no release charged twice)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Message

from app.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from app.results import load_rounds
from tests.helpers import run, without_wall


def test_a_checkpoint_round_trips_every_kind_of_state(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rng.random(3)
    state = {"model": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "none": None, "nan": math.nan,
             "inf": -math.inf, "ints": {3: 0.5, 7: 1.0}, "nodes": {11, 2}, "rows": [{"a": 1, "b": [1.5, "x"]}],
             "rng": rng, "flag": True}
    save_checkpoint(tmp_path / "c.npz", state)
    back = load_checkpoint(tmp_path / "c.npz")
    assert np.array_equal(back["model"]["w"], state["model"]["w"]) and back["model"]["w"].dtype == np.float32
    assert back["none"] is None and math.isnan(back["nan"]) and back["inf"] == -math.inf
    assert back["ints"] == {3: 0.5, 7: 1.0} and back["nodes"] == {2, 11} and back["rows"] == state["rows"]
    assert back["rng"].random() == rng.random()  # the generator continues where it was saved
    assert back["flag"] is True


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "c.npz"
    save_checkpoint(path, {"round": 1})
    monkeypatch.setattr("app.filelock.os.replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        save_checkpoint(path, {"round": 2})
    assert load_checkpoint(path)["round"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]  # no temporary file left behind


def test_a_checkpoint_refuses_to_load_what_is_not_one(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(tmp_path / "bad.npz")
    np.savez(tmp_path / "pickle.npz", x=np.array([object()], dtype=object))  # needs pickle to load
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "pickle.npz")


class ServerCrash(Exception):
    """What the hook raises: the ServerApp dies in the middle of a round."""


def _crash_in(round_: int):
    def hook(node: int, msg: Message, reply: Message) -> Message:
        if msg.metadata.message_type == "train" and int(msg.content["config"]["round"]) == round_:
            raise ServerCrash(f"server lost in round {round_}")
        return reply
    return hook


CASES = {
    "mbsgd": {"algorithm": "mbsgd"},
    "spider": {"algorithm": "spider", "spider.q": 2},  # h, h_at carried across rounds
    "plsvrg-random-output": {"algorithm": "plsvrg", "output": "random", "plsvrg.restarts": 2},  # the sampler
    "gradbant": {"algorithm": "robust", "privacy.mode": "off", "trust.size": 40, "attack.kind": "sign-flip",
                 "attack.fraction": 0.5},  # trust weights p
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_resumed_run_ends_where_the_uninterrupted_run_ends(tmp_path: Path, case: str) -> None:
    """Round 3 of 5 is lost after the first silo answered it (its release is on its ledger);
    the resumed run replays round 3 from the round-2 checkpoint: the first silo answers with the
    reply it already released (charged once), and the run ends bit-identical to one that never
    stopped."""
    cfg = CASES[case] | {"num-rounds": 5, "eval-every": 1}
    ref_summary, ref_rows, _ = run(tmp_path / "ref", cfg, run_id=1, name="r")
    with pytest.raises(ServerCrash):
        run(tmp_path / "cut", cfg, hook=_crash_in(3), run_id=1, name="r")
    cut = tmp_path / "cut" / "out" / "r"
    assert load_checkpoint(cut / "checkpoint.npz")["round"] == 2
    assert len(load_rounds(cut / "rounds.jsonl")) == 2
    summary, rows, _ = run(tmp_path / "cut", cfg | {"resume": True, "ledger-run-key": "run1"}, run_id=2, name="r")
    # the gradbant case learns in round 1 and then stalls (every score 0): run health stops it early
    # as completed (app/run_health.py Watch.learned), the same verdict either way
    assert summary["status"] == ref_summary["status"] and summary["resumed_after_round"] == 2
    assert summary["status"] == "completed"
    assert summary["health"]["evidence"].get("stopped_early", False) == ref_summary["health"]["evidence"].get(
        "stopped_early", False)
    assert without_wall(rows) == without_wall(ref_rows)
    final, ref_final = (load_checkpoint(p / "out" / "r" / "checkpoint.npz") for p in (tmp_path / "cut", tmp_path / "ref"))
    assert all(np.array_equal(final["model"][k], ref_final["model"][k]) for k in ref_final["model"])
    assert summary["test_error"] == ref_summary["test_error"]
    # the silos' ledgers: the same releases as the uninterrupted run's, none charged twice
    for silo, ref_silo in zip(summary["silos"], ref_summary["silos"], strict=True):
        assert silo["releases"] == ref_silo["releases"] and silo["eps_spent"] == ref_silo["eps_spent"]


def test_a_resume_with_other_settings_is_refused(tmp_path: Path) -> None:
    cfg = {"num-rounds": 3}
    with pytest.raises(ServerCrash):
        run(tmp_path, cfg, hook=_crash_in(2), run_id=1, name="r")
    with pytest.raises(CheckpointError, match="lr"):
        run(tmp_path, cfg | {"resume": True, "lr": 0.1}, run_id=2, name="r")
    with pytest.raises(CheckpointError, match="no checkpoint"):
        run(tmp_path, cfg | {"resume": True}, run_id=3, name="other")


def test_checkpoint_holds_the_settings_and_the_ledger_key_to_resume_with(tmp_path: Path) -> None:
    run(tmp_path, {"num-rounds": 2}, run_id=7, name="r")
    state = load_checkpoint(tmp_path / "out" / "r" / "checkpoint.npz")
    assert state["round"] == 2 and state["ledger_run_key"] == "run7" and state["run_name"] == "r"
    assert state["settings"]["num_rounds"] == 2
    json.dumps(state["settings"])  # plain JSON: the launcher reads it back for --resume


# -- every bad checkpoint: one CheckpointError naming what is wrong, before any round ------------------

def _corrupt_file(how: str):
    def corrupt(path: Path) -> None:
        data = path.read_bytes()
        if how == "truncated":
            path.write_bytes(data[: len(data) // 2])
        elif how == "empty":
            path.write_bytes(b"")
        elif how == "random bytes":
            path.write_bytes(np.random.default_rng(0).bytes(len(data)))
        elif how == "no tree":  # a valid .npz without the tree
            np.savez(path.with_suffix(".tmp.npz"), a0=np.zeros(3))
            path.with_suffix(".tmp.npz").replace(path)
    return corrupt


def _edit_state(edit):
    def corrupt(path: Path) -> None:
        state = load_checkpoint(path)
        edit(state)
        save_checkpoint(path, state)
    return corrupt


def _first_param(state: dict) -> str:
    return sorted(state["model"])[0]


CORRUPTIONS = {
    # how the file is damaged -> what the one-line reason must name
    "truncated": (_corrupt_file("truncated"), "unreadable"),
    "empty": (_corrupt_file("empty"), "empty"),
    "random bytes": (_corrupt_file("random bytes"), "unreadable"),
    "no tree": (_corrupt_file("no tree"), "__tree__"),
    "missing round": (_edit_state(lambda s: s.pop("round")), "no round"),
    "missing model": (_edit_state(lambda s: s.pop("model")), "no model"),
    "round 1e9": (_edit_state(lambda s: s.update(round=10**9)), r"round = 1000000000 is out of range"),
    "round -5": (_edit_state(lambda s: s.update(round=-5)), r"round = -5 is out of range"),
    "round 2.5": (_edit_state(lambda s: s.update(round=2.5)), "round = 2.5 is not an integer"),
    "NaN model": (_edit_state(lambda s: s["model"][_first_param(s)].__setitem__(..., np.nan)), "non-finite"),
    "wrong shape": (_edit_state(lambda s: s["model"].update({_first_param(s): np.zeros((3, 3), np.float32)})),
                    "has shape"),
    "float64 model": (_edit_state(lambda s: s.update(model={k: v.astype(np.float64) for k, v in s["model"].items()})),
                      "dtype float64"),
    "missing parameter": (_edit_state(lambda s: s["model"].pop(_first_param(s))), "missing"),
    "rows not a list": (_edit_state(lambda s: s.update(rows="x")), "rows"),
    "uploads NaN": (_edit_state(lambda s: s.update(uploads=math.nan)), "uploads"),
    "no settings": (_edit_state(lambda s: s.pop("settings")), "settings"),
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A real 2-round run's outputs (its checkpoint after round 2) and its run config."""
    tmp = tmp_path_factory.mktemp("ckpt")
    cfg = {"num-rounds": 2, "eval-every": 0}
    run(tmp, cfg, run_id=1, name="r")
    return tmp, cfg


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src / "out", dst / "out")
    shutil.copytree(src / "state", dst / "state")
    path = dst / "out" / "r" / "checkpoint.npz"
    state = load_checkpoint(path)  # the same run, moved: its outputs-dir is the new folder
    state["settings"]["outputs_dir"] = state["run_config"]["outputs-dir"] = str(dst / "out")
    save_checkpoint(path, state)
    return path


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_every_bad_checkpoint_is_refused_with_one_line_before_any_round(finished_run, tmp_path: Path,
                                                                         case: str) -> None:
    """The real ServerApp resumed from a damaged checkpoint: a CheckpointError naming what is
    wrong (never BadZipFile, EOFError, KeyError, AttributeError, nor a run that 'completes'
    without training), and no instruction sent to any silo."""
    src, cfg = finished_run
    corrupt, reason = CORRUPTIONS[case]
    corrupt(_copy_run(src, tmp_path))
    with pytest.raises(CheckpointError, match=reason) as info:
        run(tmp_path, cfg | {"resume": True, "ledger-run-key": "run1"}, run_id=2, name="r")
    assert "\n" not in str(info.value)
    assert [m for m in info.value.grid.sent if m.metadata.message_type == "train"] == []


def test_the_checkpoint_of_a_finished_run_passes_the_checks(finished_run, tmp_path: Path) -> None:
    """The reference: an undamaged checkpoint (round = num-rounds) resumes, and runs no round."""
    src, cfg = finished_run
    _copy_run(src, tmp_path)
    summary, rows, grid = run(tmp_path, cfg | {"resume": True, "ledger-run-key": "run1"}, run_id=2, name="r")
    assert summary["status"] == "completed" and summary["resumed_after_round"] == 2 and len(rows) == 2
    assert [m for m in grid.sent if m.metadata.message_type == "train"] == []


@pytest.mark.parametrize("case", ["truncated", "round 1e9", "round -5", "NaN model", "wrong shape"])
def test_the_launcher_exits_2_on_a_bad_checkpoint(finished_run, tmp_path: Path, case: str, no_flower,
                                                  capsys: pytest.CaptureFixture) -> None:
    from app import launch

    src, _ = finished_run
    CORRUPTIONS[case][0](_copy_run(src, tmp_path))
    code = launch.main(["--resume", "r", "--run-config", f'outputs-dir="{tmp_path / "out"}"'])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "cannot resume" in err and len(err.splitlines()) == 1, err


#: knobs that make each algorithm's state matter within 5 rounds (an algorithm not named here
#: runs with the defaults: every registered strategy is resumed, none is left out)
KNOBS = {
    "spider": {"spider.q": 2}, "spider-alt": {"batch-size": 64}, "svrg": {"svrg.inner-steps": 2},
    "plsvrg": {"svrg.inner-steps": 1, "plsvrg.restarts": 2, "output": "random"},
    "localsgd": {"local-steps": 2, "lr": 0.2},
    "robust": {"privacy.mode": "off", "trust.size": 40, "attack.kind": "sign-flip", "attack.fraction": 0.5,
               "aggregator": "gradbant"},  # 1 of WBCD's 2 silos (0.25 made none: refused since issue 35)
}
#: a rule with state (Grad-BANT's p) as the component of another optimiser
COMPOSED = {"spider+gradbant": {"algorithm": "spider", "spider.q": 2, "privacy.mode": "off", "trust.size": 40,
                                "aggregator": "gradbant", "attack.kind": "sign-flip", "attack.fraction": 0.5}}


def _registered() -> list[str]:
    from strategies import STRATEGIES

    assert set(KNOBS) <= set(STRATEGIES), sorted(set(KNOBS) - set(STRATEGIES))
    return sorted(STRATEGIES) + sorted(COMPOSED)


@pytest.mark.parametrize("algorithm", _registered())
def test_every_registered_strategy_resumes_where_it_would_have_gone(tmp_path: Path, algorithm: str) -> None:
    """Each strategy of the registry, checkpointed after round 2 and resumed from it, ends with
    the rows, model and ledgers of the run that never stopped."""
    cfg = {"algorithm": algorithm, "num-rounds": 5, "eval-every": 1} | KNOBS.get(algorithm, {}) | COMPOSED.get(algorithm, {})
    ref_summary, ref_rows, _ = run(tmp_path / "ref", cfg, run_id=1, name="r")
    with pytest.raises(ServerCrash):
        run(tmp_path / "cut", cfg, hook=_crash_in(3), run_id=1, name="r")
    state = load_checkpoint(tmp_path / "cut" / "out" / "r" / "checkpoint.npz")
    assert state["round"] == 2
    summary, rows, _ = run(tmp_path / "cut", cfg | {"resume": True, "ledger-run-key": "run1"}, run_id=2, name="r")
    assert summary["resumed_after_round"] == 2 and summary["status"] == ref_summary["status"]
    assert without_wall(rows) == without_wall(ref_rows)
    final, ref_final = (load_checkpoint(p / "out" / "r" / "checkpoint.npz") for p in (tmp_path / "cut", tmp_path / "ref"))
    assert all(np.array_equal(final["model"][k], ref_final["model"][k]) for k in ref_final["model"])
    assert final["optimizer"].keys() == ref_final["optimizer"].keys()
    for silo, ref_silo in zip(summary["silos"], ref_summary["silos"], strict=True):
        assert silo["releases"] == ref_silo["releases"] and silo["eps_spent"] == ref_silo["eps_spent"]
