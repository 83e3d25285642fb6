"""Secure aggregation end to end on the in-process grid: the real ServerApp, silos, ledgers and
SecAgg+ rounds (privacy.mode secagg). What the server receives, the silos' Skellam ledgers
recomputed independently, dropouts (recovered above the threshold, nothing below it), and a
hostile server or silo scripted against the real node handlers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

from app import wire
from app.options import ConfigError

SECAGG = {"privacy.mode": "secagg", "num-rounds": 3, "partition": "iid", "privacy.epsilon": 3.0, "num-silos": 4,
          "silos-per-round": 4, "model": "logistic", "lr": 0.5, "privacy.delta": 1e-5, "algorithm": "mbsgd"}


@pytest.fixture()
def recording(monkeypatch: pytest.MonkeyPatch):
    """Keep every message the ServerApp sends and every reply it receives (grid.sent, grid.received)."""
    from app.local_grid import InProcessGrid

    original = InProcessGrid.send_and_receive

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        replies = original(self, messages, timeout=timeout)
        self.sent = getattr(self, "sent", []) + messages
        self.received = getattr(self, "received", []) + list(replies)
        return replies

    monkeypatch.setattr(InProcessGrid, "send_and_receive", send_and_receive)


def _independent_epsilon(release: dict, delta: float) -> float:
    """A silo's epsilon from its summary.json entry alone: the multi-dimensional Skellam bound
    written out here (Agarwal, Kairouz & Liu 2021), composed over its count and converted by
    dp-accounting; no silofl accounting code."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    orders = list(range(2, 257))
    l1, l2, mu = release["l1"], release["l2"], release["mu"]
    rdp = [release["count"] * (a * l2 * l2 / (2 * mu) + min(((2 * a - 1) * l2 * l2 + 6 * l1) / (4 * mu * mu),
                                                          3 * l1 / (2 * mu))) for a in orders]
    return float(compute_epsilon(orders, rdp, delta)[0])


def test_secagg_run_learns_and_the_server_holds_only_masked_vectors(federation, recording) -> None:
    summary, rows, grid = federation(SECAGG)
    assert summary["status"] == "completed" and len(rows) == 3
    assert all(r["answered"] == 4 and r["secagg_dropped"] == 0 for r in rows)
    assert summary["test_error"] < 42 / 114  # better than always predicting the majority class
    masked = []
    for msg in grid.received:
        if msg.metadata.message_type == "evaluate":  # the open evaluation (outside DP, node config evaluation)
            continue
        for name, record in msg.content.array_records.items():
            for key in record:
                arr = record[key].numpy()
                # nothing the server gets from a silo is a float vector (no update, no gradient)
                assert arr.dtype.kind == "u", (name, arr.dtype)
                if name == "secagg-masked":
                    masked.append(arr)
    assert len(masked) == 3 * 4 and all(m.dtype == np.uint16 for m in masked)
    # each masked vector is uniform on [0, 2^16) (the encodings are small integers near 0 mod 2^16):
    # a chi-square over 16 bins of all of them, at a level a correct run fails with probability 1e-6
    values = np.concatenate(masked).astype(np.int64)
    counts = np.bincount(values >> 12, minlength=16)
    expected = values.size / 16
    assert ((counts - expected) ** 2 / expected).sum() < 50.0
    for silo in summary["silos"]:
        (release,) = silo["releases"]
        assert release["mechanism"] == "skellam" and release["count"] == 3
        assert silo["eps_spent"] <= 3.0
        assert math.isclose(_independent_epsilon(release, silo["delta"]), silo["eps_spent"], rel_tol=1e-6)
        assert silo["secagg"]["count_on"] == 4 and "unless" in silo["secagg"]["trust"]["holds"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["svrg", "spider", "proxsgd"])
def test_variance_reduced_and_prox_algorithms_run_under_secagg(federation, algorithm: str) -> None:
    summary, rows, _ = federation(SECAGG | {"algorithm": algorithm, "num-rounds": 4, "svrg.inner-steps": 2, "spider.q": 2}
                                  if algorithm != "proxsgd" else SECAGG | {"algorithm": algorithm, "num-rounds": 4})
    assert summary["status"] == "completed"
    assert all(r["answered"] == 4 for r in rows)
    assert all(s["eps_spent"] <= 3.0 + 1e-9 for s in summary["silos"])


def _drop_train_reply(node_index: int):
    """A silo that shared its secrets but whose masked vector never arrives (its node went away:
    Flower's error reply for an unavailable node)."""
    from flwr.app import Error

    from strategies.messaging import UNAVAILABLE_CODES

    def hook(nid: int, msg, reply):
        if nid == 1000 + node_index and msg.metadata.message_type == "train":
            return Message(Error(code=min(UNAVAILABLE_CODES), reason="node unavailable"), reply_to=msg)
        return reply

    return hook


def test_a_silo_dropping_after_sharing_is_recovered_and_the_sum_opens(federation) -> None:
    # count-on 2: the three survivors' noise still covers every survivor's requirement
    summary, rows, _ = federation(SECAGG | {"secagg.count-on": 2}, _drop_train_reply(3))
    assert summary["status"] == "completed"
    assert all(r["answered"] == 3 and r["secagg_dropped"] == 1 for r in rows), rows
    assert summary["test_error"] < 42 / 114


def test_survivors_whose_noise_misses_a_requirement_open_nothing(federation) -> None:
    # count-on 4: each silo adds about a quarter of the noise; with one gone the survivors refuse to unmask
    summary, rows, _ = federation(SECAGG, _drop_train_reply(3))
    assert summary["status"] == "failed"
    assert all(r["answered"] == 0 and "did not open" in r["secagg_refused"] for r in rows), rows
    assert all("below a survivor's requirement" in r["secagg_refused"] for r in rows)


def test_below_the_threshold_nothing_opens(federation) -> None:
    hooks = [_drop_train_reply(i) for i in (1, 2, 3)]

    def hook(nid, msg, reply):
        for h in hooks:
            reply = h(nid, msg, reply)
        return reply

    summary, rows, _ = federation(SECAGG | {"secagg.count-on": 1}, hook)
    assert summary["status"] == "failed" and all(r["answered"] == 0 for r in rows)


def test_a_malformed_masked_vector_counts_as_a_dropped_silo(federation) -> None:
    def hook(nid, msg, reply):
        if nid == 1001 and msg.metadata.message_type == "train" and not reply.has_error():
            content = reply.content
            bad = np.full(64, 2**16 - 1, dtype=np.uint32)  # wrong dtype and out of the 16-bit range
            content["secagg-masked"] = type(content["secagg-masked"])({"secagg-masked": wire.records.Array(bad)})
        return reply

    summary, rows, _ = federation(SECAGG | {"secagg.count-on": 2}, hook)
    assert summary["status"] == "completed"
    assert all(r["answered"] == 3 and r["malformed"] == 1 for r in rows), rows


# -- a hostile server, scripted against the real node handlers -------------------------------------

def _node(tmp_path: Path, index: int, overrides: dict, node_config: dict | None = None) -> Context:
    from app.launch import merged_run_config

    cfg = merged_run_config([]) | {"outputs-dir": str(tmp_path / "out")} | overrides
    return Context(run_id=7, node_id=1000 + index, node_config={"partition-id": index, "num-partitions": 4,
                                                                  "state-dir": str(tmp_path / "state")}
                   | (node_config or {}), state=RecordDict(), run_config=cfg)


def _handle(message_type: str, content: RecordDict, context: Context) -> RecordDict:
    from app import node_runtime

    return node_runtime.handle(message_type, content, context, deployed=False)


def _exchange(tmp_path: Path, overrides: dict | None = None, node_config: dict | None = None):
    """Run rounds 1 and 2 of one exchange with the real silos; the server side by hand."""
    from app.secagg.protocol import Advert, SecAggServer

    cfgs = [_node(tmp_path, i, SECAGG | (overrides or {}), node_config) for i in range(4)]
    keys = {c.node_id: wire.read_keys(_handle(wire.KEYS_QUERY, RecordDict(), c))[1] for c in cfgs}
    params = wire.SecAggParams(1, 1, "grad", 16, 3, 0, 200.0, 5)
    adverts = {}
    for c in cfgs:
        reply = _handle(wire.SECAGG_KEYS_QUERY, params.encode(), c)
        adverts[c.node_id] = Advert.decode(wire.BlobReply.decode(reply).blob)
    server = SecAggServer(params.context(7), 3, 16, 64, None, (5).to_bytes(8, "big"))
    server.adverts(adverts)
    shares = {}
    for c in cfgs:
        request = wire.ShareRequest(params, {n: a.encode() for n, a in adverts.items()}, keys)
        shares[c.node_id] = dict(wire.ShareReply.decode(_handle(wire.SECAGG_SHARE_QUERY, request.encode(), c)).blobs)
    return cfgs, params, server, server.route(shares), keys


def _train(c: Context, params: wire.SecAggParams, routed: dict) -> RecordDict:
    w = {"linear.weight": np.zeros((2, 30), np.float32), "linear.bias": np.zeros(2, np.float32)}
    ins = wire.Instruction(1, wire.Phase.GRAD, w, secagg=params, shares=routed.get(c.node_id, {}))
    return _handle("train", ins.encode(), c)


def test_a_server_asking_for_both_shares_of_a_silo_or_twice_gets_refused(tmp_path: Path) -> None:
    cfgs, params, server, routed, _ = _exchange(tmp_path, {"secagg.count-on": 2})
    for c in cfgs:
        assert wire.Refusal.decode(_train(c, params, routed)) is None
    nodes = [c.node_id for c in cfgs]
    victim = nodes[0]
    # the server names the victim a survivor (its self-mask share) AND dropped (its mask key share)
    both = wire.UnmaskRequest(params, nodes, [victim])
    refusal = wire.Refusal.decode(_handle(wire.SECAGG_UNMASK_QUERY, both.encode(), cfgs[1]))
    assert refusal is not None and "both" in refusal.reason
    # a fair request is answered once; the same silo asked again with other lists refuses
    fair = wire.UnmaskRequest(params, nodes, [])
    assert wire.Refusal.decode(_handle(wire.SECAGG_UNMASK_QUERY, fair.encode(), cfgs[1])) is None
    other = wire.UnmaskRequest(params, nodes[1:], [victim])
    refusal = wire.Refusal.decode(_handle(wire.SECAGG_UNMASK_QUERY, other.encode(), cfgs[1]))
    assert refusal is not None and "already answered" in refusal.reason


def test_a_scale_below_the_silos_floor_is_refused_before_anything_is_recorded(tmp_path: Path) -> None:
    from app.privacy.ledger import read_ledger

    cfgs, params, _, routed, _ = _exchange(tmp_path)
    low = wire.SecAggParams(params.exchange, 1, "grad", 16, 3, 0, 0.5, params.seed)  # sqrt(64)/1 = 8 is the floor
    refusal = wire.Refusal.decode(_train(cfgs[0], low, routed))
    assert refusal is not None and "below this silo's smallest" in refusal.reason
    (ledger,) = (tmp_path / "state").glob("ledger-*silo0.json")
    assert read_ledger(ledger)["releases"] == []


@pytest.mark.parametrize("how", ["forged", "replayed", "garbage"])
def test_a_forged_or_replayed_share_payload_is_left_out_never_a_crash(tmp_path: Path, how: str) -> None:
    cfgs, params, _, routed, _ = _exchange(tmp_path, {"secagg.count-on": 2})
    me, one, two, three = (c.node_id for c in cfgs)
    mine = dict(routed[me])
    mine[one] = {"forged": bytes(len(mine[one])),  # zeros in place of silo 1's payload
                 "replayed": routed[two][one],  # silo 1's payload, but the one sealed to silo 2
                 "garbage": b"\xff"}[how]
    reply = _train(cfgs[0], params, {me: mine})
    masked = wire.MaskedReply.decode(reply, 16, 64)
    assert set(masked.view) == {two, three}  # it masked only against the peers whose payloads verified


def test_a_silo_refuses_a_threshold_of_half_its_neighbourhood(tmp_path: Path) -> None:
    from app.secagg.protocol import Advert

    c = _node(tmp_path, 0, SECAGG)
    keys = wire.read_keys(_handle(wire.KEYS_QUERY, RecordDict(), c))[1]
    params = wire.SecAggParams(1, 1, "grad", 16, 2, 0, 200.0, 5)
    advert = Advert.decode(wire.BlobReply.decode(_handle(wire.SECAGG_KEYS_QUERY, params.encode(), c)).blob)
    fake = {1000 + i: Advert(1000 + i, bytes([9 + i]) * 32, bytes(32)) for i in range(1, 4)}
    request = wire.ShareRequest(params, {c.node_id: advert.encode()} | {n: a.encode() for n, a in fake.items()},
                                {c.node_id: keys} | {n: "ab" * 32 for n in fake})
    refusal = wire.Refusal.decode(_handle(wire.SECAGG_SHARE_QUERY, request.encode(), c))
    assert refusal is not None and "majority" in refusal.reason


def test_a_capped_silo_without_pinned_peer_keys_refuses_and_one_with_pins_ignores_a_substituted_key(
        tmp_path: Path) -> None:
    capped = {"epsilon-cap": 3.0, "secagg-count-on-max": 4}
    c = _node(tmp_path / "a", 0, SECAGG, capped)
    refusal = wire.Refusal.decode(_handle(wire.SECAGG_KEYS_QUERY, wire.SecAggParams(1, 1, "grad", 16, 3, 0, 200.0,
                                                                                    5).encode(), c))
    assert refusal is not None and "pinned no peer keys" in refusal.reason
    # with the operator's pins, the server's substituted key for silo 3 gets it left out of the roster
    from app.privacy.envelope import StaticKeys

    state = tmp_path / "b" / "state"
    state.mkdir(parents=True)
    pins = [StaticKeys.load_or_create(state / f"secagg-silo{i}.key").public_hex for i in range(4)]
    (tmp_path / "peers").write_text("\n".join(pins) + "\n")
    cfgs, params, server, routed, keys = _exchange(tmp_path / "b", None, capped | {"secagg-peer-keys":
                                                                                    str(tmp_path / "peers"),
                                                                                    "noise-seed": "run"})
    assert all(len(routed[n]) == 3 for n in routed)  # with honest keys every silo shared with all 3 others

    cfgs = [_node(tmp_path / "b", i, SECAGG, capped | {"secagg-peer-keys": str(tmp_path / "peers"),
                                                       "noise-seed": "run"}) for i in range(4)]
    params2 = wire.SecAggParams(2, 1, "grad", 16, 3, 0, 200.0, 5)
    from app.secagg.protocol import Advert

    adverts = {c.node_id: Advert.decode(wire.BlobReply.decode(_handle(wire.SECAGG_KEYS_QUERY, params2.encode(),
                                                                      c)).blob) for c in cfgs}
    evil = StaticKeys.generate().public_hex
    request = wire.ShareRequest(params2, {n: a.encode() for n, a in adverts.items()},
                                keys | {cfgs[3].node_id: evil})
    # silo 0 seals to the pinned keys only: silo 3, whose key the server swapped, gets nothing
    blobs = wire.ShareReply.decode(_handle(wire.SECAGG_SHARE_QUERY, request.encode(), cfgs[0])).blobs
    assert set(blobs) == {cfgs[1].node_id, cfgs[2].node_id}
    # without pins (a simulation) the same request seals a payload to the server's key
    plain = [_node(tmp_path / "c", i, SECAGG) for i in range(4)]
    for c in plain:
        _handle(wire.SECAGG_KEYS_QUERY, params2.encode(), c)
    adverts_c = {c.node_id: Advert.decode(wire.BlobReply.decode(_handle(wire.SECAGG_KEYS_QUERY, params2.encode(),
                                                                        c)).blob) for c in plain}
    keys_c = {c.node_id: wire.read_keys(_handle(wire.KEYS_QUERY, RecordDict(), c))[1] for c in plain}
    request = wire.ShareRequest(params2, {n: a.encode() for n, a in adverts_c.items()},
                                keys_c | {plain[3].node_id: evil})
    blobs = wire.ShareReply.decode(_handle(wire.SECAGG_SHARE_QUERY, request.encode(), plain[0])).blobs
    assert plain[3].node_id in blobs  # documented: a simulation takes the server's keys


def test_a_run_asking_to_count_on_more_silos_than_the_node_allows_is_refused(tmp_path: Path) -> None:
    c = _node(tmp_path, 0, SECAGG, {"secagg-count-on-max": 2})
    refusal = wire.Refusal.decode(_handle(wire.SECAGG_KEYS_QUERY,
                                          wire.SecAggParams(1, 1, "grad", 16, 3, 0, 200.0, 5).encode(), c))
    assert refusal is not None and "secagg-count-on-max" in refusal.reason


@pytest.mark.parametrize("overrides, needle", [
    ({"sketch.kind": "gaussian"}, "sketch.kind"),
    ({"aggregator": "median"}, "only their sum"),
    ({"secagg.threshold": 2}, "more than half"),
    ({"silos-per-round": 1}, "silos-per-round >= 2"),
    ({"algorithm": "localsgd"}, "not available"),
    ({"privacy.mode": "isrl", "secagg.bits": 20}, "secagg.* act only"),
])
def test_secagg_settings_that_cannot_work_are_refused_in_one_line(overrides: dict, needle: str) -> None:
    from app.config import parse_settings
    from app.launch import merged_run_config

    with pytest.raises(ConfigError) as info:
        parse_settings(merged_run_config([]) | SECAGG | overrides)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_silo_that_missed_the_keys_query_is_asked_again_and_joins(federation) -> None:
    """A silo whose first answer did not come (its ClientApp was slow to start) is not left out of
    the run: every exchange asks the silos without a known key again."""
    from flwr.app import Error

    from strategies.messaging import UNAVAILABLE_CODES

    missed = {"n": 0}

    def hook(nid: int, msg, reply):
        if nid == 1002 and msg.metadata.message_type == wire.KEYS_QUERY and missed["n"] == 0:
            missed["n"] += 1
            return Message(Error(code=min(UNAVAILABLE_CODES), reason="message expired"), reply_to=msg)
        return reply

    summary, rows, _ = federation(SECAGG, hook)
    assert missed["n"] == 1 and summary["status"] == "completed"
    assert all(r["answered"] == 4 for r in rows), rows


def test_an_instruction_addressed_to_one_silo_decodes_with_its_exchange_and_shares() -> None:
    """The relay adds a silo's parameters and payloads to the shared content without re-encoding the model."""
    w = {"linear.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "linear.bias": np.ones(2, np.float32)}
    base = wire.Instruction(3, wire.Phase.GRAD, w).encode()
    params = wire.SecAggParams(4, 3, "grad", 16, 3, 0, 40.0, 9)
    ins = wire.Instruction.decode(wire.with_secagg(base, params, {1001: b"abc"}))
    assert ins.secagg == params and ins.shares == {1001: b"abc"} and ins.round == 3
    assert all(np.array_equal(ins.arrays[k], w[k]) for k in w)
    assert wire.Instruction.decode(base).secagg is None  # the shared content itself is left as it was


def test_a_sampled_secagg_release_names_the_bound_it_is_accounted_with(federation) -> None:
    from clients.silo_secagg import SAMPLED_BOUND

    summary, _, _ = federation(SECAGG | {"num-rounds": 2, "batch-size": 16, "privacy.noise-seed": "os",
                                         "secagg.amplification": "sampling"})
    release = summary["silos"][0]["releases"][0]
    assert "amplified at gamma = K/n" in release["sampling"] and SAMPLED_BOUND in release["sampling"]
    assert release["amplification"] == "sampling"


@pytest.mark.parametrize("gamma", [2.0**30.9, 2.0**40])  # the noise, then the row norms, overflow
def test_a_scale_too_large_to_encode_is_refused_before_anything_is_recorded(tmp_path: Path, gamma: float) -> None:
    """A hostile gamma whose Skellam noise or row norms no longer fit the integers must not cost the
    silo a release it then cannot send (nothing is spent for nothing)."""
    from app.privacy.ledger import read_ledger

    cfgs, params, _, routed, _ = _exchange(tmp_path)
    high = wire.SecAggParams(params.exchange, 1, "grad", 16, 3, 0, gamma, params.seed)
    refusal = wire.Refusal.decode(_train(cfgs[0], high, routed))
    assert refusal is not None and refusal.code == wire.REFUSED_POLICY and "too large" in refusal.reason
    (ledger,) = (tmp_path / "state").glob("ledger-*silo0.json")
    assert read_ledger(ledger)["releases"] == []
