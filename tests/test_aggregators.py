"""Aggregation is a component of every optimiser: a rule set in the run config applies to every
algorithm (it was silently the mean outside algorithm=robust), the default is unchanged (the
mean; Grad-BANT for robust), and a combination that cannot work is refused with one line.
Expected values are computed by hand here (the coordinate median, the mean)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app import wire
from app.algorithms import Phase
from app.config import ConfigError, parse_settings
from strategies import STRATEGIES
from strategies.aggregators import GradBANT, Mean, Rule
from strategies.replies import Updates, flatten

LAYOUT = {"w": (3,)}
W0 = {"w": np.array([1.0, -2.0, 0.5], dtype=np.float32)}
#: two honest silos and one far away: the median ignores it, the mean does not
VECTORS = [[1.0, 1.0, 1.0], [1.0, 2.0, 1.0], [100.0, 100.0, 100.0]]


def _updates(vectors: list[list[float]]) -> Updates:
    ups = [{"w": np.asarray(v, dtype=np.float32)} for v in vectors]
    nodes = [1000 + i for i in range(len(ups))]
    return Updates(nodes=nodes, updates=ups, metrics=[wire.TrainReply(u, 0.0) for u in ups],
                   messages={n: flatten(u) for n, u in zip(nodes, ups)}, lift=lambda m: wire.unflatten(m, LAYOUT))


def _step(algorithm: str, **cfg) -> tuple[object, dict]:
    s = parse_settings({"algorithm": algorithm, "lr": 0.5, "privacy.mode": "off", "num-silos": 5,
                        "silos-per-round": 3} | cfg)
    opt = STRATEGIES[s.algorithm](s, LAYOUT)
    asked = []

    def ask(phase, at, prev=None):
        asked.append(phase)
        return _updates(VECTORS)
    return opt, opt.step(1, W0, ask).model


@pytest.mark.parametrize("algorithm", ["mbsgd", "spider", "svrg", "proxsgd"])
def test_an_explicit_rule_applies_to_every_algorithm(algorithm: str) -> None:
    median = np.median(np.array(VECTORS), axis=0)  # (1, 2, 1)
    opt, w1 = _step(algorithm, aggregator="median", **{"byzantine.f": 1})
    assert isinstance(opt.aggregator, Rule) and opt.aggregator.name == "median"
    np.testing.assert_allclose(w1["w"], W0["w"] - 0.5 * median, rtol=1e-6)
    _, w_mean = _step(algorithm)  # the default: the mean, as before
    np.testing.assert_allclose(w_mean["w"], W0["w"] - 0.5 * np.mean(VECTORS, axis=0), rtol=1e-6)


def test_local_sgd_takes_the_rule_over_model_changes() -> None:
    opt, w1 = _step("localsgd", aggregator="median", **{"byzantine.f": 1, "local-steps": 2})
    np.testing.assert_allclose(w1["w"], W0["w"] + np.median(np.array(VECTORS), axis=0), rtol=1e-6)


def test_the_defaults_are_unchanged() -> None:
    for name, cls in STRATEGIES.items():
        s = parse_settings({"algorithm": name, "privacy.mode": "off", "trust.size": 40})
        agg = cls(s, LAYOUT).aggregator
        assert (agg.name == "gradbant") if name == "robust" else isinstance(agg, Mean), name


def test_combinations_that_cannot_work_are_refused_with_one_line() -> None:
    with pytest.raises(ConfigError, match="needs byzantine.f"):  # was: silently SPIDER's mean
        parse_settings({"algorithm": "spider", "aggregator": "krum"})
    with pytest.raises(ConfigError, match="shuffle") as exc:
        parse_settings({"algorithm": "mbsgd", "aggregator": "median", "byzantine.f": 1, "privacy.mode": "shuffle",
                        "num-silos": 5, "silos-per-round": 5})
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match="noise-aware"):
        parse_settings({"algorithm": "spider", "aggregator": "fltrust", "trust.size": 40,
                        "gradbant.noise-aware": True})
    # accepted for every optimiser: each exchange's allowance is its own release's (tests/test_spider_gradbant.py)
    assert parse_settings({"algorithm": "spider", "aggregator": "gradbant", "trust.size": 40,
                           "gradbant.noise-aware": True}).robust.gradbant_noise_aware
    with pytest.raises(TypeError, match="betta"):
        GradBANT(betta=0.3)


def test_every_rule_has_a_typed_class_equal_to_its_run_config() -> None:
    """Each rule's class, bound to a strategy, aggregates with the options the same rule gets from
    a run config (Krum(f=2, pre=(NNM(),)) = aggregator krum, byzantine.f 2, pre-aggregators nnm)."""
    from strategies.aggregators import ARC, NNM, RULE_CLASSES, CenteredClipping, FLTrust, Krum, Median
    from strategies.options import AGGREGATORS

    assert set(RULE_CLASSES) == set(AGGREGATORS) - {"mean"}
    base = {"algorithm": "mbsgd", "privacy.mode": "off", "num-silos": 7, "silos-per-round": 7, "trust.size": 40,
            "partition": "iid"}
    cases = [(Krum(f=2, pre=(NNM(),)), {"aggregator": "krum", "byzantine.f": 2, "pre-aggregators": "nnm"}),
             (Median(f=1, pre=(ARC(),)), {"aggregator": "median", "byzantine.f": 1, "pre-aggregators": "arc"}),
             (CenteredClipping(tau=0.5, f=1), {"aggregator": "centered-clipping", "cc.tau": 0.5, "byzantine.f": 1}),
             (GradBANT(beta=0.25, smoothness="auto"), {"aggregator": "gradbant", "gradbant.beta": 0.25,
                                                       "gradbant.smoothness": "auto"}),
             (FLTrust(trust_size=30), {"aggregator": "fltrust", "trust.size": 30})]
    for rule, cfg in cases:
        bound = STRATEGIES["mbsgd"](parse_settings(base), LAYOUT, aggregator=rule).aggregator.impl.s.robust
        assert bound == parse_settings(base | cfg).robust, rule.name


def test_gradbant_as_a_constructor_argument_overrides_the_run_config() -> None:
    s = parse_settings({"algorithm": "spider", "privacy.mode": "off"})
    opt = STRATEGIES["spider"](s, LAYOUT, aggregator=GradBANT(beta=0.25, trust_size=40))
    assert opt.aggregator.impl.s.robust.gradbant_beta == 0.25 and len(opt.aggregator.impl.trust.y) == 40
    assert opt.optimizer_state()["aggregator"]["p"].shape == (s.num_silos,)


def test_spider_with_gradbant_under_attack_gives_the_sign_flippers_no_weight(tmp_path: Path) -> None:
    from tests.helpers import run

    cfg = {"algorithm": "spider", "spider.q": 2, "batch-size": 64, "aggregator": "gradbant", "trust.size": 60,
           "partition": "iid", "num-silos": 4, "silos-per-round": 4, "privacy.mode": "off",
           "attack.kind": "sign-flip", "attack.fraction": 0.25, "num-rounds": 4}
    summary, rows, _ = run(tmp_path, cfg)
    assert summary["status"] == "completed" and len(rows) == 4
    anchors = [r for r in rows if r["round"] % 2 == 1]  # q = 2: rounds 1 and 3 are anchor rounds
    assert all(r["byzantine_answered"] == 1 and r["byzantine_weight"] == 0.0 for r in anchors)


def test_the_rules_load_no_torch() -> None:
    """Importing the rules (and the aggregator components) loads numpy, not torch or Flower's
    server: the strategy registry is built on first use."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    code = ("import sys; import strategies.aggregation, strategies.aggregators; "
            "print(sorted(m for m in ('torch', 'scipy', 'flwr', 'app.config') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                         env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_knobs_are_constructor_arguments_checked_as_the_run_config() -> None:
    s = parse_settings({"algorithm": "spider", "privacy.mode": "off"})
    opt = STRATEGIES["spider"](s, LAYOUT, lr=0.1, spider_q=5)
    assert (opt.s.lr, opt.s.spider.q, s.spider.q) == (0.1, 5, parse_settings({}).spider.q)
    with pytest.raises(ConfigError, match="spider.q"):
        STRATEGIES["spider"](s, LAYOUT, spider_q=0)
    assert STRATEGIES["spider"](s, LAYOUT, q=2).s.spider.q == 2  # the optimiser's own group, without its prefix
    with pytest.raises(ConfigError, match="unknown knob 'inner_steps'"):  # svrg's, not SPIDER's
        STRATEGIES["spider"](s, LAYOUT, inner_steps=2)


def test_an_optimiser_needs_no_run_config() -> None:
    """A Flower user's own app declares none of silofl's run-config keys: the constructor's
    arguments over the declared defaults of the optimiser's algorithm are the whole plan."""
    opt = STRATEGIES["spider"](lr=0.05, q=3, num_rounds=4, num_silos=4, silos_per_round=4, privacy_mode="off")
    defaults = parse_settings({"algorithm": "spider"})
    assert (opt.s.algorithm, opt.s.lr, opt.s.spider.q, opt.s.num_rounds, opt.s.silos_per_round) == \
        ("spider", 0.05, 3, 4, 4)
    assert opt.s.spider.anchor_batch == defaults.spider.anchor_batch and opt.layout == {}
    opt.bind_layout({"w": (3,)})  # what start() does with the initial arrays
    assert opt.layout == {"w": (3,)} and opt.n_params == 3
    with pytest.raises(ConfigError, match="not served by FedProxSPIDER"):
        STRATEGIES["spider"](algorithm="mbsgd")


def test_the_attack_harness_wraps_the_mean_too() -> None:
    """mbsgd + the mean under a sign-flip attack: the Byzantine silo's message is negated before
    the mean (w1 = w0 - lr * mean(v0, v1, -v2)), and the row counts it."""
    from strategies.byzantine_harness import Attacked

    s = parse_settings({"algorithm": "mbsgd", "lr": 0.5, "privacy.mode": "off", "num-silos": 3,
                        "silos-per-round": 3, "attack.kind": "sign-flip", "attack.fraction": 0.34})
    opt = STRATEGIES["mbsgd"](s, LAYOUT)
    assert isinstance(opt.aggregator, Attacked) and isinstance(opt.aggregator.inner, Mean)
    opt.aggregator.byzantine_nodes = {1002}  # what prepare() learns from the identity query
    result = opt.step(1, W0, lambda phase, at, prev=None: _updates(VECTORS))
    flipped = np.array(VECTORS[:2] + [[-x for x in VECTORS[2]]])
    np.testing.assert_allclose(result.model["w"], W0["w"] - 0.5 * flipped.mean(axis=0), rtol=1e-6)
    assert result.row == {"byzantine_answered": 1}
