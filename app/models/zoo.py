"""Model zoo: logistic regression, MLP, LeNet-5.

Per DESIGN.md, models used with DP contain no BatchNorm (per-sample gradients of a
BatchNorm layer are not defined). Every model maps a batch ``[B, *feature_shape]`` to
logits ``[B, num_classes]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from app.models.leaves import Leaves, sequential_leaves

MODELS = ("logistic", "mlp", "lenet5", "resnet18")


class Logistic(nn.Module):
    """Multinomial logistic regression: logits = W flatten(x) + b."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))

    def forward_leaves(self) -> Leaves:
        """The leaf modules forward() calls, in order, ``("", None)`` for its flatten(1)
        (app/privacy/per_sample.py's layer-wise per-record gradients)."""
        return [("", None), ("linear", self.linear)]


class MLP(nn.Module):
    """Fully connected ReLU network ``in -> hidden[0] -> ... -> num_classes``.

    The paper's WBCD model is MLP 30-5-2, its MNIST model MLP 50-64-2.
    """

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))

    def forward_leaves(self) -> Leaves:
        """The leaf modules forward() calls, in order (``("", None)``: its flatten(1))."""
        return [("", None), *sequential_leaves("net", self.net)]


class LeNet5(nn.Module):
    """The paper's CIFAR-10 CNN: conv(6, 5x5) -> ReLU -> maxpool 2 -> conv(16, 5x5) -> ReLU
    -> maxpool 2 -> FC 120 -> FC 84 -> FC num_classes. Works for any square input >= 16 px."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )
        side = ((image_size - 4) // 2 - 4) // 2
        self.classifier = nn.Sequential(
            nn.Linear(16 * side * side, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))

    def forward_leaves(self) -> Leaves:
        """The leaf modules forward() calls, in order (``("", None)``: its flatten(1))."""
        return [*sequential_leaves("features", self.features), ("", None),
                *sequential_leaves("classifier", self.classifier)]


def resnet18_groupnorm(in_channels: int, num_classes: int, groups: int = 32) -> nn.Module:
    """torchvision's ResNet-18 (11.2M parameters) with GroupNorm instead of BatchNorm (per-sample
    gradients and DP need no batch statistics) and the CIFAR stem: a 3x3 stride-1 first
    convolution and no max-pool, for 32x32 (or 28x28) images."""
    from torchvision.models import resnet18

    model = resnet18(num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(min(groups, c), c))
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


def build_model(
    name: str,
    feature_shape: Sequence[int],
    num_classes: int,
    *,
    hidden: Sequence[int] = (5,),
    generator: torch.Generator | None = None,
    kwargs: str = "",
) -> nn.Module:
    """Build model ``name`` for inputs of ``feature_shape``; initial weights are drawn
    from ``generator`` (PyTorch's default init, re-drawn so that every process that
    builds the model from the same seed gets the same w_0). A name outside :data:`MODELS` is
    your own model (an import path or entry point, built with ``kwargs``, the run's
    ``model-kwargs``, and checked for DP: app/models/custom.py)."""
    if name not in MODELS and name:
        from app.models.custom import build_custom

        return build_custom(name, feature_shape, num_classes, kwargs, generator)
    feature_shape = tuple(int(s) for s in feature_shape)
    in_features = math.prod(feature_shape)
    if name == "logistic":
        model: nn.Module = Logistic(in_features, num_classes)
    elif name == "mlp":
        model = MLP(in_features, hidden, num_classes)
    elif name == "lenet5":
        if len(feature_shape) != 3 or feature_shape[1] != feature_shape[2] or feature_shape[1] < 16:
            raise ValueError(
                f"model=lenet5 needs square images [C, H, W] with H >= 16; got feature shape {feature_shape}"
            )
        model = LeNet5(feature_shape[0], feature_shape[1], num_classes)
    elif name == "resnet18":
        if len(feature_shape) != 3:
            raise ValueError(f"model=resnet18 needs images [C, H, W]; got feature shape {feature_shape}")
        model = resnet18_groupnorm(feature_shape[0], num_classes)
    else:
        raise ValueError(f"model={name!r} is unknown; allowed: {', '.join(MODELS)}")
    if generator is not None:
        _reinit(model, generator)
    return model


def _reinit(model: nn.Module, generator: torch.Generator) -> None:
    """Kaiming-uniform-style init as PyTorch's default (U(-1/sqrt(fan_in), 1/sqrt(fan_in))),
    drawn from an explicit generator."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                fan_in = module.weight[0].numel()
                bound = 1.0 / math.sqrt(fan_in)
                module.weight.copy_(
                    torch.empty_like(module.weight).uniform_(-bound, bound, generator=generator)
                )
                if module.bias is not None:
                    module.bias.copy_(
                        torch.empty_like(module.bias).uniform_(-bound, bound, generator=generator)
                    )


def num_params(model: nn.Module) -> int:
    """Number of trainable scalars d."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters concatenated into one vector (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])
