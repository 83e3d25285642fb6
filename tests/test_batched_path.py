"""The batched simulation path (app/privacy/row_batcher.py, app/local_grid.py ``batched=True``)
against the one-silo-at-a-time path, and the virtual silos' ledger durability.

Independent facts: the batcher's rows are checked against ``per_sample_grads`` on each request
alone and against the per-record loop; a batched federation against the same federation run one
silo at a time (every reply's arrays, every silo's ledger); the ledger's fsyncs are counted at
the system call."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from app.models.zoo import build_model
from app.privacy.per_sample import per_sample_grads, per_sample_grads_loop
from app.privacy.row_batcher import RowBatcher, per_sample_rows
from tests.helpers import run, without_wall


def _point(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) * 0.3 for k, v in model.named_parameters()}


def test_each_call_gets_the_rows_of_its_own_request_in_one_batched_call_per_model_and_point() -> None:
    g = torch.Generator().manual_seed(0)
    mlp = [build_model("mlp", (8,), 3, hidden=(5,)) for _ in range(4)]
    other = build_model("logistic", (8,), 3)
    w, w2, wl = _point(mlp[0], 1), _point(mlp[0], 2), _point(other, 3)
    data = [(torch.randn(k, 8, generator=g), torch.randint(0, 3, (k,), generator=g)) for k in (1, 2, 5, 3, 4, 2)]
    # (model, point, records): four silos at w (one call), one at another point, one of another architecture
    asks = [(mlp[0], w, 0), (mlp[1], w, 1), (mlp[2], w2, 2), (other, wl, 3), (mlp[3], w, 4), (mlp[1], w, 5)]
    calls = [lambda m=m, p=p, i=i: per_sample_rows(m, {k: v.clone() for k, v in p.items()}, *data[i])
             for m, p, i in asks]
    batcher = RowBatcher()
    got = batcher.run(calls)
    assert batcher.requests == 6 and batcher.batches == 1
    for (m, p, i), rows in zip(asks, got, strict=True):
        x, y = data[i]
        alone = per_sample_grads(m, p, x, y)
        assert rows.shape == alone.shape
        torch.testing.assert_close(rows, per_sample_grads_loop(m, p, x, y), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rows, alone, rtol=1e-6, atol=1e-7)


def test_calls_run_one_at_a_time_in_order_and_a_call_that_raises_returns_its_error() -> None:
    model = build_model("logistic", (4,), 2)
    w = _point(model, 0)
    order: list[str] = []
    x, y = torch.ones(2, 4), torch.tensor([0, 1])

    def call(i: int):
        def f():
            order.append(f"{i}:start")
            per_sample_rows(model, w, x, y)
            order.append(f"{i}:rows")
            if i == 1:
                raise ValueError("silo 1 fails after its rows")
            per_sample_rows(model, w, x, y)
            order.append(f"{i}:end")
            return i
        return f

    batcher = RowBatcher()
    out = batcher.run([call(0), call(1), call(2)])
    assert out[0] == 0 and out[2] == 2 and isinstance(out[1], ValueError)
    assert order == ["0:start", "1:start", "2:start", "0:rows", "1:rows", "2:rows", "0:end", "2:end"]
    assert batcher.batches == 2 and batcher.requests == 5
    assert per_sample_rows(model, w, x, y).shape == (2, sum(v.numel() for v in w.values()))  # outside: alone


def _replies(store: list):
    def hook(nid, msg, reply):
        if reply.has_content():
            arrays = {f"{name}/{k}": np.asarray(v.numpy()) for name, rec in reply.content.array_records.items()
                      for k, v in rec.items()}
            store.append((msg.metadata.message_type, nid, arrays))
        return reply
    return hook


def _ledgers(state: Path) -> dict[str, list[dict]]:
    out = {}
    for p in sorted(state.glob("ledger-*.json")):
        rows = [json.loads(line) for line in p.read_text().splitlines()[1:]]
        out[p.name] = [{k: v for k, v in r["release"].items() if k != "time"} for r in rows if "release" in r]
    return out


CASES = {  # the releases of three kinds of exchange: one gradient, two points (SPIDER's difference), Q local steps
    "mbsgd": {"algorithm": "mbsgd", "num-rounds": 3},
    "spider": {"algorithm": "spider", "num-rounds": 4, "spider.q": 2, "diff-clip": 1.0},
    "localsgd": {"algorithm": "localsgd", "num-rounds": 2, "local-steps": 3, "lr": 0.2},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_batched_federation_releases_what_the_one_at_a_time_path_releases(tmp_path: Path, case: str) -> None:
    over = {"dataset": "digits", "partition": "iid", "num-silos": 12, "silos-per-round": 12, "batch-size": 8,
            "privacy.delta": 1e-5, "checkpoint": False} | CASES[case]
    got = {}
    for path in ("alone", "batched"):
        replies: list = []
        summary, rows, grid = run(tmp_path / path, over, hook=_replies(replies), name=path, batched=path == "batched")
        got[path] = (summary, rows, replies, _ledgers(tmp_path / path / "state"))
        assert (grid.batcher is not None) == (path == "batched")
    (s1, r1, rep1, led1), (s2, r2, rep2, led2) = got["alone"], got["batched"]
    assert len(rep1) == len(rep2) > 12
    worst = {"release": 0.0, "evaluation": 0.0}
    for (t1, n1, a1), (t2, n2, a2) in zip(rep1, rep2, strict=True):
        assert (t1, n1, sorted(a1)) == (t2, n2, sorted(a2))
        for k in a1:
            part = "release" if k.startswith(("update/", "sketch/")) else "evaluation"
            worst[part] = max(worst[part], float(np.max(np.abs(a1[k].astype(np.float64) - a2[k]), initial=0.0)))
    # the same records, batch, clip and noise draw: only the per-record rows' last bits may differ
    # (a product over 12 silos' rows can take another kernel than over one silo's); an open
    # evaluation's training gradient is the mean of the per-record rows there (another order)
    print(f"\n{case}: max |batched - alone| over the releases = {worst['release']:.3g}, over the evaluation "
          f"gradients = {worst['evaluation']:.3g}")
    assert worst["release"] <= 1e-5 and worst["evaluation"] <= 1e-5, worst
    assert led1 == led2  # the same releases recorded by every silo: seq, round, kind, K, n, z
    assert [s["eps_spent"] for s in s1["silos"]] == [s["eps_spent"] for s in s2["silos"]]
    _same_rows(r1, r2)


def _same_rows(r1: list[dict], r2: list[dict]) -> None:
    """rounds.jsonl rows equal but for wall_s, their floats to 1e-4: the open evaluation's
    statistics (losses, the gradient mapping) are summed in another order on the batched path."""
    assert len(r1) == len(r2)
    for a, b in zip(without_wall(r1), without_wall(r2), strict=True):
        assert a.keys() == b.keys()
        for k in a:
            if isinstance(a[k], float):
                assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), k
            else:
                assert a[k] == b[k], k


def test_a_batched_federation_is_reproducible(tmp_path: Path) -> None:
    over = {"dataset": "digits", "partition": "iid", "num-silos": 6, "silos-per-round": 4, "num-rounds": 3,
            "privacy.delta": 1e-5, "checkpoint": False}
    a = run(tmp_path / "a", over, name="a", batched=True)
    b = run(tmp_path / "b", over, name="b", batched=True)
    assert without_wall(a[1]) == without_wall(b[1])


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The path of every file or folder fsynced from now on (from /proc/self/fd)."""
    calls: list[str] = []
    real = os.fsync

    def counting(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return calls


def test_a_virtual_silo_fsyncs_no_release_and_the_server_syncs_before_its_witnesses_and_checkpoints(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app import server_app
    from app.privacy.ledger import witness

    fsyncs = _count_fsyncs(monkeypatch)
    order: list[str] = []
    real_sync, real_save = os.sync, server_app.save_checkpoint
    real_write = witness.write_bytes_atomically
    monkeypatch.setattr(os, "sync", lambda: (order.append("sync"), real_sync())[1])
    monkeypatch.setattr(server_app, "save_checkpoint", lambda *a, **k: (order.append("checkpoint"), real_save(*a, **k)))
    monkeypatch.setattr(witness, "write_bytes_atomically", lambda *a, **k: (order.append("witness"), real_write(*a, **k)))
    over = {"dataset": "digits", "partition": "iid", "num-silos": 3, "silos-per-round": 3, "num-rounds": 2,
            "privacy.delta": 1e-5}
    before = len(fsyncs)
    summary, rows, _ = run(tmp_path, over)
    assert summary["status"] == "completed" and len(rows) == 2
    # after each exchange: one sync that puts the silos' ledger rows on disk, then the server's
    # witnesses of them, then (after a training round) the checkpoint that counts on them
    assert order.count("checkpoint") == 2 and order.count("sync") == order.count("witness") >= 2
    assert all(order[i - 1] == "sync" for i, step in enumerate(order) if step == "witness")
    assert all("witness" in order[:i] for i, step in enumerate(order) if step == "checkpoint")
    ledgers = _ledgers(tmp_path / "state")
    assert sum(len(v) for v in ledgers.values()) == 6  # 3 silos x 2 releases, all recorded
    # in the silos' state dir only the ledger key, created once, is fsynced: no ledger, mark or
    # release (the server's witnesses, checkpoints and outputs are, elsewhere)
    state = str(tmp_path / "state")
    assert [p for p in fsyncs[before:] if p.startswith(state)] == [str(tmp_path / "state" / "ledger.key")] or \
        all(Path(p).name.startswith(".ledger.key") for p in fsyncs[before:] if p.startswith(state))


def test_a_silo_with_a_privacy_cap_still_fsyncs_every_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    over = {"dataset": "digits", "partition": "iid", "num-silos": 3, "silos-per-round": 3, "num-rounds": 2,
            "privacy.delta": 1e-5, "checkpoint": False}
    fsyncs = _count_fsyncs(monkeypatch)
    # an operator's cap (node config epsilon-cap) makes the node keep its own guarantees: every entry on disk
    summary, _, _ = run(tmp_path / "capped", over, node_config={"epsilon-cap": 10.0, "delta-cap": 1e-5,
                                                                "evaluation": "open", "noise-seed": "run"},
                        name="capped")
    assert summary["status"] == "completed"
    releases = sum(len(v) for v in _ledgers(tmp_path / "capped" / "state").values())
    assert releases == 6
    state = tmp_path / "capped" / "state"
    ledger_syncs = [p for p in fsyncs if Path(p).parent == state and Path(p).name.startswith("ledger-")]
    assert len(ledger_syncs) >= releases  # each release's append, besides the ledgers' creation


def test_a_sweep_job_on_the_batched_engine_says_which_path_it_took(tmp_path: Path, capsys,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from app.config import ConfigError
    from app.launch import merged_run_config
    from app.sweep import federation_with_retries, sweep_engine

    cfg = merged_run_config([]) | {"dataset": "digits", "partition": "iid", "num-silos": 5, "silos-per-round": 5,
                                   "num-rounds": 2, "privacy.delta": 1e-5, "outputs-dir": str(tmp_path / "out"),
                                   "run-name": "job"}
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr"))  # the silos' state dir, as the engine's nodes have it
    result = federation_with_retries(cfg, {"engine": "batched"}, "job")
    assert result["status"] == "completed" and result["retries"] == 0 and len(result["rounds_rows"]) == 2
    found = re.search(r"\((\d+) requests in (\d+) calls\)", result["simulation_path"])
    assert result["simulation_path"].startswith("batched") and found is not None
    requests, calls = int(found[1]), int(found[2])
    assert requests >= 5 * 2 and calls <= requests / 5  # each call served the 5 silos' requests of one kind
    assert "sweep.engine = batched, simulation path: batched" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="sweep.engine = 'ray'; allowed: in-process, batched, flower"):
        federation_with_retries(cfg, {"engine": "ray"}, "job")
    # a Ray setting with an engine that runs no Ray is refused, not ignored
    with pytest.raises(ConfigError, match="sweep.client-cpus is set but sweep.engine = 'batched' runs no Ray"):
        federation_with_retries(cfg, {"engine": "batched", "client-cpus": 2}, "job")
    # the default engine: the in-process grid, one silo at a time (the fastest on CPU, scripts/bench/sweep_engines.py)
    assert sweep_engine({}) == "in-process"


def test_a_node_parses_each_run_config_once_and_tells_1_from_true() -> None:
    from app.config import ConfigError
    from app.launch import merged_run_config
    from app.node_runtime import run_settings

    cfg = merged_run_config([])
    assert run_settings(dict(cfg)) is run_settings(dict(cfg))  # cached, by value
    assert cfg["checkpoint"] is True
    with pytest.raises(ConfigError, match="checkpoint"):  # 1 == True, but not a boolean to parse_settings
        run_settings(dict(cfg) | {"checkpoint": 1})


@pytest.mark.parametrize("over", [
    # the shuffle line: sealed binomial contributions through the shuffler node (its own exchange)
    {"privacy.mode": "shuffle", "num-rounds": 2, "partition": "iid", "privacy.epsilon": 3.0, "num-silos": 3,
     "silos-per-round": 3},
    # a robust rule under attack: Grad-BANT's trust set on the server, label-flipping silos
    {"dataset": "digits", "partition": "iid", "num-silos": 5, "silos-per-round": 5, "num-rounds": 2,
     "privacy.delta": 1e-5, "aggregator": "gradbant", "gradbant.noise-aware": True, "trust.size": 100,
     "attack.kind": "label-flip",
     "attack.fraction": 0.4},
], ids=["shuffle", "gradbant-label-flip"])
def test_the_batched_path_runs_every_mode_as_the_one_at_a_time_path(tmp_path: Path, over: dict) -> None:
    over = over | {"checkpoint": False}
    a = run(tmp_path / "a", over, name="a")
    b = run(tmp_path / "b", over, name="b", batched=True)
    assert a[0]["status"] == b[0]["status"] == "completed"
    assert [s["eps_spent"] for s in a[0]["silos"]] == [s["eps_spent"] for s in b[0]["silos"]]
    assert _ledgers(tmp_path / "a" / "state") == _ledgers(tmp_path / "b" / "state")
    _same_rows(a[1], b[1])


def test_requests_beyond_one_call_s_size_are_split_into_calls_of_whole_requests(monkeypatch) -> None:
    from app.privacy import row_batcher

    model = build_model("mlp", (8,), 3, hidden=(5,))
    w = _point(model, 0)
    d = sum(v.numel() for v in w.values())
    monkeypatch.setattr(row_batcher, "MAX_ELEMENTS", 5 * d)  # at most 5 rows a call
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(k, 8, generator=g), torch.randint(0, 3, (k,), generator=g)) for k in (3, 2, 4, 1, 6)]
    calls = [lambda x=x, y=y: per_sample_rows(model, w, x, y) for x, y in data]
    calls_made: list[int] = []
    real = row_batcher.per_sample_grads
    monkeypatch.setattr(row_batcher, "per_sample_grads", lambda m, p, x, y: (calls_made.append(len(y)), real(m, p, x, y))[1])
    got = RowBatcher().run(calls)
    assert calls_made == [5, 5, 6]  # 3+2 | 4+1 | 6 alone (more than a call holds, but a request is never cut)
    for (x, y), rows in zip(data, got, strict=True):
        torch.testing.assert_close(rows, real(model, w, x, y), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_silos_without_test_records_answer_a_loss_sum_of_0_and_the_run_is_not_read_as_diverged(tmp_path: Path) -> None:
    """With 1,000 silos of digits' 1,797 records some silos hold one record, none for testing: the sum
    of its test losses is 0 (before: the mean of none, NaN, times 0; the server dropped every
    such reply as non-finite and the run health called a healthy run diverged)."""
    over = {"dataset": "digits", "partition": "iid", "num-silos": 1000, "silos-per-round": 1000, "num-rounds": 1,
            "lr": 0.1, "privacy.delta": 1e-5, "checkpoint": False}
    summary, rows, _ = run(tmp_path, over)
    assert summary["status"] == "completed", summary.get("status_reason")
    assert "non_finite_evaluations" not in rows[-1] and rows[-1]["refused"] == 0
