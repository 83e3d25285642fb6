"""Shuffle DP against a curious server and a lying silo, scripted against the real silos, server
relay (strategies/shuffle_relay.py) and shuffler node (clients/shuffler.py via app/node_runtime.py):

* cross-run replay: the server resends run 1's exchange context with 11 of its 12 sealed blobs in
  a new run; the difference of the two sums would be silo 0's contribution exactly;
* a deployed silo without a pinned shuffler key, and a run asking a silo to count on more silos'
  noise than its node config allows (shuffle-count-on-max), are refused;
* a silo claiming noise trials it did not add (2**63 - 1, 2**62, 2**40 with counts near 0), and a
  debiased mean outside the bound every honest mean obeys.

Expected values are independent facts: the silo's own counts opened with the shuffler's key, the
binomial tail bound (Hoeffding), the closed-form debias o = (2R/g)(T - p m) - N R."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
from pathlib import Path

import numpy as np
import pytest

from app import wire
from app.privacy.contribution import Contribution
from app.privacy.envelope import StaticKeys, open_sealed, seal

BASE = {"privacy.mode": "shuffle", "num-rounds": 1, "partition": "iid", "privacy.epsilon": 3.0, "model": "logistic",
        "lr": 0.5, "privacy.delta": 1e-5, "eval-every": 0}


def _shuffle_requests(grid) -> list:
    return [m for m in grid.sent if m.metadata.message_type == wire.SHUFFLE_QUERY]


def _capture_shuffle_replies(store: list):
    def hook(nid, msg, reply):
        if msg.metadata.message_type == wire.SHUFFLE_QUERY:
            store.append(reply)
        return reply
    return hook


# -- A. cross-run replay ------------------------------------------------------------------------


def test_cross_run_replay_of_run_1s_context_with_one_blob_left_out_is_refused(federation, tmp_path: Path) -> None:
    """Attack (issue 24 #1): run 1 aggregates 12 sealed blobs; in a new run (run id 2, same
    shuffler state dir) the server relays run 1's context with the 11 blobs of silos 1..11.
    Before the fix the shuffler summed them again and T1 - T2 was silo 0's counts exactly, with
    1/12 (x 1.1) of the noise silo 0 calibrated for. Now the run-2 shuffler refuses a context of
    another run, and a restarted shuffler of run 1 (new object, same state dir) still refuses it."""
    from flwr.app import Message

    from app import node_runtime
    from app.local_grid import InProcessGrid
    from app.privacy.settings import ShuffleSettings
    from strategies.shuffle_relay import ShuffleRelay

    replies: list = []
    summary, rows, grid = federation(BASE | {"num-silos": 12, "silos-per-round": 12},
                                     hook=_capture_shuffle_replies(replies), run_id=1)
    assert rows[0]["answered"] == 12 and rows[0]["shuffle_dropped"] == 0
    (sent,) = _shuffle_requests(grid)
    request = wire.ShuffleRequest.decode(sent.content)
    assert len(request.blobs) == 12
    run1 = wire.ShuffleReply.decode(replies[0].content, request.dim)
    state = tmp_path / "state"
    silo0 = StaticKeys.load_or_create(state / "shuffle-sender-silo0.key").public
    shuffler_keys = StaticKeys.load_or_create(state / "shuffler.key")
    (i0,) = [i for i, b in enumerate(request.blobs) if b[35:67] == silo0]  # the envelope's sender field
    _, plaintext = open_sealed(shuffler_keys, request.blobs[i0], request.context, None)
    mine = Contribution.decode(plaintext, request.dim, request.levels)

    replay = dataclasses.replace(request, blobs=tuple(b for i, b in enumerate(request.blobs) if i != i0))
    run_config = grid.contexts[grid.node_ids[0]].run_config

    def relay_in(run_id: int):
        node_runtime._SHUFFLERS.clear()  # a new process (or a restart) of the shuffler node, same state dir
        grid2 = InProcessGrid(run_config, len(grid.node_ids), str(state), run_id=run_id)
        relay = ShuffleRelay(ShuffleSettings(p=0.25), 1.0, 1.0, lambda msg, what: "error")  # only relays here
        relay.shuffler = grid2.node_ids[-1]
        msg = Message(replay.encode(), dst_node_id=relay.shuffler, message_type=wire.SHUFFLE_QUERY)
        return relay._relay(grid2, 1, msg, timeout=60.0), grid2

    for run_id in (2, 1):  # a new run; then the shuffler of run 1 restarted
        result, _ = relay_in(run_id)
        if result is not None:  # what the server learns: silo 0's counts, exactly
            isolated = run1.totals - result.totals
            pytest.fail(f"run {run_id}: the shuffler summed run 1's context again; T1 - T2 == silo 0's counts: "
                        f"{np.array_equal(isolated, mine.counts)} (trials {run1.trials} - {result.trials} = "
                        f"{run1.trials - result.trials}, silo 0 claimed {mine.trials} of the {mine.required_trials} "
                        f"its calibration needs)")
    # the silo bound its contribution to this exchange and to its ledger release, inside the seal
    assert mine.binding[:32] == hashlib.sha256(request.context).digest() and len(mine.binding) == 40
    assert struct.unpack("<Q", mine.binding[32:])[0] >= 0


def test_shuffler_serves_only_its_run_and_remembers_contexts_across_runs(tmp_path: Path) -> None:
    from clients.shuffler import ShuffleRefused, Shuffler

    sk, silos = StaticKeys.generate(), [StaticKeys.generate() for _ in range(2)]
    seen = tmp_path / "shuffler-seen.json"
    ctx1 = wire.shuffle_context(1, 1, 1, "grad")

    def blobs(ctx):
        c = Contribution(records=2, trials=20, required_trials=30, levels=2, counts=np.array([7, 8], dtype=np.int64))
        return [seal(sk.public, s, c.encode(), ctx) for s in silos]

    with pytest.raises(ShuffleRefused, match="names run 1, but this shuffler serves run 2"):
        Shuffler(sk, [s.public for s in silos], seen, run_id=2).aggregate(blobs(ctx1), ctx1, 2, 2)
    assert Shuffler(sk, [s.public for s in silos], seen, run_id=1).aggregate(blobs(ctx1), ctx1, 2, 2).accepted == 2
    with pytest.raises(ShuffleRefused, match="already aggregated"):  # restarted, same state dir
        Shuffler(sk, [s.public for s in silos], seen, run_id=1).aggregate(blobs(ctx1)[1:], ctx1, 2, 2)
    # the per-run files of older versions count too
    legacy = tmp_path / "shuffler-seen-run3.json"
    ctx3 = wire.shuffle_context(3, 1, 1, "grad")
    legacy.write_text(f'["{hashlib.sha256(ctx3).hexdigest()}"]')
    with pytest.raises(ShuffleRefused, match="already aggregated"):
        Shuffler(sk, None, seen, run_id=3, legacy_seen=[legacy]).aggregate(blobs(ctx3), ctx3, 2, 2)
    # a contribution bound to another context than the one it is opened under is dropped
    ctx4 = wire.shuffle_context(4, 1, 1, "grad")
    bound = Contribution(2, 20, 20, 2, np.array([7, 8], dtype=np.int64), binding=Contribution.bind(ctx1, 5))
    with pytest.raises(ShuffleRefused) as info:
        Shuffler(sk, None, run_id=4).aggregate([seal(sk.public, silos[0], bound.encode(), ctx4)], ctx4, 2, 2)
    assert "another exchange" in info.value.dropped[silos[0].public_hex]


# -- B. a deployed silo seals only to a pinned key ---------------------------------------------


def test_a_deployed_silo_without_a_pinned_shuffler_key_refuses_and_a_simulation_takes_the_servers(
        federation, monkeypatch: pytest.MonkeyPatch) -> None:
    import app.client_app as client_app

    summary, rows, _ = federation(BASE | {"num-silos": 3, "silos-per-round": 3}, sub="sim")
    assert rows[0]["answered"] == 3  # a simulation seals to the key the server relays (documented)
    monkeypatch.setattr(client_app, "deployed_process", lambda: True)
    from app import node_runtime
    node_runtime._SILOS.clear()
    summary, rows, _ = federation(BASE | {"num-silos": 3, "silos-per-round": 3, "shuffle.count-on": 1}, sub="dep",
                                  run_id=7)
    assert rows[0]["answered"] == 0 and rows[0]["refused"] == 3
    assert all(s["eps_spent"] == 0 and not s["releases"] for s in summary["silos"])
    reasons = [node_runtime._SILOS[k].policy_violation for k in node_runtime._SILOS]
    assert reasons and all("deployed and pinned no shuffler key" in r for r in reasons), reasons


# -- C. the silo bounds whom it counts on ------------------------------------------------------


def test_policy_count_on_max_defaults_and_parsing() -> None:
    from app.privacy.policy import PolicyError, collusion_threshold, node_policy, shuffle_trust_violation

    assert node_policy({}).shuffle_count_on_max is None
    assert node_policy({}, deployed=True).shuffle_count_on_max == 1
    assert node_policy({"epsilon-cap": 3.0}).shuffle_count_on_max == 1
    assert node_policy({"epsilon-cap": 3.0, "shuffle-count-on-max": 4}).shuffle_count_on_max == 4
    for bad in (0, -1, 1.5, "x", True):
        with pytest.raises(PolicyError, match="shuffle-count-on-max"):
            node_policy({"shuffle-count-on-max": bad})
    capped = node_policy({"epsilon-cap": 3.0})
    assert shuffle_trust_violation(capped, 1) is None
    assert "at most 1 silo" in shuffle_trust_violation(capped, 12)
    assert (collusion_threshold(1, 12), collusion_threshold(2, 12), collusion_threshold(12, 12)) == (11, 0, 0)


def test_a_run_asking_a_silo_to_count_on_more_silos_than_its_node_config_allows_is_refused(federation) -> None:
    cfg = BASE | {"num-silos": 3, "silos-per-round": 3}
    summary, rows, _ = federation(cfg | {"shuffle.count-on": 3}, node_config={"shuffle-count-on-max": 2}, sub="a",
                                  run_id=11)
    assert rows[0]["answered"] == 0 and rows[0]["refused"] == 3
    assert all(s["eps_spent"] == 0 for s in summary["silos"])
    summary, rows, _ = federation(cfg | {"shuffle.count-on": 2}, node_config={"shuffle-count-on-max": 2}, sub="b",
                                  run_id=12)
    assert rows[0]["answered"] == 3
    trust = [s["shuffle"]["trust"] for s in summary["silos"]]
    assert all(t["count_on"] == 2 and t["collusion_threshold"] == 0 and "more than 0 of the other 2" in t["holds"]
               for t in trust)
    summary, rows, _ = federation(cfg | {"shuffle.count-on": 1}, sub="c", run_id=13)
    assert all(s["shuffle"]["trust"]["collusion_threshold"] == 2 for s in summary["silos"])


# -- D. a silo claiming noise it did not add -----------------------------------------------------


def _lying_silo0(state: Path, trials: int, counts_at_mean: bool = False):
    """Silo 0 replaces its contribution by one claiming ``trials`` noise trials with counts 0
    (or exactly p * trials), sealed with its own sender key (it is an allowed sender)."""
    def hook(nid, msg, reply):
        if nid != 1000 or msg.metadata.message_type != "train" or wire.Refusal.decode(reply.content) is not None:
            return reply
        ins = wire.Instruction.decode(msg.content)
        ctx = wire.shuffle_context(1, ins.round, ins.shuffle.exchange, str(ins.phase))
        sealed = wire.SealedReply.decode(reply.content)
        shuffler = StaticKeys.load_or_create(state / "shuffler.key")
        sender = StaticKeys.load_or_create(state / "shuffle-sender-silo0.key")
        _, plain = open_sealed(shuffler, sealed.blob, ctx, None)
        honest = Contribution.decode(plain, honest_dim(plain), honest_levels(plain))
        value = round(0.25 * trials) if counts_at_mean else 0
        forged = Contribution(honest.records, trials, honest.required_trials, honest.levels,
                              np.full(honest.dim, value, dtype=np.int64))
        if getattr(honest, "binding", b""):
            forged = dataclasses.replace(forged, binding=honest.binding)
        from flwr.app import Message
        return Message(wire.SealedReply(seal(shuffler.public, sender, forged.encode(), ctx), 0.1).encode(),
                       reply_to=msg)
    return hook


def honest_dim(plain: bytes) -> int:
    return struct.unpack_from("<4sQQQQQ", plain)[5]


def honest_levels(plain: bytes) -> int:
    return struct.unpack_from("<4sQQQQQ", plain)[4]


@pytest.fixture()
def means(monkeypatch: pytest.MonkeyPatch) -> list:
    """Every debiased mean the relay hands the optimiser."""
    from strategies.shuffle_relay import ShuffleRelay

    store: list = []
    original = ShuffleRelay.exchange

    def exchange(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        store.extend(np.concatenate([np.ravel(v) for v in u.values()]) for u in out.updates)
        return out

    monkeypatch.setattr(ShuffleRelay, "exchange", exchange)
    return store


COUNT_ON_2 = BASE | {"num-silos": 3, "silos-per-round": 3, "shuffle.count-on": 2}


def test_a_claim_of_2_63_trials_is_dropped_not_a_refused_exchange(federation, tmp_path: Path, means) -> None:
    """Issue 23 #5: before, the whole exchange was refused ("could sum to >= 2**63"): one silo
    blocked every round. Now its contribution alone is dropped; the two honest silos (count-on 2)
    are summed."""
    summary, rows, _ = federation(COUNT_ON_2 | {"num-rounds": 2}, hook=_lying_silo0(tmp_path / "state", 2**63 - 1))
    assert [(r["answered"], r["shuffle_dropped"]) for r in rows] == [(2, 1), (2, 1)], rows
    assert len(means) == 2 and all(np.all(np.abs(m) <= 4.0 * 1.5) for m in means)


@pytest.mark.parametrize("trials", [2**62, 2**40])
def test_a_claim_of_trials_never_added_with_counts_near_0_is_dropped(federation, tmp_path: Path, means,
                                                                     trials: int) -> None:
    """Before: 2**62 trials with counts 0 passed, and the debias o = (2R/g)(T - p m) - N R moved
    the mean by about -p 2**62 (2R/g) / N per coordinate (-1e14). Now the claim is dropped (above
    2**54; 2**40 fails the Hoeffding lower bound p T - t) and the mean is the honest silos'."""
    from app.config import parse_settings
    from app.launch import merged_run_config
    from app.privacy.shuffle import ShuffleCode, debias

    summary, rows, grid = federation(COUNT_ON_2, hook=_lying_silo0(tmp_path / "state", trials))
    (mean,) = means
    assert (rows[0]["answered"], rows[0]["shuffle_dropped"]) == (2, 1), (rows[0], float(np.mean(mean)))
    s = parse_settings(merged_run_config([]) | COUNT_ON_2)
    R = s.privacy.clip
    request = wire.ShuffleRequest.decode(_shuffle_requests(grid)[0].content)
    assert request.p == 0.25  # the server sends p: the shuffler's count test needs it
    assert float(np.max(np.abs(mean))) < 10 * R  # the honest silos' noisy mean, not a shifted one
    # what the lie did before: with its trials counted in m and counts 0, the debias subtracts
    # (2R/g) p trials more from each coordinate's sum (closed form, app/privacy/shuffle.py)
    code = ShuffleCode(R, request.levels, 0.25)
    shift = float(debias(np.zeros(1), 1, trials, code)[0] + R)
    assert math.isclose(shift, -(2 * R / request.levels) * 0.25 * trials, rel_tol=1e-12)


def test_the_server_never_applies_a_mean_outside_the_honest_bound(federation, means) -> None:
    """A shuffler reply claiming 2**62 trials with totals 0 (what a lying silo got through before):
    the debiased mean is -(2R/g) p 2**62 / N per coordinate, far outside R + (2R/g) t / N; the
    relay drops the exchange and the model does not move."""
    from flwr.app import Message

    def hook(nid, msg, reply):
        if msg.metadata.message_type != wire.SHUFFLE_QUERY:
            return reply
        real = wire.ShuffleReply.decode(reply.content, wire.ShuffleRequest.decode(msg.content).dim)
        forged = wire.ShuffleReply(np.zeros_like(real.totals), real.trials + 2**62, real.records, real.accepted, 0)
        return Message(forged.encode(), reply_to=msg)

    summary, rows, _ = federation(COUNT_ON_2 | {"num-rounds": 2}, hook=hook)
    assert all(r["answered"] == 0 for r in rows), (rows, [float(np.mean(m)) for m in means])


def test_honest_contributions_pass_the_count_test_at_its_tail_probability() -> None:
    """Hoeffding's bound against the exact binomial tail: the slack t for T trials and d
    coordinates leaves at most ALPHA / (2d) in each tail (scipy's exact Bin(T, p) CDF)."""
    from scipy.stats import binom

    from app.privacy.shuffle import HONEST_ALPHA, count_slack

    for trials, d, p in [(1000, 62, 0.25), (10**6, 1000, 0.5), (10**9, 10, 0.01)]:
        t = count_slack(trials, d)
        assert binom.cdf(math.floor(p * trials - t), trials, p) <= HONEST_ALPHA / (2 * d)
        assert binom.sf(math.ceil(p * trials + t), trials, p) <= HONEST_ALPHA / (2 * d)
