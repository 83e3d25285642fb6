"""Aggregation as a component: every optimiser combines each exchange's updates with one.

    Mean()                          (1/M_r) sum_i u_i, the default of every algorithm but robust
    GradBANT(beta=..., trust=...)   Grad-BANT trust scores against the server's trust set (state: p)
    Krum(f=2, pre=(NNM(),))         a baseline rule of strategies/aggregation.py after pre-aggregators
    TrimmedMean(f=1), Median(), GeometricMedian(), MultiKrum(f=...), CenteredClipping(tau=...),
    SMEA(f=...), FLTrust()          the other baselines (each one class, its own typed arguments)

``FedProxSPIDER(lr=..., aggregator=GradBANT())`` is private, robust, variance-reduced SPIDER;
without ``aggregator`` the run config's ``aggregator`` is used (``auto``: Grad-BANT for ``algorithm
= robust``, the mean for every other algorithm; any rule set explicitly applies to every
algorithm). A rule's arguments are its own options (``RobustSettings``' fields, each checked by its
declared parser, so a bad value is the same one-line error as in a run config), over the run's.
A rule sees each message in the space it was sent in, lifted: a gradient (grad, anchor,
disjoint), a model change (local: as the pseudo-gradient -d / gamma) or a gradient difference
(SPIDER's and SVRG's difference rounds: Grad-BANT and FLTrust then score against the trust set's
own difference grad f0(at) - grad f0(prev)); with ``space = "sketch"`` it sees the sketch
y itself, and only its result is lifted (RobAJoL: ``TrimmedMean(f=2, pre=(NNM(),), space="sketch")``).
The simulation's attack harness (strategies/byzantine_harness.py ``Attacked``, a wrapper) replaces
the Byzantine silos' messages before any rule, the mean included. A combination that cannot work is
refused with one line (strategies/refusals.py).

This module is light (no torch): a robust rule's machinery (strategies/gradbant.py) is imported
when a strategy is built with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from flwr.serverapp import Grid

    from app.data.federated import TrustSet
    from strategies.exchange import Exchange
    from strategies.options import RobustSettings
    from strategies.replies import Params, Updates

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


@dataclass(frozen=True)
class NNM:
    """Nearest-neighbour mixing (Allouah et al. 2023): each row the mean of its n - f nearest."""

    name: ClassVar[str] = "nnm"


@dataclass(frozen=True)
class ARC:
    """Adaptive robust clipping (Allouah et al. 2024) of the floor(2f(n-f)/n) largest norms."""

    name: ClassVar[str] = "arc"


@dataclass(frozen=True)
class Bucketing:
    """Means of random buckets of ``size`` rows (Karimireddy et al. 2022)."""

    size: int = 2
    name: ClassVar[str] = "bucketing"


PreAggregator = NNM | ARC | Bucketing


def rule_options(given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` (RobustSettings field -> value; None: not given) parsed by each field's declared
    parser under its run-config key: the one-line ConfigError a run config would get."""
    from app.options import OPTION
    from strategies.options import RobustSettings

    declared = {f.name: f.metadata[OPTION] for f in fields(RobustSettings)}
    out = {}
    for name, value in given.items():
        if value is None:
            continue
        opt = declared[name]
        if isinstance(value, (tuple, list)):  # the lists' run-config spelling: comma-separated
            value = ",".join(str(v) for v in value)
        out[name] = opt.parse(opt.key, value)
    return out


def pre_options(pre: Sequence[PreAggregator]) -> dict[str, Any]:
    """The chain ``pre`` (applied in order) as RobustSettings fields: its names and bucket size."""
    bad = [p for p in pre if not isinstance(p, (NNM, ARC, Bucketing))]
    if bad:
        raise TypeError(f"pre-aggregator {bad[0]!r}: allowed NNM(), ARC(), Bucketing(size=...)")
    sizes = {p.size for p in pre if isinstance(p, Bucketing)}
    if len(sizes) > 1:
        raise ValueError(f"one bucket size per chain, got {sorted(sizes)}")
    return {"pre": tuple(p.name for p in pre) or None, "bucket_size": next(iter(sizes), None)}


class Rule(Aggregator):
    """A robust rule (``gradbant`` or a baseline of strategies/aggregation.py) named ``name``, with
    its ``options`` (RobustSettings fields, parsed: :func:`rule_options`) over the run's. The
    classes below are its typed faces; ``trust`` and ``model`` are the server's own labelled
    records and reference model (None: the run's trust set and model)."""

    def __init__(self, name: str, options: Mapping[str, Any] | None = None, *, trust: TrustSet | None = None,
                 model: Any = None) -> None:
        from strategies.options import AGGREGATORS

        if name not in AGGREGATORS:
            raise ValueError(f"unknown aggregator {name!r}; allowed: {', '.join(AGGREGATORS)}")
        self.name, self.options = name, rule_options(options or {})
        self.trust, self.model = trust, model
        self.impl: Any = None

    def bind(self, owner: Any) -> None:
        from strategies.gradbant import RobustAggregator
        from strategies.options import tolerated_f

        s = owner.s
        rule = replace(s.robust, aggregator=self.name, **self.options)
        s = replace(s, robust=rule)
        if rule.pre:
            from strategies.refusals import refuse_pre

            # the same one-line refusal as the run config's pre-aggregators
            refuse_pre(self.name, rule, privacy_mode=s.privacy.mode, silos_per_round=s.silos_per_round,
                       f=tolerated_f(rule, s.attack, s.num_silos))
        if rule.space == "sketch":
            from strategies.refusals import refuse_space

            refuse_space(self.name, s.sketch.kind)  # ... and as its aggregation-space
        phase = owner.scheduled_phase(1) if owner.algorithm.rule_step else None
        self.impl = RobustAggregator(s, owner.layout, owner.roster, phase, trust=self.trust, model=self.model)

    def combine(self, rnd: int, ex: Exchange, updates: Updates) -> tuple[Params | None, dict[str, Any]]:
        return self.impl.combine(rnd, ex, updates)

    def state(self) -> dict[str, Any]:
        return self.impl.state()

    def restore(self, state: dict[str, Any]) -> None:
        self.impl.restore(state)


class GradBANT(Rule):
    """Grad-BANT: trust scores of each message against the server's trust-set reference, with
    momentum ``beta`` and the descent-lemma penalty of smoothness L (``smoothness``, or "auto");
    ``noise_aware``: subtract an honest message's expected noise energy (needs ``silo_records``,
    public bounds (smallest, largest) on a silo's records, where the server cannot read the
    partition); ``trust``/``model``: the server's own records (``TrustSet(x, y)``) and the
    federation's torch model (a Flower user's own app brings both); ``trust_size``: how many
    of the run's records the trust set draws otherwise. None: the run's value."""

    def __init__(self, *, beta: float | None = None, smoothness: float | str | None = None,
                 noise_aware: bool | None = None, trust_size: int | None = None,
                 silo_records: tuple[int, int] | None = None, trust: TrustSet | None = None, model: Any = None,
                 pre: Sequence[PreAggregator] = ()) -> None:
        super().__init__("gradbant", {"gradbant_beta": beta, "gradbant_smoothness": smoothness,
                                      "gradbant_noise_aware": noise_aware, "trust_size": trust_size,
                                      "gradbant_silo_records": silo_records, **pre_options(pre)},
                         trust=trust, model=model)


class BaselineRule(Rule):
    """A baseline rule of strategies/aggregation.py with f, pre-aggregators and a space."""

    rule: ClassVar[str] = ""

    def __init__(self, f: int | None = None, *, pre: Sequence[PreAggregator] = (), space: str | None = None,
                 **more: Any) -> None:
        super().__init__(self.rule, {"byzantine_f": f, "space": space, **pre_options(pre), **more})


class Krum(BaselineRule):
    """Krum (Blanchard et al. 2017): the update closest to its n - f - 2 nearest (n > 2f + 2)."""

    rule = "krum"


class MultiKrum(BaselineRule):
    """Multi-Krum: the mean of the n - f updates with the lowest Krum scores."""

    rule = "multi-krum"


class TrimmedMean(BaselineRule):
    """Coordinate-wise mean without the f largest and f smallest values (Yin et al. 2018)."""

    rule = "trimmed-mean"


class Median(BaselineRule):
    """The coordinate-wise median (Yin et al. 2018)."""

    rule = "median"


class GeometricMedian(BaselineRule):
    """The geometric median by smoothed Weiszfeld (RFA, Pillutla et al. 2022)."""

    rule = "geometric-median"


class SMEA(BaselineRule):
    """The mean of the n - f updates whose covariance has the smallest top eigenvalue."""

    rule = "smea"


class CenteredClipping(BaselineRule):
    """Centered clipping (Karimireddy et al. 2021) of radius ``tau`` around the last aggregate."""

    rule = "centered-clipping"

    def __init__(self, tau: float | None = None, f: int | None = None, *, pre: Sequence[PreAggregator] = ()) -> None:
        super().__init__(f, pre=pre, cc_tau=tau)


class FLTrust(Rule):
    """FLTrust (Cao et al. 2021): ReLU-cosine trust against the server's root update."""

    def __init__(self, *, trust_size: int | None = None, trust: TrustSet | None = None, model: Any = None,
                 pre: Sequence[PreAggregator] = ()) -> None:
        super().__init__("fltrust", {"trust_size": trust_size, **pre_options(pre)}, trust=trust, model=model)


#: the typed face of every rule, by its run-config name (tests/test_aggregators.py checks it is whole)
RULE_CLASSES: dict[str, type[Rule]] = {
    "gradbant": GradBANT, "fltrust": FLTrust,
    **{cls.rule: cls for cls in (Krum, MultiKrum, TrimmedMean, Median, GeometricMedian, SMEA, CenteredClipping)}}


def make_aggregator(robust: RobustSettings, algorithm: str) -> Aggregator:
    """The run config's aggregator: the mean, or :class:`Rule` (algorithm robust: always a Rule)."""
    from app.algorithms import get_algorithm
    from strategies.options import resolve_aggregator

    rule = resolve_aggregator(robust.aggregator, algorithm)
    return Rule(rule) if get_algorithm(algorithm).weighs_each_message(rule) or robust.pre else Mean()


def with_harness(agg: Aggregator, attack_kind: str) -> Aggregator:
    """``agg`` inside the simulation's attack harness when ``attack.kind`` is set
    (strategies/byzantine_harness.py ``Attacked``), else ``agg``."""
    if attack_kind == "none" or hasattr(agg, "inner"):
        return agg
    from strategies.byzantine_harness import Attacked

    return Attacked(agg)  # type: ignore[return-value]
