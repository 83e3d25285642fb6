"""Per-sample gradients and per-sample clipping.

* ``per_sample_grads`` equals the independent per-record loop (``per_sample_grads_loop``: one
  ordinary autograd backward per record through the model's own forward) on every model of
  app/models/zoo.py, in float64 (tight tolerance) and float32, on both of its routes: the
  layer-wise route (Linear/Conv2d models: the MLPs, logistic regression, LeNet-5) and the
  ``vmap(grad)`` route (ResNet-18 with GroupNorm, and any model forced onto it);
* the layer-wise route handles convolutions with stride, padding, dilation and no bias, average
  pooling, a subset of the parameters and a non-default loss, and models it cannot handle
  (weight sharing, Dropout, norm layers, unknown classes) go to ``vmap``;
* ``clip_rows`` bounds every row by L and leaves rows already inside the ball unchanged;
* the mean of the per-sample gradients equals the gradient of the mean loss computed by
  ordinary autograd on the whole batch (an independent check of the per-sample matrix).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from app.models.zoo import LeNet5, build_model, num_params
from app.privacy import per_sample
from app.privacy.clipping import clip_rows
from app.privacy.per_sample import model_params, per_sample_grads, per_sample_grads_loop

# (id, build_model args, kwargs, feature shape, classes, layer-wise route): every zoo model
MODELS = [
    ("logistic-30-2", ("logistic", (30,), 2), {}, (30,), 2, True),
    ("mlp-30-5-2", ("mlp", (30,), 2), {"hidden": (5,)}, (30,), 2, True),
    ("mlp-50-64-2", ("mlp", (50,), 2), {"hidden": (64,)}, (50,), 2, True),
    ("mlp-64-32-16-10", ("mlp", (64,), 10), {"hidden": (32, 16)}, (64,), 10, True),
    ("lenet5-3x32x32", ("lenet5", (3, 32, 32), 10), {}, (3, 32, 32), 10, True),
    ("lenet5-1x28x28", ("lenet5", (1, 28, 28), 10), {}, (1, 28, 28), 10, True),
    ("resnet18-3x32x32", ("resnet18", (3, 32, 32), 10), {}, (3, 32, 32), 10, False),
]
SMALL = [m for m in MODELS if not m[0].startswith("resnet")]
BATCH = 6


def _setup(spec, seed: int = 0, dtype: torch.dtype = torch.float32, batch: int = BATCH):
    _, margs, kw, shape, classes, _ = spec
    model = build_model(*margs, **kw, generator=torch.Generator().manual_seed(seed)).to(dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn((batch, *shape), generator=gen).to(dtype)
    y = torch.randint(0, classes, (batch,), generator=gen)
    return model, model_params(model), x, y


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> bool:
    scale = float(b.abs().max().clamp_min(1e-12))
    return a.shape == b.shape and torch.allclose(a, b, rtol=0.0, atol=tol * scale)


TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("spec", MODELS, ids=[m[0] for m in MODELS])
def test_per_sample_grads_match_loop(spec, dtype):
    batch = 2 if spec[0].startswith("resnet") else BATCH
    model, params, x, y = _setup(spec, dtype=dtype, batch=batch)
    assert per_sample._layerwise_ok(model, params) is spec[5]  # the route this model takes
    G = per_sample_grads(model, params, x, y)
    ref = per_sample_grads_loop(model, params, x, y)
    assert G.shape == (batch, num_params(model)) and G.dtype == dtype
    assert not G.requires_grad
    assert _close(G, ref, TOL[dtype]), float((G - ref).abs().max())


@pytest.mark.parametrize("spec", SMALL, ids=[m[0] for m in SMALL])
def test_vmap_route_matches_loop(spec):
    model, params, x, y = _setup(spec, dtype=torch.float64)
    G = per_sample.per_sample_grads_vmap(model, params, x, y)
    assert _close(G, per_sample_grads_loop(model, params, x, y), 1e-12)


def test_layerwise_route_keeps_the_vmap_routes_numbers_on_lenet5():
    """float32: the two routes differ in rounding only."""
    model, params, x, y = _setup(MODELS[4], seed=4, batch=40)
    assert _close(per_sample_grads(model, params, x, y), per_sample.per_sample_grads_vmap(model, params, x, y))


def test_layerwise_route_records_are_independent_and_chunking_is_exact(monkeypatch):
    """Record i's row does not depend on the other records, and the conv patches' chunk size
    (records per copy) does not change a single bit."""
    model, params, x, y = _setup(MODELS[4], seed=2, batch=9)
    full = per_sample_grads(model, params, x, y)
    monkeypatch.setattr(per_sample, "_PATCH_CHUNK_ELEMS", 1)  # one record per chunk
    assert torch.equal(per_sample_grads(model, params, x, y), full)
    assert torch.allclose(per_sample_grads(model, params, x[3:4], y[3:4])[0], full[3], rtol=0, atol=1e-6)


def _conv_net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.Tanh(),
        nn.Conv2d(4, 3, (3, 2), dilation=(2, 1), padding=(2, 0), bias=False), nn.Sigmoid(),
        nn.AvgPool2d(2), nn.Sequential(nn.Conv2d(3, 5, 1), nn.ReLU()), nn.Flatten(),
        nn.Linear(5 * 2 * 1, 3),
    ).double()


def test_layerwise_conv_variants_match_loop():
    model = _conv_net()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn((5, 2, 9, 8), generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (5,), generator=gen)
    params = model_params(model)
    assert per_sample._layerwise_ok(model, params)
    assert _close(per_sample_grads(model, params, x, y), per_sample_grads_loop(model, params, x, y), 1e-12)


def test_layerwise_subset_of_params_and_custom_loss():
    model, params, x, y = _setup(MODELS[4], dtype=torch.float64)
    subset = {k: v for k, v in params.items() if k.startswith("features.3") or k == "classifier.4.bias"}
    assert per_sample._layerwise_ok(model, subset)
    assert _close(per_sample_grads(model, subset, x, y), per_sample_grads_loop(model, subset, x, y), 1e-12)

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits, target, label_smoothing=0.1) + (logits ** 2).mean()

    assert _close(per_sample_grads(model, params, x, y, loss), per_sample_grads_loop(model, params, x, y, loss), 1e-12)


def test_models_the_layerwise_route_refuses_still_get_exact_gradients():
    lin = nn.Linear(4, 4)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((5, 4), generator=gen, dtype=torch.float64)
    y = torch.randint(0, 4, (5,), generator=gen)
    cases = {
        "weight sharing": nn.Sequential(lin, nn.ReLU(), lin),
        "dropout (eval)": nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 4)).eval(),
        "layer norm": nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 4)),
        "grouped conv": nn.Sequential(nn.Unflatten(1, (4, 1, 1)), nn.Conv2d(4, 4, 1, groups=2), nn.Flatten()),
        "in-place relu": nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 4)),
    }
    for name, model in cases.items():
        model = model.double()
        params = model_params(model)
        assert not per_sample._layerwise_ok(model, params), name
        assert _close(per_sample_grads(model, params, x, y), per_sample_grads_loop(model, params, x, y), 1e-12), name

    merges_records = nn.Sequential(nn.Linear(4, 4), nn.Flatten(0), nn.Unflatten(0, (5, 4)))
    assert not per_sample._layerwise_ok(merges_records, model_params(merges_records))

    class Subclass(LeNet5):  # a forward() this module does not know
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = Subclass(1, 16, 3).double()
    assert not per_sample._layerwise_ok(model, model_params(model))


@pytest.mark.parametrize("spec", SMALL, ids=[m[0] for m in SMALL])
def test_mean_of_per_sample_grads_is_batch_gradient(spec):
    model, params, x, y = _setup(spec, seed=3, dtype=torch.float64)
    G = per_sample_grads(model, params, x, y)
    # ordinary autograd on the whole batch, mean-reduced loss
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    batch_grad = torch.cat([p.grad.reshape(-1) for _, p in model.named_parameters()])
    assert _close(G.mean(dim=0), batch_grad, 1e-12), float((G.mean(0) - batch_grad).abs().max())


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
    model, params, x, y = _setup(MODELS[2], seed=5)
    G = per_sample_grads(model, params, x, y)
    L = float(G.norm(dim=1).median())
    _check_clipped(G, L)
    assert torch.equal(clip_rows(G, float("inf")), G)


def test_resnet18_has_no_batch_statistics_and_gives_per_sample_gradients() -> None:
    """The GPU configuration's ResNet-18: GroupNorm only (DP needs per-record gradients that do
    not depend on the other records of the batch), 11.2M parameters, CIFAR stem."""
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
