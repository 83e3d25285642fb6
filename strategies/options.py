"""The Byzantine-robust options (``aggregator``, ``trust.*``, ``gradbant.*``, ``cc.tau``,
``byzantine.f``), declared once (app/options.py), and the rule lists the config derives from
each rule's declared needs (strategies/aggregation.py ``Rule``: f, the trust set, a centre).
Light: numpy only (strategies/gradbant.py, with torch, is imported when a strategy is built)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.attacks import byzantine_count
from app.options import ConfigError, boolean, choice, int_list, number, number_or_word, option
from strategies.aggregation import RULES
from strategies.preaggregation import PRE_AGGREGATORS

if TYPE_CHECKING:
    from app.attacks import AttackSettings

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


def rule_steps(algorithm: str) -> bool:
    """Whether ``algorithm``'s server step is its aggregation rule (``Algorithm.rule_step``: the
    robust line, algorithm robust and its alias gradbant): the one place that meaning is read."""
    from app.algorithms import get_algorithm

    return get_algorithm(algorithm).rule_step


def resolve_aggregator(aggregator: str, algorithm: str) -> str:
    """The run's aggregation rule: ``aggregator``, where ``auto`` (the default) is Grad-BANT for an
    algorithm whose step is its rule (robust) and the mean for every other (strategies/aggregators.py)."""
    if aggregator == "auto":
        return GRADBANT if rule_steps(algorithm) else "mean"
    return aggregator


def tolerated_f(robust: RobustSettings, attack: AttackSettings, num_silos: int) -> int:
    """The Byzantine silos a rule must tolerate: ``byzantine.f`` when stated, else a simulated
    attack's count (the harness's ground truth), else -1 (neither)."""
    if robust.byzantine_f >= 0:
        return robust.byzantine_f
    return byzantine_count(num_silos, attack.fraction) if attack.kind != "none" else -1
