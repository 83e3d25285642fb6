"""The threat model as attacks: a hostile server against the real silo, a hostile silo against
the real strategies. Each test scripts one attack of docs/threat-model.md through the project's
own code (Silo.train / Silo.evaluate, the ClientApp, the ServerApp on an in-process grid) and
checks the guarantee against an independent fact (a sensitivity bound, a noise variance, a cap)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from app import wire
from app.config import ConfigError, parse_settings
from app.data.federated import build_federated_data
from app.launch import merged_run_config
from app.privacy.clipping import clip_rows
from app.privacy.per_sample import per_sample_grads
from clients.silo import Silo
from strategies.aggregation import HonestMajorityRequired, krum, multi_krum
from tests.helpers import run

# -------------------------------------------------------------------------------------------------
# a hostile server against the silo
# -------------------------------------------------------------------------------------------------


def _silo(tmp_path: Path, overrides: dict[str, Any], *, index: int = 0, record: tuple[int, int] | None = None,
          **kwargs: Any) -> Silo:
    """Silo ``index`` of the run config; ``record`` = (i, j) replaces training record i by a copy
    of record j (the neighbouring dataset D')."""
    s = parse_settings(merged_run_config([]) | overrides)
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    data = fed.silos[index]
    if record is not None:
        x, y = data.train_x.clone(), data.train_y.clone()
        x[record[0]], y[record[0]] = x[record[1]], y[record[1]]
        data = dataclasses.replace(data, train_x=x, train_y=y)
    return Silo(s, data, fed.num_classes, fed.feature_shape, tmp_path, "t", **kwargs)


def _overflow_model(silo: Silo) -> tuple[dict[str, np.ndarray], int]:
    """A finite float32 model whose first-layer column j is so large that only the record with
    the largest feature j overflows (its activations become inf, its gradient NaN). Returns the
    model and that record's index."""
    x = silo.records.train_x.numpy()
    j = int(np.argmax(x.max(axis=0)))
    order = np.argsort(x[:, j])
    top, second = x[order[-1], j], x[order[-2], j]
    w = {k: v.detach().numpy().copy() for k, v in silo.model.named_parameters()}
    first = next(iter(w))
    w[first][:, j] = np.float32(3.4e38 / ((top + second) / 2))
    assert np.all(np.isfinite(w[first]))
    return w, int(order[-1])


def _train(silo: Silo, w: dict[str, np.ndarray], cfg: dict[str, Any], prev: dict[str, np.ndarray] | None = None
           ) -> RecordDict:
    return silo.train(wire.instruction(wire.params_to_record(w), cfg,
                                       None if prev is None else wire.params_to_record(prev)))


def _update(reply: RecordDict) -> np.ndarray:
    assert wire.refusal_of(reply) is None, wire.refusal_of(reply)
    rec = reply.array_records[wire.UPDATE]
    return np.concatenate([rec[k].numpy().reshape(-1) for k in rec])


def test_clip_rows_bounds_nan_inf_and_overflowing_rows() -> None:
    """Every clipped row is finite with norm <= L, whatever the per-sample gradients are."""
    g = torch.tensor([[1e37, 1e37, 3.0], [math.nan, 1.0, 1.0], [math.inf, 0.0, 0.0], [3.0, 4.0, 0.0],
                      [0.3, 0.4, 0.0]], dtype=torch.float32)
    out = clip_rows(g, 1.0)
    assert torch.isfinite(out).all()
    norms = out.double().norm(dim=1)
    assert (norms <= 1.0 + 1e-6).all()
    np.testing.assert_allclose(out[0, :2].numpy(), [2 ** -0.5, 2 ** -0.5], rtol=1e-6)  # direction kept
    assert out[1].abs().sum() == 0 and out[2].abs().sum() == 0  # non-finite rows -> 0
    np.testing.assert_allclose(out[3].numpy(), [0.6, 0.8, 0.0], rtol=1e-6)
    np.testing.assert_array_equal(out[4].numpy(), g[4].numpy())  # inside the ball: unchanged


def test_overflow_model_cannot_move_the_mean_by_more_than_the_sensitivity(tmp_path: Path) -> None:
    """The mechanism's input (mean of clipped per-record gradients) at the crafted model moves by
    at most 2L/K between D and D' (the overflowing record replaced) — the sensitivity the noise
    is calibrated for."""
    silo = _silo(tmp_path / "a", {})
    w, target = _overflow_model(silo)
    other = (target + 1) % silo.n
    params = {k: torch.as_tensor(v) for k, v in w.items()}
    y = silo.records.train_y
    x_prime = silo.records.train_x.clone()
    x_prime[target] = silo.records.train_x[other]
    means = []
    for x in (silo.records.train_x, x_prime):
        raw = per_sample_grads(silo.model, params, x, y)
        assert not torch.isfinite(raw).all() or x is x_prime  # the attack does overflow the target on D
        means.append(clip_rows(raw, 1.0).double().mean(dim=0))
    assert torch.isfinite(means[0]).all() and torch.isfinite(means[1]).all()
    assert float((means[0] - means[1]).norm()) <= 2 * 1.0 / silo.n * (1 + 1e-5)


@pytest.mark.parametrize("algorithm,extra,phases", [
    ("mbsgd", {}, ["grad"]),
    ("localsgd", {"local-steps": 3, "lr": 0.1}, ["local"]),
    ("spider", {"spider.q": 2}, ["anchor", "diff"]),
    ("spider", {"spider.q": 2, "diff-clip": 0.1}, ["diff"]),
    ("proxsgd", {"num-rounds": 5}, ["disjoint"] * 5),  # the 5 blocks cover every record, the target's too
    ("mbsgd", {"batch-size": 32, "num-rounds": 20}, ["grad"] * 20),  # sampled: 20 batches of 32 of 170
])
def test_overflow_model_gives_a_finite_release_for_every_kind(tmp_path: Path, algorithm: str, extra: dict,
                                                              phases: list[str]) -> None:
    """A model that makes one record's gradient NaN still gets a finite reply (before: a NaN
    reply whenever the record is in the batch, which tells D from D' with certainty)."""
    silo = _silo(tmp_path, {"algorithm": algorithm} | extra)
    w, _ = _overflow_model(silo)
    for rnd, phase in enumerate(phases, start=1):
        cfg = {"round": rnd, "phase": phase, "local-steps": extra.get("local-steps", 1), "lr": 0.1}
        prev = {k: v * 0.5 for k, v in w.items()} if phase == "diff" else None
        assert np.all(np.isfinite(_update(_train(silo, w, cfg, prev)))), (algorithm, phase)


def test_overflow_attack_sees_the_same_distribution_on_d_and_d_prime(tmp_path: Path) -> None:
    """The released vector at the crafted model is N(mu_D, sigma^2 I) with ||mu_D - mu_D'|| <= 2L/K:
    over T releases on D and on D' (fixed run seed), the "reply is NaN" distinguisher fires on
    neither, and the two sample means differ by no more than the sensitivity plus a 6-sigma band
    of their noise, sigma * sqrt(2 d / T) (chi with d degrees of freedom is below sqrt(d) + 6)."""
    T = 120
    over = {"num-rounds": T, "privacy.epsilon": 50.0}
    d_silo = _silo(tmp_path / "d", over)
    w, target = _overflow_model(d_silo)
    p_silo = _silo(tmp_path / "p", over, record=(target, (target + 1) % d_silo.n))
    sigma = d_silo.plan["grad"].sigma
    means, nan_replies = [], []
    for silo in (d_silo, p_silo):
        replies = np.stack([_update(_train(silo, w, {"round": r, "phase": "grad"})) for r in range(1, T + 1)])
        nan_replies.append(int((~np.isfinite(replies)).any(axis=1).sum()))
        means.append(replies.mean(axis=0))
    assert nan_replies == [0, 0]
    dim = means[0].size
    gap = float(np.linalg.norm(means[0] - means[1]))
    assert gap <= 2 * 1.0 / d_silo.n + sigma * math.sqrt(2 / T) * (math.sqrt(dim) + 6)
    # and the replies are not degenerate: their spread is the calibrated sigma (within 10%)
    assert sigma > 0


def test_fed_spider_alt_uploads_of_one_round_have_independent_noise(tmp_path: Path) -> None:
    """The server asks, in one round, for the difference at (w, w) -- pure noise sigma_d xi_1 -- and
    the fresh gradient at w, g + sigma_g xi_2. With one noise draw per round (xi_1 = xi_2) the
    server cancels it: grad - (sigma_g / sigma_d) diff = g exactly. Independent draws leave
    noise of variance 2 sigma_g^2 per coordinate, and diff and grad are uncorrelated."""
    silo = _silo(tmp_path, {"algorithm": "spider-alt", "num-rounds": 60, "privacy.epsilon": 50.0})
    w = {k: v.detach().numpy() for k, v in silo.model.named_parameters()}
    s_d, s_g = silo.plan["diff"].sigma, silo.plan["grad"].sigma
    diffs, grads = [], []
    for rnd in range(2, 31):
        diffs.append(_update(_train(silo, w, {"round": rnd, "phase": "diff"}, prev=w)))
        grads.append(_update(_train(silo, w, {"round": rnd, "phase": "grad"})))
    diffs_a, grads_a = np.stack(diffs), np.stack(grads)
    residual = grads_a - (s_g / s_d) * diffs_a
    residual -= residual.mean(axis=0)  # g is the same every round (full batch): remove it
    assert residual.std() == pytest.approx(math.sqrt(2) * s_g, rel=0.1)
    rho = np.corrcoef(diffs_a.ravel() / s_d, (grads_a - grads_a.mean(axis=0)).ravel() / s_g)[0, 1]
    assert abs(rho) < 0.1


def test_a_repeated_round_number_gets_fresh_noise_and_a_fresh_batch(tmp_path: Path) -> None:
    """Two requests with the same round number and (nearly) the same model: the difference of
    the replies is N(0, 2 sigma^2 I), not 0 (the ledger counts two releases, so they must be two
    draws). The models differ by 1e-7 in one weight: an identical request is a replay (below)."""
    silo = _silo(tmp_path, {"num-rounds": 60, "privacy.epsilon": 50.0, "batch-size": 32})
    w = {k: v.detach().numpy() for k, v in silo.model.named_parameters()}
    sigma = silo.plan["grad"].sigma

    def nudged(i: int) -> dict[str, np.ndarray]:
        out = {k: v.copy() for k, v in w.items()}
        first = next(iter(out))
        out[first].flat[0] += 1e-7 * (i + 1)
        return out

    pairs = [(_update(_train(silo, nudged(2 * i), {"round": 7, "phase": "grad"})),
              _update(_train(silo, nudged(2 * i + 1), {"round": 7, "phase": "grad"}))) for i in range(25)]
    diff = np.stack([a - b for a, b in pairs])
    # sampled batches differ too, which only adds variance: at least the noise's share
    assert diff.std() >= 0.9 * math.sqrt(2) * sigma
    assert len({tuple(a[:3]) for a, _ in pairs} | {tuple(b[:3]) for _, b in pairs}) == 50
    assert len(silo.ledger.releases) == 50


def test_an_identical_request_is_answered_with_the_same_release_and_charged_once(tmp_path: Path) -> None:
    """A server resumed from its checkpoint asks again what it lost: an identical instruction
    gets the identical reply (a copy of a release is no new release), one ledger row; any change
    to the request (model, round, phase) is a new release with fresh noise."""
    silo = _silo(tmp_path, {"num-rounds": 60, "privacy.epsilon": 50.0, "batch-size": 32})
    w = {k: v.detach().numpy() for k, v in silo.model.named_parameters()}
    first = _update(_train(silo, w, {"round": 3, "phase": "grad"}))
    again = _update(_train(silo, w, {"round": 3, "phase": "grad"}))
    assert np.array_equal(first, again) and len(silo.ledger.releases) == 1
    other_round = _update(_train(silo, w, {"round": 4, "phase": "grad"}))
    assert not np.array_equal(first, other_round) and len(silo.ledger.releases) == 2
    # a rebuilt silo on the same ledger (the resumed run's, in the same process) still replays
    twin = _silo(tmp_path, {"num-rounds": 60, "privacy.epsilon": 50.0, "batch-size": 32})
    assert np.array_equal(_update(_train(twin, w, {"round": 4, "phase": "grad"})), other_round)
    assert len(twin.ledger.releases) == 2


def test_training_reply_carries_only_what_the_server_uses(tmp_path: Path) -> None:
    silo = _silo(tmp_path, {})
    w = {k: v.detach().numpy() for k, v in silo.model.named_parameters()}
    reply = _train(silo, w, {"round": 1, "phase": "grad"})
    assert set(reply.metric_records[wire.METRICS]) == {"eps-spent"}  # no timing, sigma or identity
    off = _silo(tmp_path / "off", {"privacy.mode": "off"})
    reply = _train(off, w, {"round": 1, "phase": "grad"})
    assert set(reply.metric_records[wire.METRICS]) == {"eps-spent", "loss"}


def test_an_instruction_that_cannot_be_read_is_refused_before_anything_is_spent(tmp_path: Path) -> None:
    silo = _silo(tmp_path, {})
    w = {k: v.detach().numpy() for k, v in silo.model.named_parameters()}
    code, reason = wire.refusal_of(_train(silo, w, {"round": "x", "phase": "grad"}))
    assert code == wire.REFUSED_CONFIG and "not an integer" in reason
    assert wire.refusal_of(_train(silo, w, {"round": 1, "phase": "eval"}))[0] == wire.REFUSED_CONFIG
    assert silo.ledger.releases == []


# -------------------------------------------------------------------------------------------------
# the silo's own policy (node config) against the run config
# -------------------------------------------------------------------------------------------------

CAPPED = {"epsilon-cap": 3.0, "delta-cap": 1e-5}


def test_delta_cap_holds_when_the_run_asks_for_auto_delta(tmp_path: Path) -> None:
    """delta = "auto" is 1/n^2 = 3.5e-5 for the n = 170 silo, above a 1e-5 cap: refused."""
    summary, rows, _ = run(tmp_path / "auto", {"num-rounds": 2}, node_config=CAPPED)
    assert [r["refused"] for r in rows] == [2, 2]
    assert all(s["releases"] == [] for s in summary["silos"])
    summary, rows, _ = run(tmp_path / "ok", {"num-rounds": 2, "privacy.delta": 1e-5}, node_config=CAPPED)
    assert [r["answered"] for r in rows] == [2, 2]
    assert all(s["delta"] <= 1e-5 and s["eps_spent"] <= 3.0 for s in summary["silos"])


def test_a_node_with_a_cap_keeps_one_lifetime_budget_across_runs(tmp_path: Path) -> None:
    """Two runs each asking for the whole cap: the second is refused (before: each run had a
    fresh ledger and spent epsilon = 3 again)."""
    cfg = {"num-rounds": 3, "privacy.delta": 1e-5, "eval-every": 0}
    first, rows1, _ = run(tmp_path, cfg, node_config=CAPPED, run_id=1, name="a")
    second, rows2, _ = run(tmp_path, cfg, node_config=CAPPED, run_id=2, name="b")
    assert [r["answered"] for r in rows1] == [2, 2, 2]
    assert [r["answered"] for r in rows2] == [0, 0, 0] and [r["refused"] for r in rows2] == [2, 2, 2]
    assert all(s["eps_spent"] <= 3.0 * (1 + 1e-9) for s in second["silos"])
    # an operator who wants a budget per run says so
    _, rows3, _ = run(tmp_path, cfg, node_config=CAPPED | {"ledger-scope": "run"}, run_id=3, name="c")
    assert [r["answered"] for r in rows3] == [2, 2, 2]


def test_a_lifetime_ledger_serves_runs_that_ask_for_different_deltas(tmp_path: Path) -> None:
    """A node with only an epsilon cap keeps its lifetime ledger at delta = 1/n^2 whatever each run
    asks (before: the first run's delta was fixed in the ledger and a run asking another delta
    crashed every ClientApp with LedgerError)."""
    node = {"epsilon-cap": 3.0}
    run(tmp_path, {"num-rounds": 2, "privacy.epsilon": 1.0, "eval-every": 0}, node_config=node, run_id=1, name="a")
    second, rows, _ = run(tmp_path, {"num-rounds": 2, "privacy.epsilon": 1.0, "privacy.delta": 1e-3, "eval-every": 0},
                          node_config=node, run_id=2, name="b")
    assert second["status"] == "completed" and not second["client_errors"]
    assert [r["answered"] for r in rows] == [2, 2]
    assert all(s["delta"] == pytest.approx(1 / s["n"] ** 2) and s["eps_spent"] <= 3.0 for s in second["silos"])


def test_an_unreadable_ledger_makes_the_silo_refuse_not_crash(tmp_path: Path) -> None:
    node = CAPPED
    cfg = {"num-rounds": 1, "privacy.delta": 1e-5, "eval-every": 0}
    run(tmp_path, cfg, node_config=node, run_id=1, name="a")
    for ledger in (tmp_path / "state").glob("ledger-node-silo*.json"):
        ledger.write_text("{ not json")
    summary, rows, _ = run(tmp_path, cfg, node_config=node, run_id=2, name="b")
    assert not summary["client_errors"] and rows[0]["refused"] == 2
    assert summary["status"] == "failed" and "ledger-unusable" in summary["status_reason"]  # and it says so
    assert all("unreadable" in s["error"] for s in summary["silos"])


def test_a_capped_node_refuses_evaluation_and_no_privacy_by_default(tmp_path: Path) -> None:
    summary, rows, grid = run(tmp_path, {"num-rounds": 2, "privacy.delta": 1e-5}, node_config=CAPPED)
    assert summary["test_error"] is None and all("test_error" not in r for r in rows)
    evals = [m for m in grid.sent if m.metadata.message_type == "evaluate"]
    assert evals  # the server asked...
    # ...and a capped node (even one with only a delta cap) refuses a run without privacy
    _, rows, _ = run(tmp_path / "off", {"num-rounds": 1, "privacy.mode": "off"}, node_config={"delta-cap": 1e-5})
    assert rows[0]["refused"] == 2


def test_evaluation_is_refused_when_the_silo_refuses_the_run(tmp_path: Path) -> None:
    """Even an open-evaluation node answers nothing in a run its policy refuses."""
    _, rows, _ = run(tmp_path, {"num-rounds": 1, "privacy.epsilon": 8.0},
                     node_config={"epsilon-cap": 3.0, "evaluation": "open"})
    assert rows[0]["refused"] == 2 and "test_error" not in rows[0]


def test_private_evaluation_is_noisy_planned_and_charged_to_the_ledger(tmp_path: Path) -> None:
    """evaluation = private: each answer is a Gaussian release in the ledger; the silo plans
    one per evaluation round, so an attacker asking 1000 times is refused after the plan, and
    epsilon never passes the budget."""
    silo = _silo(tmp_path, {"num-rounds": 4}, evaluation="private")
    assert silo.plan["eval"].count == 4
    w = {k: v.detach().numpy() for k, v in silo.model.named_parameters()}
    req = wire.instruction(wire.params_to_record(w), {"round": 1, wire.TRAIN_GRADIENT: True})
    answers = [silo.evaluate(req) for _ in range(1000)]
    ok = [a for a in answers if wire.refusal_of(a) is None]
    # the plan is 4 full-batch gradients + 4 evaluations at one noise multiplier, calibrated to
    # spend exactly the budget; with no training done, 8 equal Gaussian releases fit (Gaussian DP
    # composition), the 9th does not
    assert len(ok) == 8 and wire.refusal_of(answers[8])[0] == wire.REFUSED_BUDGET
    assert all(wire.TRAIN_GRADIENT not in a.array_records for a in ok)  # no exact gradient
    assert silo.ledger.spent() <= 3.0 * (1 + 1e-9)
    losses = [a.metric_records[wire.METRICS]["test-loss-sum"] for a in ok]
    assert len(set(losses)) == len(losses)  # noisy, not the exact sum repeated
    errors = [a.metric_records[wire.METRICS]["test-errors"] for a in ok]
    assert all(0 <= e <= len(silo.records.test_y) for e in errors)


def test_open_evaluation_stays_the_simulation_default(tmp_path: Path) -> None:
    summary, _, _ = run(tmp_path, {"num-rounds": 2})
    assert summary["test_error"] is not None and summary["grad_mapping_norm_eval"] is not None


# -------------------------------------------------------------------------------------------------
# a hostile silo against the server
# -------------------------------------------------------------------------------------------------

ROBUST = {"algorithm": "gradbant", "dataset": "wbcd", "partition": "iid", "num-silos": 4, "silos-per-round": 4,
          "model": "logistic", "privacy.mode": "off", "lr": 0.5, "num-rounds": 4, "batch-size": 32, "trust.size": 60}


def _with_metrics(reply: Message, extra: dict[str, float]) -> Message:
    content = reply.content
    metrics = dict(content.metric_records[wire.METRICS]) | extra
    content.metric_records[wire.METRICS] = MetricRecord(metrics)
    return reply


@pytest.mark.parametrize("claim", [math.nan, math.inf, -1.0, 99.0, 1.0])
def test_a_silo_claiming_an_identity_neither_crashes_the_server_nor_gains_weight(tmp_path: Path, claim: float) -> None:
    """Node 1000 (silo 0) puts silo-index = claim (NaN, inf, out of range, or silo 1's index) in
    its replies: the run completes and every weight is what it is without the claim."""
    _, honest, _ = run(tmp_path / "h", ROBUST)

    def forge(node: int, msg: Message, reply: Message) -> Message:
        if node == 1000 and msg.metadata.message_type == "train" and not reply.has_error():
            return _with_metrics(reply, {"silo-index": claim})
        return reply

    summary, forged, _ = run(tmp_path / "f", ROBUST, hook=forge)
    assert summary["status"] == "completed"
    assert [r["silo_weights"] for r in forged] == [r["silo_weights"] for r in honest]


class _DuplicatingGrid:
    """Delivers every train reply of node 1000 twice, the copy with a 10x update (a replayed or
    injected message must not count a second time)."""

    def __init__(self, grid: Any) -> None:
        self.grid = grid

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> list[Message]:
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        extra = []
        for r in replies:
            if r.metadata.src_node_id == 1000 and r.metadata.message_type == "train" and not r.has_error() \
                    and wire.UPDATE in r.content.array_records:
                rec = r.content.array_records[wire.UPDATE]
                copy = RecordDict({wire.UPDATE: ArrayRecord({k: Array(rec[k].numpy() * 10) for k in rec}),
                                   wire.METRICS: r.content.metric_records[wire.METRICS]})
                extra.append(Message(copy, reply_to=next(m for m in messages if m.metadata.dst_node_id == 1000)))
        return replies + extra


def test_duplicate_replies_of_one_node_count_once(tmp_path: Path) -> None:
    import app.server_app as server_app
    from flwr.app import Context
    from app.local_grid import InProcessGrid

    _, honest, _ = run(tmp_path / "h", ROBUST)
    cfg = merged_run_config([]) | {"outputs-dir": str(tmp_path / "out"), "run-name": "d"} | ROBUST
    grid = _DuplicatingGrid(InProcessGrid(cfg, cfg["num-silos"], str(tmp_path / "state")))
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    rows = [json.loads(line) for line in (tmp_path / "out" / "d" / "rounds.jsonl").read_text().splitlines()]
    assert [r["answered"] for r in rows] == [4] * 4
    assert [r["silo_weights"] for r in rows] == [r["silo_weights"] for r in honest]


def _huge(node_to_poison: int, value: float):
    def hook(node: int, msg: Message, reply: Message) -> Message:
        if node != node_to_poison or msg.metadata.message_type != "train" or reply.has_error() \
                or wire.UPDATE not in reply.content.array_records:
            return reply
        rec = reply.content.array_records[wire.UPDATE]
        reply.content.array_records[wire.UPDATE] = ArrayRecord(
            {k: Array(np.full(rec[k].numpy().shape, value, dtype=np.float32)) for k in rec})
        return reply
    return hook


@pytest.mark.parametrize("extra", [
    {},  # Grad-BANT, no sketch
    {"sketch.kind": "srht", "sketch.ratio": 0.5},  # Grad-BANT with SRHT
    {"aggregator": "mean", "sketch.kind": "srht", "sketch.ratio": 0.5},
    {"aggregator": "mean"},
])
def test_a_silo_sending_3e38_leaves_the_model_finite_and_the_others_progressing(tmp_path: Path, extra: dict) -> None:
    """A finite but huge payload (3e38 per coordinate) overflowed the float32 lift and Grad-BANT's
    scores (crash in the next round), or under the mean stalled every round / overflowed the
    model. Now it is rejected as malformed and the other silos' rounds go on."""
    cfg = ROBUST | {"num-rounds": 6} | extra
    clean, _, _ = run(tmp_path / "c", cfg)
    summary, rows, _ = run(tmp_path / "p", cfg, hook=_huge(1000, 3e38))
    assert summary["status"] == "completed"
    assert all(r["answered"] == 3 and r["malformed"] == 1 for r in rows)
    assert math.isfinite(summary["test_error"]) and math.isfinite(summary["train_loss"])
    assert summary["test_error"] <= clean["test_error"] + 0.1  # the three honest silos still learn


def test_a_step_that_would_leave_float32_range_is_skipped(tmp_path: Path) -> None:
    """Updates just inside the per-coordinate bound, with a step size that multiplies them out of
    float32's range: the server skips the step instead of storing inf, the row says so, and the
    run ends diverged with lr to blame (app/run_health.py)."""
    cfg = ROBUST | {"aggregator": "mean", "num-rounds": 2, "lr": 1e30}
    summary, rows, _ = run(tmp_path, cfg, hook=_huge(1000, 1e19))
    assert all(math.isfinite(r.get("train_loss", 0.0)) for r in rows)
    assert all(r["step_skipped"] for r in rows)
    assert summary["status"] == "diverged" and summary["health"]["blame"]["setting"] == "lr"


@pytest.mark.parametrize("n,f", [(5, 2), (7, 3), (9, 4), (21, 10), (6, 2)])
def test_krum_refuses_n_at_most_2f_plus_2(n: int, f: int) -> None:
    """Blanchard et al.'s condition n > 2f + 2. At n = 2f + 1 the f colluding identical rows are
    each other's nearest neighbours (score 0), so Krum picks an attacker in every trial."""
    rng = np.random.default_rng(0)
    honest = rng.normal(size=(n - f, 10))
    rows = np.vstack([honest, np.tile(-0.5 * honest.mean(axis=0), (f, 1))])  # IPM: identical rows
    for rule in (krum, multi_krum):
        with pytest.raises(HonestMajorityRequired, match="n > 2f"):
            rule(rows, f)
    with pytest.raises(ConfigError, match="needs num-silos > 2f \\+ 2"):
        parse_settings(ROBUST | {"num-silos": n, "silos-per-round": n, "aggregator": "krum", "attack.kind": "ipm",
                                 "attack.fraction": (f + 0.5) / n})
