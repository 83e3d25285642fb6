"""End-to-end: real `flwr run` against the local SuperLink in simulation mode, through the
launcher that the README's `make run` uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


def launch(tmp_path: Path, run_config: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "outputs"
    cfg = f'{run_config} outputs-dir="{out}" run-name="e2e"'
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run([sys.executable, "-m", "app.launch", "--run-config", cfg, *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc, out / "e2e"


def test_flwr_run_two_silos_three_rounds(tmp_path: Path) -> None:
    proc, out = launch(tmp_path, "num-rounds=3 privacy.epsilon=3.0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "status finished:completed" in proc.stdout
    assert proc.stdout.count("[silofl] round ") == 3
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == 3 and summary["status"] == "completed"
    majority_error = 42 / 114  # WBCD test split: predicting "benign" always
    assert summary["test_error"] < majority_error
    assert len(summary["silos"]) == 2 and all(s["eps_spent"] <= 3.0 for s in summary["silos"])


def test_failing_clientapp_makes_the_command_fail(tmp_path: Path) -> None:
    """Silos cannot load their data (the pre-flight check is skipped on purpose): every silo
    refuses with the reason (no crash), the ServerApp fails the run naming it, and the launcher
    exits 1."""
    proc, out = launch(tmp_path, f'num-rounds=2 dataset="fashion-mnist" data-dir="{tmp_path / "nowhere"}" '
                                 'model="logistic" partition="iid"', "--no-preflight")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "finished:failed" in proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["dropped"]["refused"] > 0
    assert "fashion-mnist: missing train-images-idx3-ubyte" in summary["status_reason"]


def test_flwr_run_srht_half_learns(tmp_path: Path) -> None:
    """Real `flwr run` with SRHT at k/n = 0.5: each silo compresses its noised update with the seed
    the server broadcasts, the server lifts it, and the model still learns."""
    proc, out = launch(tmp_path, 'num-rounds=10 privacy.epsilon=3.0 sketch.kind="srht" sketch.ratio=0.5')
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "completed" and summary["dropped"]["malformed"] == 0
    assert all(r["uplink_floats"] == 2 * 84 for r in rounds)  # k = 84 of n = 167 floats per silo
    assert summary["test_error"] < 0.15


def test_flwr_run_shuffle_mode_the_server_holds_no_plaintext(tmp_path: Path) -> None:
    """Real `flwr run` in shuffle mode (3 silos + the shuffler node) with ``transcript=true``:
    every message the ServerApp received is on disk. From the silos it got only sealed bytes
    (none is a count vector, none opens without the shuffler's key) and float evaluation
    replies; integer totals came only from the shuffler."""
    import numpy as np

    from app.privacy.contribution import Contribution, ContributionError
    from app.privacy.envelope import EnvelopeError, StaticKeys, open_sealed

    proc, out = launch(tmp_path, 'num-rounds=3 privacy.mode="shuffle" model="logistic" partition="iid" num-silos=3 '
                                 'silos-per-round=3 privacy.delta=1e-5 transcript=true')
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "completed" and all(r["answered"] == 3 for r in rounds)
    entries = [json.loads(x) for x in (out / "transcript" / "index.jsonl").read_text().splitlines()]
    shuffler = {e["node"] for e in entries if e.get("config_records", {}).get("keys", {}).get("role") == "shuffler"}
    assert len(shuffler) == 1
    sealed = totals = 0
    for e in entries:
        arrays = np.load(out / "transcript" / e["file"])
        for name in arrays.files:
            arr = arrays[name]
            if e["node"] in shuffler:
                assert name == "shuffle/totals" and arr.dtype == np.int64
                totals += 1
                continue
            if name == "sealed/sealed":
                sealed += 1
                with pytest.raises(ContributionError):
                    Contribution.decode(arr.tobytes(), 62, 32)
                with pytest.raises(EnvelopeError):
                    open_sealed(StaticKeys.generate(), arr.tobytes(), b"", None)
            else:
                assert arr.dtype.kind == "f", (e["type"], name, arr.dtype)
    assert sealed == 3 * 3 and totals == 3


def test_flwr_run_secagg_mode_the_server_holds_only_masked_vectors(tmp_path: Path) -> None:
    """Real `flwr run` in secagg mode (4 silos, the four SecAgg+ rounds of every exchange through
    Flower's engine) with ``transcript=true``: from the silos the server got only protocol blobs
    (uint8) and masked vectors (uint16 at 16 bits), and float replies only to the open evaluation."""
    import numpy as np

    proc, out = launch(tmp_path, 'num-rounds=3 privacy.mode="secagg" model="logistic" partition="iid" num-silos=4 '
                                 'silos-per-round=4 privacy.delta=1e-5 transcript=true')
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "completed" and all(r["answered"] == 4 for r in rounds), rounds
    assert summary["test_error"] < 42 / 114
    entries = [json.loads(x) for x in (out / "transcript" / "index.jsonl").read_text().splitlines()]
    masked = 0
    for e in entries:
        arrays = np.load(out / "transcript" / e["file"])
        for name in arrays.files:
            arr = arrays[name]
            if name == "secagg-masked/secagg-masked":
                masked += 1
                assert arr.dtype == np.uint16
            elif "evaluat" not in e["type"]:
                assert arr.dtype == np.uint8, (e["type"], name, arr.dtype)
    assert masked == 3 * 4
    assert all(s["releases"][0]["mechanism"] == "skellam" and s["eps_spent"] <= 3.0 for s in summary["silos"])
