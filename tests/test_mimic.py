"""The learning Mimic (Karimireddy, He & Jaggi, ICLR 2022) against a line-by-line transcription of
their MimicVariantAttacker (epfml/byzantine-robust-noniid-optimizer, codes/attacks/mimic.py, in
torch), and the facts it rests on: it finds the honest silo furthest along the top variance
direction, keeps it after the warm-up, and T0 = 0 is ByzFL's fixed Mimic."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.adaptive_attacks import MimicState, mimic, mimic_learning


class Transcribed:
    """MimicVariantAttacker's omniscient_callback with argmax = True, z0 given (theirs draws it
    from torch.Generator(0); ours from the caller's generator)."""

    def __init__(self, warmup: int, z0: torch.Tensor) -> None:
        self.warmup, self.t, self.mu, self.z, self.z0, self.target_rank = warmup, 0, None, None, z0, None

    def step(self, good_ranks: list[int], good: list[torch.Tensor]) -> int:
        avg = sum(good) / len(good)
        if self.t == 0:
            self.mu, self.z = avg, self.z0.clone()
            cumu = 0
            for g in good:
                cumu += (g - self.mu).dot(self.z) * (g - self.mu)
            self.z = cumu / cumu.norm()
        elif self.t < self.warmup:
            self.mu = self.t / (1 + self.t) * self.mu + avg / (1 + self.t)
            cumu = 0
            for g in good:
                cumu += (g - self.mu).dot(self.z) * (g - self.mu)
            self.z = self.t / (1 + self.t) * self.z + cumu / cumu.norm() / (1 + self.t)
            self.z = self.z / self.z.norm()
        if self.t < self.warmup:
            values = [g.dot(self.z) for g in good]
            self.target_rank = good_ranks[int(np.argmax(values))]
        self.t += 1
        return self.target_rank


@pytest.mark.parametrize("warmup", [1, 3, 8])
def test_learning_mimic_matches_karimireddy_et_al_transcription(warmup: int):
    rng = np.random.default_rng(7)
    ids = [11, 12, 14, 15, 17, 19]
    z_rng = np.random.default_rng(99)
    z0 = np.random.default_rng(99).standard_normal(30)
    theirs = Transcribed(warmup, torch.tensor(z0, dtype=torch.float64))
    state = MimicState()
    for _ in range(12):
        h = rng.normal(size=(len(ids), 30)) * np.linspace(0.2, 2.0, 30)
        target, state = mimic_learning(state, h, ids, warmup, z_rng)
        assert target == theirs.step(ids, [torch.tensor(r) for r in h])
    np.testing.assert_allclose(state.z, theirs.z.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state.mu, theirs.mu.numpy(), rtol=1e-12, atol=1e-12)


def test_learning_mimic_finds_the_outlying_silo_and_keeps_it_after_the_warmup():
    """Honest messages spread along e_0, silo 23 the furthest out: z -> +-e_0 and the target is the
    silo with the largest projection; after T0 the target stays even when another silo moves."""
    rng = np.random.default_rng(0)
    ids, state = [20, 21, 22, 23, 24], MimicState()
    base = np.array([-2.0, -1.0, 0.0, 1.0, 4.0])
    for _ in range(4):
        h = rng.normal(scale=0.01, size=(5, 10))
        h[:, 0] += base
        target, state = mimic_learning(state, h, ids, 4, np.random.default_rng(1))
    assert abs(abs(state.z[0]) - 1.0) < 1e-3
    expected = 24 if state.z[0] > 0 else 20
    assert target == expected
    h = rng.normal(scale=0.01, size=(5, 10))
    h[:, 0] += base[::-1] * 10
    assert mimic_learning(state, h, ids, 4, np.random.default_rng(1))[0] == expected
    # the copied silo not sampled this exchange: the largest projection among those present
    other, _ = mimic_learning(state, h[:3], ids[:3], 4, np.random.default_rng(1))
    assert other == ids[int(np.argmax(h[:3] @ state.z))]


def test_no_warmup_is_byzfls_fixed_mimic():
    h = np.arange(12.0).reshape(3, 4)
    target, state = mimic_learning(MimicState(), h, [5, 6, 7], 0, np.random.default_rng(0))
    assert target == 5 and state.z is None
    np.testing.assert_array_equal(h[[5, 6, 7].index(target)], mimic(h))
    assert mimic_learning(state, h[::-1], [7, 6, 5], 0, np.random.default_rng(0))[0] == 5


def test_learning_mimic_refuses_bad_input():
    with pytest.raises(ValueError, match="len\\(ids\\)"):
        mimic_learning(MimicState(), np.ones((2, 3)), [1], 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="warmup"):
        mimic_learning(MimicState(), np.ones((2, 3)), [1, 2], -1, np.random.default_rng(0))
    # identical honest messages (no variance): a target, no division by zero
    target, state = mimic_learning(MimicState(), np.ones((2, 3)), [1, 2], 2, np.random.default_rng(0))
    assert target in (1, 2) and np.all(np.isfinite(state.z))


def test_the_harness_sends_the_learned_silos_message_from_every_byzantine_silo():
    """Attacked.attacked on one exchange of real (unsketched) replies: every Byzantine message
    becomes the message of the honest silo mimic_learning picks, and that lift is what the rule sees."""
    from types import SimpleNamespace

    from app.config import parse_settings
    from app.seeding import np_rng
    from strategies.byzantine_harness import Attacked
    from strategies.replies import ReplyReader, Updates, flatten

    s = parse_settings({"algorithm": "robust", "aggregator": "mean", "num-silos": 6, "silos-per-round": 6,
                        "privacy.mode": "off", "attack.kind": "mimic", "attack.fraction": 0.3,
                        "attack.mimic-warmup": 2})
    layout = {"w": (2, 3)}
    reader = ReplyReader(layout, None, lambda msg, what: "")
    rows = np.random.default_rng(5).normal(size=(6, 6)).astype(np.float32)
    nodes = [31, 32, 33, 34, 35, 36]
    messages = {n: r for n, r in zip(nodes, rows)}
    updates = Updates(nodes=nodes, updates=[reader.lift(messages[n]) for n in nodes], messages=messages,
                      metrics=[None] * 6, lift=reader.lift)
    harness = Attacked(SimpleNamespace(name="mean"))
    harness.s, harness.byzantine_nodes = s, {31, 34}
    expected, _ = mimic_learning(MimicState(), rows[[1, 2, 4, 5]].astype(np.float64), [32, 33, 35, 36], 2,
                                 np_rng(s.seed, "mimic-z", 1))
    out = harness.attacked(1, updates)
    assert expected not in (31, 34) and harness.mimic.target == expected
    for node in (31, 34):
        np.testing.assert_array_equal(out.messages[node], messages[expected])
        np.testing.assert_array_equal(flatten(out.updates[nodes.index(node)]), messages[expected])
    for node in (32, 33, 35, 36):
        np.testing.assert_array_equal(out.messages[node], messages[node])


def test_mimic_through_the_server_runs_to_its_end(tmp_path):
    """The real ServerApp and harness (digits, no DP, trimmed mean told f = 3): a Mimic run with its
    warm-up completes, the 3 Byzantine silos answering every round."""
    from tests.helpers import run

    cfg = {"algorithm": "robust", "aggregator": "trimmed-mean", "dataset": "digits", "partition": "iid",
           "num-silos": 10, "silos-per-round": 10, "privacy.mode": "off", "byzantine.f": 3,
           "attack.kind": "mimic", "attack.fraction": 0.3, "attack.mimic-warmup": 2, "num-rounds": 4,
           "batch-size": 32}
    summary, rows, _ = run(tmp_path, cfg)
    assert summary["status"] == "completed" and len(rows) == 4
    assert all(r["byzantine_answered"] == 3 for r in rows)


def test_mimic_state_survives_a_checkpoint(tmp_path):
    from types import SimpleNamespace

    from app.checkpoint import load_checkpoint, save_checkpoint
    from strategies.byzantine_harness import Attacked

    harness = Attacked(SimpleNamespace(name="mean", state=lambda: {}, restore=lambda s: None))
    h = np.random.default_rng(3).normal(size=(4, 6))
    _, harness.mimic = mimic_learning(MimicState(), h, [101, 102, 103, 104], 3, np.random.default_rng(0))
    harness.byzantine_nodes = {7, 8}
    save_checkpoint(tmp_path / "c.npz", {"harness": harness.state()})
    again = Attacked(SimpleNamespace(name="mean", state=lambda: {}, restore=lambda s: None))
    again.restore(load_checkpoint(tmp_path / "c.npz")["harness"])
    assert again.mimic.t == 1 and again.mimic.target == harness.mimic.target and again.byzantine_nodes == {7, 8}
    np.testing.assert_array_equal(again.mimic.z, harness.mimic.z)


def test_an_attacked_message_beyond_the_servers_bounds_is_dropped_not_fatal(tmp_path):
    """A harness attack whose message the server would refuse (IPM with epsilon 1e39: -eps * mean
    overflows float32 to inf) is dropped as malformed, as the server drops such a reply; the run goes
    on with the honest silos (before: the harness raised ReplyError and the job failed)."""
    from tests.helpers import run

    cfg = {"algorithm": "robust", "aggregator": "mean", "dataset": "digits", "partition": "iid",
           "num-silos": 10, "silos-per-round": 10, "privacy.mode": "off", "attack.kind": "ipm",
           "attack.ipm-epsilon": 1e39, "attack.fraction": 0.3, "num-rounds": 3, "batch-size": 32}
    summary, rows, _ = run(tmp_path, cfg)
    assert summary["status"] == "completed" and len(rows) == 3
    assert all(r["attack_dropped"] == 3 and r["byzantine_answered"] == 0 and r["answered"] == 10 for r in rows)
    assert summary["test_error"] < 0.5
