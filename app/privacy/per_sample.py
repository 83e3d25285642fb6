"""Per-sample gradients with ``torch.func`` (functional_call + vmap(grad)).

For a batch of B records this returns the B individual gradients of the per-record loss
f0(w, x_i) in one vectorised call, which is what per-sample clipping needs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

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

    * models built only from ``nn.Linear`` and parameter-free element-wise layers (the
      zoo's ``Logistic``/``MLP``, or an ``nn.Sequential`` of such layers): one batched
      forward, one backward of the summed per-record losses to the *outputs* of the
      linear layers (delta_i), then per record dW_i = delta_i a_i^T and db_i = delta_i.
      Records never interact in these models, so this is the same gradient as the
      per-record one; it avoids the fixed dispatch cost of ``vmap`` that dominates for
      small MLPs (2-3x faster there; with the default loss it also skips the one-off
      ~2.5 s warm-up of the first torch.func call in a process).
    * anything else (e.g. LeNet-5's convolutions): ``vmap(grad(...))`` over records with
      ``torch.func.functional_call``.
    """
    if _linear_fast_path_ok(model, params):
        out = _per_sample_grads_linear(model, params, x, y, loss_fn)
        if out is not None:
            return out
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def one_loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    grads = vmap(grad(one_loss), in_dims=(None, 0, 0))(params, x, y)
    return torch.cat([g.reshape(g.shape[0], -1) for g in grads.values()], dim=1)


# Leaf modules whose forward acts on each record separately and has no parameters,
# buffers or randomness (Dropout is deliberately absent: its mask differs between a
# batched call and B single-record calls).
_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Flatten)


def _linear_fast_path_ok(model: nn.Module, params: dict[str, torch.Tensor]) -> bool:
    """True if ``model`` is known to process records independently and every entry of
    ``params`` is the weight or bias of one of its ``nn.Linear`` layers."""
    from app.models.zoo import MLP, Logistic  # whose forward() is flatten + Sequential

    if type(model) not in (MLP, Logistic, nn.Sequential) or not params:
        return False
    for m in model.modules():
        if m is model or type(m) is nn.Sequential:
            continue
        if type(m) is not nn.Linear and type(m) not in _ELEMENTWISE:
            return False
        if type(m) is nn.Flatten and m.start_dim < 1:  # would merge records
            return False
    if next(model.buffers(), None) is not None:
        return False
    mods = dict(model.named_modules())
    for name in params:
        owner, _, attr = name.rpartition(".")
        if attr not in ("weight", "bias") or type(mods.get(owner)) is not nn.Linear:
            return False
    return True


def _per_sample_grads_linear(
    model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
    loss_fn: LossFn,
) -> torch.Tensor | None:
    """Per-sample gradients of a Linear-only model from one batched forward/backward.

    Returns None (caller falls back to vmap) if a linear layer is not called exactly
    once in the forward (e.g. weight sharing)."""
    mods = dict(model.named_modules())
    owners = list(dict.fromkeys(name.rpartition(".")[0] for name in params))
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {m: [] for m in owners}

    def hook(name: str):
        def fn(_mod: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            seen[name].append((inp[0], out))
        return fn

    handles = [mods[m].register_forward_hook(hook(m)) for m in owners]
    try:
        with torch.enable_grad():
            p = {k: v.detach().requires_grad_(True) for k, v in params.items()}
            logits = functional_call(model, p, (x,))
            if any(len(v) != 1 for v in seen.values()):
                return None
            if loss_fn is cross_entropy:
                # sum over records of each record's own (batch-of-one) mean loss
                total = nn.functional.cross_entropy(logits, y, reduction="sum")
            else:
                total = vmap(lambda o, t: loss_fn(o.unsqueeze(0), t.unsqueeze(0)))(logits, y).sum()
            deltas = torch.autograd.grad(total, [seen[m][0][1] for m in owners])
    finally:
        for h in handles:
            h.remove()

    B = x.shape[0]
    delta = dict(zip(owners, deltas))
    cols = []
    for name in params:
        owner, _, attr = name.rpartition(".")
        d_out, a_in = delta[owner], seen[owner][0][0].detach()
        if d_out.dim() == 2:  # [B, out] and [B, in]: outer product per record
            g = d_out.unsqueeze(2) * a_in.unsqueeze(1) if attr == "weight" else d_out
        else:  # extra (e.g. sequence) dims are summed over, as autograd does
            d3 = d_out.reshape(B, -1, d_out.shape[-1])
            g = torch.bmm(d3.transpose(1, 2), a_in.reshape(B, -1, a_in.shape[-1])) if attr == "weight" else d3.sum(1)
        cols.append(g.reshape(B, -1))
    return torch.cat(cols, dim=1)


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
