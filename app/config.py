"""Typed, validated settings: the ONLY place the run config is parsed.

The run config is flat with dotted keys, the same names in ``pyproject.toml``
(``[tool.flwr.app.config]``), ``flwr run --run-config`` and Hydra's ``conf/``. A bad value
raises :class:`ConfigError` with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from app.algorithms import ALGORITHMS as ALGORITHM_REGISTRY, get_algorithm
from app.attacks import ATTACKS as ATTACK_REGISTRY, byzantine_count
from app.data.partition import PARTITIONS as PARTITION_REGISTRY
from app.data.scaling import PCA_FITS, SCALING_MODES, resolve_scaling
from app.data.sources import SOURCES
from app.presets import PRESET, PRESET_KEYS, PRESETS, preset_values
from app.privacy.policy import NOISE_SEEDS as POLICY_NOISE_SEEDS
from app.privacy.amplification import AMPLIFICATIONS
from app.privacy.shuffle import MAX_HEADROOM, auto_levels
from app.prox import PROX_KINDS as PROX_REGISTRY

ALGORITHMS = tuple(ALGORITHM_REGISTRY)
#: the algorithms whose server step is a prox step (not local SGD, whose message is a model delta,
#: nor the robust line, which steps with its aggregation rule)
PROX_ALGORITHMS = tuple(name for name, algo in ALGORITHM_REGISTRY.items() if algo.prox_step)
ATTACKS = ("none", *ATTACK_REGISTRY)
DATASETS = SOURCES
PARTITIONS = PARTITION_REGISTRY
STANDARDIZE = SCALING_MODES
PROX_KINDS = PROX_REGISTRY
NOISE_SEEDS = POLICY_NOISE_SEEDS
# The option lists below belong to modules that import torch (sketches, models, mechanisms) or
# sit above this layer (the aggregation rules in strategies/): copied here so that parsing a
# config stays light, and tests/test_config.py checks that each copy equals its registry.
#: aggregation rules of the Byzantine-robust line (= "gradbant" + strategies.aggregation.RULES)
AGGREGATORS = ("gradbant", "mean", "fltrust", "krum", "multi-krum", "trimmed-mean", "median", "geometric-median",
               "centered-clipping")
#: rules that score updates against the server's trust set
TRUST_AGGREGATORS = ("gradbant", "fltrust")
#: sketch kinds with an exact expected noise energy E||S^T S xi||^2 (app/sketch/noise.py), for gradbant.noise-aware
NOISE_AWARE_SKETCH_KINDS = ("none", "gaussian", "rademacher", "srht", "countsketch", "randk")
#: rules that need num-silos > 2f + 2 (= strategies.aggregation.KRUM_RULES)
KRUM_AGGREGATORS = ("krum", "multi-krum")
#: rules that cannot run without f, byzantine.f or an attack's (= strategies.aggregation.F_RULES)
F_AGGREGATORS = ("krum", "multi-krum", "trimmed-mean")
#: the trust set's appearance shifts (= app.data.federated.TRUST_SHIFTS)
TRUST_SHIFTS = ("none", "noise", "blur")
#: which iterate the run returns: the last one, or one drawn uniformly from w_1..w_R (the paper's w_priv).
OUTPUTS = ("last", "random")
#: = app.models.MODELS
MODELS = ("logistic", "mlp", "lenet5", "resnet18")
#: "off" + app.privacy.mechanism.MECHANISMS
PRIVACY_MODES = ("off", "isrl", "shuffle")
PLANNED_PRIVACY_MODES: tuple[str, ...] = ()
#: the algorithms with a shuffle-DP form (the paper's Algorithms 7-10, and MB-SGD for comparison):
#: their server step needs only the mean of the silos' releases, which is all the shuffler gives
SHUFFLE_ALGORITHMS = ("mbsgd", "proxsgd", "svrg", "plsvrg", "spider")
#: "none" + app.sketch.SKETCH_KINDS. PowerSGD keeps per-silo state (warm start, error feedback)
#: across the rounds the silo takes part in.
SKETCH_KINDS = ("none", "gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch", "randk", "kronecker",
                "adaptive", "powersgd")
DEVICES = ("cpu", "cuda", "auto")


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class PrivacySettings:
    mode: str = "isrl"
    epsilon: float = 3.0
    #: delta in (0, 1), or None for the paper's 1/n^2 with each silo's own n.
    delta: float | None = None
    clip: float = 1.0
    #: rounds each silo plans its noise for; 0 means num-rounds (every round, worst case).
    planned_rounds: int = 0
    #: "run": noise and batch sampling seeded from the run seed (reproducible research runs,
    #: NOT secret from the server); "os": from the operating system's CSPRNG (deployments).
    noise_seed: str = "run"
    #: the budget split between release kinds: noise multiplier of full-gradient releases
    #: (SPIDER/SVRG anchors, Fed-SPIDER's fresh gradients) relative to difference releases.
    #: 1 = equal multipliers z (each kind's sigma proportional to its sensitivity).
    anchor_noise_ratio: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.mode != "off" and not math.isinf(self.epsilon)


@dataclass(frozen=True)
class ShuffleSettings:
    """Shuffle DP's binomial encoding (app/privacy/shuffle.py): g levels (0: chosen from the model
    size d, app.privacy.shuffle_plan.auto_levels), the noise bits' probability p, and how many
    silos' noise a silo counts on (0: silos-per-round)."""

    levels: int = 0
    p: float = 0.25
    count_on: int = 0
    #: each silo carries (1 + headroom) / count-on of the noise trials it needs, so that silos
    #: whose calibrations differ a little (delta = 1/n^2 with different n) meet each other's
    headroom: float = 0.1
    #: record-level amplification of sampled binomial releases: "sampling" (the batch of K < n
    #: records is drawn without replacement: app/privacy/amplification.py) or "none" (default:
    #: amplified requirements differ much more between silos of different n, see docs/privacy.md)
    amplification: str = "none"

    def levels_for(self, dim: int) -> int:
        """g for a model of ``dim`` parameters: ``shuffle.levels``, or when it is 0 the automatic
        choice (app.privacy.shuffle.auto_levels). Silos and server both take it from here."""
        return self.levels or auto_levels(dim)


@dataclass(frozen=True)
class ProxSettings:
    """The composite loss's f1 (app/prox.py): ``prox.kind``, its ``strength`` and elastic net's ``l2``."""

    kind: str = "none"
    strength: float = 0.0
    l2: float = 0.0


@dataclass(frozen=True)
class SpiderSettings:
    #: anchor every q rounds
    q: int = 5
    #: K1 of the anchors (0: the full batch n)
    anchor_batch: int = 0


@dataclass(frozen=True)
class SVRGSettings:
    #: inner steps Q per snapshot
    inner_steps: int = 5


@dataclass(frozen=True)
class PLSVRGSettings:
    #: S stages (restarts)
    restarts: int = 2


@dataclass(frozen=True)
class SketchSettings:
    """The silos' compressor (app/sketch/): kind, k/n, the adaptive sketch's JL epsilon, per layer
    or whole-vector, PowerSGD's error feedback."""

    kind: str = "none"
    ratio: float = 0.5
    epsilon: float = 0.3
    layerwise: bool = True
    error_feedback: bool = True


@dataclass(frozen=True)
class RobustSettings:
    """The Byzantine-robust line: the aggregation rule, the server's trust set, the rules' knobs."""

    aggregator: str = "auto"  # parse_settings resolves it: gradbant for algorithm robust, else mean
    trust_size: int = 0
    trust_classes: tuple[int, ...] = ()
    trust_shift: str = "none"
    gradbant_beta: float = 0.5
    #: L of the descent-lemma penalty, or "auto": a secant estimate on the trust set each round
    gradbant_smoothness: float | str = 1.0
    #: subtract the expected noise energy of an honest message (DP noise; with gradient messages
    #: also the minibatch's sampling noise) from the norm penalty (docs/byzantine.md)
    gradbant_noise_aware: bool = False
    #: a public (smallest, largest) number of training records of any silo, for noise-aware
    #: Grad-BANT when the server cannot read the partition (a deployment); () = from the partition
    gradbant_silo_records: tuple[int, ...] = ()
    cc_tau: float = 1.0
    #: byzantine.f: the number of Byzantine silos the rule must tolerate, as the operator states
    #: it; -1 = not stated (a simulation's attack harness then tells the rule each round's count)
    byzantine_f: int = -1


@dataclass(frozen=True)
class AttackSettings:
    """The experiment's Byzantine silos (app/attacks.py)."""

    kind: str = "none"
    fraction: float = 0.0
    ipm_epsilon: float = 0.5
    alie_z: float = 0.0
    noise_std: float = 1.0


#: the nested groups of Settings, by attribute name
GROUPS = {"privacy": PrivacySettings, "shuffle": ShuffleSettings, "prox": ProxSettings, "spider": SpiderSettings, "svrg": SVRGSettings,
          "plsvrg": PLSVRGSettings, "sketch": SketchSettings, "robust": RobustSettings, "attack": AttackSettings}


@dataclass(frozen=True)
class Settings:
    algorithm: str = "mbsgd"
    dataset: str = "wbcd"
    data_dir: str = ""
    partition: str = "label"
    partition_alpha: float = 0.5
    partition_p: float = 0.0
    #: feature scaling (app/data/scaling.py): auto (public ranges, else DP statistics), public,
    #: server, dp; pooled and local are outside the guarantee (reproducing papers only), none
    standardize: str = "auto"
    test_fraction: float = 0.2
    #: share of each silo's training split held out for hyper-parameter selection (0 = none)
    validation_fraction: float = 0.0
    #: project the features on their top principal components (0 = off; fitted on the pooled
    #: training records: non-private pre-processing, like pooled standardisation)
    pca: int = 0
    #: where the PCA is fitted: "public" (the server's public sample) or "pooled" (all silos'
    #: training records: outside the guarantee, reproducing papers only)
    pca_fit: str = "public"
    #: records of the server's public sample (carved out before the partition, disjoint from every
    #: silo) when pca-fit = "public" with pca > 0, or standardize = "server"; 0: min(500, a tenth)
    public_size: int = 0
    #: standardize = "dp": the share of each silo's epsilon its pre-processing release spends, and
    #: the L2 norm its records are clipped to (in the features' units after public range scaling)
    preprocess_share: float = 0.1
    preprocess_clip: float = 1.0
    num_silos: int = 2
    silos_per_round: int = 2
    model: str = "mlp"
    model_hidden: tuple[int, ...] = (5,)
    num_rounds: int = 25
    lr: float = 0.5
    batch_size: int = 0
    local_steps: int = 1
    seed: int = 0
    eval_every: int = 1
    diff_clip: float = 0.0
    output: str = "last"
    prox: ProxSettings = field(default_factory=lambda: ProxSettings())
    spider: SpiderSettings = field(default_factory=lambda: SpiderSettings())
    svrg: SVRGSettings = field(default_factory=lambda: SVRGSettings())
    plsvrg: PLSVRGSettings = field(default_factory=lambda: PLSVRGSettings())
    sketch: SketchSettings = field(default_factory=lambda: SketchSettings())
    robust: RobustSettings = field(default_factory=lambda: RobustSettings())
    attack: AttackSettings = field(default_factory=lambda: AttackSettings())
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    shuffle: ShuffleSettings = field(default_factory=ShuffleSettings)
    outputs_dir: str = "outputs"
    run_name: str = ""
    fail_on_client_error: bool = True
    #: mark a run failed when the aggregator kept the model in at least half of its rounds
    fail_on_no_progress: bool = False
    round_timeout: float = 600.0
    device: str = "cpu"
    #: write every message the ServerApp receives under outputs/<run>/transcript/ (audits)
    transcript: bool = False
    #: seconds the server waits for num-silos silo nodes (at the start, or when fewer than
    #: min-silos are connected); then it goes on with those present (the paper's M_r <= M)
    node_wait: float = 120.0
    #: the fewest connected silo nodes a round may run with; below it, after node-wait, the run fails
    min_silos: int = 1
    #: the server's longest pause between two pulls of replies (seconds; it starts at 5 ms)
    poll_interval: float = 0.05
    #: write the server's whole state to outputs/<run>/checkpoint/ after every round
    checkpoint: bool = True
    #: continue the run named run-name from its last checkpoint (same settings, same outputs)
    resume: bool = False
    #: the silos' per-run ledger name ("" = the Flower run id): a resumed run sets its
    #: original's, so a silo with a per-run budget keeps spending the same budget
    ledger_run_key: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Every setting, for summary.json."""
        d = asdict(self)
        d["model_hidden"] = list(self.model_hidden)
        d["robust"]["trust_classes"] = list(self.robust.trust_classes)
        return d

    def delta_for(self, n: int) -> float:
        """The silo's delta: the configured one, or 1/n^2 (the paper's choice)."""
        return self.privacy.delta if self.privacy.delta is not None else 1.0 / (n * n)

    def batch_for(self, n: int) -> int:
        """K for a silo with n training records: ``batch-size``, or when it is 0 the algorithm's
        default (the full batch K = n; for proxsgd K = floor(n / R), disjoint blocks)."""
        if self.batch_size:
            return self.batch_size
        return get_algorithm(self.algorithm).default_batch(self, n)

    def simulation_nodes(self) -> int:
        """Nodes a simulation starts: one per silo, plus the shuffler in shuffle mode (the last
        node, partition-id = num-silos)."""
        return self.num_silos + (1 if self.privacy.mode == "shuffle" else 0)

    def planned_rounds(self) -> int:
        return self.privacy.planned_rounds or self.num_rounds


# (key, attribute path, parser) -- the run-config schema.
def _str(choices: tuple[str, ...] | None = None, planned: tuple[str, ...] = ()) -> Any:
    def parse(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r} must be a string")
        if choices is not None and value not in choices:
            if value in planned:
                raise ConfigError(f"{key} = {value!r} is not implemented yet; allowed: {', '.join(choices)}")
            raise ConfigError(f"{key} = {value!r} is not allowed; allowed: {', '.join(choices)}")
        return value

    return parse


def _num(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
         integer: bool = False, allow_inf: bool = False) -> Any:
    def parse(key: str, value: Any) -> float | int:
        if isinstance(value, str) and allow_inf and value.strip().lower() in ("inf", "infinity"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} = {value!r} must be a number; allowed: {_range(lo, hi, lo_open, hi_open)}")
        if integer and (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{key} = {value!r} must be an integer; allowed: {_range(lo, hi, lo_open, hi_open)}")
        v = float(value)
        bad = math.isnan(v) or (math.isinf(v) and not allow_inf)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            bad = True
        if hi is not None and (v > hi or (hi_open and v == hi)):
            bad = True
        if bad:
            raise ConfigError(f"{key} = {value!r} is out of range; allowed: {_range(lo, hi, lo_open, hi_open)}")
        return int(v) if integer else v

    return parse


def _range(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    lo_s = "-inf" if lo is None else f"{lo:g}"
    hi_s = "inf" if hi is None else f"{hi:g}"
    return f"{left}{lo_s}, {hi_s}{right}"


def _num_or_word(number: Any, word: str) -> Any:
    """A number as ``number`` parses it, or the string ``word`` (e.g. "auto")."""
    def parse(key: str, value: Any) -> float | int | str:
        if isinstance(value, str) and value.strip().lower() == word:
            return word
        try:
            return number(key, value)
        except ConfigError as exc:
            raise ConfigError(f"{exc}, or {word!r}") from None

    return parse


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{key} = {value!r} must be true or false")


def _int_tuple(lo: int, example: str, what: str) -> Any:
    """A comma-separated list of integers >= ``lo`` (e.g. layer widths, class indices)."""
    def parse(key: str, value: Any) -> tuple[int, ...]:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r} must be a comma-separated list of {what}, e.g. {example}")
        try:
            out = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            raise ConfigError(f"{key} = {value!r} must be a comma-separated list of {what}") from None
        if any(v < lo for v in out):
            raise ConfigError(f"{key} = {value!r} must be a comma-separated list of {what}")
        return out

    return parse


_hidden = _int_tuple(1, '"64" or "128,64"', "positive integers (layer widths)")
_int_list = _int_tuple(0, '"0,1,2" ("": all)', "class indices >= 0")


#: old algorithm names still accepted: "gradbant" ran the robust line with any ``aggregator``
#: (Grad-BANT is the default rule), so ``algorithm=gradbant aggregator=krum`` ran Krum
ALGORITHM_ALIASES = {"gradbant": "robust"}


def _algorithm(key: str, value: Any) -> str:
    if isinstance(value, str) and value in ALGORITHM_ALIASES:
        return ALGORITHM_ALIASES[value]
    return _str(ALGORITHMS)(key, value)


def _delta(key: str, value: Any) -> float | None:
    if isinstance(value, str) and value.strip().lower() in ("auto", "1/n^2", "1/n2"):
        return None
    v = _num(0.0, 1.0, lo_open=True, hi_open=True)(key, value)
    return float(v)


SCHEMA: dict[str, tuple[str, Any]] = {
    "algorithm": ("algorithm", _algorithm),
    "dataset": ("dataset", _str(DATASETS)),
    "data-dir": ("data_dir", _str()),
    "partition": ("partition", _str(PARTITIONS)),
    "dirichlet-alpha": ("partition_alpha", _num(0, None, lo_open=True)),
    "mixing-p": ("partition_p", _num(0, 1)),
    "standardize": ("standardize", _str(STANDARDIZE)),
    "test-fraction": ("test_fraction", _num(0, 1, lo_open=True, hi_open=True)),
    "validation-fraction": ("validation_fraction", _num(0, 1, hi_open=True)),
    "pca": ("pca", _num(0, 100_000, integer=True)),
    "pca-fit": ("pca_fit", _str(PCA_FITS)),
    "public-size": ("public_size", _num(0, None, integer=True)),
    "preprocess-share": ("preprocess_share", _num(0, 1, lo_open=True, hi_open=True)),
    "preprocess-clip": ("preprocess_clip", _num(0, None, lo_open=True)),
    "num-silos": ("num_silos", _num(1, 10_000, integer=True)),
    "silos-per-round": ("silos_per_round", _num(1, 10_000, integer=True)),
    "model": ("model", _str(MODELS)),
    "mlp-hidden": ("model_hidden", _hidden),
    "num-rounds": ("num_rounds", _num(1, 1_000_000, integer=True)),
    "lr": ("lr", _num(0, None, lo_open=True)),
    "batch-size": ("batch_size", _num(0, None, integer=True)),
    "local-steps": ("local_steps", _num(1, 100_000, integer=True)),
    "seed": ("seed", _num(0, 2**62, integer=True)),
    "eval-every": ("eval_every", _num(0, None, integer=True)),
    "prox.kind": ("prox.kind", _str(PROX_KINDS)),
    "prox.strength": ("prox.strength", _num(0, None)),
    "prox.l2": ("prox.l2", _num(0, None)),
    "spider.q": ("spider.q", _num(1, 1_000_000, integer=True)),
    "spider.anchor-batch": ("spider.anchor_batch", _num(0, None, integer=True)),
    "diff-clip": ("diff_clip", _num(0, None)),
    "svrg.inner-steps": ("svrg.inner_steps", _num(1, 1_000_000, integer=True)),
    "plsvrg.restarts": ("plsvrg.restarts", _num(1, 1_000_000, integer=True)),
    "output": ("output", _str(OUTPUTS)),
    "sketch.kind": ("sketch.kind", _str(SKETCH_KINDS)),
    "sketch.error-feedback": ("sketch.error_feedback", _bool),
    "sketch.ratio": ("sketch.ratio", _num(0, 1, lo_open=True)),
    "sketch.epsilon": ("sketch.epsilon", _num(0, 1, lo_open=True, hi_open=True)),
    "sketch.layerwise": ("sketch.layerwise", _bool),
    "aggregator": ("robust.aggregator", _str(("auto", *AGGREGATORS))),
    "trust.size": ("robust.trust_size", _num(0, 1_000_000, integer=True)),
    "trust.classes": ("robust.trust_classes", _int_list),
    "trust.shift": ("robust.trust_shift", _str(TRUST_SHIFTS)),
    "gradbant.beta": ("robust.gradbant_beta", _num(0, 1, lo_open=True)),
    "gradbant.smoothness": ("robust.gradbant_smoothness", _num_or_word(_num(0, None), "auto")),
    "gradbant.noise-aware": ("robust.gradbant_noise_aware", _bool),
    "gradbant.silo-records": ("robust.gradbant_silo_records",
                              _int_tuple(1, '"500,6000" (smallest,largest; "": from the partition)',
                                         "two positive integers")),
    "cc.tau": ("robust.cc_tau", _num(0, None, lo_open=True)),
    "byzantine.f": ("robust.byzantine_f", _num(-1, 10_000, integer=True)),
    "attack.kind": ("attack.kind", _str(ATTACKS)),
    "attack.fraction": ("attack.fraction", _num(0, 0.9)),
    "attack.ipm-epsilon": ("attack.ipm_epsilon", _num(0, None, lo_open=True)),
    "attack.alie-z": ("attack.alie_z", _num(0, None)),
    "attack.noise-std": ("attack.noise_std", _num(0, None)),
    "privacy.mode": ("privacy.mode", _str(PRIVACY_MODES, PLANNED_PRIVACY_MODES)),
    "privacy.epsilon": ("privacy.epsilon", _num(0, None, lo_open=True, allow_inf=True)),
    "privacy.delta": ("privacy.delta", _delta),
    "privacy.clip": ("privacy.clip", _num(0, None, lo_open=True)),
    "privacy.planned-rounds": ("privacy.planned_rounds", _num(0, 1_000_000, integer=True)),
    "privacy.noise-seed": ("privacy.noise_seed", _str(NOISE_SEEDS)),
    "privacy.anchor-noise-ratio": ("privacy.anchor_noise_ratio", _num(0, None, lo_open=True)),
    "shuffle.levels": ("shuffle.levels", _num(0, 4096, integer=True)),
    "shuffle.p": ("shuffle.p", _num(0, 1, lo_open=True, hi_open=True)),
    "shuffle.count-on": ("shuffle.count_on", _num(0, 10_000, integer=True)),
    "shuffle.headroom": ("shuffle.headroom", _num(0, MAX_HEADROOM)),
    "shuffle.amplification": ("shuffle.amplification", _str(AMPLIFICATIONS)),
    "outputs-dir": ("outputs_dir", _str()),
    "run-name": ("run_name", _str()),
    "fail-on-client-error": ("fail_on_client_error", _bool),
    "fail-on-no-progress": ("fail_on_no_progress", _bool),
    "round-timeout": ("round_timeout", _num(1, None)),
    "device": ("device", _str(DEVICES)),
    "transcript": ("transcript", _bool),
    "node-wait": ("node_wait", _num(0, None)),
    "min-silos": ("min_silos", _num(1, 1_000_000, integer=True)),
    "poll-interval": ("poll_interval", _num(0, 10, lo_open=True)),
    "checkpoint": ("checkpoint", _bool),
    "resume": ("resume", _bool),
    "ledger-run-key": ("ledger_run_key", _str()),
}


#: nodes of the Hydra config (conf/config.yaml) that are not run config
HYDRA_ONLY_NODES = ("sweep", "hydra")


def flatten_run_config(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The one mapping from Hydra's composed (nested) config to the flat run config:
    ``{"privacy": {"epsilon": 3}}`` -> ``{"privacy.epsilon": 3}``, the same convention Flower
    uses for pyproject's ``[tool.flwr.app.config]`` tables. The ``sweep`` and ``hydra`` nodes
    are the sweep's own settings and are left out."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        if not prefix and key in HYDRA_ONLY_NODES:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat |= flatten_run_config(value, f"{name}.")
        elif isinstance(value, float) and math.isinf(value):
            flat[name] = "inf"  # Flower's run config has no infinity; parse_settings reads "inf"
        else:
            flat[name] = value
    return flat


def resolve_presets(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config with every key of :data:`app.presets.PRESET_KEYS` that is absent or
    ``"preset"`` (the default in pyproject.toml and conf/config.yaml) set to its value in the
    preset of the run's dataset, model, algorithm and privacy (:func:`app.presets.preset_values`; a
    private run has privacy.mode other than "off" and a finite epsilon, as PrivacySettings.enabled); a key
    given any other value keeps it. ``silos-per-round`` from the preset is at most ``num-silos``
    (so ``num-silos=4`` alone asks for 4 silos, each round at most all of them); a preset's
    ``gradbant.noise-aware = true`` applies only where the option does (aggregator gradbant,
    ISRL-DP, a sketch kind with an exact noise energy), else it is false. Values are not
    validated here (parse_settings does that), except the dataset: it chooses the preset."""
    flat = dict(run_config)
    dataset = flat.get("dataset", Settings.dataset)
    if not isinstance(dataset, str) or dataset not in PRESETS:
        _str(DATASETS)("dataset", dataset)  # the one-line error naming the allowed values
        raise ConfigError(f"dataset = {dataset!r} has no preset; add one to app/presets.py")
    model, algorithm = flat.get("model", PRESET), flat.get("algorithm", Settings.algorithm)
    model = model if isinstance(model, str) and model != PRESET else None
    algorithm = ALGORITHM_ALIASES.get(algorithm, algorithm) if isinstance(algorithm, str) else None
    mode, epsilon = flat.get("privacy.mode", PrivacySettings.mode), flat.get("privacy.epsilon", PrivacySettings.epsilon)
    infinite = (isinstance(epsilon, str) and epsilon.strip().lower() in ("inf", "infinity")) or (
        isinstance(epsilon, float) and math.isinf(epsilon))
    values = preset_values(dataset, model, algorithm, private=mode != "off" and not infinite)
    preset_silos = _is_preset(flat, "silos-per-round")
    preset_aware = _is_preset(flat, "gradbant.noise-aware")
    for key in PRESET_KEYS:
        if _is_preset(flat, key):
            flat[key] = values[key]
    if preset_aware and flat["gradbant.noise-aware"] is True and not (
            flat.get("aggregator", "auto") in ("auto", "gradbant") and algorithm == "robust" and mode in ("isrl", "off")
            and flat.get("sketch.kind", "none") in NOISE_AWARE_SKETCH_KINDS):
        flat["gradbant.noise-aware"] = False  # the preset's choice applies to Grad-BANT where it is exact only
    num_silos = flat["num-silos"]
    if preset_silos and isinstance(num_silos, (int, float)) and not isinstance(num_silos, bool):
        flat["silos-per-round"] = min(flat["silos-per-round"], int(num_silos))
    return flat


def _is_preset(run_config: Mapping[str, Any], key: str) -> bool:
    value = run_config.get(key, PRESET)
    return isinstance(value, str) and value == PRESET


def parse_settings(run_config: Mapping[str, Any]) -> Settings:
    """Parse and validate a flat run config. Keys of :data:`app.presets.PRESET_KEYS` that are
    absent or ``"preset"`` take the dataset's preset (:func:`resolve_presets`), other absent keys
    the defaults above; unknown keys are an error (a typo must not silently fall back to a default)."""
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown:
        raise ConfigError(unknown_key_message(unknown[0]))
    top: dict[str, Any] = {}
    groups: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    for key, value in resolve_presets(run_config).items():
        attr, parser = SCHEMA[key]
        try:
            parsed = parser(key, value)
        except ConfigError as exc:
            if key in PRESET_KEYS:
                raise ConfigError(f'{exc}; or "{PRESET}" (the dataset\'s preset, docs/presets.md)') from None
            raise
        group, _, field_name = attr.rpartition(".")
        (groups[group] if group else top)[field_name] = parsed
    settings = Settings(**top, **{name: GROUPS[name](**values) for name, values in groups.items()})
    _check_relations(settings)
    return settings


def _check_relations(s: Settings) -> None:
    if s.silos_per_round > s.num_silos:
        raise ConfigError(
            f"silos-per-round = {s.silos_per_round} is out of range; allowed: [1, num-silos = {s.num_silos}]"
        )
    if s.min_silos > s.num_silos:
        raise ConfigError(f"min-silos = {s.min_silos} is out of range; allowed: [1, num-silos = {s.num_silos}]")
    if s.resume and not s.run_name:
        raise ConfigError("resume = true needs run-name: the name of the run to continue (outputs/<run-name>/checkpoint)")
    if s.resume and not s.checkpoint:
        raise ConfigError("resume = true needs checkpoint = true (a resumed run goes on writing checkpoints)")
    if s.privacy.planned_rounds and s.privacy.planned_rounds > s.num_rounds:
        raise ConfigError(
            f"privacy.planned-rounds = {s.privacy.planned_rounds} is out of range; allowed: [0, num-rounds = {s.num_rounds}]"
        )
    if s.prox.kind != "none" and s.algorithm not in PROX_ALGORITHMS:
        raise ConfigError(f"prox.kind = {s.prox.kind!r} is not supported by algorithm = {s.algorithm!r}; allowed: none "
                          f"(the server's prox step is part of {', '.join(PROX_ALGORITHMS)})")
    if s.prox.kind == "l2-ball" and s.prox.strength <= 0:
        raise ConfigError(f"prox.strength = {s.prox.strength!r} is out of range for prox.kind l2-ball; allowed: (0, inf)")
    if s.prox.kind == "box" and s.prox.strength <= 0:
        raise ConfigError(f"prox.strength = {s.prox.strength!r} is out of range for prox.kind box; allowed: (0, inf)")
    if s.algorithm == "plsvrg" and s.plsvrg.restarts > s.num_rounds:
        raise ConfigError(f"plsvrg.restarts = {s.plsvrg.restarts} is out of range; allowed: [1, num-rounds = {s.num_rounds}]")
    if s.partition == "even-odd-pairs" and s.num_silos > 25:
        raise ConfigError(f"num-silos = {s.num_silos} is out of range for partition even-odd-pairs; allowed: [1, 25]")
    _check_byzantine(s)
    _check_shuffle(s)


def _check_shuffle(s: Settings) -> None:
    """Shuffle DP's settings: which algorithms, no sketch, a finite budget, whom silos count on."""
    if s.privacy.mode != "shuffle":
        return
    if s.algorithm not in SHUFFLE_ALGORITHMS:
        raise ConfigError(f"privacy.mode = 'shuffle' is not available for algorithm = {s.algorithm!r}; allowed: "
                          f"{', '.join(SHUFFLE_ALGORITHMS)} (the shuffler releases only the sum of the silos' messages)")
    if resolve_scaling(s.standardize, s.dataset) == "dp":
        raise ConfigError("standardize = 'dp' is not allowed with privacy.mode = 'shuffle' (its calibration has no "
                          "fixed release); allowed: public, server, none (or pooled, local: not covered by epsilon)")
    if math.isinf(s.privacy.epsilon):
        raise ConfigError("privacy.epsilon = inf is not allowed with privacy.mode = 'shuffle'; allowed: (0, inf) "
                          "(use privacy.mode = off for a non-private run)")
    if s.sketch.kind != "none":
        raise ConfigError(f"sketch.kind = {s.sketch.kind!r} is not allowed with privacy.mode = 'shuffle'; allowed: none "
                          "(the shuffler sums integer counts; a sketch of them would not debias)")
    if s.shuffle.count_on > s.silos_per_round:
        raise ConfigError(f"shuffle.count-on = {s.shuffle.count_on} is out of range; allowed: [0, silos-per-round = "
                          f"{s.silos_per_round}] (0 means silos-per-round)")


def effective_aggregator(s: Settings) -> str:
    """The run's aggregation rule: ``aggregator``, where ``auto`` (the default) is Grad-BANT for
    algorithm robust and the mean for every other algorithm (strategies/aggregators.py)."""
    if s.robust.aggregator == "auto":
        return "gradbant" if s.algorithm == "robust" else "mean"
    return s.robust.aggregator


def _check_byzantine(s: Settings) -> None:
    """The Byzantine-robust line's settings that depend on each other."""
    agg = effective_aggregator(s)
    _check_byzantine_f(s)
    if s.algorithm != "robust":
        from strategies.aggregators import refuse_combination

        refuse_combination(s)  # ConfigError (one line) for a rule this algorithm cannot aggregate with
        if agg == "mean" and s.attack.kind == "none":
            return
    if agg in TRUST_AGGREGATORS and s.robust.trust_size < 1:
        raise ConfigError(f"trust.size = {s.robust.trust_size} is out of range for aggregator {agg!r}; allowed: "
                          "[1, number of records) (the server's trust set, e.g. 500)")
    byz = byzantine_count(s.num_silos, s.attack.fraction) if s.attack.kind != "none" else 0
    stated = s.robust.byzantine_f >= 0  # then _check_byzantine_f checks the rule against the stated f
    if not stated and agg not in ("gradbant", "mean", "fltrust") and byz >= s.num_silos / 2:
        raise ConfigError(
            f"aggregator = {agg!r} needs an honest majority, but attack.fraction = {s.attack.fraction:g} "
            f"makes {byz} of the {s.num_silos} silos Byzantine (f < N/2 = {s.num_silos / 2:g} required); "
            "use gradbant, fltrust or mean, or a smaller fraction")
    if not stated and agg in KRUM_AGGREGATORS and s.num_silos <= 2 * byz + 2:  # = min_clients
        raise ConfigError(
            f"aggregator = {agg!r} needs num-silos > 2f + 2 (Blanchard et al. 2017), but attack.fraction = "
            f"{s.attack.fraction:g} makes f = {byz} of the {s.num_silos} silos Byzantine (at least {2 * byz + 3} "
            "silos needed); with fewer, colluding identical updates (IPM, ALIE) win every round")
    if s.robust.gradbant_noise_aware:
        if agg != "gradbant":
            raise ConfigError(f"gradbant.noise-aware = true needs aggregator = 'gradbant', got {agg!r}")
        if s.privacy.enabled and s.privacy.mode != "isrl":
            raise ConfigError(f"gradbant.noise-aware = true needs privacy.mode = 'isrl' or 'off', got {s.privacy.mode!r}")
        if s.sketch.kind not in NOISE_AWARE_SKETCH_KINDS:
            raise ConfigError(f"gradbant.noise-aware = true has an exact noise energy for sketch.kind in "
                              f"{', '.join(NOISE_AWARE_SKETCH_KINDS)}; got {s.sketch.kind!r}")
    bounds = s.robust.gradbant_silo_records
    if bounds and (len(bounds) != 2 or bounds[0] > bounds[1]):
        raise ConfigError(f"gradbant.silo-records = {','.join(map(str, bounds))!r} must be two numbers "
                          "\"smallest,largest\" with smallest <= largest, or \"\" (from the partition)")
    if s.attack.kind == "alie" and not s.attack.alie_z and byz >= s.num_silos / 2:
        raise ConfigError(f"attack.alie-z = 0 (Baruch et al.'s formula) is undefined for a Byzantine majority "
                          f"({byz} of {s.num_silos} silos); allowed: attack.alie-z > 0, e.g. 1.0")


def _check_byzantine_f(s: Settings) -> None:
    """byzantine.f: stated for a rule that needs it (F_AGGREGATORS) unless an attack is configured
    (a simulation: its harness tells the rule each round's count), and within the rule's limit for
    the silos-per-round replies it aggregates: n > 2f + 2 for Krum and Multi-Krum, n > 2f for the
    other honest-majority rules; f > 0 with no rule that tolerates Byzantine silos is refused."""
    f, rule, n = s.robust.byzantine_f, effective_aggregator(s), s.silos_per_round
    robust = s.algorithm == "robust" or rule != "mean"
    # the largest f the rule accepts from n replies (= strategies.aggregation.min_clients)
    most = (n - 3) // 2 if rule in KRUM_AGGREGATORS else (n - 1) // 2
    allowed = f"[0, {most}]" if most >= 0 else f"none (silos-per-round = {n}; {rule} needs at least 3)"
    if f < 0:
        if robust and rule in F_AGGREGATORS and s.attack.kind == "none":
            raise ConfigError(f"aggregator = {rule!r} needs byzantine.f, the number of Byzantine silos it must tolerate "
                              f"(not set; allowed: {allowed}, e.g. byzantine.f = 1)")
        return
    if f > 0 and (not robust or rule == "mean"):
        what = "aggregator = 'mean'" if robust else f"algorithm = {s.algorithm!r}"
        raise ConfigError(f"byzantine.f = {f} needs a Byzantine-robust rule, but {what} tolerates none; allowed: 0 "
                          "(or algorithm = 'robust' with a robust aggregator)")
    if robust and rule not in ("gradbant", "mean", "fltrust") and f > most:
        why = "n > 2f + 2, Blanchard et al. 2017" if rule in KRUM_AGGREGATORS else "an honest majority, n > 2f"
        raise ConfigError(f"byzantine.f = {f} is out of range for aggregator {rule!r}; allowed: {allowed} "
                          f"({why}, of the silos-per-round = {n} replies)")


def check_silo_sizes(s: Settings, train_sizes: list[int]) -> None:
    """Checks that need the data: K <= n for every silo."""
    if s.spider.anchor_batch > min(train_sizes):
        raise ConfigError(f"spider.anchor-batch = {s.spider.anchor_batch} is out of range; allowed: "
                          f"[0, {min(train_sizes)}] (the smallest silo's n; 0 means K1 = n)")
    smallest = min(train_sizes)
    if s.algorithm == "proxsgd":  # disjoint blocks: K * R <= n for every silo
        rounds = s.planned_rounds()
        if s.batch_size * rounds > smallest:
            raise ConfigError(
                f"batch-size = {s.batch_size} is out of range for proxsgd; allowed: [0, {smallest // rounds}] "
                f"(each of the {rounds} rounds needs its own K records and the smallest silo has n = {smallest}; "
                "0 means K = floor(n / R))")
        if rounds > smallest:
            raise ConfigError(f"num-rounds = {rounds} is out of range for proxsgd; allowed: [1, {smallest}] "
                              f"(K = floor(n / R) must be at least 1 for the smallest silo, n = {smallest})")
    if s.batch_size > 0:
        if s.batch_size > smallest:
            raise ConfigError(
                f"batch-size = {s.batch_size} is out of range; allowed: [0, {smallest}] "
                f"(the smallest silo has n = {smallest} training records; 0 means K = n)"
            )


# -- the operator's --run-config text, checked before Flower's parser sees it ---------------------
#: one ``key=value`` of Flower's ``--run-config`` (flwr.common.config.parse_config_args, flwr 1.42):
#: a key, ``=``, and a '...' or "..." quoted value or one without spaces. Flower keeps what this
#: finds and silently drops everything else in the string ("num-rounds=", "num-rounds = 3").
RUN_CONFIG_PAIR = r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)"


def check_run_config_args(args: list[str]) -> None:
    """ConfigError (one line naming the fragment) unless every ``--run-config`` string is made of
    ``key=value`` pairs that Flower's parser keeps, separated by spaces, each value a TOML value
    (a string in double quotes, a number, true/false). A lone ``.toml`` path is Flower's file form
    and is left to it."""
    import re
    import tomllib

    pair = re.compile(RUN_CONFIG_PAIR)
    if len(args) == 1 and args[0].endswith(".toml"):
        return
    for text in args:
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            m = pair.match(text, pos)
            end = m.end() if m else pos
            if m is None or (end < len(text) and not text[end].isspace()):
                fragment = text[pos:].split()[0] if m is None else text[pos:].split(None, 1)[0]
                raise ConfigError(f"--run-config: cannot parse {fragment!r} (in {text!r}); write key=value pairs "
                                  f"without spaces around '=', separated by spaces, e.g. 'num-rounds=3 "
                                  f"dataset=\"digits\"'{_fragment_hint(fragment)}")
            key, value = m.group(1), m.group(2)
            try:
                tomllib.loads(f"v = {value}")
            except tomllib.TOMLDecodeError:
                raise ConfigError(f"--run-config: {key}={value} is not a value Flower can read; "
                                  f"{_value_hint(key, value)}") from None
            pos = end


def _fragment_hint(fragment: str) -> str:
    if fragment.count('"') % 2 or fragment.count("'") % 2:
        return " (a quote is not closed)"
    if fragment.endswith("="):
        return f" ({fragment[:-1]} has no value)"
    if "=" not in fragment:
        return " (no '=' in it)"
    return ""


def _value_hint(key: str, value: str) -> str:
    if value.lower() in ("true", "false"):
        return f"write {key}={value.lower()} (TOML booleans are lower case)"
    if value[:1] in "\"'" and value[-1:] != value[:1] or len(value) == 1 and value in "\"'":
        return "a quote is not closed"
    if value[:1].isdigit() or value[:1] in "+-.":
        return "not a number TOML reads (e.g. 3, 0.5, 1e-3, inf)"
    shown = value.strip("\"'")
    return (f"a string needs double quotes: {key}=\"{shown}\" (in a shell, quote the whole option: "
            f"--run-config '{key}=\"{shown}\"')")


def unknown_key_message(key: str) -> str:
    """The error for a run-config key that is not in :data:`SCHEMA`: the closest keys (difflib)
    instead of all of them."""
    import difflib

    close = difflib.get_close_matches(key, list(SCHEMA), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(k) for k in close)}?" if close else "no known key is close to it"
    return f"unknown config key {key!r}; {hint} (every key: docs/configuration.md)"
