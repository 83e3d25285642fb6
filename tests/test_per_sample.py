"""Per-sample gradients and per-sample clipping.

* ``per_sample_grads`` (both of its routes: the batched Linear-only route used for the
  MLPs and the ``vmap(grad)`` route) equals the per-record loop for the paper's models;
* ``clip_rows`` bounds every row by L and leaves rows already inside the ball unchanged;
* the mean of the per-sample gradients equals the gradient of the mean loss computed by
  ordinary autograd on the whole batch (an independent check of the per-sample matrix).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from app.models.zoo import build_model, num_params
from app.privacy import per_sample
from app.privacy.clipping import clip_rows
from app.privacy.per_sample import model_params, per_sample_grads, per_sample_grads_loop

# (id, build_model args, kwargs, feature shape, classes): the paper's three models
MODELS = [
    ("mlp-30-5-2", ("mlp", (30,), 2), {"hidden": (5,)}, (30,), 2),
    ("mlp-50-64-2", ("mlp", (50,), 2), {"hidden": (64,)}, (50,), 2),
    ("lenet5-3x32x32", ("lenet5", (3, 32, 32), 10), {}, (3, 32, 32), 10),
]
BATCH = 6


def _setup(spec, seed: int = 0):
    _, margs, kw, shape, classes = spec
    model = build_model(*margs, **kw, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((BATCH, *shape), generator=gen)
    y = torch.randint(0, classes, (BATCH,), generator=gen)
    return model, model_params(model), x, y


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = float(b.abs().max().clamp_min(1e-12))
    return torch.allclose(a, b, rtol=0.0, atol=1e-5 * scale)


@pytest.mark.parametrize("route", ["default", "vmap"])
@pytest.mark.parametrize("spec", MODELS, ids=[m[0] for m in MODELS])
def test_per_sample_grads_match_loop(spec, route, monkeypatch):
    if route == "vmap":  # force the vmap(grad) route even for the Linear-only MLPs
        monkeypatch.setattr(per_sample, "_linear_fast_path_ok", lambda *a, **k: False)
    model, params, x, y = _setup(spec)
    G = per_sample_grads(model, params, x, y)
    ref = per_sample_grads_loop(model, params, x, y)
    assert G.shape == (BATCH, num_params(model))
    assert not G.requires_grad
    assert _close(G, ref), float((G - ref).abs().max())


@pytest.mark.parametrize("spec", MODELS, ids=[m[0] for m in MODELS])
def test_mean_of_per_sample_grads_is_batch_gradient(spec):
    model, params, x, y = _setup(spec, seed=3)
    G = per_sample_grads(model, params, x, y)
    # ordinary autograd on the whole batch, mean-reduced loss
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    batch_grad = torch.cat([p.grad.reshape(-1) for _, p in model.named_parameters()])
    assert _close(G.mean(dim=0), batch_grad), float((G.mean(0) - batch_grad).abs().max())


def _check_clipped(G: torch.Tensor, L: float) -> None:
    C = clip_rows(G, L)
    norms_in, norms_out = G.norm(dim=1), C.norm(dim=1)
    assert bool((norms_out <= L + 1e-6).all()), float(norms_out.max())
    inside = norms_in < L
    assert torch.equal(C[inside], G[inside])
    # rows outside the ball end up on its boundary, pointing the same way
    outside = ~inside
    assert torch.allclose(norms_out[outside], torch.full_like(norms_out[outside], L), rtol=1e-5)
    assert torch.allclose(C[outside] * norms_in[outside, None] / L, G[outside], rtol=1e-5, atol=1e-7)


def test_clip_rows_bounds_norms_and_keeps_small_rows():
    gen = torch.Generator().manual_seed(7)
    G = torch.randn(64, 40, generator=gen) * torch.logspace(-3, 1, 64)[:, None]
    for L in (0.05, 0.5, 1.0):
        inside = G.norm(dim=1) < L
        assert 0 < int(inside.sum()) < G.shape[0]  # both kinds of rows are present
        _check_clipped(G, L)


def test_clip_rows_on_real_per_sample_grads():
    model, params, x, y = _setup(MODELS[1], seed=5)
    G = per_sample_grads(model, params, x, y)
    L = float(G.norm(dim=1).median())
    _check_clipped(G, L)
    assert torch.equal(clip_rows(G, float("inf")), G)


def test_resnet18_has_no_batch_statistics_and_gives_per_sample_gradients() -> None:
    """The GPU configuration's ResNet-18: GroupNorm only (DP needs per-record gradients that do
    not depend on the other records of the batch), 11.2M parameters, CIFAR stem."""
    import torch

    from app.models import build_model, num_params
    from app.privacy.per_sample import per_sample_grads

    model = build_model("resnet18", (3, 32, 32), 10, generator=torch.Generator().manual_seed(0))
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert 11_100_000 < num_params(model) < 11_300_000
    x, y = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = per_sample_grads(model, params, x, y)
    assert g.shape == (2, num_params(model))
    # record 0's gradient does not depend on record 1 (no batch statistics); float32 convolutions
    # batched two ways differ in rounding only (measured relative difference ~1e-5)
    g0_alone = per_sample_grads(model, params, x[:1], y[:1])[0]
    assert float((g[0] - g0_alone).norm() / g0_alone.norm()) < 1e-3
