"""scripts/bench/pfl_compare.py and dp_floor.py (issue 37): the bench runs with pfl absent, and
the floor's batched step is the per-record-clipped noisy step it claims to be.

The first test runs the real command (silofl's side in a fresh process) on a tiny size with a pfl
interpreter that does not exist: it must say so on a ``pfl side: SKIPPED`` line, still print
silofl's row, and exit 0. The second checks the floor's vmap step against a per-record Python
loop (plain autograd, one record at a time) with the noise off, and that the noise is drawn from
the generator it is given.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_pfl_compare_without_pfl_prints_skip_and_silofl_side(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", FLWR_TELEMETRY_ENABLED="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    absent = tmp_path / "no-such-venv" / "bin" / "python"
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.pfl_compare", "--datasets", "digits",
                           "--clients", "4", "--rounds", "1", "--no-floor", "--pfl-python", str(absent)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"pfl side: SKIPPED (interpreter {absent} absent" in out
    row = [ln for ln in out.splitlines() if ln.startswith("| silofl (in-process grid) |")]
    assert len(row) == 1, out
    cells = [c.strip() for c in row[0].strip("|").split("|")]
    wall, cpu_per_cr, acc = float(cells[1]), float(cells[3]), float(cells[4])
    assert wall > 0 and cpu_per_cr > 0 and 0.0 <= acc <= 1.0
    assert "clips each RECORD's gradient" in out  # silofl's unit of privacy is printed
    assert "pfl 0.6.0 (SimulatedBackend)" not in out


def _loop_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float, lr: float) -> dict:
    """The noiseless step by hand: each record's gradient by its own backward pass, clipped to
    ``clip``, averaged per silo, averaged over silos, one SGD step of ``lr``."""
    params = dict(model.named_parameters())
    total = {k: torch.zeros_like(p) for k, p in params.items()}
    s, k = x.shape[:2]
    for i in range(s):
        silo = {n: torch.zeros_like(p) for n, p in params.items()}
        for j in range(k):
            model.zero_grad()
            nn.functional.cross_entropy(model(x[i, j:j + 1]), y[i, j:j + 1]).backward()
            g = {n: p.grad.detach().clone() for n, p in params.items()}
            norm = torch.sqrt(sum((v ** 2).sum() for v in g.values()))
            scale = min(1.0, clip / float(norm))
            for n in silo:
                silo[n] += scale * g[n] / k
        for n in total:
            total[n] += silo[n] / s
    return {n: (p - lr * total[n]).detach() for n, p in params.items()}


def test_dp_floor_step_is_the_per_record_clipped_step() -> None:
    from scripts.bench.dp_floor import build, make_step

    model = build(d_in=64, seed=3)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 4, 64, generator=gen) * 3.0  # large inputs: some records get clipped
    y = torch.randint(0, 10, (3, 4), generator=gen)
    params = {k: v.detach() for k, v in model.named_parameters()}
    got = make_step(model, clip=0.5, sigma=0.0, lr=0.7)(params, x, y, torch.Generator().manual_seed(0))
    want = _loop_step(model, x, y, clip=0.5, lr=0.7)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6)
    noisy = make_step(model, clip=0.5, sigma=1.0, lr=0.7)
    a = noisy(params, x, y, torch.Generator().manual_seed(1))
    b = noisy(params, x, y, torch.Generator().manual_seed(1))
    c = noisy(params, x, y, torch.Generator().manual_seed(2))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a)
