"""Helpers shared by several test modules (tests/conftest.py turns ``run`` into the
``federation`` fixture). Import them from here, never from another test module."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import norm

#: Fashion-MNIST idx files of the Debian package dataset-fashion-mnist (installed by .ci/run).
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
HAS_FASHION = os.path.isdir(FASHION_DIR)


def missing_data(name: str) -> str | None:
    """Why the optional data set ``name`` cannot be read from its default place on this machine
    (None when its files are there): Fashion-MNIST's idx files (Debian package
    dataset-fashion-mnist), torchvision's MNIST / Fashion-MNIST / CIFAR-10 files under
    app.data.sources.DEFAULT_TORCHVISION_ROOT. For ``@pytest.mark.needs_data(name)``."""
    from app.data import sources

    if name == "fashion-mnist":
        folder = Path(sources.FASHION_MNIST_DIR)
        stems = [stem for pair in sources._FASHION_FILES for stem in pair]
        absent = [s for s in stems if not any((folder / f"{s}{ext}").is_file() for ext in ("", ".gz"))]
        return (f"Fashion-MNIST is not in {folder} (missing {', '.join(absent)}; install the Debian package "
                "dataset-fashion-mnist)") if absent else None
    if name in sources._TV:
        cls_name, sub, _ = sources._TV[name]
        folder = Path(sources.DEFAULT_TORCHVISION_ROOT).expanduser() / sub
        return None if folder.is_dir() and any(folder.iterdir()) else (
            f"{name} is not in {folder} (torchvision.datasets.{cls_name}'s files)")
    raise ValueError(f"needs_data: {name!r} is not an optional data set")


def run(tmp_path: Path, overrides: dict[str, Any], hook=None, node_config: dict | None = None, *,
        run_id: int = 1, name: str = "t", batched: bool = False) -> tuple[dict, list[dict], Any]:
    """One federation of the real ServerApp and ClientApp on the in-process grid (no Flower
    runtime): the pyproject defaults with ``overrides``, outputs under ``tmp_path/out/<name>``,
    the silos' state (ledgers) under ``tmp_path/state``. Returns (summary.json, the rows of
    rounds.jsonl, the grid with every message sent). ``batched``: the batched simulation path
    (app/privacy/row_batcher.py)."""
    from app.launch import merged_run_config
    from app.local_grid import run_local
    from app.results import load_rounds

    from app.server_app import NothingTrained

    cfg = merged_run_config([]) | {"outputs-dir": str(tmp_path / "out"), "run-name": name} | overrides
    try:
        grid = run_local(cfg, str(tmp_path / "state"), run_id=run_id, hook=hook, node_config=node_config,
                         batched=batched)
    except NothingTrained as exc:  # the run wrote its outputs (status "failed"): the test reads them
        grid = exc.grid  # type: ignore[attr-defined]
    out = tmp_path / "out" / name
    return json.loads((out / "summary.json").read_text()), load_rounds(out / "rounds.jsonl"), grid


def without_wall(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rounds.jsonl rows without ``wall_s`` (the one field that differs between two runs of the
    same seeds)."""
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def analytic_gaussian_delta(sigma: float, sensitivity: float, eps: float) -> float:
    """Balle & Wang (2018), Theorem 8: the exact delta(eps) of the Gaussian mechanism."""
    a = sensitivity / (2 * sigma)
    b = eps * sigma / sensitivity
    return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b)


def logistic_objective(settings, lam: float):
    """F(w) = (1/N) sum_i mean_{x in silo i} CE(w; x) + (lam/2)||w||^2 for logistic regression
    with 2 outputs: the objective the federation minimises (uniform average over silos)."""
    import torch

    from app.data.federated import build_federated_data

    fed = build_federated_data(settings, settings.seed, settings.robust.trust_size)
    data = [(s.train_x.double(), s.train_y) for s in fed.silos]

    def f(theta: np.ndarray) -> tuple[float, np.ndarray]:
        t = torch.tensor(theta, requires_grad=True)
        W, b = t[:60].reshape(2, 30), t[60:]
        loss = sum(torch.nn.functional.cross_entropy(x @ W.T + b, y) for x, y in data) / len(data)
        loss = loss + lam / 2 * (t ** 2).sum()
        loss.backward()
        return float(loss.detach()), t.grad.numpy()

    return f


class FlowerStarted(Exception):
    """The launcher went on to start a Flower process (raised by the ``no_flower`` fixture)."""


def service_node_config(state: Path) -> str:
    """The node config the silo-service tests start ``python -m app.runtime.silo_service`` with."""
    return (f"partition-id=0 num-partitions=2 state-dir='{state}' noise-seed='run' evaluation='open' "
            "epsilon-cap=3.0 ledger-scope='run'")


def service_env(home: Path) -> dict[str, str]:
    """The environment of a silo service a test starts (its own FLWR_HOME, no telemetry)."""
    return dict(os.environ) | {"FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1",
                               "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONUNBUFFERED": "1"}


def silo_down_hook(node_index: int):
    """A grid hook (:func:`run`'s ``hook``): silo ``node_index`` answers every train message with
    an error, as a node that went down would."""
    from flwr.app import Error, Message

    def hook(nid: int, msg, reply):
        if nid == 1000 + node_index and msg.metadata.message_type == "train":
            return Message(Error(code=0, reason="silo down"), reply_to=msg)
        return reply

    return hook


def refusal_bytes(content) -> bytes:
    """What a node sends back, as Flower serialises it, less the ledger's witness (a MAC'd summary
    of the ledger: its entries' hash, id and key are the node's own randomness, so two nodes'
    witnesses differ whatever their records); the witness is checked to hold only the ledger's
    own counts, hash, id and MAC, no record."""
    from flwr.app import RecordDict
    from flwr.common.serde import recorddict_to_proto

    from app import wire

    for text in wire.witnesses_of(content):
        doc = text if isinstance(text, dict) else json.loads(text)
        assert set(doc) <= {"w", "entries", "epoch", "eps_spent", "head", "id", "ledger", "mac", "releases"}, doc
    kept = RecordDict({k: v for k, v in content.items() if k != wire.WITNESS})
    return recorddict_to_proto(kept).SerializeToString()


@__import__("contextlib").contextmanager
def stub_services():
    """Start silo services in threads, each answering with a stand-in runtime: yields
    ``start(runtime, **limits)`` -> the running app.runtime.silo_service.SiloService (its socket in a new
    temporary folder); every service started is stopped and its folder removed at the end."""
    import shutil
    import tempfile
    import threading

    from app.runtime import silo_protocol, silo_service

    services = []

    def start(runtime, **limits):
        path = Path(tempfile.mkdtemp(prefix="silostub")) / "s.sock"
        svc = silo_service.SiloService(path, {"partition-id": 0}, **limits)
        svc.runtime, svc.types = runtime, frozenset(runtime.HANDLERS) | {silo_protocol.PING}
        svc.bind()
        thread = threading.Thread(target=svc.serve_forever, daemon=True)
        thread.start()
        services.append((svc, thread))
        return svc

    try:
        yield start
    finally:
        for svc, thread in services:
            svc.stopping = True
            thread.join(10)
            shutil.rmtree(Path(svc.path).parent, ignore_errors=True)


def wait_for_service(proc, sock: Path, log: Path, wait_s: float) -> None:
    """Until the silo service ``proc`` answers a ping on ``sock`` (its output in ``log``); the test
    fails if it exits or does not answer within ``wait_s`` seconds."""
    import time

    from app.runtime import silo_protocol

    deadline = time.monotonic() + wait_s
    while True:
        assert proc.poll() is None, f"the service exited: {log.read_text()}"
        try:
            silo_protocol.ping(str(sock), timeout=1.0)
            return
        except (silo_protocol.ServiceUnavailable, silo_protocol.ServiceError):
            assert time.monotonic() < deadline, f"no service: {log.read_text()}"
            time.sleep(0.1)
