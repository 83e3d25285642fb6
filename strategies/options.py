"""The Byzantine-robust options (``aggregator``, ``trust.*``, ``gradbant.*``, ``cc.tau``,
``byzantine.f``), declared once (app/options.py), and the rule lists the config derives from
each rule's declared needs (strategies/aggregation.py ``Rule``: f, the trust set, a centre).
Light: numpy only (strategies/gradbant.py, with torch, is imported when a strategy is built)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.attacks import byzantine_count
from app.options import ConfigError, boolean, choice, int_list, number, number_or_word, option
from app.sketch_settings import NOISE_AWARE_SKETCH_KINDS
from strategies.aggregation import RULES, check_smea_size
from strategies.preaggregation import PRE_AGGREGATORS, rows_after

if TYPE_CHECKING:
    from app.config import Settings

#: Grad-BANT (strategies/gradbant.py): scores against the server's trust set, no f
GRADBANT = "gradbant"
#: every aggregation rule: Grad-BANT and the baselines of strategies/aggregation.py
AGGREGATORS = (GRADBANT, *RULES)
#: rules that score updates against the server's trust set
TRUST_AGGREGATORS = (GRADBANT, *(name for name, rule in RULES.items() if rule.trust))
#: rules that need num-silos > 2f + 2
KRUM_AGGREGATORS = tuple(name for name, rule in RULES.items() if rule.krum_bound)
#: rules that cannot run without f, byzantine.f or an attack's
F_AGGREGATORS = tuple(name for name, rule in RULES.items() if rule.needs_f)
#: rules that need an honest majority, f < N/2
HONEST_MAJORITY_AGGREGATORS = tuple(name for name, rule in RULES.items() if rule.honest_majority)


def parse_pre_list(key: str, value: object) -> tuple[str, ...]:
    """A comma-separated list of pre-aggregators (strategies/preaggregation.py), "" for none."""
    out = tuple(v.strip() for v in choice()(key, value).split(",") if v.strip())
    bad = [v for v in out if v not in PRE_AGGREGATORS]
    if bad:
        raise ConfigError(f"{key} = {value!r}: unknown pre-aggregator {bad[0]!r}; allowed: comma list of "
                          f"{', '.join(PRE_AGGREGATORS)}, or \"\"")
    return out


#: where a rule runs on sketched messages: on the lifts S_t^T y_i (model space) or on the sketches
#: y_i themselves, the aggregate then lifted once (RobAJoL; strategies/composition.py refuse_space)
AGGREGATION_SPACES = ("lifted", "sketch")

#: the trust set's appearance shifts (= app.data.federated.TRUST_SHIFTS, a copy: that module imports torch)
TRUST_SHIFTS = ("none", "noise", "blur")


@dataclass(frozen=True)
class RobustSettings:
    """The Byzantine-robust line: the aggregation rule, the server's trust set, the rules' knobs."""

    #: parse_settings resolves "auto": gradbant for algorithm robust, else mean
    aggregator: str = option("aggregator", choice(("auto", *AGGREGATORS)), "auto",
                             "how every algorithm combines each exchange's updates")
    trust_size: int = option("trust.size", number(0, 1_000_000, integer=True), "preset",
                             "the server's trust set, in records (gradbant, fltrust)")
    trust_classes: tuple[int, ...] = option("trust.classes", int_list(0, '"0,1,2" ("": all)', "class indices >= 0"),
                                            "", "a class subset of the trust set")
    trust_shift: str = option("trust.shift", choice(TRUST_SHIFTS), "none", "an appearance shift of the trust set")
    gradbant_beta: float = option("gradbant.beta", number(0, 1, lo_open=True), 0.5, "Grad-BANT's momentum beta")
    #: L of the descent-lemma penalty, or "auto": a secant estimate on the trust set each round
    gradbant_smoothness: float | str = option("gradbant.smoothness", number_or_word(number(0, None), "auto"), 1.0,
                                              "Grad-BANT's smoothness L, or auto")
    #: subtract the expected noise energy of an honest message (DP noise; with gradient messages
    #: also the minibatch's sampling noise) from the norm penalty (docs/byzantine.md)
    gradbant_noise_aware: bool = option("gradbant.noise-aware", boolean, "preset",
                                        "subtract an honest message's expected noise energy from the penalty")
    #: a public (smallest, largest) number of training records of any silo, for noise-aware
    #: Grad-BANT when the server cannot read the partition (a deployment); () = from the partition
    gradbant_silo_records: tuple[int, ...] = option(
        "gradbant.silo-records", int_list(1, '"500,6000" (smallest,largest; "": from the partition)',
                                          "two positive integers"),
        "", "public bounds on a silo's number of records, for gradbant.noise-aware")
    cc_tau: float = option("cc.tau", number(0, None, lo_open=True), 1.0, "centered clipping's radius tau")
    #: pre-aggregators applied in order before the rule (strategies/preaggregation.py); bucket size s
    pre: tuple[str, ...] = option("pre-aggregators", parse_pre_list, "", "pre-aggregators before the rule, in order "
                                  "(comma list of nnm, bucketing, arc)")
    bucket_size: int = option("bucketing.size", number(1, 10_000, integer=True), 2, "bucketing's bucket size s")
    #: byzantine.f: the number of Byzantine silos the rule must tolerate, as the operator states
    #: it; -1 = not stated (a simulation's attack harness then tells the rule each round's count)
    byzantine_f: int = option("byzantine.f", number(-1, 10_000, integer=True), -1,
                              "the number of Byzantine silos the rule must tolerate (-1: not stated)")
    #: lifted: the rule (and its pre-aggregators) on S_t^T y_i in R^d; sketch: on y_i in R^k, then
    #: S_t^T once on the aggregate (RobAJoL, Xia et al. 2025: robust averaging in the JL space)
    space: str = option("aggregation-space", choice(AGGREGATION_SPACES), "lifted",
                        "where the rule runs on sketched messages: lifted (S^T y) or sketch (y, then S^T once)",
                        inert=("sketch.kind", ("none",)))


# -- the checks of these options that depend on each other (app.config.parse_settings) -----------

def effective_aggregator(s: Settings) -> str:
    """The run's aggregation rule: ``aggregator``, where ``auto`` (the default) is Grad-BANT for
    algorithm robust and the mean for every other algorithm (strategies/aggregators.py)."""
    if s.robust.aggregator == "auto":
        return GRADBANT if s.algorithm == "robust" else "mean"
    return s.robust.aggregator


def check_byzantine(s: Settings) -> None:
    """The Byzantine-robust line's settings that depend on each other."""
    agg = effective_aggregator(s)
    _check_byzantine_f(s)
    if s.robust.space == "sketch":
        from strategies.composition import refuse_space

        refuse_space(s)  # ConfigError (one line) for a rule or sketch that cannot aggregate sketches
    if s.robust.pre:
        from strategies.composition import refuse_pre

        refuse_pre(s)  # ConfigError (one line) for a pre-aggregator chain that cannot work
    if s.algorithm != "robust":
        from strategies.aggregators import refuse_combination

        refuse_combination(s)  # ConfigError (one line) for a rule this algorithm cannot aggregate with
        if agg == "mean" and s.attack.kind == "none":
            return
    if agg in TRUST_AGGREGATORS and s.robust.trust_size < 1 and not s.server_trust_file:
        raise ConfigError(f"trust.size = {s.robust.trust_size} is out of range for aggregator {agg!r}; allowed: "
                          "[1, number of records) (the server's trust set, e.g. 500)")
    byz = byzantine_count(s.num_silos, s.attack.fraction) if s.attack.kind != "none" else 0
    stated = s.robust.byzantine_f >= 0  # then _check_byzantine_f checks the rule against the stated f
    if not stated and agg in HONEST_MAJORITY_AGGREGATORS and byz >= s.num_silos / 2:
        raise ConfigError(
            f"aggregator = {agg!r} needs an honest majority, but attack.fraction = {s.attack.fraction:g} "
            f"makes {byz} of the {s.num_silos} silos Byzantine (f < N/2 = {s.num_silos / 2:g} required); "
            "use gradbant, fltrust or mean, or a smaller fraction")
    if not stated and agg in KRUM_AGGREGATORS and s.num_silos <= 2 * byz + 2:  # = min_clients
        raise ConfigError(
            f"aggregator = {agg!r} needs num-silos > 2f + 2 (Blanchard et al. 2017), but attack.fraction = "
            f"{s.attack.fraction:g} makes f = {byz} of the {s.num_silos} silos Byzantine (at least {2 * byz + 3} "
            "silos needed); with fewer, colluding identical updates (IPM, ALIE) win every round")
    if agg == "smea":
        _check_smea_size(s, s.robust.byzantine_f if stated else byz)
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


def _check_smea_size(s: Settings, f: int) -> None:
    """SMEA compares C(n, f) subsets of the n rows it gets each round (silos-per-round replies,
    after the pre-aggregators): refused (one line) above strategies.aggregation.SMEA_MAX_SUBSETS
    for the largest f a round can bring (C(n, f) grows with f up to n/2)."""
    n = rows_after(s.robust.pre, s.silos_per_round, s.robust.bucket_size)
    try:
        check_smea_size(n, max(0, min(f, (n - 1) // 2)))
    except ValueError as exc:
        raise ConfigError(f"aggregator = 'smea' cannot run: {exc}") from None


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
    if robust and rule in HONEST_MAJORITY_AGGREGATORS and f > most:
        why = "n > 2f + 2, Blanchard et al. 2017" if rule in KRUM_AGGREGATORS else "an honest majority, n > 2f"
        raise ConfigError(f"byzantine.f = {f} is out of range for aggregator {rule!r}; allowed: {allowed} "
                          f"({why}, of the silos-per-round = {n} replies)")
