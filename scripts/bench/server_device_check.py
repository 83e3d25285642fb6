"""Device check of the server side (``server-device``, app/server_device.py): the ServerApp's
computations give the same numbers on the GPU as on the CPU.

    python -m scripts.bench.server_device_check               # on a CUDA machine
    python -m scripts.bench.server_device_check --device cpu    # the same path, CPU against CPU

1. Grad-BANT's trust-set computations (strategies/gradbant.py RobustAggregator): the full trust-set
   gradient, the local-steps reference (Q = 2 SGD steps on trust batches) and the clipped per-record
   rows, for logistic regression on WBCD and LeNet-5 on CIFAR-10-shaped synthetic images.
2. The lift S^T y of a sketched reply (strategies/replies.py ReplyReader) for every sketch kind.
3. A 3-round Grad-BANT + SRHT federation on the in-process grid (silos on the CPU), once with
   ``server-device=cpu`` and once with ``--device``: the final models.

Each line: the largest |GPU - CPU| relative to the largest |CPU| entry; tolerance 1e-3 (cuDNN may
run convolutions in TF32; float32 reductions differ in order). With ``--device cpu`` every
difference must be exactly 0. Exit 0 when all pass, 1 when one fails, 2 without CUDA.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

TOL = 1e-3
ROBUST = {"algorithm": "robust", "aggregator": "gradbant", "partition": "iid", "num-silos": 4, "silos-per-round": 4,
          "privacy.mode": "isrl", "batch-size": 16, "trust.size": 40, "seed": 1}
MODELS = {"logistic/wbcd": {"model": "logistic", "dataset": "wbcd"},
          "lenet5/synthetic-image": {"model": "lenet5", "dataset": "synthetic-image", "pca": 0}}
SKETCHES = ("gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch", "randk", "kronecker")


def rel(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    scale = float(np.abs(a).max()) or 1.0
    return float(np.abs(a - b).max()) / scale


def trust_checks(device: str) -> list[tuple[str, float]]:
    from app.config import parse_settings
    from app.data.federated import dataset_meta
    from app.models import build_model
    from app.seeding import torch_gen
    from app.algorithms import Phase
    from strategies.gradbant import RobustAggregator
    from strategies.replies import NodeRoster

    out = []
    for label, extra in MODELS.items():
        aggs = []
        for dev in ("cpu", device):
            s = parse_settings(ROBUST | extra | {"server-device": dev, "local-steps": 2})
            shape, classes = dataset_meta(s)
            model = build_model(s.model, shape, classes, generator=torch_gen(0, "init"))
            layout = {k: tuple(v.shape) for k, v in model.named_parameters()}
            w = {k: v.detach().numpy() for k, v in model.named_parameters()}
            aggs.append(RobustAggregator(s, layout, NodeRoster()))
        cpu, dev_agg = aggs
        assert str(dev_agg.device).startswith(device), dev_agg.device
        out.append((f"{label} trust gradient", rel(cpu.trust_gradient(w), dev_agg.trust_gradient(w))))
        out.append((f"{label} local reference (Q=2)",
                    rel(cpu.reference(w, 1, Phase.LOCAL), dev_agg.reference(w, 1, Phase.LOCAL))))
        out.append((f"{label} clipped trust rows", rel(cpu.trust_rows(w), dev_agg.trust_rows(w))))
    return out


def lift_checks(device: str) -> list[tuple[str, float]]:
    from app.sketch.broadcast import build_sketch, round_sketch
    from strategies.replies import ReplyReader, flatten

    layout = {"conv.weight": (6, 3, 5, 5), "conv.bias": (6,), "fc.weight": (10, 400), "fc.bias": (10,)}
    out = []
    for kind in SKETCHES:
        spec = round_sketch(kind, 0.25, 0.3, True, 7, 3)
        lifted = []
        for dev in ("cpu", device):
            sketch = build_sketch(spec, list(layout.values()))
            reader = ReplyReader(layout, sketch, lambda msg, text: text, device=torch.device(dev))
            y = np.random.default_rng(5).normal(size=sketch.payload_size).astype(np.float32)
            lifted.append(flatten(reader.lift(y)))
        out.append((f"lift S^T y, {kind}", rel(*lifted)))
    return out


def federation_check(device: str) -> list[tuple[str, float]]:
    from app.checkpoint import load_checkpoint
    from app.config import parse_settings
    from app.launch import merged_run_config
    from strategies.flower_rounds import initial_model
    from app.local_grid import run_local

    models = []
    with tempfile.TemporaryDirectory() as tmp:
        for dev in ("cpu", device):
            cfg = merged_run_config([]) | ROBUST | {
                "model": "logistic", "privacy.mode": "off", "sketch.kind": "srht", "num-rounds": 3,
                "attack.kind": "sign-flip", "attack.fraction": 0.25, "server-device": dev,
                "outputs-dir": str(Path(tmp) / dev), "run-name": "t"}
            run_local(cfg, str(Path(tmp) / dev / "state"))
            state: Any = load_checkpoint(Path(tmp) / dev / "t" / "checkpoint.npz")
            models.append(np.concatenate([np.ravel(v) for _, v in sorted(state["model"].items())]))
    layout, arrays = initial_model(parse_settings(cfg))
    w0 = np.concatenate([np.ravel(arrays[k].numpy()) for k in sorted(layout)])
    moved = float(np.abs(models[0] - w0).max())
    assert moved > 0, "the federation left the model unchanged: nothing to compare"
    return [(f"Grad-BANT + SRHT federation, final model (moved {moved:.2e} from w0)", rel(*models))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 2
    tol = 0.0 if args.device == "cpu" else TOL
    ok = True
    for label, diff in trust_checks(args.device) + lift_checks(args.device) + federation_check(args.device):
        good = diff <= tol
        ok &= good
        print(f"[server_device_check] {label}: cpu vs {args.device} max rel diff {diff:.2e} "
              f"({'ok' if good else f'FAIL, tolerance {tol:g}'})", flush=True)
    print("[server_device_check] all checks passed" if ok else "[server_device_check] A CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
