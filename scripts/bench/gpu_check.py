"""Device check (needs a CUDA GPU): the silo's DP gradient pieces give the same numbers on the GPU
as on the CPU, the two per-sample routes (layer-wise, vmap) agree on the GPU, and noise drawn from
the CPU generator is bit-identical on any device.

    python -m scripts.bench.gpu_check

Prints one line per check and a small timing table (torch.func per-sample gradients, CPU vs GPU).
Exits 1 when a check fails. Only torch and the project's torch-only modules are imported.
"""

from __future__ import annotations

import sys
import time

import torch

from app.models.zoo import build_model
from app.privacy.clipping import clip_rows
from app.privacy.mechanism import add_gaussian_noise
from app.privacy.per_sample import model_params, per_sample_grads, per_sample_grads_vmap
from app.seeding import torch_gen

SPECS = [("MLP 30-5-2", "mlp", (30,), 2, (5,)), ("MLP 50-64-2", "mlp", (50,), 2, (64,)),
         ("LeNet-5 3x32x32", "lenet5", (3, 32, 32), 10, ())]


def timed(fn, repeats: int = 10) -> float:
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 1
    cuda = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    ok = True
    rows = []
    for label, name, shape, classes, hidden in SPECS:
        model = build_model(name, shape, classes, hidden=hidden or (5,), generator=torch_gen(0, "init"))
        g = torch_gen(1, "x")
        x = torch.randn((64, *shape), generator=g)
        y = torch.randint(0, classes, (64,), generator=g)
        cpu = clip_rows(per_sample_grads(model, model_params(model), x, y), 1.0).mean(0)
        model_gpu = build_model(name, shape, classes, hidden=hidden or (5,), generator=torch_gen(0, "init")).to(cuda)
        gpu = clip_rows(per_sample_grads(model_gpu, model_params(model_gpu), x.to(cuda), y.to(cuda)), 1.0).mean(0)
        close = torch.allclose(cpu, gpu.cpu(), rtol=1e-4, atol=1e-6)
        noisy_cpu = add_gaussian_noise(cpu, 0.5, torch_gen(2, "noise"))
        noisy_gpu = add_gaussian_noise(cpu.to(cuda), 0.5, torch_gen(2, "noise"))
        same_noise = torch.equal(noisy_cpu - cpu, (noisy_gpu.cpu() - cpu))
        # the layer-wise route (strided conv patches, outer products) against vmap(grad), on the GPU
        xg64, yg64 = x.to(cuda), y.to(cuda)
        # (to 1e-3 of the largest entry: cuDNN may run the convolutions in TF32)
        g_lw = per_sample_grads(model_gpu, model_params(model_gpu), xg64, yg64)
        g_vm = per_sample_grads_vmap(model_gpu, model_params(model_gpu), xg64, yg64)
        routes = bool((g_lw - g_vm).abs().max() <= 1e-3 * g_vm.abs().max())
        print(f"{label}: clipped mean gradient CPU == GPU: {close}; noise bit-identical: {same_noise}; "
              f"GPU layer-wise == vmap: {routes}")
        ok &= close and same_noise and routes
        for b in (128, 512):
            xb = torch.randn((b, *shape), generator=g)
            yb = torch.randint(0, classes, (b,), generator=g)
            t_cpu = timed(lambda: per_sample_grads(model, model_params(model), xb, yb))
            xg, yg = xb.to(cuda), yb.to(cuda)
            t_gpu = timed(lambda: per_sample_grads(model_gpu, model_params(model_gpu), xg, yg))
            rows.append((label, b, t_cpu, t_gpu))
    print("\n| model | batch | CPU ms | GPU ms |\n|---|---|---|---|")
    for label, b, tc, tg in rows:
        print(f"| {label} | {b} | {tc:.2f} | {tg:.2f} |")
    print("\nall checks passed" if ok else "\nA CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
