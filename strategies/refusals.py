"""The one-line refusals of a rule composition that cannot work: the checks of
app/config_robust.py (the run config) and of a rule's constructor arguments (strategies/aggregators.py
``Rule.bind``), apart from the rules' machinery, so that checking a run config loads none of it.
Why each combination cannot work: strategies/composition.py's docstring."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.options import ConfigError
from strategies.aggregation import RULES, min_clients
from strategies.preaggregation import rows_after

if TYPE_CHECKING:
    from strategies.options import RobustSettings


#: the privacy modes whose server gets only the sum of the silos' messages (the shuffler's, the secure sum)
SUM_ONLY_MODES = ("shuffle", "secagg")


def refuse_pre(rule: str, robust: RobustSettings, *, privacy_mode: str, silos_per_round: int, f: int) -> None:
    """ConfigError (one line) for a ``pre-aggregators`` chain (``robust.pre``) that cannot work with
    ``rule`` on ``silos_per_round`` replies; ``f``: the Byzantine silos to tolerate (byzantine.f, or a
    simulated attack's count; -1: neither)."""
    pre, n = robust.pre, silos_per_round
    chain = ",".join(pre)
    if privacy_mode in SUM_ONLY_MODES:
        raise ConfigError(f"pre-aggregators = {chain!r} needs each silo's message, but privacy.mode = {privacy_mode!r} "
                          "gives the server only their sum; allowed: \"\"")
    if rule == "gradbant" and "bucketing" in pre:
        raise ConfigError(f"pre-aggregators = {chain!r}: bucketing mixes random silos each round, so Grad-BANT's "
                          "per-silo trust p would follow no silo; allowed with gradbant: nnm, arc")
    if robust.gradbant_noise_aware:
        raise ConfigError(f"pre-aggregators = {chain!r} changes an honest row's noise energy, which "
                          "gradbant.noise-aware = true subtracts exactly; set one of them")
    needs_f = [p for p in pre if p in ("nnm", "arc")]
    if needs_f and f < 0:
        raise ConfigError(f"pre-aggregators = {chain!r}: {needs_f[0]} needs byzantine.f, the number of Byzantine "
                          "silos to tolerate (not set, and no attack.kind tells it), e.g. byzantine.f = 1")
    if "nnm" in pre and f >= n:
        raise ConfigError(f"pre-aggregators = {chain!r}: nnm needs f < n, got f = {f} of silos-per-round = {n}")
    rows = rows_after(pre, n, robust.bucket_size)
    if rule in RULES and RULES[rule].honest_majority and f >= 0 and rows < min_clients(rule, f):
        raise ConfigError(f"pre-aggregators = {chain!r} leaves {rows} rows of the {n} replies (bucketing.size = "
                          f"{robust.bucket_size}), but {rule} with f = {f} needs at least {min_clients(rule, f)}; "
                          "use a smaller bucket size or f")


def refuse_space(rule: str, sketch_kind: str) -> None:
    """ConfigError (one line) when ``aggregation-space = sketch`` cannot work for ``rule`` and the
    run's ``sketch.kind`` (see the module docstring)."""
    from app.sketch_settings import JL_SKETCH_KINDS

    kind = sketch_kind
    ok = [name for name, spec in RULES.items() if not spec.trust and "center" not in spec.inputs]
    if kind == "none":
        raise ConfigError("aggregation-space = 'sketch' runs the rule on the silos' sketches y_i = S_t x_i, but "
                          f"sketch.kind = 'none'; allowed: sketch.kind in {', '.join(JL_SKETCH_KINDS)}, or "
                          "aggregation-space = 'lifted'")
    if kind not in JL_SKETCH_KINDS:
        raise ConfigError(f"aggregation-space = 'sketch' needs a linear JL sketch shared by every silo, but "
                          f"sketch.kind = {kind!r} is not one (distances between its payloads do not track the "
                          f"updates'); allowed: {', '.join(JL_SKETCH_KINDS)}")
    if rule == "gradbant" or (rule in RULES and RULES[rule].trust):
        raise ConfigError(f"aggregation-space = 'sketch' gives the rule only the sketches y_i, but aggregator = "
                          f"{rule!r} scores them against the server's trust-set reference in the model space; "
                          f"allowed: {', '.join(ok)}")
    if rule in RULES and "center" in RULES[rule].inputs:
        raise ConfigError(f"aggregation-space = 'sketch': {rule}'s centre, the last aggregate, lies in the last "
                          f"round's sketch space (S_t is redrawn every round); allowed: {', '.join(ok)}")


def refuse_combination(rule: str, privacy_mode: str) -> None:
    """ConfigError (one line) for an aggregator the privacy mode cannot aggregate with."""
    if rule != "mean" and privacy_mode in SUM_ONLY_MODES:
        raise ConfigError(f"aggregator = {rule!r} needs each silo's message, but privacy.mode = {privacy_mode!r} gives "
                          "the server only their sum; allowed: mean")
