"""Robust rules in a deployment (issue 23, section 4): a hostile silo against the real ServerApp
with no attack harness, i.e. what a deployed server sees.

A deployed server has no attack configured, so the number f of Byzantine silos a rule must
tolerate comes only from ``byzantine.f``: the rules that need it refuse to start without it, and
with it one hostile silo sending values at the reply bound (2^64) or -10 times its own update
(IPM with epsilon = 10, from its own message) cannot ruin the trimmed mean or Multi-Krum. The
geometric median is checked against its breakdown bound with rows at the bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message

from app import wire
from app.config import ConfigError, parse_settings
from app.launch import merged_run_config
from strategies.aggregation import HonestMajorityRequired, geometric_median, krum, multi_krum, trimmed_mean
from strategies.replies import MAX_UPDATE_ABS
from tests.helpers import run

#: a deployment-like run: the robust loop with no attack harness (attack.kind = none)
DEPLOYED = {"algorithm": "robust", "dataset": "wbcd", "partition": "iid", "num-silos": 5, "silos-per-round": 5,
            "model": "logistic", "privacy.mode": "off", "lr": 0.5, "num-rounds": 4, "batch-size": 32,
            "trust.size": 60, "attack.kind": "none"}


def _at_bound(shape: tuple[int, ...], layer: int) -> np.ndarray:
    """The same values for every hostile node (they collude): 2^64 with a fixed random sign."""
    signs = np.random.default_rng([23, layer]).choice([-1.0, 1.0], size=shape)
    return (signs * MAX_UPDATE_ABS).astype(np.float32)


def _hostile(nodes: set[int], kind: str):
    """A reply hook: the train replies of ``nodes`` carry values at the bound, 2^64 with a sign
    fixed per coordinate and shared by the colluding nodes (``bound``), or -10 times the node's
    own update (``ipm10``: IPM with epsilon = 10 from the one message it sees)."""
    def hook(node: int, msg: Message, reply: Message) -> Message:
        if node not in nodes or msg.metadata.message_type != "train" or reply.has_error() \
                or wire.UPDATE not in reply.content.array_records:
            return reply
        rec = reply.content.array_records[wire.UPDATE]
        new = {k: (_at_bound(rec[k].numpy().shape, i) if kind == "bound"
                   else (-10.0 * rec[k].numpy()).astype(np.float32)) for i, k in enumerate(rec)}
        reply.content.array_records[wire.UPDATE] = ArrayRecord({k: Array(v) for k, v in new.items()})
        return reply
    return hook


# -------------------------------------------------------------------------------------------------
# the config: f is stated, or the rule does not start
# -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["krum", "multi-krum", "trimmed-mean", "smea"])
def test_a_rule_that_needs_f_refuses_to_start_without_it(rule: str) -> None:
    cfg = merged_run_config([]) | DEPLOYED | {"aggregator": rule}
    with pytest.raises(ConfigError, match="needs byzantine.f") as exc:
        parse_settings(cfg)
    assert "\n" not in str(exc.value)
    assert parse_settings(cfg | {"byzantine.f": 1}).robust.byzantine_f == 1
    # a simulation with an attack: the harness tells the rule each round's count
    parse_settings(cfg | {"attack.kind": "sign-flip", "attack.fraction": 0.2})


@pytest.mark.parametrize("rule", ["mean", "gradbant", "fltrust", "median", "geometric-median", "centered-clipping"])
def test_rules_that_take_no_f_or_only_check_it_start_without_it(rule: str) -> None:
    assert parse_settings(merged_run_config([]) | DEPLOYED | {"aggregator": rule}).robust.byzantine_f == -1


@pytest.mark.parametrize("rule", ["krum", "multi-krum", "trimmed-mean", "median", "geometric-median",
                                  "centered-clipping", "smea"])
@pytest.mark.parametrize("n", [3, 4, 5, 6, 7, 9])
def test_byzantine_f_is_refused_exactly_where_the_rule_cannot_tolerate_it(rule: str, n: int) -> None:
    """Blanchard et al.: Krum and Multi-Krum need n > 2f + 2; the other honest-majority rules
    n > 2f (n = the replies a round aggregates, silos-per-round)."""
    for f in range(0, n):
        ok = n > 2 * f + 2 if rule in ("krum", "multi-krum") else n > 2 * f
        cfg = merged_run_config([]) | DEPLOYED | {"aggregator": rule, "num-silos": 9, "silos-per-round": n,
                                                  "byzantine.f": f}
        if ok:
            parse_settings(cfg)
        else:
            with pytest.raises(ConfigError, match=f"byzantine.f = {f} is out of range for aggregator '{rule}'"):
                parse_settings(cfg)


def test_smea_with_too_many_subsets_is_refused_at_the_start() -> None:
    """SMEA compares C(n, f) subsets of the round's n rows: C(20, 8) = 125,970 is over its limit
    of 100,000, C(20, 7) = 77,520 is not; the rows are those after the pre-aggregators (40 replies,
    f = 5: C(40, 5) = 658,008, bucketed in pairs C(20, 5) = 15,504); an attack's count stands for
    an unstated f."""
    cfg = merged_run_config([]) | DEPLOYED | {"aggregator": "smea", "num-silos": 20, "silos-per-round": 20}
    with pytest.raises(ConfigError, match=r"^aggregator = 'smea' cannot run: smea compares .*"
                                          r"C\(20, 8\) = 125,970 subsets") as exc:
        parse_settings(cfg | {"byzantine.f": 8})
    assert "\n" not in str(exc.value)
    parse_settings(cfg | {"byzantine.f": 7})
    with pytest.raises(ConfigError, match=r"C\(40, 5\) = 658,008"):
        parse_settings(cfg | {"byzantine.f": 5, "num-silos": 40, "silos-per-round": 40})
    parse_settings(cfg | {"byzantine.f": 5, "num-silos": 40, "silos-per-round": 40, "pre-aggregators": "bucketing"})
    with pytest.raises(ConfigError, match=r"C\(20, 9\) = 167,960"):
        parse_settings(cfg | {"attack.kind": "sign-flip", "attack.fraction": 0.45})


def test_byzantine_f_with_nothing_that_tolerates_it_is_refused() -> None:
    with pytest.raises(ConfigError, match="byzantine.f = 1 needs a Byzantine-robust rule"):
        parse_settings(merged_run_config([]) | DEPLOYED | {"aggregator": "mean", "byzantine.f": 1})
    with pytest.raises(ConfigError, match="byzantine.f = 2 needs a Byzantine-robust rule"):
        parse_settings(merged_run_config([]) | {"byzantine.f": 2})
    with pytest.raises(ConfigError, match="byzantine.f = -2 is out of range"):
        parse_settings(merged_run_config([]) | DEPLOYED | {"byzantine.f": -2})


# -------------------------------------------------------------------------------------------------
# one hostile silo against the real ServerApp, no harness
# -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("rule", ["trimmed-mean", "multi-krum"])
@pytest.mark.parametrize("kind", ["bound", "ipm10"])
def test_one_hostile_silo_cannot_ruin_trimmed_mean_or_multi_krum_in_a_deployment(tmp_path: Path, rule: str,
                                                                                 kind: str) -> None:
    """Node 1000 of 5 is hostile; the server has no attack harness. With byzantine.f = 1 the run
    learns as without the hostile silo; with f = 0 (what the server used before byzantine.f) the
    same silo ruins it, so the attack is real."""
    cfg = DEPLOYED | {"aggregator": rule, "byzantine.f": 1}
    clean, _, _ = run(tmp_path / "c", cfg)
    summary, rows, _ = run(tmp_path / "h", cfg, hook=_hostile({1000}, kind))
    assert summary["status"] == "completed"
    assert summary["test_error"] <= clean["test_error"] + 0.05, (summary["test_error"], clean["test_error"])
    if kind == "bound":  # its values are the largest of every coordinate: always trimmed, never selected
        assert all(r["silo_weights"]["0"] == 0.0 for r in rows)
    ruined, _, _ = run(tmp_path / "r", cfg | {"byzantine.f": 0}, hook=_hostile({1000}, kind))
    assert ruined["test_error"] is None or ruined["test_error"] >= clean["test_error"] + 0.2


# -------------------------------------------------------------------------------------------------
# the geometric median with rows at the bound
# -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,f", [(10, 4), (9, 4)])
def test_geometric_median_stays_within_its_breakdown_bound_with_rows_at_the_bound(n: int, f: int) -> None:
    """Breakdown point 1/2: for any point x, the geometric median z* of h = n - f honest points
    and f arbitrary ones satisfies (h - f) ||z* - x|| <= 2 sum_H ||u_i - x|| (triangle inequality
    on sum_i ||z* - u_i|| <= sum_i ||x - u_i||), so ||z* - x|| <= 2h/(h - f) * max_H ||u_i - x||.
    With x the honest mean and f rows at the reply bound 2^64, 100 Weiszfeld steps from the mean
    left z about 10 (f = 4 of 10) to 1e9 (4 of 9) times that far away."""
    rng = np.random.default_rng(7)
    h, d = n - f, 200
    honest = 0.3 + 0.1 * rng.standard_normal((h, d))
    rows = np.vstack([honest, np.full((f, d), MAX_UPDATE_ABS)])
    x = honest.mean(axis=0)
    spread = np.linalg.norm(honest - x, axis=1).max()
    agg = geometric_median(rows, f=f)
    assert np.linalg.norm(agg.vector - x) <= 2 * h / (h - f) * spread
    np.testing.assert_allclose(agg.weights @ rows, agg.vector, rtol=1e-9, atol=1e-9)


def test_geometric_median_with_four_of_ten_silos_at_the_bound_in_a_deployment(tmp_path: Path) -> None:
    """Four of ten silos send every value at the bound to the real ServerApp (no harness): the
    geometric median learns as it does without them."""
    cfg = DEPLOYED | {"aggregator": "geometric-median", "num-silos": 10, "silos-per-round": 10}
    clean, _, _ = run(tmp_path / "c", cfg)
    summary, rows, _ = run(tmp_path / "h", cfg, hook=_hostile({1000, 1001, 1002, 1003}, "bound"))
    assert summary["status"] == "completed"
    assert summary["test_error"] <= clean["test_error"] + 0.05, (summary["test_error"], clean["test_error"])


def test_the_pure_rules_still_refuse_what_the_config_refuses() -> None:
    """The functions behind the config check agree with it (n > 2f + 2 for Krum, n > 2f else)."""
    u = np.random.default_rng(0).standard_normal((5, 3))
    for rule in (krum, multi_krum):
        rule(u, 1)
        with pytest.raises(HonestMajorityRequired):
            rule(u, 2)
    trimmed_mean(u, 2)
    with pytest.raises(HonestMajorityRequired):
        trimmed_mean(u, 3)
