"""Your own model (``model = "package.module:Class"`` or a ``silofl.models`` entry point):
the config's form, each one-line refusal of the DP check, the seeded construction, and a
federation that trains a model defined in this module under ISRL-DP.

The models below are what a user writes; the run config names them as
``tests.test_your_model:TinyNet`` (this module, importable from the repository root).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch
from torch import nn

from app.config import ConfigError, parse_settings
from app.models import build_model
from tests.helpers import run

HERE = "tests.test_your_model"


class TinyNet(nn.Module):
    """A user's two-layer tanh network (not a zoo class: per-sample gradients take the vmap route)."""

    def __init__(self, in_features: int, num_classes: int, width: int = 6) -> None:
        super().__init__()
        self.body = nn.Linear(in_features, width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(x.flatten(1))))


class WithLayerNorm(nn.Module):
    """LayerNorm normalises each record alone: allowed."""

    def __init__(self, feature_shape: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(feature_shape[-1])
        self.out = nn.Linear(feature_shape[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class WithBatchNorm(nn.Module):
    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.bn(self.fc(x.flatten(1))))


class WrongOutput(nn.Module):
    """Always 3 logits, whatever the run's number of classes."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


class BatchCentred(nn.Module):
    """No BatchNorm, but subtracts the batch mean: each record's output depends on the others."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.fc(x - x.mean(dim=0, keepdim=True))


class WithDropout(nn.Module):
    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_features, num_classes)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(x.flatten(1)))


class NotAModule:
    def __init__(self, in_features: int, num_classes: int) -> None:
        self.w = torch.zeros(in_features, num_classes)


def tiny_factory(in_features: int, num_classes: int, width: int = 4) -> nn.Module:
    """A factory (not a class) that takes only some of the arguments silofl offers."""
    return nn.Sequential(nn.Flatten(), nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, num_classes))


def not_a_module_factory(num_classes: int) -> str:
    return "a string"


WBCD = ((30,), 2)  # feature shape and classes of the default dataset


def _refusal(spec: str, kwargs: str = "") -> str:
    with pytest.raises(ConfigError) as info:
        build_model(spec, *WBCD, kwargs=kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# -- the run config ---------------------------------------------------------------------------

def test_the_config_takes_an_import_path_and_json_kwargs() -> None:
    s = parse_settings({"model": f"{HERE}:TinyNet", "model-kwargs": '{"width": 3}'})
    assert s.model == f"{HERE}:TinyNet" and s.model_kwargs == '{"width": 3}'
    assert parse_settings({"model": "mlp"}).model_kwargs == ""  # the zoo stays the default


@pytest.mark.parametrize("overrides, words", [
    ({"model": "nets:"}, "is not an import path"),
    ({"model": "my nets:Net"}, "is not an import path"),
    ({"model": "nonesuch"}, "is not allowed; allowed: logistic, mlp, lenet5, resnet18, an import path"),
    ({"model": f"{HERE}:TinyNet", "model-kwargs": "{width: 3}"}, "is not JSON"),
    ({"model": f"{HERE}:TinyNet", "model-kwargs": "[3]"}, "must be a JSON object"),
    ({"model": "mlp", "model-kwargs": '{"width": 3}'}, "is for your own model"),
])
def test_the_config_refuses_a_bad_model_in_one_line(overrides: dict, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(overrides)
    assert words in str(info.value) and "\n" not in str(info.value), info.value


# -- building and the DP check ----------------------------------------------------------------

def test_a_user_model_is_built_with_the_arguments_it_declares() -> None:
    model = build_model(f"{HERE}:TinyNet", *WBCD, kwargs='{"width": 7}')
    assert type(model).__name__ == "TinyNet" and model.body.weight.shape == (7, 30) and model.head.weight.shape == (2, 7)
    layer = build_model(f"{HERE}:WithLayerNorm", *WBCD)  # feature_shape, per-record normalisation
    assert type(layer).__name__ == "WithLayerNorm"
    seq = build_model(f"{HERE}:tiny_factory", *WBCD, kwargs='{"width": 5}')  # a factory
    assert isinstance(seq, nn.Sequential) and seq[1].weight.shape == (5, 30)


def test_an_image_model_gets_in_channels() -> None:
    """The zoo's LeNet-5 class by import path, for 3x32x32 images: in_channels and num_classes
    from the run, image_size from model-kwargs; the DP check passes (no BatchNorm)."""
    model = build_model("app.models.zoo:LeNet5", (3, 32, 32), 10, kwargs='{"image_size": 32}')
    assert model.features[0].weight.shape == (6, 3, 5, 5) and model.classifier[-1].weight.shape == (10, 84)


def test_the_seeded_construction_gives_every_process_the_same_weights() -> None:
    from app.seeding import torch_gen

    def weights(seed: int) -> list[torch.Tensor]:
        torch.manual_seed(seed + 1000)  # the global RNG must not matter
        m = build_model(f"{HERE}:WithLayerNorm", *WBCD, generator=torch_gen(seed, "init"))
        return [p.detach().clone() for p in m.parameters()]

    a, b, c = weights(3), weights(3), weights(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(torch.equal(x, y) for x, y in zip(a, c, strict=True))


def test_batchnorm_is_refused() -> None:
    message = _refusal(f"{HERE}:WithBatchNorm")
    assert "has a BatchNorm layer (bn: BatchNorm1d)" in message and "GroupNorm or LayerNorm" in message


def test_a_wrong_output_size_is_refused() -> None:
    message = _refusal(f"{HERE}:WrongOutput")
    assert "maps a batch [2, 30] to (2, 3)" in message and "logits [2, 2]" in message


def test_a_model_that_mixes_records_is_refused() -> None:
    assert "mixes records" in _refusal(f"{HERE}:BatchCentred")


def test_a_random_forward_is_refused() -> None:
    assert "gives two outputs for the same batch (randomness in training, e.g. Dropout)" in _refusal(
        f"{HERE}:WithDropout")


@pytest.mark.parametrize("spec, words", [
    ("tests.no_such_module:Net", "cannot import module 'tests.no_such_module'"),
    (f"{HERE}:NoSuchNet", f"module '{HERE}' has no attribute 'NoSuchNet'"),
])
def test_an_import_path_that_is_not_found_is_refused(spec: str, words: str) -> None:
    assert words in _refusal(spec)


@pytest.mark.parametrize("spec, words", [
    (f"{HERE}:NotAModule", "is the class NotAModule, not a torch.nn.Module subclass"),
    (f"{HERE}:not_a_module_factory", "returned a str, not a torch.nn.Module"),
])
def test_something_that_is_not_a_torch_module_is_refused(spec: str, words: str) -> None:
    assert words in _refusal(spec)


def test_wrong_kwargs_are_refused() -> None:
    assert "could not be built with arguments ['height', 'in_features', 'num_classes']" in _refusal(
        f"{HERE}:TinyNet", '{"height": 3}')


def test_a_registered_entry_point_names_a_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A package that declares ``[project.entry-points."silofl.models"] tiny = "pkg.nets:Net"``."""
    import importlib.metadata as metadata

    real = metadata.entry_points

    def entry_points(**kw):
        if kw.get("group") == "silofl.models":
            return [EntryPoint(name="tiny", value=f"{HERE}:TinyNet", group="silofl.models")]
        return real(**kw)

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    assert parse_settings({"model": "tiny"}).model == "tiny"
    assert type(build_model("tiny", *WBCD)).__name__ == "TinyNet"  # (this module, imported by its path)
    with pytest.raises(ConfigError, match="registered silofl.models entry points: tiny"):
        parse_settings({"model": "tinier"})


# -- a federation -----------------------------------------------------------------------------

def test_a_user_model_trains_under_isrl_dp(tmp_path: Path) -> None:
    """The real ServerApp and ClientApp train TinyNet (vmap per-sample gradients, clipping,
    Gaussian noise) on WBCD at epsilon = 3. Facts checked: the accounting does not depend on the
    model (each silo's sigma and epsilon are those of the zoo's MLP in the same run), the
    silos trained TinyNet's d = 30*6+6 + 6*2+2 = 200 parameters, and the model learnt (test
    error well below the 37% of always answering the majority class)."""
    base = {"num-rounds": 6, "seed": 2, "privacy.mode": "isrl", "privacy.epsilon": 3.0}
    mine, rows, grid = run(tmp_path / "mine", base | {"model": f"{HERE}:TinyNet", "model-kwargs": '{"width": 6}'})
    zoo, _, _ = run(tmp_path / "zoo", base | {"model": "mlp"})
    assert mine["status"] == "completed", mine["status_reason"]
    assert mine["model"] == f"{HERE}:TinyNet" and mine["config"]["model_kwargs"] == '{"width": 6}'
    assert [(s["sigma"], s["eps_spent"]) for s in mine["silos"]] == [(s["sigma"], s["eps_spent"]) for s in zoo["silos"]]
    assert all(0 < s["eps_spent"] <= 3.0 + 1e-9 for s in mine["silos"])
    import numpy as np

    from app.checkpoint import load_checkpoint

    state = load_checkpoint(tmp_path / "mine" / "out" / "t" / "checkpoint.npz")
    assert sum(int(np.prod(v.shape)) for v in state["model"].values()) == 200
    assert len(rows) == 6 and mine["test_error"] < 0.2, mine["test_error"]


def test_the_launcher_refuses_a_batchnorm_model_in_one_line(tmp_path: Path, no_flower,
                                                           capsys: pytest.CaptureFixture) -> None:
    from app import launch

    code = launch.main(["--run-config", f'outputs-dir="{tmp_path / "out"}" model="{HERE}:WithBatchNorm"'])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "has a BatchNorm layer (bn: BatchNorm1d)" in err and len(err.splitlines()) == 1, err


def test_the_server_app_refuses_a_bad_model_before_round_one(tmp_path: Path) -> None:
    """A deployed ServerApp (no launcher): the same line, and no round is run or written."""
    with pytest.raises(ConfigError, match="it must give logits"):
        run(tmp_path, {"model": f"{HERE}:WrongOutput", "num-rounds": 2})
    assert not (tmp_path / "out" / "t" / "rounds.jsonl").exists()


def test_the_launcher_hands_json_kwargs_to_flower_intact() -> None:
    """The launcher re-writes the operator's keys for ``flwr run --run-config``: Flower's own parser
    (flwr.common.config.parse_config_args) must read model-kwargs' JSON back unchanged."""
    from flwr.common.config import parse_config_args

    from app.launch import toml_value

    values = {"model-kwargs": '{"depth": 3, "name": "a b", "width": 64}', "model": f"{HERE}:TinyNet",
              "run-name": "it's", "num-rounds": 3}
    text = " ".join(f"{k}={toml_value(v)}" for k, v in values.items())
    assert parse_config_args([text]) == values
