"""The silo side as a small API (clients/private_silo.py): a user's own ClientApp, with its own
model and records, gets silofl's record-level ISRL-DP, ledger, node policy and sketch.

Checked against independent facts: dp-accounting's RDP accountant for the plan, the built-in
silo node's release (another path to the same silo: the run config's data and zoo model), and
what the policy mod must not do (call the handler, write the ledger)."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp

from app import wire
from app.algorithms import Phase
from app.launch import merged_run_config
from app.local_grid import run_local
from app.sketch.broadcast import RoundSketch

DOC = Path(__file__).resolve().parents[1] / "docs" / "private-clientapp.md"
#: the integer Renyi orders the ledger says it accounts at (app/privacy/accounting.py, docs/privacy.md)
ORDERS = list(range(2, 65)) + [80, 96, 128, 192, 256]


@pytest.fixture(autouse=True)
def _task_identity() -> None:
    """Flower messages need a task identity; the in-process grid sets one (as here)."""
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0


def example_module() -> types.ModuleType:
    """The complete ClientApp of docs/private-clientapp.md ("Your own ClientApp"), as a module."""
    code = re.search(r"## Your own ClientApp.*?```python\n(.*?)```", DOC.read_text(), re.S)
    assert code, "docs/private-clientapp.md has no python block under 'Your own ClientApp'"
    mod = types.ModuleType("user_clientapp")
    exec(compile(code.group(1), str(DOC), "exec"), mod.__dict__)  # noqa: S102 - our own docs
    return mod


def run_config(tmp_path: Path, **over: Any) -> dict[str, Any]:
    """silofl's defaults for a 30-feature, 2-class logistic model (the example's Net's layout)."""
    return merged_run_config([]) | {"outputs-dir": str(tmp_path / "out"), "run-name": "t", "dataset": "wbcd",
                                    "model": "logistic", "algorithm": "mbsgd", "num-rounds": 5, "num-silos": 2,
                                    "silos-per-round": 2} | over


def context(tmp_path: Path, cfg: dict[str, Any], node: dict[str, Any] | None = None, run_id: int = 7) -> Context:
    return Context(run_id=run_id, node_id=1, node_config={"partition-id": 0, "num-partitions": 2,
                                                          "state-dir": str(tmp_path / "state")} | (node or {}),
                   state=RecordDict(), run_config=cfg)


def model_arrays(shift: float = 0.0) -> dict[str, np.ndarray]:
    """A model of the server's layout (logistic 30 -> 2), its weights shifted by ``shift``."""
    g = np.random.default_rng(0)
    return {"linear.weight": (g.normal(size=(2, 30)) * 0.1 + shift).astype(np.float32),
            "linear.bias": np.zeros(2, np.float32) + np.float32(shift)}


def train_msg(rnd: int, arrays: dict[str, np.ndarray], phase: Phase = Phase.GRAD, **kw: Any) -> Message:
    content = wire.Instruction(round=rnd, phase=phase, arrays=arrays, **kw).encode()
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN)


def sampled_gaussian_epsilon(n: int, batch: int, z: float, count: int, delta: float) -> float:
    """dp-accounting: ``count`` Gaussian releases (multiplier z) on K of n records drawn without
    replacement, replace-one adjacency, composed in RDP at :data:`ORDERS`."""
    acc = RdpAccountant(ORDERS, dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(n, batch, dpa.GaussianDpEvent(z)), count))
    return float(acc.get_epsilon(delta))


# -- (a) the documented ClientApp against silofl's server -------------------------------------------

def test_docs_example_runs_against_silofl_server_and_its_ledger_is_the_accountants(tmp_path: Path) -> None:
    user = example_module()
    cfg = run_config(tmp_path, **{"sketch.kind": "gaussian", "sketch.ratio": 0.5})  # SketchMod on every round
    run_local(cfg, str(tmp_path / "state"), run_id=3, client=user.app)
    out = tmp_path / "out" / "t"
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "completed", summary["status_reason"]
    assert [r["answered"] for r in rows] == [2] * 5  # every silo's release was accepted every round
    # evaluation is refused by default (issue 34 section 4): the final model, read from the checkpoint,
    # learned the user's rule on the held-out records of both silos
    from app.checkpoint import load_checkpoint

    assert summary["test_error"] is None
    model = user.Net()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in load_checkpoint(out / "checkpoint.npz")["model"].items()})
    held = [user.my_records(Context(run_id=0, node_id=0, node_config={"partition-id": i}, state=RecordDict(),
                                    run_config={})) for i in (0, 1)]
    errors = [(model(x).argmax(1) != y).float().mean().item() for _, _, x, y in held]
    assert max(errors) < 0.5, errors
    assert len(summary["silos"]) == 2
    for silo in summary["silos"]:
        (rel,) = silo["releases"]
        # the plan of the example: 5 releases of K = 32 of its n = 240 records, delta = 1e-5
        assert (rel["kind"], rel["count"], rel["n"], rel["batch"]) == ("grad", 5, 240, 32)
        assert rel["sampling"] == "fixed-size without replacement" and silo["delta"] == 1e-5
        eps = sampled_gaussian_epsilon(240, 32, rel["noise_multiplier"], 5, 1e-5)
        assert silo["eps_spent"] == pytest.approx(eps, rel=1e-6)
        assert 3.0 * 0.99 <= eps <= 3.0 * (1 + 1e-9)  # calibrated for its own epsilon = 3, not the run's
        assert silo["eps_budget"] == 3.0 and silo["clip"] == 1.0


# -- (b) the policy mod refuses before the handler ---------------------------------------------------

def guarded_app(user: types.ModuleType) -> tuple[ClientApp, list[int]]:
    """The example's silo behind its policy mod, with a handler that counts its calls."""
    calls: list[int] = []
    app = ClientApp(mods=[user.silo.policy_mod])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        calls.append(1)
        return user.silo.release(msg, ctx)

    return app, calls


def refusal(reply: Message) -> tuple[str, str]:
    found = wire.refusal_of(reply.content)
    assert found is not None, "expected a refusal"
    return found


def ledger_bytes(tmp_path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((tmp_path / "state").rglob("*")) if p.is_file()}


@pytest.mark.parametrize("bad", ["shape", "round-0", "round-past-plan", "phase", "sketch", "lr"])
def test_policy_mod_refuses_a_malformed_instruction_without_calling_the_handler(tmp_path: Path, bad: str) -> None:
    user = example_module()
    app, calls = guarded_app(user)
    ctx = context(tmp_path, run_config(tmp_path))
    user.silo.silo(ctx)  # the silo and its ledger exist (calibrated) before the request
    before = ledger_bytes(tmp_path)
    w = model_arrays()
    msg = {"shape": lambda: train_msg(1, {"linear.weight": w["linear.weight"][:, :29], "linear.bias": w["linear.bias"]}),
           "round-0": lambda: train_msg(0, w),
           "round-past-plan": lambda: train_msg(6, w),  # the silo planned 5 releases
           "phase": lambda: train_msg(1, w, Phase.DIFF, prev=w),  # mbsgd plans no differences
           "sketch": lambda: train_msg(1, w, sketch=RoundSketch("gaussian", 7.0, 0.3, True, 1, 1)),
           "lr": lambda: train_msg(1, w, lr=-1.0)}[bad]()
    code, reason = refusal(app(msg, ctx))
    assert code == wire.REFUSED_CONFIG and reason
    assert calls == [] and ledger_bytes(tmp_path) == before


def test_policy_mod_refuses_an_over_budget_request_without_calling_the_handler(tmp_path: Path) -> None:
    user = example_module()
    app, calls = guarded_app(user)
    ctx = context(tmp_path, run_config(tmp_path))
    for rnd in range(1, 6):  # the whole plan: 5 releases, epsilon ~ 3
        assert wire.refusal_of(app(train_msg(rnd, model_arrays(0.01 * rnd)), ctx).content) is None
    assert len(calls) == 5
    spent, before = user.silo.eps_spent(ctx), ledger_bytes(tmp_path)
    # a sixth release (round 3 again, another model: no replay) would take epsilon past 3
    code, reason = refusal(app(train_msg(3, model_arrays(0.5)), ctx))
    assert code == wire.REFUSED_BUDGET and "budget exceeded" in reason
    assert len(calls) == 5 and ledger_bytes(tmp_path) == before and user.silo.eps_spent(ctx) == spent
    # the ledger, not the mod, is the promise: without the mod the silo refuses it too
    assert wire.refusal_of(user.silo.release(train_msg(3, model_arrays(0.5)), ctx).content)[0] == wire.REFUSED_BUDGET


@pytest.mark.parametrize("node", [{"epsilon-cap": 1.0}, {"algorithms": "spider,svrg"}, {"noise-seed": "sometimes"}])
def test_policy_mod_applies_the_node_policy_before_the_handler(tmp_path: Path, node: dict[str, Any]) -> None:
    user = example_module()
    app, calls = guarded_app(user)
    ctx = context(tmp_path, run_config(tmp_path), node)
    code, reason = refusal(app(train_msg(1, model_arrays()), ctx))
    assert code == wire.REFUSED_POLICY and reason
    assert calls == []
    assert not list((tmp_path / "state").rglob("*.json")) or all(  # nothing was ever released
        '"release"' not in p.read_text() for p in (tmp_path / "state").rglob("*.json"))


def test_the_run_config_cannot_weaken_the_silos_own_plan(tmp_path: Path) -> None:
    """The server writes the run config: asking for no privacy, a huge epsilon and clip, or a
    one-release plan changes nothing the silo calibrates; its noise is the one for its own plan."""
    def planned(cfg: dict[str, Any], where: str) -> list[dict[str, Any]]:
        user = example_module()
        ctx = context(tmp_path / where, cfg)
        assert wire.refusal_of(user.silo.release(train_msg(1, model_arrays()), ctx).content) is None
        report = user.silo.silo(ctx).ledger_report()
        assert (report["eps_budget"], report["delta"], report["clip"], report["batch"]) == (3.0, 1e-5, 1.0, 32)
        return report["planned"]

    honest = planned(run_config(tmp_path), "honest")
    greedy = planned(run_config(tmp_path, **{"privacy.mode": "off", "privacy.epsilon": 1000.0, "privacy.clip": 100.0,
                                             "privacy.delta": 0.5, "privacy.planned-rounds": 1, "batch-size": 1}),
                     "greedy")
    assert greedy == honest and honest[0]["count"] == 5 and honest[0]["noise_multiplier"] > 1.0


def test_policy_mod_refuses_evaluations_the_node_policy_forbids(tmp_path: Path) -> None:
    user = example_module()
    calls: list[int] = []
    app = ClientApp(mods=[user.silo.policy_mod])

    @app.evaluate()
    def evaluate(msg: Message, ctx: Context) -> Message:
        calls.append(1)
        return user.silo.evaluate(msg, ctx)

    ask = wire.EvaluateRequest(1, model_arrays()).encode()
    off = context(tmp_path, run_config(tmp_path), {"evaluation": "off"})
    code, _ = refusal(app(Message(ask, dst_node_id=1, message_type=MessageType.EVALUATE), off))
    assert code == wire.REFUSED_POLICY and calls == []
    # issue 34 section 4: a node config that says open does not open a PrivateSilo's evaluation, nor
    # does a simulation's default: only its constructor (before: the exact training gradient, eps = inf)
    from clients.private_silo import PrivateSilo

    plain = PrivateSilo(user.Net, user.my_records, epsilon=3.0, delta=1e-5, clip=1.0, batch_size=32, rounds=5)
    plain_app = ClientApp(mods=[plain.policy_mod])

    @plain_app.evaluate()
    def plain_evaluate(msg: Message, ctx: Context) -> Message:
        calls.append(2)
        return plain.evaluate(msg, ctx)

    for run_id, node in ((8, {}), (9, {"evaluation": "open"})):
        sim = context(tmp_path / f"sim{run_id}", run_config(tmp_path), node, run_id=run_id)
        got = wire.refusal_of(plain_app(Message(ask, dst_node_id=1, message_type=MessageType.EVALUATE), sim).content)
        assert got is not None and got[0] == wire.REFUSED_POLICY
    assert calls == []
    opened = PrivateSilo(user.Net, user.my_records, epsilon=3.0, delta=1e-5, clip=1.0, batch_size=32, rounds=5,
                         policy={"evaluation": "open"})
    open_ = context(tmp_path / "open", run_config(tmp_path), run_id=10)
    assert wire.refusal_of(opened.evaluate(Message(ask, dst_node_id=1, message_type=MessageType.EVALUATE),
                                           open_).content) is None


# -- (c) the noise never repeats and is the silo's own -------------------------------------------

def test_two_releases_never_share_noise(tmp_path: Path) -> None:
    """Run-seeded (a simulation): the same model in two rounds -> two batches, two noises, keyed
    to the ledger's sequence number, not to anything the server sends."""
    user = example_module()
    ctx = context(tmp_path, run_config(tmp_path))
    a = wire.TrainReply.decode(user.silo.release(train_msg(1, model_arrays()), ctx).content, None).update
    b = wire.TrainReply.decode(user.silo.release(train_msg(2, model_arrays()), ctx).content, None).update
    assert not np.array_equal(a["linear.weight"], b["linear.weight"])


def test_deployed_silo_noise_comes_from_the_os_csprng(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deployment-like (``deployed=True``: noise-seed os by default): two silos given everything
    the server chooses identically (run seed, round, model) and the same records release
    different updates; with the CSPRNG pinned they release the same one, so the difference is
    the OS's randomness and nothing the server knows."""
    def release(where: str) -> np.ndarray:
        user = example_module()
        user.silo.deployed = True
        ctx = context(tmp_path / where, run_config(tmp_path))
        reply = user.silo.release(train_msg(1, model_arrays()), ctx)
        return wire.TrainReply.decode(reply.content, None).update["linear.weight"]

    assert not np.array_equal(release("a"), release("b"))
    import clients.silo

    monkeypatch.setattr(clients.silo.secrets, "randbits", lambda bits: 12345)
    assert np.array_equal(release("c"), release("d"))


# -- (d) the API's release is the built-in silo's, bit for bit --------------------------------------

class UserLogistic(torch.nn.Module):
    """A user's own module of the zoo's logistic layout (written here, not imported from the zoo)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(30, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


@pytest.mark.parametrize("algorithm,sketch", [("mbsgd", None), ("mbsgd", "gaussian"), ("spider", None)])
def test_api_release_equals_the_built_in_silo_bit_for_bit(tmp_path: Path, algorithm: str, sketch: str | None) -> None:
    from app import node_runtime
    from clients.private_silo import PrivateSilo, SketchMod

    cfg = run_config(tmp_path, **{"algorithm": algorithm, "batch-size": 32, "privacy.epsilon": 3.0,
                                  "privacy.delta": 1e-5, "privacy.clip": 1.0, "spider.anchor-batch": 64})
    built_in_ctx = context(tmp_path / "built-in", cfg)
    built_in = node_runtime.silo(built_in_ctx)  # the run config's data (wbcd, silo 0) and zoo model
    d = built_in.data
    api = PrivateSilo(UserLogistic, (d.train_x.clone(), d.train_y.clone(), d.test_x.clone(), d.test_y.clone()),
                      epsilon=3.0, delta=1e-5, clip=1.0, batch_size=32, rounds=5, algorithm=algorithm,
                      options={"spider.anchor-batch": 64}, policy={"noise-seed": "run"})  # reproducible, as asked
    app = ClientApp(mods=[SketchMod(), api.policy_mod])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        return api.release(msg, ctx)

    api_ctx = context(tmp_path / "api", cfg)
    rs = None if sketch is None else RoundSketch(sketch, 0.5, 0.3, True, 99, 1)
    w0, w1 = model_arrays(), model_arrays(0.02)
    phases = [(Phase.ANCHOR, None), (Phase.DIFF, w0)] if algorithm == "spider" else [(Phase.GRAD, None)] * 2
    for rnd, (phase, prev) in enumerate(phases, start=1):
        w = w0 if rnd == 1 else w1
        mine = app(train_msg(rnd, w, phase, prev=prev, sketch=rs), api_ctx).content
        theirs = node_runtime.train(train_msg(rnd, w, phase, prev=prev, sketch=rs).content, built_in_ctx)
        assert wire.refusal_of(mine) is None and wire.refusal_of(theirs) is None
        a = wire.record_to_params(mine.array_records[wire.UPDATE])
        b = wire.record_to_params(theirs.array_records[wire.UPDATE])
        assert list(a) == list(b) == ([wire.SKETCH] if sketch else ["linear.weight", "linear.bias"])
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes()
        assert dict(mine.metric_records[wire.METRICS]) == dict(theirs.metric_records[wire.METRICS])
    # the two ledgers hold the same releases with the same noise multiplier
    assert api.silo(api_ctx).ledger.recorded() == built_in.ledger.recorded()


@pytest.mark.parametrize("algorithm,phase", [("mbsgd", Phase.GRAD), ("localsgd", Phase.LOCAL),
                                             ("proxsgd", Phase.DISJOINT), ("spider", Phase.ANCHOR)])
def test_the_policy_mods_budget_check_prices_the_release_the_ledger_records(tmp_path: Path, algorithm: str,
                                                                           phase: Phase) -> None:
    """The mod's pre-check (the silo mechanism's releases, clients/silo_mechanism.py) and the silo's release must price
    the same ledger rows, or the mod would admit what the ledger refuses (or the reverse)."""
    from clients.private_silo import PrivateSilo

    x = torch.randn(240, 30, generator=torch.Generator().manual_seed(1))
    api = PrivateSilo(UserLogistic, (x, (x[:, 0] > 0).long()), epsilon=3.0, delta=1e-5, clip=1.0, batch_size=32,
                      rounds=5, algorithm=algorithm, options={"local-steps": 3, "spider.anchor-batch": 64})
    ctx = context(tmp_path, run_config(tmp_path, algorithm=algorithm))
    steps = {"local_steps": 3, "lr": 0.1} if phase == Phase.LOCAL else {}
    msg = train_msg(1, model_arrays(), phase, **steps)
    silo = api.silo(ctx)
    ins = wire.Instruction.decode(msg.content)
    predicted = silo.mechanism.releases(ins, silo.plan[ins.phase], silo.disjoint_kind)
    assert api.admission(msg.content, ctx) is None
    assert wire.refusal_of(api.release(msg, ctx).content) is None
    assert silo.ledger.recorded() == predicted
