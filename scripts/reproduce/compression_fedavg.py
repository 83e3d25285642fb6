"""Fashion-MNIST FedAvg with every compressor at k/n = 0.5 (issue: JL compression in the federation).

10 IID silos, all of them every round, non-private local SGD (FedAvg: each silo takes Q local
steps and sends its model delta, compressed with the round's broadcast sketch; the server lifts
and averages). Features: PCA to 50 components (fitted on the pooled training records), MLP
50-64-10, so that the dense Gaussian / Rademacher sketches stay cheap enough for a CPU.
For each kind: the best test accuracy, and G(t) (cumulative uploads in full-gradient
equivalents, a silo's round costs k/n) when the run first reaches 80% of the uncompressed run's
best accuracy.

Each run is the real ServerApp / ClientApp code on an in-process grid (app/local_grid.py).

  python -m scripts.reproduce.compression_fedavg [--rounds 30] [--kinds srht randk ...]

Writes outputs/reproduce/compression-fedavg/{rows.jsonl,table.md}.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from app.sketch_settings import SKETCH_KINDS  # noqa: E402
from app.launch import merged_run_config  # noqa: E402
from app.local_grid import run_local  # noqa: E402
from app.results import load_rounds  # noqa: E402
from app.server_app import reach  # noqa: E402

BASE = {"dataset": "fashion-mnist", "partition": "iid", "num-silos": 10, "silos-per-round": 10, "pca": 50,
        "mlp-hidden": "64", "algorithm": "localsgd", "local-steps": 5, "batch-size": 32, "lr": 0.1,
        "privacy.mode": "off", "eval-every": 1, "sketch.ratio": 0.5, "sketch.epsilon": 0.3}


def run_kind(kind: str, rounds: int, seed: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = merged_run_config([]) | BASE | {"sketch.kind": kind, "num-rounds": rounds, "seed": seed,
                                              "outputs-dir": f"{tmp}/out", "run-name": "r"}
        run_local(cfg, f"{tmp}/state")
        return load_rounds(f"{tmp}/out/r/rounds.jsonl")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kinds", nargs="+", default=list(SKETCH_KINDS))
    ap.add_argument("--out", type=Path, default=Path("outputs/reproduce/compression-fedavg"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    kinds = ["none"] + [k for k in args.kinds if k != "none"]
    results: dict[str, list[dict[str, Any]]] = {}
    with (args.out / "rows.jsonl").open("w") as fh:
        for kind in kinds:
            t0 = time.perf_counter()
            rows = run_kind(kind, args.rounds, args.seed)
            results[kind] = rows
            for r in rows:
                fh.write(json.dumps({"kind": kind} | r) + "\n")
            best = max(1 - r["test_error"] for r in rows if "test_error" in r)
            print(f"[compression] {kind}: best test accuracy {best:.2%}, G(R) {rows[-1]['uploads_G']:.1f}, "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)
    target = 0.8 * max(1 - r["test_error"] for r in results["none"] if "test_error" in r)
    lines = [f"Target: 80% of the uncompressed run's best accuracy = {target:.2%}.", "",
             "| kind | k/n | best test accuracy | G(t) to reach the target | rounds to reach it | G(R) |",
             "|---|---|---|---|---|---|"]
    for kind, rows in results.items():
        best = max(1 - r["test_error"] for r in rows if "test_error" in r)
        rnd, g = reach(rows, target)
        ratio = rows[0]["uploads_G"] / BASE["num-silos"]  # one round of every silo: k/n each
        lines.append(f"| {kind} | {ratio:.3f} | {best:.2%} | {'never' if g is None else f'{g:.1f}'} | "
                     f"{rnd if rnd else '-'} | {rows[-1]['uploads_G']:.1f} |")
    md = "\n".join(lines)
    (args.out / "table.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
