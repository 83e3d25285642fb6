"""Aggregation as a component: every optimiser combines each exchange's updates with one.

    Mean()                     (1/M_r) sum_i u_i, the default of every algorithm but robust
    GradBANT(beta=..., ...)    Grad-BANT trust scores against the server's trust set (its state: p)
    Rule("krum", ...)          a baseline rule of strategies/aggregation.py (f, a centre, a trust update)

``FedProxSPIDER(settings, layout, aggregator=GradBANT())`` is private, robust, variance-reduced
SPIDER; without ``aggregator`` the run config's ``aggregator`` is used (``auto``: Grad-BANT for
``algorithm = robust``, the mean for every other algorithm; any rule set explicitly applies to every
algorithm). A rule sees each message in the space it was sent in, lifted: a gradient (grad, anchor,
disjoint), a model change (local: as the pseudo-gradient -d / gamma) or a gradient difference
(SPIDER's and SVRG's difference rounds: Grad-BANT and FLTrust then score against the trust set's
own difference grad f0(at) - grad f0(prev)); with ``aggregation-space = sketch`` it sees the sketch
y itself, and only its result is lifted (RobAJoL). The simulation's attack harness
(strategies/byzantine_harness.py ``Attacked``, a wrapper) replaces the Byzantine silos' messages
before any rule, the mean included. A combination that cannot work is refused with one line (:func:`refuse_combination`).

This module is light (no torch): a robust rule's machinery (strategies/gradbant.py) is imported
when a strategy is built with it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flwr.serverapp import Grid

    from app.data.federated import TrustSet
    from strategies.exchange import Exchange
    from strategies.options import RobustSettings
    from strategies.replies import Params, Updates

#: the short knob names of :func:`GradBANT` and :class:`Rule`, as RobustSettings fields
_KNOBS = {"beta": "gradbant_beta", "smoothness": "gradbant_smoothness", "noise_aware": "gradbant_noise_aware",
          "trust_size": "trust_size", "f": "byzantine_f", "tau": "cc_tau", "pre": "pre",
          "bucket_size": "bucket_size", "space": "space", "silo_records": "gradbant_silo_records",
          "trust_classes": "trust_classes"}


class Aggregator:
    """The mean: what an optimiser's step averages. Subclasses keep state (:meth:`state`)."""

    name = "mean"

    def bind(self, owner: Any) -> None:
        """Once, by the strategy that uses it (its settings, layout and node roster)."""

    def prepare(self, grid: Grid, timeout: float) -> None:
        """Once, after the nodes have connected and before round 1."""

    def combine(self, rnd: int, ex: Exchange, updates: Updates) -> tuple[Params | None, dict[str, Any]]:
        """The exchange's combined update (None: nothing kept, the model stays) and row entries."""
        return updates.mean(), {}

    def state(self) -> dict[str, Any]:
        return {}

    def restore(self, state: dict[str, Any]) -> None:
        pass


class Mean(Aggregator):
    """(1/M_r) sum_i u_i over the silos that answered."""


class Rule(Aggregator):
    """A robust rule (``gradbant`` or a baseline of strategies/aggregation.py) with the attack
    harness; ``knobs`` override the run config's: beta, smoothness, noise_aware, trust_size, f, tau,
    pre (pre-aggregators applied in order, e.g. ``Rule("krum", f=2, pre=("nnm",))``), bucket_size and
    space (``"sketch"``: the rule on the sketches y_i, then S_t^T once; RobAJoL is
    ``Rule("trimmed-mean", pre="nnm", space="sketch")``, strategies/composition.py)."""

    def __init__(self, name: str, *, trust: TrustSet | None = None, model: Any = None, **knobs: Any) -> None:
        from app.config import AGGREGATORS

        if name not in AGGREGATORS:
            raise ValueError(f"unknown aggregator {name!r}; allowed: {', '.join(AGGREGATORS)}")
        unknown = sorted(set(knobs) - set(_KNOBS))
        if unknown:
            raise ValueError(f"unknown knob {unknown[0]!r} for aggregator {name!r}; allowed: {', '.join(_KNOBS)}")
        if isinstance(knobs.get("pre"), str):
            knobs["pre"] = (knobs["pre"],)
        from strategies.preaggregation import PRE_AGGREGATORS

        bad = [p for p in knobs.get("pre", ()) if p not in PRE_AGGREGATORS]
        if bad:
            raise ValueError(f"unknown pre-aggregator {bad[0]!r}; allowed: {', '.join(PRE_AGGREGATORS)}")
        from strategies.options import AGGREGATION_SPACES

        if knobs.get("space", "lifted") not in AGGREGATION_SPACES:
            raise ValueError(f"unknown space {knobs['space']!r}; allowed: {', '.join(AGGREGATION_SPACES)}")
        self.name, self.knobs = name, {_KNOBS[k]: (tuple(v) if k in ("pre", "silo_records", "trust_classes") else v)
                                       for k, v in knobs.items()}
        #: the server's own labelled records and reference model (a Flower user's own app): None,
        #: the run's (``trust.*`` over the run's data set, and its ``model``)
        self.trust, self.model = trust, model
        self.impl: Any = None

    def bind(self, owner: Any) -> None:
        from strategies.gradbant import RobustAggregator
        from strategies.options import tolerated_f

        s = owner.s
        rule = replace(s.robust, aggregator=self.name, **self.knobs)
        s = replace(s, robust=rule)
        if rule.pre:
            from strategies.composition import refuse_pre

            # the same one-line refusal as the run config's pre-aggregators
            refuse_pre(self.name, rule, privacy_mode=s.privacy.mode, silos_per_round=s.silos_per_round,
                       f=tolerated_f(rule, s.attack, s.num_silos))
        if rule.space == "sketch":
            from strategies.composition import refuse_space

            refuse_space(self.name, s.sketch.kind)  # ... and as its aggregation-space
        phase = owner.scheduled_phase(1) if owner.algorithm.name == "robust" else None
        self.impl = RobustAggregator(s, owner.layout, owner.roster, phase, trust=self.trust, model=self.model)

    def combine(self, rnd: int, ex: Exchange, updates: Updates) -> tuple[Params | None, dict[str, Any]]:
        return self.impl.combine(rnd, ex, updates)

    def state(self) -> dict[str, Any]:
        return self.impl.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.impl.restore(state)


def GradBANT(*, trust: TrustSet | None = None, model: Any = None, **knobs: Any) -> Rule:  # noqa: N802 (reads as the class it makes)
    """Grad-BANT (``beta``, ``smoothness``, ``noise_aware``, ``trust_size``, ``silo_records`` override
    the run config). ``trust``: the server's own labelled records (``TrustSet(x, y)``, torch
    tensors in the silos' pre-processing) and ``model`` the torch module whose parameters the
    federation trains: a Flower user's own app brings both; None: the run's trust set and model."""
    return Rule("gradbant", trust=trust, model=model, **knobs)


def make_aggregator(robust: RobustSettings, algorithm: str) -> Aggregator:
    """The run config's aggregator: the mean, or :class:`Rule` (algorithm robust: always a Rule)."""
    from strategies.options import resolve_aggregator

    rule = resolve_aggregator(robust.aggregator, algorithm)
    return Mean() if rule == "mean" and algorithm != "robust" and not robust.pre else Rule(rule)


def with_harness(agg: Aggregator, attack_kind: str) -> Aggregator:
    """``agg`` inside the simulation's attack harness when ``attack.kind`` is set
    (strategies/byzantine_harness.py ``Attacked``), else ``agg``."""
    if attack_kind == "none" or hasattr(agg, "inner"):
        return agg
    from strategies.byzantine_harness import Attacked

    return Attacked(agg)  # type: ignore[return-value]


def refuse_combination(rule: str, privacy_mode: str) -> None:
    """ConfigError (one line) for an aggregator the privacy mode cannot aggregate with."""
    from app.options import ConfigError

    if rule != "mean" and privacy_mode == "shuffle":
        raise ConfigError(f"aggregator = {rule!r} needs each silo's message, but privacy.mode = 'shuffle' gives the "
                          "server only their sum; allowed: mean")
