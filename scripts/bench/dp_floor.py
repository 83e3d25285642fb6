"""The vectorised floor: one per-record-clipped noisy gradient step for many silos at once.

What a batched simulation must at least pay per silo-round for ISRL-DP MB-SGD on the digits
preset's model (MLP 64-64-10, 4,810 parameters), computed the way the cheapest batched path
would: every silo's K records in one tensor [S, K, 64], and

    g_sk   = grad of CE(f(w; x_sk), y_sk) w.r.t. w           (torch.func: vmap over silos of
                                                              vmap over records of grad)
    gc_sk  = g_sk * min(1, C / ||g_sk||)                      (per-record clip to C)
    r_s    = (1/K) sum_k gc_sk + sigma * N(0, I)              (each silo's noisy mean gradient)
    w'     = w - lr * (1/S) sum_s r_s                         (the server's step)

with one shared model w (every silo starts a round from the same global model), one explicit
``torch.Generator`` for the noise, float32 on the CPU. No ledger, no wire, no Flower: this is the
arithmetic alone, the lower bound for issue 37's batched path. The figure is CPU time
(``time.process_time``: the process's user + system) and wall per call, divided by S.

    python -m scripts.bench.dp_floor [--silos 1000] [--records 32,2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch import nn
from torch.func import functional_call, grad, vmap


def build(d_in: int = 64, hidden: int = 64, classes: int = 10, seed: int = 0) -> nn.Module:
    """The digits preset's MLP d_in-hidden-classes (Linear, ReLU, Linear), seeded."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def make_step(model: nn.Module, clip: float, sigma: float, lr: float):
    """The step above as a function of (params, x [S, K, d], y [S, K], generator) -> new params."""

    def loss(params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, params, (x.unsqueeze(0),))
        return nn.functional.cross_entropy(out, y.unsqueeze(0))

    per_record = vmap(vmap(grad(loss), in_dims=(None, 0, 0)), in_dims=(None, 0, 0))

    def step(params: dict, x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> dict:
        g = per_record(params, x, y)  # name -> [S, K, *shape]
        s, k = x.shape[0], x.shape[1]
        flat = torch.cat([t.reshape(s, k, -1) for t in g.values()], dim=2)  # [S, K, P]
        norms = flat.norm(dim=2, keepdim=True)
        clipped = flat * torch.clamp(clip / (norms + 1e-12), max=1.0)
        noisy = clipped.mean(dim=1) + sigma * torch.randn(s, flat.shape[2], generator=gen)  # [S, P]
        update = noisy.mean(dim=0)
        out, i = {}, 0
        for name, p in params.items():
            n = p.numel()
            out[name] = p - lr * update[i:i + n].view_as(p)
            i += n
        return out

    return step


def measure(silos: int, records: int, repeats: int, seed: int = 0) -> dict:
    """Median CPU and wall of one step for ``silos`` silos of ``records`` records (after one warm-up)."""
    model = build()
    params = {k: v.detach() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(silos, records, 64, generator=gen)
    y = torch.randint(0, 10, (silos, records), generator=gen)
    step = make_step(model, clip=2.0, sigma=1.0, lr=1.0)
    step(params, x, y, gen)  # warm-up
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        step(params, x, y, gen)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    c, w = statistics.median(cpu), statistics.median(wall)
    return {"silos": silos, "records": records, "repeats": repeats, "step_cpu_s": c, "step_wall_s": w,
            "cpu_per_silo_round_ms": 1e3 * c / silos, "wall_per_silo_round_ms": 1e3 * w / silos,
            "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--silos", type=int, default=1000)
    ap.add_argument("--records", default="32,2", help="K values, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"dp floor: MLP 64-64-10, {args.silos} silos at once, torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.2f}", flush=True)
    for k in (int(v) for v in args.records.split(",")):
        r = measure(args.silos, k, args.repeats)
        print(f"  K = {k:>3}: step {r['step_cpu_s'] * 1e3:8.1f} ms CPU ({r['step_wall_s'] * 1e3:.1f} ms wall) "
              f"-> {r['cpu_per_silo_round_ms']:.3f} ms CPU per silo-round; load {os.getloadavg()[0]:.2f}",
              flush=True)
        print("FLOOR_RESULT " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
