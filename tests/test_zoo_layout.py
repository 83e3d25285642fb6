"""The launcher's pre-flight counts a zoo model's parameters from its spec (app/model_spec.py
``zoo_layout``, no torch); the count must be the built module's, shape for shape, in order."""

from __future__ import annotations

import pytest

from app.model_spec import zoo_layout
from app.models.zoo import MODELS, build_model

#: (model, feature shape, classes, hidden) covering every zoo model, the datasets' shapes and edge sizes
SPECS = [
    ("logistic", (30,), 2, (5,)),
    ("logistic", (1, 28, 28), 10, ()),
    ("mlp", (30,), 2, (5,)),
    ("mlp", (50,), 2, (64,)),
    ("mlp", (3, 32, 32), 10, (128, 64, 32)),
    ("mlp", (7,), 3, ()),
    ("mlp", (1,), 1, (1,)),
    ("lenet5", (3, 32, 32), 10, (5,)),
    ("lenet5", (1, 28, 28), 10, (5,)),
    ("lenet5", (1, 16, 16), 2, (5,)),
    ("lenet5", (2, 17, 17), 4, (5,)),
    ("resnet18", (3, 32, 32), 10, (5,)),
    ("resnet18", (1, 28, 28), 2, (5,)),
]


def _torch_layout(name: str, shape: tuple[int, ...], classes: int, hidden: tuple[int, ...]) -> list:
    model = build_model(name, shape, classes, hidden=hidden)
    return [(k, tuple(v.shape)) for k, v in model.named_parameters()]


def test_every_zoo_model_is_covered() -> None:
    assert {name for name, *_ in SPECS} == set(MODELS)


@pytest.mark.parametrize(("name", "shape", "classes", "hidden"), SPECS)
def test_zoo_layout_is_the_built_modules(name: str, shape: tuple[int, ...], classes: int,
                                         hidden: tuple[int, ...]) -> None:
    layout = zoo_layout(name, shape, classes, hidden)
    assert layout is not None
    assert list(layout.items()) == _torch_layout(name, shape, classes, hidden)


@pytest.mark.parametrize(("name", "shape"), [("lenet5", (3, 15, 15)), ("lenet5", (3, 32, 30)), ("lenet5", (30,)),
                                             ("resnet18", (30,))])
def test_a_shape_the_zoo_refuses_is_left_to_torch(name: str, shape: tuple[int, ...]) -> None:
    """None, so that the launcher builds the model and shows the zoo's own error."""
    assert zoo_layout(name, shape, 2, (5,)) is None
    with pytest.raises(ValueError, match=f"model={name} needs"):
        build_model(name, shape, 2)


def test_no_layout_for_a_name_outside_the_zoo_or_sizes_not_positive() -> None:
    assert zoo_layout("pkg.mod:Net", (30,), 2, (5,)) is None
    assert zoo_layout("mlp", (30,), 2, (0,)) is None
    assert zoo_layout("logistic", (0,), 2, ()) is None
