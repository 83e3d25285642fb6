"""The server on the run's device (``server-device``, app/server_device.py): which device each
setting gives, the one-line refusal of "cuda" without CUDA (launcher and ServerApp), that the
trust-set gradients and the sketch lifts are computed on the device asked for (PyTorch's "meta"
device stands in for a GPU here: its tensors hold no data, so the copy back to numpy is where it
stops), and that "cpu" reproduces the golden run recorded before the key existed.
GPU against CPU numbers: scripts/bench/server_device_check.py (run on a CUDA machine).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app import launch
from app.config import ConfigError, parse_settings
from app.server_device import server_device
from tests.helpers import run

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture()
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.mark.parametrize("cfg, want", [
    ({}, "cpu"),
    ({"device": "auto"}, "cpu"),
    ({"server-device": "auto"}, "cpu"),
    ({"device": "cuda", "server-device": "cpu"}, "cpu"),
])
def test_the_server_device_follows_the_setting(cfg: dict, want: str, no_cuda) -> None:
    assert server_device(parse_settings(cfg)) == torch.device(want)


def test_the_server_device_follows_device_on_a_cuda_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert server_device(parse_settings({"device": "cuda"})) == torch.device("cuda")
    assert server_device(parse_settings({"device": "cuda", "server-device": "cpu"})) == torch.device("cpu")
    assert server_device(parse_settings({"server-device": "auto"})) == torch.device("cuda")


@pytest.mark.parametrize("cfg, key", [({"server-device": "cuda"}, "server-device"), ({"device": "cuda"}, "device")])
def test_cuda_without_cuda_is_refused_in_one_line(cfg: dict, key: str, no_cuda) -> None:
    with pytest.raises(ConfigError) as info:
        server_device(parse_settings(cfg))
    message = str(info.value)
    assert message.startswith(f'{key} = "cuda" but the server has no CUDA device') and "\n" not in message
    assert 'set server-device = "cpu"' in message


def test_the_launcher_refuses_server_cuda_for_the_local_simulation(tmp_path: Path, no_flower, no_cuda,
                                                                  capsys: pytest.CaptureFixture) -> None:
    code = launch.main(["--run-config", f'outputs-dir="{tmp_path / "out"}" server-device="cuda"'])
    err = capsys.readouterr().err.strip()
    assert code == 2 and 'server-device = "cuda" but the server has no CUDA device' in err
    assert len(err.splitlines()) == 1, err


def test_the_server_app_refuses_before_round_one(tmp_path: Path, no_cuda) -> None:
    """A deployed ServerApp (no launcher): the same line, and no round is run or written."""
    with pytest.raises(ConfigError, match='server-device = "cuda" but the server has no CUDA device'):
        run(tmp_path, {"server-device": "cuda", "num-rounds": 2})
    assert not (tmp_path / "out" / "t" / "rounds.jsonl").exists()


# -- the computations happen on the device asked for --------------------------------------------

ROBUST = {"algorithm": "robust", "aggregator": "gradbant", "partition": "iid", "num-silos": 4, "silos-per-round": 4,
          "model": "logistic", "privacy.mode": "isrl", "batch-size": 32, "trust.size": 60}


def _on_meta(monkeypatch: pytest.MonkeyPatch, cfg: dict):
    """A RobustAggregator whose server device is "meta", and the model w it scores."""
    import strategies.gradbant as gradbant
    from app.models import build_model
    from strategies.replies import NodeRoster

    monkeypatch.setattr(gradbant, "server_device", lambda s: torch.device("meta"))
    s = parse_settings(cfg)
    model = build_model(s.model, (30,), 2)
    layout = {k: tuple(v.shape) for k, v in model.named_parameters()}
    w = {k: v.detach().numpy() for k, v in model.named_parameters()}
    return gradbant.RobustAggregator(s, layout, NodeRoster()), w


@pytest.mark.parametrize("method", ["trust_gradient", "reference", "trust_rows"])
def test_the_trust_set_gradient_is_computed_on_the_server_device(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    import app.privacy.per_sample as per_sample
    import strategies.gradbant as gradbant

    extra = {"reference": {"local-steps": 2}, "trust_rows": {"privacy.mode": "off"}}.get(method, {})  # (no .item())
    agg, w = _on_meta(monkeypatch, ROBUST | extra)
    assert agg.trust.x.device.type == agg.trust.y.device.type == "meta"
    assert {p.device.type for p in agg.model.parameters()} == {"meta"}
    seen: list[tuple[str, ...]] = []
    loss, rows = gradbant.cross_entropy, per_sample.per_sample_grads

    def spy_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append((logits.device.type, y.device.type))
        return loss(logits, y)

    def spy_rows(model, params, x, y, *a, **kw):
        seen.append((x.device.type, y.device.type, *{v.device.type for v in params.values()}))
        return rows(model, params, x, y, *a, **kw)

    monkeypatch.setattr(gradbant, "cross_entropy", spy_loss)
    monkeypatch.setattr(per_sample, "per_sample_grads", spy_rows)
    call = {"trust_gradient": lambda: agg.trust_gradient(w), "reference": lambda: agg.reference(w, 1),
            "trust_rows": lambda: agg.trust_rows(w)}[method]
    with pytest.raises(NotImplementedError, match="meta tensor"):  # the copy back to numpy: data on the device
        call()
    assert seen and all(set(entry) == {"meta"} for entry in seen), seen


def test_sketch_lifts_run_on_the_server_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimiser hands its server device to each round's ReplyReader, which lifts S^T y there
    and returns numpy on the CPU."""
    import strategies.loop as loop
    from strategies import STRATEGIES

    monkeypatch.setattr(loop, "server_device", lambda s: torch.device("meta"))
    s = parse_settings({"sketch.kind": "srht", "model": "logistic"})
    opt = STRATEGIES["mbsgd"](s, {"linear.weight": (2, 30), "linear.bias": (2,)})
    opt.nodes.sample_nodes = lambda grid, rnd: [1, 2]
    reader = opt.open_round(None, 1).reader
    assert reader.device == torch.device("meta")
    seen: list[str] = []

    class Spy:
        payload_size = reader.sketch.payload_size

        def decompress(self, y: torch.Tensor) -> torch.Tensor:
            seen.append(y.device.type)
            return torch.zeros(62)

    reader.sketch = Spy()
    lifted = reader.lift(np.ones(Spy.payload_size, dtype=np.float32))
    assert seen == ["meta"] and {k: v.shape for k, v in lifted.items()} == {"linear.weight": (2, 30),
                                                                           "linear.bias": (2,)}


def test_server_device_cpu_reproduces_the_golden_run(tmp_path: Path) -> None:
    """Grad-BANT with SRHT sketches (trust-set gradients and lifts on the server), recorded in
    tests/golden before server-device existed: bit-identical with server-device = "cpu"."""
    golden = json.loads((GOLDEN / "gradbant-sign-flip-srht.json").read_text())
    summary, rows, _ = run(tmp_path, {"num-rounds": 4, "seed": 3, "server-device": "cpu", "standardize": "pooled"} | golden["config"])
    got = [{k: v for k, v in r.items() if k != "wall_s"} for r in json.loads(json.dumps(rows))]
    from tests.test_golden import _close, platform_signature

    if golden.get("platform") != platform_signature():  # recorded on another machine: test_golden's tolerance
        _close(got, golden["rounds"], "rounds")
        _close(summary["test_error"], golden["summary"]["test_error"], "test_error")
        return
    assert got == golden["rounds"]
    assert summary["test_error"] == golden["summary"]["test_error"]


@pytest.mark.slow
def test_the_device_check_script_runs_on_the_cpu(capsys: pytest.CaptureFixture) -> None:
    """scripts/bench/server_device_check.py --device cpu: the GPU check's path, CPU against CPU,
    where every difference must be exactly 0 (the script's own tolerance on the CPU)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench" / "server_device_check.py"
    spec = importlib.util.spec_from_file_location("server_device_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--device", "cpu"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[server_device_check]")]
    assert len(lines) == 6 + len(module.SKETCHES) + 2 and lines[-1].endswith("all checks passed"), lines
