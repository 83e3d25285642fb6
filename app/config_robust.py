"""The Byzantine-robust options' checks that depend on the rest of the run (the algorithm, the
silos, the attack, the privacy mode, the sketch): part of assembling the root Settings
(app.config.parse_settings), next to it. Each refusal is one line naming the key, the value and
what is allowed; the options themselves are declared with their owner (strategies/options.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.algorithms import get_algorithm
from app.attacks import byzantine_count
from app.options import ConfigError
from app.sketch_settings import NOISE_AWARE_SKETCH_KINDS
from strategies.aggregation import check_smea_size
from strategies.refusals import refuse_combination, refuse_pre, refuse_space
from strategies.options import (F_AGGREGATORS, HONEST_MAJORITY_AGGREGATORS, KRUM_AGGREGATORS, TRUST_AGGREGATORS,
                                rule_steps, tolerated_f)
from strategies.preaggregation import rows_after

if TYPE_CHECKING:
    from app.config import Settings


def check_byzantine(s: Settings) -> None:
    """The Byzantine-robust line's settings that depend on each other."""
    agg = s.aggregation_rule()
    _check_byzantine_f(s)
    if s.robust.space == "sketch":
        refuse_space(agg, s.sketch.kind)  # ConfigError (one line) for a rule or sketch that cannot aggregate sketches
    if s.robust.pre:  # ConfigError (one line) for a pre-aggregator chain that cannot work
        refuse_pre(agg, s.robust, privacy_mode=s.privacy.mode, silos_per_round=s.silos_per_round,
                   f=tolerated_f(s.robust, s.attack, s.num_silos))
    if not rule_steps(s.algorithm):
        refuse_combination(agg, s.privacy.mode)  # ConfigError (one line) for a rule this algorithm cannot aggregate with
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
    f, rule, n = s.robust.byzantine_f, s.aggregation_rule(), s.silos_per_round
    robust = get_algorithm(s.algorithm).weighs_each_message(rule)
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
