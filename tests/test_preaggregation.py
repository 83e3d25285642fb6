"""Pre-aggregators (strategies/preaggregation.py), their composition with the rules
(strategies/composition.py) and the adaptive attacks (app/adaptive_attacks.py) against hand-worked
answers and their formulas; ByzFL parity is in tests/test_byzfl_parity.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app import config
from app.adaptive_attacks import adaptive_alie, adaptive_ipm, attack_effect, mimic, optimal_scale
from app.attacks import ATTACKS, MODEL_ATTACKS
from app.config import ConfigError, parse_settings
from strategies.aggregation import krum
from strategies.preaggregation import PRE_AGGREGATORS, apply_chain, arc, bucketing, nnm, rows_after

A = np.array


def test_config_copy_equals_the_registry():
    assert config.PRE_AGGREGATORS == tuple(PRE_AGGREGATORS)
    assert {"alie-adaptive", "ipm-adaptive", "mimic"} <= set(MODEL_ATTACKS)
    assert all(ATTACKS[k].omniscient for k in ("alie-adaptive", "ipm-adaptive", "mimic"))


def test_nnm_by_hand():
    # rows 0, 1, 10 on a line; f = 1: each row mixes its 2 nearest (itself included)
    out = nnm(A([[0.0], [1.0], [10.0]]), 1)
    np.testing.assert_allclose(out.rows, [[0.5], [0.5], [5.5]])
    np.testing.assert_allclose(out.mix, [[0.5, 0.5, 0], [0.5, 0.5, 0], [0, 0.5, 0.5]])


def test_nnm_ties_break_by_index():
    # row 1 at 0 is equidistant (1) from rows 0 and 2; f = 1 keeps itself and the lower index
    out = nnm(A([[-1.0], [0.0], [1.0]]), 1)
    np.testing.assert_allclose(out.rows[1], [-0.5])
    with pytest.raises(ValueError, match="f must be in"):
        nnm(A([[0.0], [1.0]]), 2)


def test_bucketing_by_hand_and_its_generator():
    u = A([[1.0], [2.0], [3.0], [4.0], [5.0]])
    out = bucketing(u, 2, perm=A([4, 0, 1, 3, 2]))
    np.testing.assert_allclose(out.rows, [[3.0], [3.0], [3.0]])  # (5+1)/2, (2+4)/2, 3
    a, b = bucketing(u, 2, np.random.default_rng(7)), bucketing(u, 2, np.random.default_rng(7))
    np.testing.assert_array_equal(a.rows, b.rows)  # the explicit generator decides the permutation
    np.testing.assert_allclose(a.mix.sum(axis=1), 1.0)
    assert rows_after(("bucketing",), 5, 2) == 3 == len(a.rows)
    with pytest.raises(ValueError, match="rng"):
        bucketing(u, 2)


def test_arc_by_hand():
    # n = 4, f = 1: k = floor(2 * 1 * 3 / 4) = 1 clipped, to the 3rd smallest norm (3)
    u = A([[1.0, 0.0], [0.0, 2.0], [3.0, 0.0], [0.0, 30.0]])
    out = arc(u, 1)
    np.testing.assert_allclose(out.rows, [[1, 0], [0, 2], [3, 0], [0, 3]])
    np.testing.assert_allclose(np.diag(out.mix), [1, 1, 1, 0.1])
    np.testing.assert_array_equal(arc(u, 0).rows, u)  # k = 0: nothing clipped


def test_chain_mix_reproduces_rows_and_maps_weights_to_silos():
    u = np.random.default_rng(1).normal(size=(9, 4))
    out = apply_chain(u, ("arc", "nnm", "bucketing"), 2, 3, np.random.default_rng(0))
    np.testing.assert_allclose(out.rows, out.mix @ u, atol=1e-12)
    assert out.mix.shape == (3, 9)
    agg = krum(out.rows, 0)  # one-hot on a bucket -> spread over that bucket's silos' mix
    np.testing.assert_allclose(agg.weights @ out.mix @ u, agg.vector, atol=1e-12)


def test_optimal_scale_finds_a_known_maximum():
    # effect(t) = -(t - 25)^2, by hand: 0 (-625), 10 (-225, delta -> 20), 30 (-25, delta -> 40),
    # 70 (-2025: stop, delta -> 32); contraction proposes only best + delta (ByzFL's search moves
    # right): 62, 55.6, 50.5, 46.4, 43.1, 40.5, 38.4 (-179.6 < -25? no), ... all worse than 30
    effect = lambda x: -(x - 25.0) ** 2  # noqa: E731
    assert optimal_scale(effect, evals=4) == 30.0
    assert optimal_scale(effect, evals=12) == 30.0
    assert optimal_scale(lambda x: -(x - 37.0) ** 2, evals=60) > 30.0  # it only moves right, toward 37
    assert optimal_scale(lambda x: -abs(x)) == 0.0  # nothing beats start = 0


def test_adaptive_alie_and_ipm_against_the_mean_push_as_far_as_the_search_goes():
    h = np.random.default_rng(3).normal(size=(6, 5))
    mean = lambda rows: rows.mean(axis=0)  # noqa: E731
    v, tau = adaptive_alie(h, 4, mean)
    # unbounded effect: expansion doubles delta at each of the 19 steps: tau = 10 (2^19 - 1)
    assert tau == 10.0 * (2**19 - 1)
    np.testing.assert_allclose(v, h.mean(0) + tau * h.std(0, ddof=1))
    v, tau = adaptive_ipm(h, 4, mean)
    np.testing.assert_allclose(v, -tau * h.mean(0))
    assert attack_effect(h, v, 4, mean) == pytest.approx(np.linalg.norm((4 * v - 4 * h.mean(0)) / 10))


def test_adaptive_alie_against_krum_stays_inside_krums_acceptance():
    """Krum picks one row: a scale far out loses (the honest row wins), so tau* is finite and the
    result differs from the honest mean at least as much as tau = 0 (mu) does."""
    h = np.random.default_rng(4).normal(size=(6, 20))
    rule = lambda rows: krum(rows, 4).vector  # noqa: E731
    v, tau = adaptive_alie(h, 4, rule)
    assert 0 <= tau < 1000
    assert attack_effect(h, v, 4, rule) >= attack_effect(h, h.mean(0), 4, rule)


def test_mimic_repeats_one_honest_message():
    h = A([[1.0, 2.0], [3.0, 4.0]])
    np.testing.assert_array_equal(mimic(h), [1.0, 2.0])
    np.testing.assert_array_equal(mimic(h, 1), [3.0, 4.0])
    with pytest.raises(ValueError, match="target"):
        mimic(h, 2)


BASE = {"algorithm": "robust", "privacy.mode": "off", "num-silos": 10, "silos-per-round": 10, "trust.size": 40}


def test_pre_aggregators_parse_and_compose():
    s = parse_settings(BASE | {"aggregator": "krum", "pre-aggregators": "nnm, arc", "byzantine.f": 2})
    assert s.robust.pre == ("nnm", "arc")
    with pytest.raises(ConfigError, match="unknown pre-aggregator 'nmm'"):
        parse_settings(BASE | {"aggregator": "krum", "pre-aggregators": "nmm", "byzantine.f": 2})


@pytest.mark.parametrize("cfg,match", [
    ({"aggregator": "median", "pre-aggregators": "nnm"}, "nnm needs byzantine.f"),
    ({"aggregator": "gradbant", "pre-aggregators": "bucketing"}, "per-silo trust p"),
    ({"aggregator": "gradbant", "pre-aggregators": "nnm", "gradbant.noise-aware": True, "byzantine.f": 1},
     "noise energy"),
    ({"aggregator": "krum", "pre-aggregators": "bucketing", "attack.kind": "alie-adaptive", "attack.fraction": 0.3},
     "leaves 5 rows of the 10 replies"),
    ({"algorithm": "mbsgd", "aggregator": "mean", "pre-aggregators": "arc", "byzantine.f": 0,
      "privacy.mode": "shuffle"}, "shuffle"),
])
def test_combinations_that_cannot_work_are_refused_with_one_line(cfg, match):
    with pytest.raises(ConfigError, match=match) as exc:
        parse_settings(BASE | cfg)
    assert "\n" not in str(exc.value)


def test_rule_knob_pre_is_checked():
    from strategies.aggregators import NNM, Bucketing, Krum

    assert Krum(f=2, pre=(NNM(),)).options == {"byzantine_f": 2, "pre": ("nnm",)}
    assert Krum(f=2, pre=(NNM(), Bucketing(size=3))).options["bucket_size"] == 3
    with pytest.raises(TypeError, match="pre-aggregator 'nmm'"):
        Krum(f=2, pre=("nmm",))
    with pytest.raises(ConfigError, match="byzantine.f = -5"):
        Krum(f=-5)


def test_nnm_krum_under_adaptive_alie_runs_and_reports_silo_weights(tmp_path: Path):
    """A short federation through the real ServerApp: NNM∘Krum, 3 of 10 silos adaptive-ALIE;
    the silo weights are the rule's weights mapped through the mix (they sum to 1)."""
    from tests.helpers import run

    cfg = {"algorithm": "robust", "aggregator": "krum", "pre-aggregators": "nnm", "dataset": "digits",
           "partition": "iid", "num-silos": 10, "silos-per-round": 10, "privacy.mode": "off",
           "attack.kind": "alie-adaptive", "attack.fraction": 0.3, "num-rounds": 2, "batch-size": 32}
    summary, rows, _ = run(tmp_path, cfg)
    assert summary["status"] == "completed" and len(rows) == 2
    for r in rows:
        assert r["byzantine_answered"] == 3
        assert sum(r["silo_weights"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize("rule,pre,attack", [("gradbant", "nnm", "ipm-adaptive"), ("fltrust", "bucketing", "mimic"),
                                             ("centered-clipping", "arc", "alie-adaptive"),
                                             ("smea", "nnm", "ipm-adaptive")])
def test_every_kind_of_rule_composes_and_meets_the_adaptive_attacks(tmp_path: Path, rule, pre, attack):
    """Trust rules (the attacker's g0: the honest mean), a stateful rule (centered clipping's
    center, copied), a subset-search rule (SMEA, about 20 times a round in the line search) and
    Bucketing's per-round generator, through the real ServerApp."""
    from tests.helpers import run

    cfg = {"algorithm": "robust", "aggregator": rule, "pre-aggregators": pre, "dataset": "digits", "trust.size": 60,
           "partition": "iid", "num-silos": 10, "silos-per-round": 10, "privacy.mode": "off", "byzantine.f": 4,
           "attack.kind": attack, "attack.fraction": 0.4, "num-rounds": 2, "batch-size": 32}
    summary, rows, _ = run(tmp_path, cfg)
    assert summary["status"] == "completed" and len(rows) == 2
    assert all(("attack_scale" in r) == (attack != "mimic") for r in rows)
    assert all(sum(r["silo_weights"].values()) <= 1.0 + 1e-9 for r in rows)


def test_a_round_with_fewer_rows_than_the_chain_needs_keeps_the_model():
    """NNM with f = 3 over a round where only 3 replies were valid (the others dropped): the model
    stays this round, as when the rule itself cannot run (before: NNM's ValueError ended the run)."""
    from app.algorithms import Phase
    from app.config import parse_settings
    from strategies.exchange import Exchange
    from strategies.gradbant import RobustAggregator
    from strategies.replies import NodeRoster, Updates

    layout = {"w": (2, 3)}
    s = parse_settings({"algorithm": "robust", "aggregator": "krum", "pre-aggregators": "nnm", "byzantine.f": 3,
                        "num-silos": 10, "silos-per-round": 10, "privacy.mode": "off", "model": "logistic"})
    agg = RobustAggregator(s, layout, NodeRoster())
    rows = np.random.default_rng(0).normal(size=(3, 6))
    updates = Updates(nodes=[11, 12, 13], updates=[{"w": r.reshape(2, 3)} for r in rows],
                      messages={n: r.astype(np.float32) for n, r in zip([11, 12, 13], rows)})
    direction, row = agg.combine_flat(1, Exchange(Phase.GRAD, {"w": np.zeros((2, 3), dtype=np.float32)}), updates)
    assert direction is None and all(v == 0 for v in row["silo_weights"].values())
