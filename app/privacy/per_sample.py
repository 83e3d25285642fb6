"""Per-sample gradients with ``torch.func`` (functional_call + vmap(grad)).

For a batch of B records this returns the B individual gradients of the per-record loss
f0(w, x_i) in one vectorised call, which is what per-sample clipping needs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy; for one record (batch of 1) it is that record's loss."""
    return nn.functional.cross_entropy(logits, target)


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
    of loss_fn(model(x_i; w), y_i) with respect to w = params (parameter order of ``params``)."""
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def one_loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    grads = vmap(grad(one_loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1)


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
