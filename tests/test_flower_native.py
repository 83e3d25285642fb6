"""Every one-exchange optimiser is a ``flwr.serverapp.strategy.Strategy`` that runs under
Flower's own ``Strategy.start`` (on the in-process grid: the real ClientApp, silos and ledgers)
and gives what silofl's driver (``FederatedOptimizer.run``) gives with the same seeds: the same
round rows (wall time aside) and the same final model. The reference is the driver the golden
runs pin (tests/test_golden.py); the Flower run shares none of its loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.serverapp.strategy import Strategy

from app.launch import merged_run_config
from app.local_grid import InProcessGrid, simulation_nodes
from app.server_app import validate
from strategies import STRATEGIES
from strategies.exchange import MultiExchangeRound
from strategies.flower_rounds import params_of, record_of
from tests.helpers import without_wall

#: small runs; each algorithm's knobs chosen so its schedule shows within 4 rounds
EXTRA: dict[str, dict[str, Any]] = {
    "localsgd": {"local-steps": 2, "lr": 0.2},
    "proxsgd": {"prox.kind": "l2", "prox.strength": 0.01},
    "spider": {"spider.q": 2, "batch-size": 64},
    "svrg": {"svrg.inner-steps": 2, "batch-size": 64},
    "plsvrg": {"svrg.inner-steps": 1, "plsvrg.restarts": 2},
    "robust": {"partition": "iid", "num-silos": 4, "silos-per-round": 4, "model": "logistic", "privacy.mode": "off",
               "batch-size": 32, "trust.size": 60, "attack.kind": "sign-flip", "attack.fraction": 0.5},
}
#: private, robust, variance-reduced: SPIDER with Grad-BANT against a sign-flip attack
EXTRA["spider+gradbant"] = EXTRA["spider"] | {"algorithm": "spider", "aggregator": "gradbant", "trust.size": 60,
                                              "partition": "iid", "num-silos": 4, "silos-per-round": 4,
                                              "attack.kind": "sign-flip", "attack.fraction": 0.25}
ONE_EXCHANGE = sorted(name for name, cls in STRATEGIES.items() if cls.exchanges_per_round == 1) + ["spider+gradbant"]


def _setup(tmp_path: Path, algorithm: str, sub: str) -> tuple[Any, Any, dict, InProcessGrid]:
    import torch

    from app.data.federated import dataset_meta
    from app.models import build_model
    from app.seeding import torch_gen

    cfg = merged_run_config([]) | {"algorithm": algorithm, "num-rounds": 4, "eval-every": 1} | EXTRA.get(algorithm, {})
    s = validate(cfg)
    shape, classes = dataset_meta(s)
    model = build_model(s.model, shape, classes, hidden=s.model_hidden, generator=torch_gen(s.seed, "init"))
    with torch.no_grad():
        initial = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    layout = {k: tuple(v.shape) for k, v in initial.items()}
    grid = InProcessGrid(cfg, simulation_nodes(cfg), str(tmp_path / sub), run_id=1)
    return s, STRATEGIES[s.algorithm](s, layout, node_wait_s=0), initial, grid


def test_every_optimiser_is_a_flower_strategy() -> None:
    for cls in STRATEGIES.values():
        assert issubclass(cls, Strategy) and not getattr(cls, "__abstractmethods__", None), cls


@pytest.mark.parametrize("algorithm", ONE_EXCHANGE)
def test_flowers_own_start_gives_silofls_rows_and_model(tmp_path: Path, algorithm: str) -> None:
    s, ours, initial, grid = _setup(tmp_path, algorithm, "ours")
    mine = ours.run(grid, initial, num_rounds=s.num_rounds, timeout=s.round_timeout)
    s, theirs, initial, grid = _setup(tmp_path, algorithm, "flower")
    result = theirs.start(grid=grid, initial_arrays=record_of(initial), num_rounds=s.num_rounds)
    assert len(ours.rows) == s.num_rounds and "test_error" in ours.rows[-1]
    assert without_wall(theirs.rows) == without_wall(ours.rows)
    final = params_of(result.arrays)
    assert final.keys() == mine.model.keys()
    assert all(np.array_equal(final[k], mine.model[k]) for k in final)
    # Flower's own history holds the same per-round numbers
    assert result.train_metrics_clientapp[s.num_rounds]["answered"] == ours.rows[-1]["answered"]
    assert result.evaluate_metrics_clientapp[s.num_rounds]["test_error"] == ours.rows[-1]["test_error"]


def test_a_round_of_several_exchanges_is_refused_under_flowers_start(tmp_path: Path) -> None:
    multi = sorted(name for name, cls in STRATEGIES.items() if cls.exchanges_per_round > 1)
    assert multi == ["spider-alt"]
    s, strategy, initial, grid = _setup(tmp_path, "spider-alt", "alt")
    with pytest.raises(MultiExchangeRound, match="silofl's driver"):
        strategy.start(grid=grid, initial_arrays=record_of(initial), num_rounds=3)


def test_the_documented_serverapp_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/flower-library.md's ServerApp (SPIDER + noise-aware Grad-BANT under Flower's start) runs as
    written, with the run config written there: the sign-flipper gets no weight in the anchor rounds,
    and honest silos get weight in the difference rounds (ISRL-DP; the paper's score gives them 0)."""
    import shlex

    from flwr.app import Context, RecordDict

    doc = (Path(__file__).parent.parent / "docs" / "flower-library.md").read_text()
    code = doc.split('"""serverapp.py:', 1)[1].split("```", 1)[0]
    run_config = shlex.split(doc.split("--run-config ", 1)[1].split("\n", 1)[0])
    assert len(run_config) == 1
    namespace: dict[str, Any] = {}
    exec(compile('"""serverapp.py:' + code, "serverapp.py", "exec"), namespace)  # noqa: S102 (our own doc)
    cfg = merged_run_config(run_config)
    assert cfg["algorithm"] == "spider" and cfg["num-rounds"] == 4 and cfg["privacy.mode"] == "isrl"
    grid = InProcessGrid(cfg, simulation_nodes(cfg), str(tmp_path), run_id=1)
    namespace["main"](grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=cfg))
    out = capsys.readouterr().out
    print(out)
    lines = [line for line in out.splitlines() if line.startswith("round ")]
    assert len(lines) == 4 and all("answered 4" in line for line in lines)
    assert "Byzantine weight 0.00" in lines[0] and "Byzantine weight 0.00" in lines[2]  # anchors: the flipper 0
    for line in (lines[1], lines[3]):  # difference rounds: some silo weighted, not only the flipper
        assert "silos weighted 0" not in line and "Byzantine weight 1.00" not in line, line
    assert "final model:" in out
    documented = doc.split("--run-config ", 1)[1].split("```", 2)[1].strip()  # the output shown after it
    assert [line for line in out.splitlines() if line.startswith(("round ", "final"))] == documented.splitlines()


def test_a_clientapp_failure_stops_flowers_start_as_it_stops_silofls(tmp_path: Path) -> None:
    from flwr.app import Error, Message

    from strategies.nodes import ClientAppsFailed

    s, strategy, initial, grid = _setup(tmp_path, "mbsgd", "fail")

    def crash(node: int, msg: Message, reply: Message) -> Message:
        if node == grid.node_ids[0] and msg.metadata.message_type == "train":
            return Message(Error(code=0, reason="ClientApp exception: disk on fire"), reply_to=msg)
        return reply
    grid.hook = crash
    with pytest.raises(ClientAppsFailed, match="round 1: 1 ClientApp failure"):
        strategy.start(grid=grid, initial_arrays=record_of(initial), num_rounds=3)
    assert [r["round"] for r in strategy.rows] == [1] and strategy.rows[0]["failed"] == 1
