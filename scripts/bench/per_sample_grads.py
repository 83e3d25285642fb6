"""Benchmark (and cross-check) four ways to compute per-sample gradients.

Computes the [B, d] matrix of per-sample gradients of the cross-entropy loss with

1. ``silofl``: the project default, ``app.privacy.per_sample.per_sample_grads`` (the exact
   layer-wise route for the zoo's Linear/Conv2d models: one forward, one backward to the layer
   outputs, outer products / strided patches),
2. ``vmap``: ``torch.func`` ``vmap(grad)`` (``per_sample_grads_vmap``, the route of every other
   model, e.g. ResNet-18),
3. Opacus ``GradSampleModule`` (forward, sum-reduced loss, backward, concatenated
   ``p.grad_sample``),
4. the per-record Python loop (``per_sample_grads_loop``),

for the paper's models (MLP 30-5-2, MLP 50-64-2, LeNet-5 on 3x32x32) and several batch
sizes. Before timing, every configuration asserts that the results agree. It also times the
*torch floor*: one ordinary batched forward + backward (batch-summed weight gradients) plus
writing a [B, d] result once, which every per-sample method pays at least; when Opacus / floor
< 1.5, no per-sample method can be 1.5x faster than Opacus on that row, whatever it does.

Each row ends with the speed-up over Opacus and ``>=1.5x: PASS``, or ``FAIL (reason)``.

Usage (from the repository root)::

    python -m scripts.bench.per_sample_grads [--repeats N] [--batches 32,128,512] [--quick]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

from app.models.zoo import build_model, num_params
from app.privacy.per_sample import (
    model_params,
    per_sample_grads,
    per_sample_grads_loop,
    per_sample_grads_vmap,
)

#: the speed-up over Opacus every row should reach
TARGET = 1.5

# Skip the per-record loop for a configuration when a single call is estimated to take
# longer than this (only relevant for LeNet-5 at large batches).
LOOP_BUDGET_S = 30.0

# (label, build_model args, build_model kwargs)
MODELS: list[tuple[str, tuple, dict]] = [
    ("MLP 30-5-2", ("mlp", (30,), 2), {"hidden": (5,)}),
    ("MLP 50-64-2", ("mlp", (50,), 2), {"hidden": (64,)}),
    ("LeNet-5 3x32x32", ("lenet5", (3, 32, 32), 10), {}),
]


def opacus_per_sample_grads(gsm: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample gradients via an Opacus GradSampleModule (built with loss_reduction="sum").

    With a sum-reduced loss, p.grad_sample[i] is the gradient of record i's own loss.
    """
    gsm.zero_grad(set_to_none=True)  # also clears grad_sample
    loss = nn.functional.cross_entropy(gsm(x), y, reduction="sum")
    loss.backward()
    params = [p for p in gsm.parameters() if p.requires_grad]
    out = torch.cat([p.grad_sample.reshape(x.shape[0], -1) for p in params], dim=1)
    gsm.zero_grad(set_to_none=True)
    return out


def make_opacus(model: nn.Module) -> nn.Module:
    from opacus import GradSampleModule

    gsm = GradSampleModule(copy.deepcopy(model), batch_first=True, loss_reduction="sum")
    gsm.train()  # Opacus only records activations in training mode (no dropout/BN here)
    return gsm


def torch_floor(model: nn.Module, x: torch.Tensor, y: torch.Tensor, d: int) -> None:
    """What any per-sample method pays at least: a batched forward + backward of the summed loss
    (torch's own kernels; the per-sample methods replace its weight-gradient reductions with
    per-record ones) and the first write of a [B, d] result (fresh memory: page faults)."""
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
    torch.zeros((x.shape[0], d))


def verdict(t_silofl: float, t_opacus: float, t_floor: float) -> str:
    """``PASS``, or ``FAIL (reason)`` for the >= TARGET speed-up over Opacus."""
    if t_opacus / t_silofl >= TARGET:
        return "PASS"
    if t_opacus / t_floor < TARGET:
        return (f"FAIL (torch floor: one batched forward+backward and the [B, d] write take {fmt(t_floor)} ms, "
                f"Opacus / floor = {t_opacus / t_floor:.2f}x < {TARGET}x)")
    return f"FAIL (silofl is {t_silofl / t_floor:.2f}x the torch floor; no documented reason)"


def time_interleaved(fns: dict[str, Callable[[], torch.Tensor]], repeats: int,
                     warmup: int = 1) -> dict[str, float]:
    """Median wall time in ms of each function after ``warmup`` untimed calls.

    The timed runs are interleaved (round robin: silofl, vmap, opacus, ...) so that
    background load on the machine affects all methods alike rather than one of them.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def assert_agree(name: str, a: torch.Tensor, ref: torch.Tensor) -> None:
    """allclose with an absolute tolerance of 1e-5 relative to the scale of ``ref``."""
    assert a.shape == ref.shape, f"{name}: shape {tuple(a.shape)} != {tuple(ref.shape)}"
    scale = float(ref.abs().max().clamp_min(1e-12))
    ok = torch.allclose(a, ref, rtol=0.0, atol=1e-5 * scale)
    err = float((a - ref).abs().max())
    assert ok, f"{name}: max abs diff {err:.3e} (scale {scale:.3e})"


def fmt(ms: float | None) -> str:
    if ms is None:
        return "skipped"
    return f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per method (median)")
    ap.add_argument("--batches", default="32,128,512", help="comma-separated batch sizes")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: batches 32 only, 2 repeats (unless given explicitly)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    repeats = args.repeats
    if args.quick:
        if "--batches" not in (argv if argv is not None else sys.argv[1:]):
            batches = [32]
        if "--repeats" not in (argv if argv is not None else sys.argv[1:]):
            repeats = 2
    if repeats < 1:
        ap.error("--repeats must be >= 1")

    warnings.filterwarnings("ignore", module="opacus")
    warnings.filterwarnings("ignore", message=".*full_backward_hook.*")

    import opacus

    print(f"torch {torch.__version__}, opacus {opacus.__version__}, python {platform.python_version()}")
    print(f"torch.get_num_threads() = {torch.get_num_threads()}; repeats = {repeats} "
          f"(median after 1 warm-up, methods interleaved); batches = {batches}")
    print("load average at start: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print()

    rows: list[tuple[str, int, int, dict[str, float]]] = []
    for label, margs, mkw in MODELS:
        gen = torch.Generator().manual_seed(args.seed)
        model = build_model(*margs, **mkw, generator=gen)
        params = model_params(model)
        d = num_params(model)
        gsm = make_opacus(model)
        floor_model = copy.deepcopy(model)
        feature_shape, num_classes = margs[1], margs[2]
        loop_ms_per_record: float | None = None

        for b in batches:
            dgen = torch.Generator().manual_seed(args.seed * 1000 + b)
            x = torch.randn((b, *feature_shape), generator=dgen)
            y = torch.randint(0, num_classes, (b,), generator=dgen)

            f_silo = lambda: per_sample_grads(model, params, x, y)  # noqa: E731
            f_vmap = lambda: per_sample_grads_vmap(model, params, x, y)  # noqa: E731
            f_opac = lambda: opacus_per_sample_grads(gsm, x, y)  # noqa: E731
            f_loop = lambda: per_sample_grads_loop(model, params, x, y)  # noqa: E731
            f_floor = lambda: torch_floor(floor_model, x, y, d)  # noqa: E731

            # --- correctness (the loop is the reference; estimate the loop's cost) -----
            g_silo, g_vmap, g_opac = f_silo(), f_vmap(), f_opac()
            run_loop = True
            if loop_ms_per_record is not None and loop_ms_per_record * b / 1e3 > LOOP_BUDGET_S:
                run_loop = False
            if run_loop:
                t0 = time.perf_counter()
                g_loop = f_loop()
                elapsed = time.perf_counter() - t0
                loop_ms_per_record = 1e3 * elapsed / b
                if elapsed > LOOP_BUDGET_S:
                    run_loop = False
                assert_agree(f"{label} B={b} silofl vs loop", g_silo, g_loop)
                assert_agree(f"{label} B={b} vmap vs loop", g_vmap, g_loop)
                assert_agree(f"{label} B={b} opacus vs loop", g_opac, g_loop)
            assert_agree(f"{label} B={b} opacus vs silofl", g_opac, g_silo)
            assert_agree(f"{label} B={b} vmap vs silofl", g_vmap, g_silo)
            assert g_silo.shape == (b, d)

            # --- timing --------------------------------------------------------------
            fns = {"silofl": f_silo, "vmap": f_vmap, "opacus": f_opac, "floor": f_floor}
            if run_loop:
                fns["loop"] = f_loop
            t = time_interleaved(fns, repeats)
            rows.append((label, d, b, t))
            print(f"  [ok] {label:16s} B={b:4d}: results agree; silofl {fmt(t['silofl'])} ms, "
                  f"vmap {fmt(t['vmap'])} ms, opacus {fmt(t['opacus'])} ms, floor {fmt(t['floor'])} ms, "
                  f"loop {fmt(t.get('loop'))} ms; opacus/silofl {t['opacus'] / t['silofl']:.2f}x", flush=True)

    print()
    print(f"| model | d | batch | silofl ms | vmap ms | opacus ms | loop ms | torch floor ms | opacus / silofl "
          f"| >={TARGET}x |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    verdicts = []
    for label, d, b, t in rows:
        v = verdict(t["silofl"], t["opacus"], t["floor"])
        verdicts.append((label, b, v))
        print(f"| {label} | {d} | {b} | {fmt(t['silofl'])} | {fmt(t['vmap'])} | {fmt(t['opacus'])} | "
              f"{fmt(t.get('loop'))} | {fmt(t['floor'])} | {t['opacus'] / t['silofl']:.2f}x | {v} |")
    print()
    print("silofl = app.privacy.per_sample.per_sample_grads (project default; layer-wise route for these "
          "models); vmap = torch.func vmap(grad); floor = batched forward+backward + [B, d] write.")
    print("load average at end: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    failed = [f"{label} B={b}: {v}" for label, b, v in verdicts if v != "PASS"]
    print(f">={TARGET}x over Opacus on every row: " + ("PASS" if not failed else "FAIL -> " + "; ".join(failed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
