"""Typed, validated settings: the ONLY place the run config is parsed.

The run config is flat with dotted keys, the same names in ``pyproject.toml``
(``[tool.flwr.app.config]``), ``flwr run --run-config`` and Hydra's ``conf/``. A bad value
raises :class:`ConfigError` with one line naming the key, the value and what is allowed.

Each option is declared ONCE, next to the code that owns it, with :func:`app.options.option`
(key, parser, default, one-line doc, when it acts); :class:`Settings` collects them (:data:`SCHEMA`,
:data:`OPTIONS`) and tests/test_options.py checks pyproject.toml, conf/config.yaml and
docs/configuration.md against them. Adding an option: docs/configuration.md, "Adding an option".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from app.algorithms import ALGORITHMS as ALGORITHM_REGISTRY, AlgorithmOptions, get_algorithm
from app.algorithms.options import ALGORITHM_ALIASES, MODELS, ProxSettings, TrainingOptions
from app.algorithms.plsvrg import PLSVRGSettings
from app.algorithms.spider import SpiderSettings
from app.algorithms.svrg import SVRGSettings
from app.attacks import ATTACKS as ATTACK_REGISTRY, AttackSettings, byzantine_count
from app.data.options import NODE_ONLY_KEYS, DataOptions, check_own_data
from app.data.scaling import SCALING_MODES as STANDARDIZE_MODES, resolve_scaling
from app.data.sources import SOURCES
from app.options import (
    OPTION, ConfigError, Option, boolean, choice, declared, group, groups, inert_keys, int_list, number, number_or_word,
)
from app.presets import PRESET, PRESET_KEYS, PRESETS, preset_values
from app.privacy.settings import PrivacySettings, SecAggSettings, ShuffleSettings
from app.runtime_options import RuntimeOptions
from app.sketch_settings import NOISE_AWARE_SKETCH_KINDS, SketchSettings
from app.config_robust import check_byzantine
from strategies.options import RobustSettings, resolve_aggregator
from strategies.preaggregation import PRE_AGGREGATORS as _PRE_RULES

#: pre-aggregators applied before a rule (= strategies.preaggregation.PRE_AGGREGATORS)
PRE_AGGREGATORS = tuple(_PRE_RULES)

#: the parsers' old names here (an option declared the old way ports with its parser unchanged)
_str, _num, _bool, _int_tuple, _num_or_word = choice, number, boolean, int_list, number_or_word

ALGORITHMS = tuple(ALGORITHM_REGISTRY)
#: the algorithms whose server step is a prox step (not local SGD, whose message is a model delta,
#: nor the robust line, which steps with its aggregation rule)
PROX_ALGORITHMS = tuple(name for name, algo in ALGORITHM_REGISTRY.items() if algo.prox_step)
ATTACKS = ("none", *ATTACK_REGISTRY)
DATASETS = SOURCES
STANDARDIZE = STANDARDIZE_MODES
#: the algorithms with a shuffle-DP form (the paper's Algorithms 7-10, and MB-SGD for comparison):
#: their server step needs only the mean of the silos' releases, which is all the shuffler gives
SHUFFLE_ALGORITHMS = tuple(name for name, algo in ALGORITHM_REGISTRY.items() if algo.shuffle_form)


@dataclass(frozen=True)
class Settings(RuntimeOptions, DataOptions, TrainingOptions):
    """Every option: the top-level ones (app/algorithms/options.py, app/data/options.py,
    app/runtime_options.py) and one group per owner. A new group: one line here."""

    prox: ProxSettings = group(ProxSettings)
    spider: SpiderSettings = group(SpiderSettings)
    svrg: SVRGSettings = group(SVRGSettings)
    plsvrg: PLSVRGSettings = group(PLSVRGSettings)
    sketch: SketchSettings = group(SketchSettings)
    robust: RobustSettings = group(RobustSettings)
    attack: AttackSettings = group(AttackSettings)
    privacy: PrivacySettings = group(PrivacySettings)
    shuffle: ShuffleSettings = group(ShuffleSettings)
    secagg: SecAggSettings = group(SecAggSettings)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, for summary.json."""
        d = asdict(self)
        d["model_hidden"] = list(self.model_hidden)
        d["robust"]["trust_classes"] = list(self.robust.trust_classes)
        return d

    def delta_for(self, n: int) -> float:
        """The silo's delta: the configured one, or 1/n^2 (the paper's choice)."""
        return self.privacy.delta_for(n)

    def algorithm_options(self) -> AlgorithmOptions:
        """What the run's algorithm reads (app/algorithms/base.py): R, the planned rounds, K, Q,
        C_diff, the anchors' budget split and the algorithms' own groups."""
        return AlgorithmOptions(num_rounds=self.num_rounds, planned_rounds=self.planned_rounds(),
                                batch_size=self.batch_size, local_steps=self.local_steps, diff_clip=self.diff_clip,
                                anchor_noise_ratio=self.privacy.anchor_noise_ratio, spider=self.spider,
                                svrg=self.svrg, plsvrg=self.plsvrg)

    def batch_for(self, n: int) -> int:
        """K for a silo with n training records: ``batch-size``, or when it is 0 the algorithm's
        default (the full batch K = n; for proxsgd K = floor(n / R), disjoint blocks)."""
        return get_algorithm(self.algorithm).batch(self.algorithm_options(), n)

    def simulation_nodes(self) -> int:
        """Nodes a simulation starts: one per silo, plus the shuffler in shuffle mode (the last
        node, partition-id = num-silos)."""
        return self.num_silos + (1 if self.privacy.mode == "shuffle" else 0)

    def planned_rounds(self) -> int:
        return self.privacy.planned_rounds or self.num_rounds

    def aggregation_rule(self) -> str:
        """The run's aggregation rule: ``aggregator`` with ``auto`` resolved
        (strategies.options.resolve_aggregator)."""
        return resolve_aggregator(self.robust.aggregator, self.algorithm)


_DECLARED = declared(Settings)
#: run-config key -> its declaration (app.options.Option), in Settings' field order
OPTIONS: dict[str, Option] = {key: opt for key, (_, opt) in _DECLARED.items()}
#: run-config key -> (attribute path, parser): the run-config schema
SCHEMA: dict[str, tuple[str, Any]] = {key: (attr, opt.parse) for key, (attr, opt) in _DECLARED.items()}
#: the nested groups of Settings, by attribute name
GROUPS = groups(Settings)


def inert_options(values: Mapping[str, Any]) -> set[str]:
    """The run-config keys that do not act under ``values`` (a flat run config or a results.csv
    row): each option's declared switch (``privacy.*`` without privacy, ``sketch.*`` without a
    sketch, ``spider.q`` for another algorithm...). app.sweep and app.report both use it."""
    return inert_keys(OPTIONS, values)


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
        choice(DATASETS)("dataset", dataset)  # the one-line error naming the allowed values
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
            flat.get("aggregator", "auto") in ("auto", "gradbant") and algorithm in ALGORITHM_REGISTRY
            and get_algorithm(algorithm).rule_step and mode in ("isrl", "off")
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
    their declared defaults; unknown keys are an error (a typo must not silently fall back to a default)."""
    unknown = sorted(set(run_config) - set(SCHEMA))
    node_only = [k for k in unknown if k in NODE_ONLY_KEYS]
    if node_only:
        raise ConfigError(f"{node_only[0]} is a silo's node-config key (its own records, set with flower-supernode "
                          "--node-config); a run config cannot set or override it (docs/your-data.md)")
    if unknown:
        raise ConfigError(unknown_key_message(unknown[0]))
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {name: {} for name in GROUPS}
    for key, value in resolve_presets(run_config).items():
        attr, parser = SCHEMA[key]
        try:
            parsed = parser(key, value)
        except ConfigError as exc:
            if key in PRESET_KEYS:
                raise ConfigError(f'{exc}; or "{PRESET}" (the dataset\'s preset, docs/presets.md)') from None
            raise
        group_name, _, field_name = attr.rpartition(".")
        (nested[group_name] if group_name else top)[field_name] = parsed
    settings = Settings(**top, **{name: GROUPS[name](**values) for name, values in nested.items()})
    check_relations(settings)
    return settings


def check_relations(s: Settings) -> None:
    if s.silos_per_round > s.num_silos:
        raise ConfigError(
            f"silos-per-round = {s.silos_per_round} is out of range; allowed: [1, num-silos = {s.num_silos}]"
        )
    if s.model_kwargs and s.model in MODELS:
        raise ConfigError(f"model-kwargs = {s.model_kwargs!r} is for your own model (model = \"package.module:Class\"); "
                          f"model = {s.model!r} takes mlp-hidden only; allowed: \"\"")
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
    _check_attack(s)
    _check_momentum(s)
    check_byzantine(s)
    _check_shuffle(s)
    _check_secagg(s)
    check_own_data(s, ConfigError)


def _check_attack(s: Settings) -> None:
    """An attack with no Byzantine silo (attack.fraction 0, or below 1/num-silos) is refused: no
    silo would attack, and the run would be a no-attack run recorded under the attack's name."""
    if s.attack.kind == "none" or byzantine_count(s.num_silos, s.attack.fraction) > 0:
        return
    allowed = (f"attack.fraction >= 1/num-silos = {1 / s.num_silos:g}" if s.num_silos > 1
               else "num-silos >= 2 (at least one silo stays honest)")
    raise ConfigError(f"attack.kind = {s.attack.kind!r} with attack.fraction = {s.attack.fraction:g} makes 0 of the "
                      f"{s.num_silos} silos Byzantine (no silo attacks; the run would be a no-attack run under the "
                      f"attack's name); allowed: {allowed}, or attack.kind = 'none' (attack=none)")


def _check_momentum(s: Settings) -> None:
    """client-momentum (app/algorithms/momentum.py): single-exchange optimisers only (every round one
    release of one phase), a silo's own Gaussian releases (not shuffle or secagg contributions, which
    are encodings of one release for a sum), and not with noise-aware Grad-BANT (its allowance c is
    one release's noise energy; an average's depends on the silo's sampling history)."""
    if not s.client_momentum:
        return
    phases = {get_algorithm(s.algorithm).round_phases(s.algorithm_options(), r) for r in range(1, s.num_rounds + 1)}
    if len(phases) != 1 or len(next(iter(phases))) != 1:
        raise ConfigError(f"client-momentum = {s.client_momentum:g} is not available for algorithm = {s.algorithm!r} "
                          "(its rounds mix releases of several phases); allowed: 0, or a single-exchange algorithm "
                          "(mbsgd, proxsgd, localsgd, robust)")
    if s.privacy.mode in ("shuffle", "secagg"):
        raise ConfigError(f"client-momentum = {s.client_momentum:g} is not available with privacy.mode = "
                          f"{s.privacy.mode!r} (a silo's contribution there encodes one release for the sum); "
                          "allowed: 0, or privacy.mode isrl or off")
    if s.robust.gradbant_noise_aware and s.aggregation_rule() == "gradbant":
        raise ConfigError(f"client-momentum = {s.client_momentum:g} is not available with gradbant.noise-aware = "
                          "true (its allowance c is one release's noise energy; an average of releases has less, "
                          "depending on the silo's sampling history); allowed: 0, or gradbant.noise-aware = false")


_SHUFFLE_DEFAULTS = ShuffleSettings()


def _refuse_inert(group: Any, defaults: Any, mode: str, owner: str) -> None:
    """ConfigError for a ``<owner>.*`` key set away from its default while privacy.mode = ``mode``,
    where it does not act (every value would run the same federation)."""
    for f in fields(group):
        value, key = getattr(group, f.name), f.metadata[OPTION].key
        if value != getattr(defaults, f.name):
            raise ConfigError(f"{key} = {value!r} is set but privacy.mode = {mode!r} ({owner}.* act only in {owner} "
                              f"mode: every value would run the same federation); use privacy.mode = '{owner}', or "
                              f"leave {key} at its default {OPTIONS[key].default!r}")


def _check_sum_only(s: Settings, sum_only: str, no_sketch: str) -> None:
    """What a mode whose server gets only the sum of the silos' integer encodings (shuffle, secagg)
    refuses: an algorithm whose step needs more than the mean, standardize = dp (its calibration
    composes no fixed release), an infinite budget, a sketch. ``sum_only``, ``no_sketch``: the
    mode's reasons, in words."""
    mode = s.privacy.mode
    if s.algorithm not in SHUFFLE_ALGORITHMS:
        raise ConfigError(f"privacy.mode = {mode!r} is not available for algorithm = {s.algorithm!r}; allowed: "
                          f"{', '.join(SHUFFLE_ALGORITHMS)} ({sum_only})")
    if resolve_scaling(s.standardize, s.dataset) == "dp":
        raise ConfigError(f"standardize = 'dp' is not allowed with privacy.mode = {mode!r} (its calibration has no "
                          "fixed release); allowed: public, server, none (or pooled, local: not covered by epsilon)")
    if math.isinf(s.privacy.epsilon):
        raise ConfigError(f"privacy.epsilon = inf is not allowed with privacy.mode = {mode!r}; allowed: (0, inf) "
                          "(use privacy.mode = off for a non-private run)")
    if s.sketch.kind != "none":
        raise ConfigError(f"sketch.kind = {s.sketch.kind!r} is not allowed with privacy.mode = {mode!r}; allowed: "
                          f"none ({no_sketch})")


def _check_shuffle(s: Settings) -> None:
    """Shuffle DP's settings: which algorithms, no sketch, a finite budget, whom silos count on."""
    if s.shuffle.silo_sample > s.num_silos:
        raise ConfigError(f"shuffle.silo-sample = {s.shuffle.silo_sample} is out of range; allowed: [0, num-silos = "
                          f"{s.num_silos}] (0: no silo sampling)")
    if s.privacy.mode in ("isrl", "secagg"):  # shuffle.* act only in shuffle mode (declared only=); under off
        _refuse_inert(s.shuffle, _SHUFFLE_DEFAULTS, s.privacy.mode, "shuffle")  # they are inert (a baseline)
    if s.privacy.mode != "shuffle":
        return
    _check_sum_only(s, "the shuffler releases only the sum of the silos' messages",
                    "the shuffler sums integer counts; a sketch of them would not debias")
    if s.shuffle.count_on > s.silos_per_round:
        raise ConfigError(f"shuffle.count-on = {s.shuffle.count_on} is out of range; allowed: [0, silos-per-round = "
                          f"{s.silos_per_round}] (0 means silos-per-round)")


_SECAGG_DEFAULTS = SecAggSettings()


def _check_secagg(s: Settings) -> None:
    """Secure aggregation's settings: which algorithms (the server gets only the sum, like the
    shuffler's), no sketch, a finite budget, a threshold and count-on the exchange can meet."""
    if s.privacy.mode in ("isrl", "shuffle"):  # secagg.* act only in secagg mode
        _refuse_inert(s.secagg, _SECAGG_DEFAULTS, s.privacy.mode, "secagg")
    if s.privacy.mode != "secagg":
        return
    _check_sum_only(s, "secure aggregation releases only the sum of the silos' messages",
                    "the masked sum is of integers; a sketch of them would not unmask")
    for key, value in (("secagg.count-on", s.secagg.count_on), ("secagg.threshold", s.secagg.threshold)):
        if value > s.silos_per_round:
            raise ConfigError(f"{key} = {value} is out of range; allowed: [0, silos-per-round = {s.silos_per_round}] "
                              "(0: automatic)")
    if s.secagg.degree == 0 and 0 < s.secagg.threshold <= s.silos_per_round // 2:
        raise ConfigError(f"secagg.threshold = {s.secagg.threshold} is out of range; allowed: 0 or "
                          f"[{s.silos_per_round // 2 + 1}, {s.silos_per_round}] (more than half of silos-per-round = "
                          f"{s.silos_per_round}, so that no two disjoint sets of silos can both open a sum)")
    if s.silos_per_round < 2:
        raise ConfigError(f"privacy.mode = 'secagg' needs silos-per-round >= 2, got {s.silos_per_round} (a sum of "
                          "one silo's vector is that vector)")


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
                f"(the smallest silo has n = {smallest} training records; 0 means K = n; a batch-size you did "
                "not set is the dataset's preset, docs/presets.md)"
            )


def unknown_key_message(key: str) -> str:
    """The error for a run-config key that is not in :data:`SCHEMA`: the closest keys (difflib)
    instead of all of them."""
    import difflib

    close = difflib.get_close_matches(key, list(SCHEMA), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(k) for k in close)}?" if close else "no known key is close to it"
    return f"unknown config key {key!r}; {hint} (every key: docs/configuration.md)"


# -- a component's constructor arguments as run-config keys (strategies/loop.py) ---------------

def knob_keys(knobs: dict[str, Any], group: str = "") -> dict[str, Any]:
    """``knobs`` as run-config keys: a name is a key with ``.`` and ``-`` written ``_``
    (``spider_q`` -> ``spider.q``) or, for an optimiser with an option group, a key of that group
    without its prefix (``FedProxSPIDER(q=5)``: ``spider.q``); ConfigError (one line) otherwise."""
    names = {key.replace(".", "_").replace("-", "_"): key for key in SCHEMA}
    keys: dict[str, Any] = {}
    for name, value in knobs.items():
        key = names.get(name) or (names.get(f"{group}_{name}") if group else None)
        if key is None:
            own = f" (or a {group}.* key without its prefix, e.g. q)" if group else ""
            raise ConfigError(f"unknown knob {name!r}: a run-config key with '.' and '-' written '_' (e.g. spider_q){own}")
        keys[key] = value
    return keys


def with_knobs(s: Settings, knobs: dict[str, Any], group: str = "") -> Settings:
    """``s`` with run-config keys (:func:`knob_keys`) set to ``knobs``' values, each parsed and
    the whole checked as parse_settings does (ConfigError, one line)."""
    for key, value in knob_keys(knobs, group).items():
        attr, parser = SCHEMA[key]
        parsed = parser(key, value)
        group_name, _, field_name = attr.rpartition(".")
        s = replace(s, **({group_name: replace(getattr(s, group_name), **{field_name: parsed})} if group_name
                          else {field_name: parsed}))
    check_relations(s)
    return s
