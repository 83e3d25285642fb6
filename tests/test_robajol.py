"""RobAJoL (Fed-DPRoC, Xia et al. 2025): ``aggregation-space = sketch`` runs the rule and its
pre-aggregators on the silos' JL sketches y_i = S_t x_i and lifts the aggregate once, S_t^T agg.
Checked against an independent computation: S_t built explicitly from app.sketch (its columns
S e_j), ByzFL's NNM and TrMean on S u_i, then S_t^T by hand."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from app.algorithms import Phase
from app.config import ConfigError, parse_settings
from app.sketch import make_sketch
from strategies.exchange import Exchange
from strategies.replies import NodeRoster, ReplyReader, Updates

LAYOUT = {"w": (3, 4), "b": (5,)}  # d = 17
BASE = {"algorithm": "robust", "privacy.mode": "off", "num-silos": 9, "silos-per-round": 9, "trust.size": 40,
        "model": "logistic", "sketch.kind": "gaussian", "sketch.ratio": 0.6, "byzantine.f": 2}
ROBAJOL = BASE | {"aggregator": "trimmed-mean", "pre-aggregators": "nnm", "aggregation-space": "sketch"}


@pytest.fixture(scope="module")
def byzfl():
    """ByzFL 0.0.11 (its benchmark module imports seaborn: a stand-in when absent, as test_byzfl_parity)."""
    try:
        import seaborn  # noqa: F401
    except ImportError:
        sys.modules.setdefault("seaborn", types.ModuleType("seaborn"))
    return pytest.importorskip("byzfl", reason="byzfl==0.0.11 is not installed (dev extra; `make setup` installs it)")


def _sketch_and_matrix(kind: str = "gaussian"):
    """The round's sketch as the server builds it and S as a k x d matrix, column j = S e_j."""
    sketch = make_sketch(kind, list(LAYOUT.values()), ratio=0.6, seed=1234, round=3)
    d = sum(int(np.prod(v)) for v in LAYOUT.values())
    import torch

    cols = [sketch.compress(torch.nn.functional.one_hot(torch.tensor(j), d).float()).numpy() for j in range(d)]
    return sketch, np.stack(cols, axis=1).astype(np.float64)


def _updates(sketch, y: np.ndarray) -> Updates:
    """One exchange's replies carrying the payloads ``y`` [m, k], lifted as the server lifts them."""
    reader = ReplyReader(LAYOUT, sketch, lambda msg, what: "")
    nodes = list(range(101, 101 + len(y)))
    messages = {n: row.astype(np.float32) for n, row in zip(nodes, y)}
    return Updates(nodes=nodes, updates=[reader.lift(messages[n]) for n in nodes], messages=messages,
                   lift=reader.lift)


def _rows(m: int = 9, byz: int = 2) -> np.ndarray:
    rng = np.random.default_rng(28)
    u = rng.normal(size=(m, 17)) * rng.uniform(0.5, 2.0, size=(m, 1))
    u[:byz] = 2.0 + 3.0 * rng.normal(size=(byz, 17))  # two off-centre updates, close enough that NNM mixes them in
    return u


def _direction(cfg: dict, updates: Updates, phase: Phase = Phase.GRAD) -> np.ndarray:
    from strategies.gradbant import RobustAggregator

    agg = RobustAggregator(parse_settings(cfg), LAYOUT, NodeRoster())
    w = {k: np.zeros(v, dtype=np.float32) for k, v in LAYOUT.items()}
    direction, row = agg.combine_flat(1, Exchange(phase, w), updates)
    assert direction is not None and sum(row["silo_weights"].values()) == pytest.approx(1.0)
    return direction


def test_the_explicit_matrix_is_the_sketch_and_its_transpose_the_lift():
    """S built column by column reproduces compress (S x) and its transpose decompress (S^T y)."""
    import torch

    sketch, S = _sketch_and_matrix()
    x = np.random.default_rng(1).normal(size=17)
    np.testing.assert_allclose(sketch.compress(torch.tensor(x, dtype=torch.float32)).numpy(), S @ x, atol=1e-5)
    y = np.random.default_rng(2).normal(size=S.shape[0])
    np.testing.assert_allclose(sketch.decompress(torch.tensor(y, dtype=torch.float32)).numpy(), S.T @ y, atol=1e-5)


@pytest.mark.parametrize("kind", ["gaussian", "srht", "countsketch"])
def test_sketch_space_aggregation_is_byzfl_on_the_sketches_then_lifted(byzfl, kind):
    """direction = S^T TrMean_f(NNM_f(S u_1..S u_m)) with ByzFL's NNM and TrMean, f = 2."""
    sketch, S = _sketch_and_matrix(kind)
    y = _rows() @ S.T
    theirs = S.T @ byzfl.TrMean(2)(byzfl.NNM(2)(y.astype(np.float32).astype(np.float64)))
    ours = _direction(ROBAJOL | {"sketch.kind": kind}, _updates(sketch, y))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())


def test_local_phase_reads_the_sketched_model_change_as_a_pseudo_gradient(byzfl):
    """Q > 1: the messages are S d_i; the rule reads S(-d_i / gamma) and the lift is S^T of that."""
    sketch, S = _sketch_and_matrix()
    y = _rows() @ S.T
    lr = parse_settings(ROBAJOL).lr
    theirs = S.T @ byzfl.TrMean(2)(byzfl.NNM(2)(-y.astype(np.float32).astype(np.float64) / lr))
    ours = _direction(ROBAJOL, _updates(sketch, y), Phase.LOCAL)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-4 * np.abs(theirs).max())


def test_the_mean_is_the_same_in_both_spaces_and_a_coordinate_rule_is_not():
    """S^T mean(y_i) = mean(S^T y_i) (S^T is linear); a coordinate-wise trimmed mean is not
    rotation-equivariant, so the two spaces give different directions."""
    sketch, S = _sketch_and_matrix()
    updates = _updates(sketch, _rows() @ S.T)
    mean = BASE | {"aggregator": "mean", "byzantine.f": 0}
    np.testing.assert_allclose(_direction(mean | {"aggregation-space": "sketch"}, updates),
                               _direction(mean, updates), rtol=0, atol=1e-5)
    trimmed = ROBAJOL | {"pre-aggregators": ""}
    lifted = _direction(trimmed | {"aggregation-space": "lifted"}, updates)
    assert np.abs(_direction(trimmed, updates) - lifted).max() > 1e-2


def test_the_adaptive_attacker_simulates_what_the_server_aggregates():
    """rule_simulator on the sketches (what the harness passes it) is the server's aggregate
    before its lift: S^T simulator(Y) = the server's direction."""
    from strategies.composition import rule_simulator
    from strategies.gradbant import RobustAggregator

    sketch, S = _sketch_and_matrix()
    y = (_rows() @ S.T).astype(np.float32).astype(np.float64)
    agg = RobustAggregator(parse_settings(ROBAJOL), LAYOUT, NodeRoster())
    simulated = rule_simulator(agg, 1, 2, y[2:].mean(axis=0))(y)
    np.testing.assert_allclose(S.T @ simulated, _direction(ROBAJOL, _updates(sketch, y)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("cfg,match", [
    ({"sketch.kind": "none"}, "sketch.kind = 'none'"),
    ({"sketch.kind": "randk"}, "linear JL sketch"),
    ({"sketch.kind": "powersgd"}, "linear JL sketch"),
    ({"aggregator": "gradbant", "pre-aggregators": ""}, "trust-set reference"),
    ({"aggregator": "fltrust", "pre-aggregators": ""}, "trust-set reference"),
    ({"aggregator": "centered-clipping"}, "last round's sketch space"),
])
def test_sketch_space_combinations_that_cannot_work_are_refused_with_one_line(cfg, match):
    with pytest.raises(ConfigError, match=match) as exc:
        parse_settings(ROBAJOL | cfg)
    assert "\n" not in str(exc.value)


def test_the_rule_knob_space():
    """Flower-native: TrimmedMean(..., space="sketch") is checked at construction (by the option's
    own parser) and refused at bind with the run config's one line."""
    from strategies.aggregators import NNM, Rule, TrimmedMean

    assert TrimmedMean(f=2, pre=(NNM(),), space="sketch").options["space"] == "sketch"
    with pytest.raises(ConfigError, match="aggregation-space = 'compressed'"):
        TrimmedMean(space="compressed")
    owner = types.SimpleNamespace(s=parse_settings(BASE | {"aggregator": "trimmed-mean"}), layout=LAYOUT,
                                  roster=NodeRoster(), scheduled_phase=lambda rnd: Phase.GRAD,
                                  algorithm=types.SimpleNamespace(name="robust", rule_step=True))
    TrimmedMean(pre=(NNM(),), space="sketch").bind(owner)
    with pytest.raises(ConfigError, match="trust-set reference"):
        Rule("fltrust", {"space": "sketch"}).bind(owner)


def test_robajol_under_adaptive_alie_runs_through_the_server_app(tmp_path: Path):
    """A short federation through the real ServerApp: RobAJoL (NNM, trimmed mean, on SRHT sketches
    k/d = 0.5), 3 of 10 silos adaptive-ALIE against the rule on the sketches."""
    from tests.helpers import run

    cfg = {"algorithm": "robust", "aggregator": "trimmed-mean", "pre-aggregators": "nnm",
           "aggregation-space": "sketch", "sketch.kind": "srht", "sketch.ratio": 0.5, "dataset": "digits",
           "partition": "iid", "num-silos": 10, "silos-per-round": 10, "privacy.mode": "off",
           "attack.kind": "alie-adaptive", "attack.fraction": 0.3, "num-rounds": 2, "batch-size": 32}
    summary, rows, _ = run(tmp_path, cfg)
    assert summary["status"] == "completed" and len(rows) == 2
    for r in rows:
        assert r["byzantine_answered"] == 3 and "attack_scale" in r
        assert sum(r["silo_weights"].values()) == pytest.approx(1.0)



def test_the_adaptive_attacker_aims_at_the_lifts_when_the_rule_runs_in_the_model_space():
    """aggregation-space = lifted (the default) with a sketch: the server's rule reads S^T y_i, so
    the attacker's simulator must too (before: it ran the rule on y, a different rule for a
    coordinate-wise trimmed mean). Its output equals the server's direction, and the harness's
    search compares it with S^T mean(y), so the tau it picks maximises the server's real deviation."""
    from strategies.byzantine_harness import Attacked, adaptive_message
    from strategies.composition import rule_simulator
    from strategies.gradbant import RobustAggregator
    from strategies.replies import flatten

    cfg = BASE | {"aggregator": "trimmed-mean", "attack.kind": "alie-adaptive", "attack.fraction": 0.2}
    sketch, S = _sketch_and_matrix()
    y = (_rows() @ S.T).astype(np.float32).astype(np.float64)
    updates = _updates(sketch, y)
    s = parse_settings(cfg)
    agg = RobustAggregator(s, LAYOUT, NodeRoster())
    harness = Attacked(type("Inner", (), {"name": "trimmed-mean", "impl": agg})())
    harness.s = s
    lift = harness.model_space_lift(updates)
    assert lift is not None
    np.testing.assert_allclose(lift(y[0]), S.T @ y[0], rtol=0, atol=1e-4)
    simulated = rule_simulator(agg, 1, 2, S.T @ y[2:].mean(axis=0), 1.0, lift)(y)
    np.testing.assert_allclose(simulated, _direction(cfg, updates), rtol=0, atol=1e-4)
    # the search's objective is the server's: ||TM(S^T rows) - S^T mean(H)||, evaluated independently
    honest = y[2:]
    report: dict[str, float] = {}
    sent = adaptive_message(s.attack.kind, s.robust.byzantine_f, honest, 2, lambda f, mean: rule_simulator(agg, 1, f, mean, 1.0, lift), report, lift)
    from strategies.aggregation import trimmed_mean

    def server_deviation(b):
        rows = np.concatenate([honest, np.repeat(b[None, :], 2, axis=0)]) @ S
        return np.linalg.norm(trimmed_mean(rows, 2).vector - S.T @ honest.mean(axis=0))

    mu, sd = honest.mean(axis=0), honest.std(axis=0, ddof=1)
    assert server_deviation(sent) >= server_deviation(mu + 0.0 * sd) - 1e-9
    np.testing.assert_allclose(sent, mu + report["attack_scale"] * sd, rtol=1e-5, atol=1e-5)
    # the search in the payload space (what it did before) finds a tau that moves the server less
    from app.adaptive_attacks import adaptive_alie

    naive, _ = adaptive_alie(honest, 2, rule_simulator(agg, 1, 2, honest.mean(axis=0)))
    assert server_deviation(sent) > server_deviation(naive)
    assert harness.model_space_lift(updates) is not None and flatten(updates.lift(y[0].astype(np.float32))).shape == (17,)
