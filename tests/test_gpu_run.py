"""scripts/bench/gpu_run.sh on the CPU (``--device cpu --small``): the GPU run's path end to end
with small sizes. To stay under 90 s on two busy cores it runs one of the two federations,
Grad-BANT + SRHT (the other, ISRL-DP MB-SGD + SRHT, differs only in its run config): the
in-process CPU-vs-CPU runs must be bit-identical, LeNet-5 goes through ``flwr run`` (the launcher,
the local simulation SuperLink, Ray) with ``device=cpu`` and ``client-resources-num-gpus=0``, the
report has rounds/s, and the SuperLink it started is stopped. It runs in its own FLWR_HOME, so on
a local SuperLink and ports of its own, whatever else runs on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench" / "gpu_run.sh"

pytestmark = pytest.mark.e2e


def _registered() -> bool:
    from app.data.federated import SOURCE_META
    from app.data.sources import SOURCES

    return "synthetic-image" in SOURCES and "synthetic-image" in SOURCE_META


@pytest.mark.skipif(not _registered(), reason="dataset synthetic-image needs its entry in app/data/federated.py "
                    "SOURCE_META ((3, 32, 32), 10)")
def test_gpu_run_script_on_cpu(tmp_path: Path) -> None:
    from app.launch import flower_env
    from app.runtime.local_superlink import own_superlink_fast_poll

    env = flower_env() | {"FLWR_HOME": str(tmp_path / "flwr-home")}
    out = tmp_path / "gpu-run"
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--device", "cpu", "--small", "--configs", "robust", "--outdir", str(out)],
        cwd=ROOT, env=env | {"SILOFL_GPU_RUN_TIMEOUT": "170"}, capture_output=True, text=True, timeout=200,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "[gpu_run] RESULT: PASS" in log
    assert "gpu_check.py: skipped (needs CUDA)" in log
    report = json.loads((out / "gpu_run.json").read_text())
    assert report["ok"] and report["device"] == "cpu" and report["small"]
    assert [(a["model"], a["config"]) for a in report["agreement"]] == [("lenet5", "robust")]
    for a in report["agreement"]:
        assert a["ok"] and a["diff_norm"] == 0.0 and a["update_norm"] > 0, a
    assert [(r["model"], r["config"]) for r in report["flwr"]] == [("lenet5", "robust")]
    for r in report["flwr"]:
        assert r["ok"] and r["status"] == "completed" and r["rounds_done"] == 2 and r["rounds_per_s"] > 0, r
        assert "rounds/s" in log
        assert r["run_config"]["algorithm"] == "gradbant" and r["run_config"]["sketch.kind"] == "srht"
        assert r["run_config"]["device"] == "cpu" and r["num_gpus"] == 0.0
        summary = json.loads((out / "flwr" / r["run_config"]["run-name"] / "summary.json").read_text())
        assert summary["dataset"] == "synthetic-image" and summary["model"] == "lenet5"
    # the SuperLink the script started (the only one of its FLWR_HOME) is gone
    assert not [pid for pid, _ in own_superlink_fast_poll(env) if os.path.exists(f"/proc/{pid}")]


def test_gpu_run_refuses_gpus_on_the_cpu() -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--num-gpus", "0.5"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "must be 0 with --device cpu" in proc.stderr
