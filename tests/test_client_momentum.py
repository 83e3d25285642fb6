"""client-momentum (issue 39): each silo sends m_t = beta m_{t-1} + (1 - beta) g_t (m_1 = g_1) of its
own privatised releases g_t. Checked against an independent recomputation: the same instructions
replayed, in the same order, to fresh silos without momentum (fresh ledgers: the same ledger
sequence numbers, so the same batches and noise) give the releases g_t; their average, computed
here, is what the silos with momentum sent. The default (0) leaves runs as they were
(tests/test_golden.py pins them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app import wire
from app.config import ConfigError, parse_settings
from app.launch import merged_run_config

BETA = 0.6


def _record_train(store: list):
    def hook(nid: int, msg, reply):
        try:
            ins = wire.Instruction.decode(msg.content)
        except wire.ReplyError:
            return reply
        if not reply.has_error() and wire.UPDATE in reply.content.array_records:
            store.append((nid, ins, msg.content, reply.content))
        return reply
    return hook


def _flat(content, ins) -> np.ndarray:
    layout = {k: tuple(np.shape(a)) for k, a in ins.arrays.items()}
    reply = wire.TrainReply.decode(content, layout)
    return np.concatenate([np.asarray(v, dtype=np.float64).reshape(-1) for v in reply.update.values()])


@pytest.mark.parametrize("algorithm", ["mbsgd", "localsgd"])
def test_a_silo_sends_the_running_average_of_the_releases_it_computed(tmp_path: Path, algorithm: str):
    from flwr.app import Context, RecordDict

    from app.node_runtime import silo
    from tests.helpers import run

    over = {"algorithm": algorithm, "num-rounds": 4, "privacy.mode": "isrl", "privacy.epsilon": 8.0,
            "local-steps": 3, "client-momentum": BETA}
    sent: list = []
    summary, rows, grid = run(tmp_path, over, hook=_record_train(sent))
    assert summary["status"] == "completed" and len(rows) == 4
    cfg = merged_run_config([]) | {"outputs-dir": str(tmp_path / "o2"), "run-name": "b0"} | over | {"client-momentum": 0.0}
    nodes = sorted({nid for nid, *_ in sent})
    assert len(nodes) == parse_settings(cfg).num_silos and len(sent) == 4 * len(nodes)
    for i, nid in enumerate(nodes):
        ctx = Context(run_id=99, node_id=nid, node_config={"partition-id": i, "num-partitions": len(nodes),
                                                           "state-dir": str(tmp_path / "recompute")},
                      state=RecordDict(), run_config=dict(cfg))
        plain = silo(ctx)  # the same silo without momentum, its own fresh ledger
        m = None
        for t, (node, ins, instruction, reply) in enumerate([r for r in sent if r[0] == nid]):
            g = _flat(plain.train(instruction), ins)  # the release g_t the silo computed this round
            m = g if m is None else BETA * m + (1 - BETA) * g
            got = _flat(reply, ins)
            np.testing.assert_allclose(got, m, rtol=1e-5, atol=1e-6 * float(np.abs(m).max()))
            if t:  # not the release itself
                assert np.abs(got - g).max() > 1e-3 * np.abs(g).max()
        assert plain.ledger.spent() > 0  # the releases were recorded again, on its own ledger


@pytest.mark.parametrize("over,match", [
    ({"algorithm": "spider"}, "not available for algorithm = 'spider'"),
    ({"algorithm": "svrg"}, "not available for algorithm = 'svrg'"),
    ({"privacy.mode": "shuffle", "algorithm": "mbsgd"}, "not available with privacy.mode = 'shuffle'"),
    ({"algorithm": "robust", "aggregator": "gradbant", "gradbant.noise-aware": True}, "gradbant.noise-aware"),
    ({"client-momentum": 1.0}, "client-momentum = 1.0 is out of range"),
])
def test_momentum_is_refused_where_it_means_nothing(over, match):
    with pytest.raises(ConfigError, match=match):
        parse_settings(merged_run_config([]) | {"client-momentum": 0.5} | over)


@pytest.mark.parametrize("algorithm", ["mbsgd", "proxsgd", "localsgd", "robust"])
def test_every_single_exchange_optimiser_takes_it(algorithm):
    s = parse_settings(merged_run_config([]) | {"client-momentum": 0.9, "algorithm": algorithm,
                                                "gradbant.noise-aware": False})
    assert s.client_momentum == 0.9
