"""Per-dataset presets: the settings that work for each data source, in one place.

A preset gives the federation's shape (partition, silos), the model, the pre-processing (PCA), the
step size, the batch, the clip norm, the local steps, the rounds and the trust set of a data set,
with overrides where they matter: per model (an image model reads pixels, so no PCA), per
algorithm (local SGD and the robust loop take ``local-steps`` steps per round, so a smaller
step size; the robust loop needs a trust set) and per algorithm in private runs (Grad-BANT's
scores under ISRL-DP noise). Naming the dataset is enough::

    make run RUN_CONFIG='dataset="fashion-mnist"'
    python -m app.sweep dataset=fmnist-iid

Every key of :data:`PRESET_KEYS` defaults to the sentinel :data:`PRESET` (``"preset"``) in
``pyproject.toml``'s ``[tool.flwr.app.config]`` and in ``conf/config.yaml``; ``app.config
.parse_settings`` replaces each one still ``"preset"`` (or absent) with the value of
:func:`preset_values` for the run's dataset, model, algorithm and privacy, and leaves every key the user
set alone (``lr=0.3`` wins, the rest keep the preset). Flower merges the pyproject defaults into
the run config before the app sees it, so a concrete default there could not be told from a
user's value; the sentinel can. Both paths (``flwr run`` and Hydra) go through the same
``parse_settings``, so they agree (tests/test_presets.py).

The ``wbcd`` preset is the embedded default of before presets existed, value for value: the
golden runs (tests/golden/) do not move. :data:`MEASURED` states what each preset reaches,
measured as its ``command`` says (docs/presets.md shows the same table; tests/test_presets.py
keeps the two equal and checks a bound per dataset on small data).

Pure data and plain functions: no torch, no Flower (app/config.py imports this module).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: the default of every preset-able key: "this dataset's preset value"
PRESET = "preset"

#: the run-config keys a preset sets (every preset gives a value for each one)
PRESET_KEYS: tuple[str, ...] = ("partition", "num-silos", "silos-per-round", "model", "mlp-hidden", "pca",
                                "num-rounds", "lr", "batch-size", "local-steps", "privacy.clip", "trust.size",
                                "gradbant.noise-aware", "diff-clip")


def _frozen(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Preset:
    """One data set's preset: ``values`` (a value for every key of :data:`PRESET_KEYS`), then
    ``models[model]``, ``algorithms[algorithm]`` and, in a private run (privacy.mode not "off",
    finite epsilon), ``private[algorithm]`` over them, in that order."""

    values: Mapping[str, Any]
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    algorithms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    private: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: where the values come from (docs/presets.md)
    origin: str = ""


#: for the algorithms whose silos take ``local-steps`` SGD steps per round (localsgd, robust)
_LOCAL = {"lr": 0.2, "local-steps": 10}

#: the algorithms that release gradient differences (diff-clip bounds their sensitivity)
_DIFF_ALGORITHMS = ("spider", "spider-alt", "svrg", "plsvrg")


def _diff_clip(c: float) -> dict[str, Mapping[str, Any]]:
    """Private runs of every difference-releasing algorithm clip each per-record difference at
    ``c``: the value private selection (issue 39, docs/presets.md) chose for SPIDER and SVRG."""
    return {a: _frozen({"diff-clip": c}) for a in _DIFF_ALGORITHMS}


#: Fashion-MNIST-shaped 28x28 grey images, 10 classes (the same preset for its three copies)
_MNIST_LIKE = Preset(
    values=_frozen({"partition": "iid", "num-silos": 10, "silos-per-round": 10, "model": "mlp", "mlp-hidden": "64",
                    "pca": 50, "num-rounds": 25, "lr": 1.0, "batch-size": 64, "local-steps": 1,
                    "privacy.clip": 2.0, "trust.size": 0, "gradbant.noise-aware": False,
                    "diff-clip": 0.0}),
    models=_frozen({"lenet5": _frozen({"pca": 0, "lr": 0.5}), "resnet18": _frozen({"pca": 0, "lr": 0.05})}),
    algorithms=_frozen({"localsgd": _frozen(_LOCAL), "robust": _frozen(_LOCAL | {"trust.size": 500})}),
    # Grad-BANT's paper score <g0, u> - (L lr / 2) ||u||^2 of a noised update gives every honest
    # silo 0 at epsilon 3 (the DP noise's energy) and the model never moves; the noise-aware score
    # (docs/byzantine.md) keeps it learning: clip 1 (the private-robust sweep's); batch 2048 and
    # lr 1, the point private selection returned most often on the gap row's grid (issue 39:
    # scripts/reproduce/robust_gap_private_tuning.py, epsilon covering the selection); SPIDER's and
    # SVRG's diff-clip 0.05, private selection's choice on the even/odd pairs
    private=_frozen({"robust": _frozen({"privacy.clip": 1.0, "gradbant.noise-aware": True, "batch-size": 2048,
                                        "lr": 1.0})} | _diff_clip(0.05)),
    origin="conf/experiment/gradbant-fmnist.yaml (PCA 50, MLP 50-64-10, batch 64; local steps: Q = 10, lr 0.2), "
           "scripts/reproduce/isrl_compare.py (R = 25, clip 2 and lr 1 chosen on validation data for MB-SGD, "
           "and the point private selection returned in 18 of 25 selections); private runs: Grad-BANT's batch and "
           "step size and SPIDER's / SVRG's diff-clip chosen by private selection (issue 39)",
)

PRESETS: Mapping[str, Preset] = _frozen({
    # the embedded default before presets (pyproject.toml's old literals), unchanged
    "wbcd": Preset(
        values=_frozen({"partition": "label", "num-silos": 2, "silos-per-round": 2, "model": "mlp", "mlp-hidden": "5",
                        "pca": 0, "num-rounds": 25, "lr": 0.5, "batch-size": 0, "local-steps": 1,
                        "privacy.clip": 1.0, "trust.size": 0, "gradbant.noise-aware": False,
                        "diff-clip": 0.0}),
        algorithms=_frozen({"robust": _frozen({"trust.size": 60})}),
        # private SPIDER and SVRG: diff-clip 0.2, private selection's choice (issue 39); the golden
        # runs pin diff-clip 0, their recorded setting
        private=_frozen(_diff_clip(0.2)),
        origin="the paper's WBCD setting (2 label-split silos, MLP 30-5-2, R = 25); trust set 60 as the golden "
               "Grad-BANT runs; private SPIDER / SVRG: diff-clip chosen by private selection (issue 39)",
    ),
    "digits": Preset(
        values=_frozen({"partition": "label", "num-silos": 10, "silos-per-round": 10, "model": "mlp",
                        "mlp-hidden": "64", "pca": 0, "num-rounds": 15, "lr": 1.0, "batch-size": 0,
                        "local-steps": 1, "privacy.clip": 2.0, "trust.size": 0, "gradbant.noise-aware": False,
                        "diff-clip": 0.0}),
        algorithms=_frozen({"localsgd": _frozen({"lr": 0.2, "local-steps": 5}), "robust": _frozen({"trust.size": 100})}),
        origin="conf/dataset/digits.yaml (10 silos of one digit each); MLP 64-64-10, full batches; R, lr and clip "
               "measured for this preset (docs/presets.md)",
    ),
    "fashion-mnist": _MNIST_LIKE,
    "tv-fashion-mnist": _MNIST_LIKE,
    "mnist": _MNIST_LIKE,
    "cifar10": Preset(
        values=_frozen({"partition": "label", "num-silos": 10, "silos-per-round": 10, "model": "lenet5",
                        "mlp-hidden": "64", "pca": 0, "num-rounds": 50, "lr": 0.1, "batch-size": 64,
                        "local-steps": 1, "privacy.clip": 1.0, "trust.size": 0, "gradbant.noise-aware": False,
                        "diff-clip": 0.0}),
        models=_frozen({"resnet18": _frozen({"lr": 0.05}), "mlp": _frozen({"pca": 50}),
                        "logistic": _frozen({"pca": 50})}),
        algorithms=_frozen({"localsgd": _frozen({"local-steps": 5}), "robust": _frozen({"trust.size": 500})}),
        origin="scripts/reproduce/isrl_compare.py (10 one-class silos, LeNet-5, batch 64, R = 50), "
               "scripts/bench/gpu_run.py (LeNet-5 lr 0.1), conf/experiment/gradbant-cifar10-resnet18.yaml "
               "(ResNet-18 lr 0.05, trust set 500); not measured here (the files are not on this machine)",
    ),
    "synthetic": Preset(
        values=_frozen({"partition": "iid", "num-silos": 2, "silos-per-round": 2, "model": "mlp", "mlp-hidden": "5",
                        "pca": 0, "num-rounds": 25, "lr": 0.5, "batch-size": 0, "local-steps": 1,
                        "privacy.clip": 1.0, "trust.size": 0, "gradbant.noise-aware": False,
                        "diff-clip": 0.0}),
        algorithms=_frozen({"localsgd": _frozen({"local-steps": 5}), "robust": _frozen({"trust.size": 100})}),
        origin="conf/dataset/synthetic.yaml (2 IID silos); WBCD's model and step size",
    ),
    "synthetic-image": Preset(
        values=_frozen({"partition": "iid", "num-silos": 10, "silos-per-round": 10, "model": "lenet5",
                        "mlp-hidden": "64", "pca": 0, "num-rounds": 25, "lr": 0.1, "batch-size": 64,
                        "local-steps": 1, "privacy.clip": 1.0, "trust.size": 0, "gradbant.noise-aware": False,
                        "diff-clip": 0.0}),
        models=_frozen({"resnet18": _frozen({"lr": 0.02}), "mlp": _frozen({"pca": 50}),
                        "logistic": _frozen({"pca": 50})}),
        algorithms=_frozen({"localsgd": _frozen({"local-steps": 5}), "robust": _frozen({"trust.size": 100})}),
        origin="scripts/bench/gpu_run.py (LeNet-5 lr 0.1, ResNet-18 lr 0.02, batch 64, 10 IID silos, trust set "
               "100); not measured here (LeNet-5 is a GPU workload)",
    ),
})


def preset_values(dataset: str, model: str | None = None, algorithm: str | None = None,
                  private: bool = False) -> dict[str, Any]:
    """The preset's value of every key of :data:`PRESET_KEYS` for ``dataset`` and, when given,
    ``model`` (else the preset's own), ``algorithm`` and whether the run is ``private``.
    KeyError for an unknown dataset."""
    preset = PRESETS[dataset]
    values = dict(preset.values)
    values |= preset.models.get(model if model is not None else values["model"], {})
    values |= preset.algorithms.get(algorithm or "", {})
    if private:
        values |= preset.private.get(algorithm or "", {})
    return values


@dataclass(frozen=True)
class Measured:
    """What a preset reached: ``accuracy`` (final test accuracy) after ``rounds`` rounds in
    ``wall_s`` seconds (the whole ``command``, on the project's 2-core CPU machine)."""

    dataset: str
    setting: str
    rounds: int
    accuracy: float
    wall_s: float
    command: str


#: the stated accuracy of each preset (docs/presets.md, "Measured"), seed 0, with the default
#: pre-processing inside epsilon (standardize = auto: the server's public sample; PCA fitted on it):
#: re-measured 2026-12-02 in-process (tests/helpers.run, the same ServerApp/ClientApp and run
#: config as the command; with standardize = pooled it gives the launcher's 2026-12-01 figures
#: exactly) on the project's 2-core CPU machine under heavy load (wall times are upper bounds)
MEASURED: tuple[Measured, ...] = (
    Measured("wbcd", "MLP 30-5-2, ISRL-DP MB-SGD, eps 3", 25, 0.9706, 5.7, "python -m app.launch"),
    Measured("digits", "MLP 64-64-10, ISRL-DP MB-SGD, eps 3", 15, 0.8302, 37.8,
             """python -m app.launch --run-config 'dataset="digits"'"""),
    Measured("digits", "the same, local SGD (Q = 5, lr 0.2)", 15, 0.7160, 54.3,
             """python -m app.launch --run-config 'dataset="digits" algorithm="localsgd"'"""),
    Measured("fashion-mnist", "PCA 50, MLP 50-64-10, ISRL-DP MB-SGD, eps 3", 25, 0.7359, 49.3,
             """python -m app.launch --run-config 'dataset="fashion-mnist"'"""),
    Measured("fashion-mnist", "the same, non-private local SGD (Q = 10, lr 0.2)", 25, 0.8261, 72.7,
             """python -m app.launch --run-config 'dataset="fashion-mnist" partition="iid" num-silos=10 """
             """silos-per-round=10 privacy.mode="off" algorithm="localsgd"'"""),
    Measured("fashion-mnist", "Grad-BANT (Q = 10, lr 0.2, trust set 500), 60% label flippers, non-private", 25,
             0.8236, 65.2, """python -m app.launch --run-config 'dataset="fashion-mnist" algorithm="robust" """
             """privacy.mode="off" attack.kind="label-flip" attack.fraction=0.6'"""),
    # re-measured 2026-12-04 with the private robust preset chosen by private selection (issue 39):
    # python -m app.launch, its "done in" (was 74.93% in 79.7 s with batch 64 and lr 0.2)
    Measured("fashion-mnist", "Grad-BANT noise-aware, ISRL-DP at eps 3 (Q = 10, batch 2048, lr 1, clip 1), 60% "
             "label flippers", 25, 0.7753, 87.1, """python -m app.launch --run-config 'dataset="fashion-mnist" """
             """algorithm="robust" attack.kind="label-flip" attack.fraction=0.6'"""),
    Measured("synthetic", "MLP 20-5-2, ISRL-DP MB-SGD, eps 3", 25, 0.8944, 4.4,
             """python -m app.launch --run-config 'dataset="synthetic"'"""),
)


def _cell(v: Any) -> str:
    return f"`{v}`" if isinstance(v, str) else f"{v:g}" if isinstance(v, float) else str(v)


def markdown() -> str:
    """docs/presets.md's two generated tables: every preset's values, and :data:`MEASURED`
    (tests/test_presets.py checks that the page holds exactly this text)."""
    keys = list(PRESET_KEYS)
    lines = ["| dataset | " + " | ".join(f"`{k}`" for k in keys) + " | per model | per algorithm | private runs |",
             "|" + " --- |" * (len(keys) + 4)]
    unique = [p for i, p in enumerate(PRESETS.values()) if all(p is not q for q in list(PRESETS.values())[:i])]
    for preset in unique:  # one row per preset, naming every dataset that has it
        names = ", ".join(f"`{name}`" for name, p in PRESETS.items() if p is preset)
        extra = [", ".join(f"{m}: " + " ".join(f"{k}={_cell(v)}" for k, v in over.items())
                           for m, over in table.items()) or "-"
                 for table in (preset.models, preset.algorithms, preset.private)]
        lines.append(f"| {names} | " + " | ".join(_cell(preset.values[k]) for k in keys) + " | " + " | ".join(extra) + " |")
    lines += ["", "| dataset | setting | rounds | test accuracy | wall | command |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{m.dataset}` | {m.setting} | {m.rounds} | {m.accuracy:.1%} | {m.wall_s:.0f} s | `{m.command}` |"
              for m in MEASURED]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
