"""A sweep job on an existing two-raylet Ray cluster (a head and a second node on loopback, one
CPU each: ray.cluster_utils.Cluster, the way Ray tests multi-node clusters on one machine)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.e2e
def test_a_sweep_job_runs_on_a_two_raylet_cluster_through_ray_address(tmp_path: Path) -> None:
    """Before (8646705): the engine asked ray.init for num_cpus while RAY_ADDRESS named a
    cluster, and the job hung until the test's 400 s timeout. Now it joins the cluster: Flower's
    pool gets one actor per CPU of the cluster, that is one per node here."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        try:
            assert [n["Resources"].get("CPU") for n in ray.nodes() if n["Alive"]] == [1.0, 1.0]
        finally:
            ray.shutdown()
        env = dict(os.environ, RAY_ADDRESS=cluster.address, PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-m", "app.sweep", "sweep.engine=flower", "sweep.name=cluster",
                               "num-rounds=3"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    finally:
        cluster.shutdown()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "outputs/sweeps/cluster/results.csv").open()))
    assert [r["status"] for r in rows] == ["completed"] and float(rows[0]["test_error"]) < 0.5
