"""Per-sample gradients with ``torch.func`` (functional_call + vmap(grad)), and an exact
layer-wise route for the zoo's Linear/Conv2d models.

For a batch of B records this returns the B individual gradients of the per-record loss
f0(w, x_i) in one vectorised call, which is what per-sample clipping needs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from app.models.leaves import forward_leaves
from app.models.losses import cross_entropy

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def model_params(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached trainable parameters by name, the ``params`` argument of the functions below."""
    return {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}


def per_sample_grads(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn = cross_entropy,
) -> torch.Tensor:
    """Return the matrix G of shape [B, d] whose row i is the flattened gradient
    of loss_fn(model(x_i; w), y_i) with respect to w = params (parameter order of ``params``).

    Two exact routes to the same matrix:

    * models built only from ``nn.Linear``/``nn.Conv2d`` and parameter-free layers that act on
      each record separately (the zoo's ``Logistic``/``MLP``/``LeNet5``, or an ``nn.Sequential``
      of such layers): one batched forward that keeps each layer's input a_i, one backward of
      the summed per-record losses to the layer *outputs* (delta_i; autograd computes no
      weight gradient on the way), then per record dW_i = delta_i a_i^T and db_i = delta_i for a
      linear layer, and for a convolution dW_i = delta_i unfold(a_i)^T (the input's patches, from
      a strided view of a_i) and db_i = delta_i summed over positions. Records never interact in
      these models, so this is the per-record gradient. It avoids ``vmap``'s fixed dispatch cost
      (MLPs: 2-3x faster, and with the default loss it skips the one-off ~2.5 s warm-up of the
      first torch.func call in a process) and ``vmap``'s per-record convolution backward
      (LeNet-5: see docs/results.md, per-sample gradients).
    * anything else (e.g. ResNet-18 with GroupNorm): ``vmap(grad(...))`` over records with
      ``torch.func.functional_call``.

    The layer-wise route re-runs those classes' forward() layer by layer (``flatten(1)`` and
    their ``nn.Sequential`` parts, app/models/leaves.py); tests/test_per_sample.py checks it against
    the per-record loop through the model's own forward() for every zoo model. For the MLPs and
    logistic regression it uses the same kernels as the earlier hook-based Linear route, so their
    rows (and the golden runs) are bit-identical to it.
    """
    if _layerwise_ok(model, params):
        return _per_sample_grads_layerwise(model, params, x, y, loss_fn)
    return per_sample_grads_vmap(model, params, x, y, loss_fn)


def per_sample_grads_vmap(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn = cross_entropy,
) -> torch.Tensor:
    """The ``vmap(grad(...))`` route of :func:`per_sample_grads`, for any model (no batch
    statistics): each record's loss through ``torch.func.functional_call``."""
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def one_loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    grads = vmap(grad(one_loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1)


# Leaf modules whose forward acts on each record separately and has no parameters,
# buffers or randomness (Dropout is deliberately absent: its mask differs between a
# batched call and B single-record calls; so are the norm layers, which have parameters
# and, for BatchNorm, batch statistics).
_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Flatten, nn.MaxPool2d, nn.AvgPool2d)
# Leaf modules whose weight (and bias) the layer-wise route differentiates per record.
_WEIGHTED = (nn.Linear, nn.Conv2d)


def _layer_ok(m: nn.Module) -> bool:
    if type(m) is nn.Linear:
        return True
    if type(m) is nn.Conv2d:  # one group, zero padding given as numbers (not "same"/"valid")
        return m.groups == 1 and m.padding_mode == "zeros" and isinstance(m.padding, tuple)
    return False


def _layerwise_ok(model: nn.Module, params: dict[str, torch.Tensor]) -> bool:
    """True if ``model`` is known to process records independently, calls each of its
    ``nn.Linear``/``nn.Conv2d`` layers once, and every entry of ``params`` is the weight or bias
    of one of them."""
    leaves = forward_leaves(model)
    if leaves is None or not params:
        return False
    weighted = [m for _, m in leaves if type(m) in _WEIGHTED]
    if len({id(m) for m in weighted}) != len(weighted):  # a layer called twice (weight sharing)
        return False
    for _, m in leaves:
        if m is None:
            continue
        if type(m) in _WEIGHTED:
            if not _layer_ok(m):
                return False
        elif type(m) not in _ELEMENTWISE or next(m.parameters(), None) is not None:
            return False
        elif getattr(m, "inplace", False):  # would overwrite a layer output the backward starts from
            return False
        elif type(m) is nn.Flatten and m.start_dim < 1:  # would merge records
            return False
    if next(model.buffers(), None) is not None:
        return False
    names = {f"{q}.{attr}".lstrip(".") for q, m in leaves if type(m) in _WEIGHTED for attr in ("weight", "bias")
             if getattr(m, attr, None) is not None}
    return set(params) <= names and {n for n, _ in model.named_parameters()} <= names


#: patch floats copied at once by _conv_weight_grads (1M floats = 4 MB for float32)
_PATCH_CHUNK_ELEMS = 1 << 20


def _conv_weight_grads(mod: nn.Conv2d, a: torch.Tensor, d: torch.Tensor, out: torch.Tensor) -> None:
    """Write the per-record weight gradients of convolution ``mod`` into ``out`` [B, O, C*kh*kw]:
    for record b, dW_b[o, c, i, j] = sum_{p,q} d[b, o, p, q] * a_pad[b, c, p*s + i*dil, q*s + j*dil]
    (the input's patches are a strided view of the padded input; one copy makes them a matrix)."""
    B, O, Ho, Wo = d.shape
    ph, pw = mod.padding
    if ph or pw:
        a = nn.functional.pad(a, (pw, pw, ph, ph))
    C = a.shape[1]
    kh, kw = mod.kernel_size
    sh, sw = mod.stride
    dh, dw = mod.dilation
    sB, sC, sH, sW = a.stride()
    d = d.reshape(B, O, Ho * Wo)
    # on the CPU a few records at a time, so that the copied patches (C*kh*kw*Ho*Wo floats per
    # record) stay in cache: 2-3x faster than one copy for the whole batch (LeNet-5's first
    # layer, B >= 128); bmm multiplies each record's matrices alone, so chunks change no bit
    step = B if a.is_cuda else max(1, _PATCH_CHUNK_ELEMS // (C * kh * kw * Ho * Wo))
    for lo in range(0, B, step):
        n = min(step, B - lo)
        patches = a.as_strided((n, C, kh, kw, Ho, Wo), (sB, sC, dh * sH, dw * sW, sh * sH, sw * sW),
                               a.storage_offset() + lo * sB)
        torch.bmm(d[lo:lo + n], patches.reshape(n, C * kh * kw, Ho * Wo).transpose(1, 2), out=out[lo:lo + n])


def _per_sample_grads_layerwise(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    loss_fn: LossFn,
) -> torch.Tensor:
    """Per-sample gradients of a Linear/Conv2d model (:func:`_layerwise_ok`) from one batched
    forward and one backward.

    The forward runs the model's layers here, in the order its forward() does, with the weights
    of ``params`` (the model's own for the others), none of them requiring grad: the graph starts
    at the first layer's output, so the backward computes only the gradients w.r.t. the layer
    outputs (delta), never the (batch-summed) weight gradients. Each layer keeps its input a."""
    leaves = forward_leaves(model)
    assert leaves is not None
    inputs: dict[str, torch.Tensor] = {}
    outputs: dict[str, torch.Tensor] = {}
    with torch.enable_grad():
        a = x
        for qual, mod in leaves:
            if mod is None:
                a = a.flatten(1)
            elif type(mod) in _WEIGHTED:
                w = params.get(f"{qual}.weight".lstrip("."), mod.weight).detach()
                b = None if mod.bias is None else params.get(f"{qual}.bias".lstrip("."), mod.bias).detach()
                inputs[qual] = a.detach()
                if type(mod) is nn.Linear:
                    a = nn.functional.linear(a, w, b)
                else:
                    a = nn.functional.conv2d(a, w, b, mod.stride, mod.padding, mod.dilation, mod.groups)
                if not a.requires_grad:  # the first layer: its output starts the graph
                    a.requires_grad_(True)
                outputs[qual] = a
            else:
                a = mod(a)
        if loss_fn is cross_entropy:
            # sum over records of each record's own (batch-of-one) mean loss
            total = nn.functional.cross_entropy(a, y, reduction="sum")
        else:
            total = vmap(lambda o, t: loss_fn(o.unsqueeze(0), t.unsqueeze(0)))(a, y).sum()
        owners = list(dict.fromkeys(name.rpartition(".")[0] for name in params))
        deltas = torch.autograd.grad(total, [outputs[m] for m in owners], allow_unused=True)

    B = x.shape[0]
    mods = dict(leaves)
    delta = dict(zip(owners, deltas))
    sizes = [v.numel() for v in params.values()]
    G = torch.empty((B, sum(sizes)), dtype=a.dtype, device=a.device)
    offset = 0
    for name, size in zip(params, sizes):
        owner, _, attr = name.rpartition(".")
        mod = mods[owner]
        d_out, a_in = delta[owner], inputs[owner]
        block = G[:, offset:offset + size]
        offset += size
        if d_out is None:  # the loss does not depend on this layer's output
            block.zero_()
        elif type(mod) is nn.Conv2d:
            if attr == "weight":
                _conv_weight_grads(mod, a_in, d_out, block.view(B, d_out.shape[1], -1))
            else:
                torch.sum(d_out, dim=(2, 3), out=block)
        elif d_out.dim() == 2:  # [B, out] and [B, in]: outer product per record
            if attr == "weight":
                torch.mul(d_out.unsqueeze(2), a_in.unsqueeze(1), out=block.view(B, d_out.shape[1], -1))
            else:
                block.copy_(d_out)
        else:  # extra (e.g. sequence) dims are summed over, as autograd does
            d3 = d_out.reshape(B, -1, d_out.shape[-1])
            g = torch.bmm(d3.transpose(1, 2), a_in.reshape(B, -1, a_in.shape[-1])) if attr == "weight" else d3.sum(1)
            block.copy_(g.reshape(B, -1))
    return G


def per_sample_grads_loop(
    model: nn.Module,
    params: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn = cross_entropy,
) -> torch.Tensor:
    """Reference implementation: one backward pass per record (slow; used by tests and
    the benchmark)."""
    rows = []
    names = list(params)
    for i in range(x.shape[0]):
        p = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        out = functional_call(model, p, (x[i : i + 1],))
        gs = torch.autograd.grad(loss_fn(out, y[i : i + 1]), [p[k] for k in names])
        rows.append(torch.cat([g.reshape(-1) for g in gs]))
    return torch.stack(rows)


def batch_loss(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    loss_fn: LossFn = cross_entropy,
) -> float:
    """Mean loss of the batch at ``params`` (no gradient)."""
    with torch.no_grad():
        return float(loss_fn(functional_call(model, params, (x,)), y))
