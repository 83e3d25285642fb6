"""The ClientApp is thin: Flower 1.42's SuperNode starts a fresh ``flwr-clientapp`` process for
every message, so whatever ``import app.client_app`` loads is paid for every message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "scipy", "matplotlib", "hydra", "sklearn", "dp_accounting", "opacus", "pandas")


def _loaded_after(module: str, before: str = "", env: dict[str, str] | None = None, then: str = "") -> list[str]:
    """The heavy packages loaded by importing ``module`` in a fresh process (after the
    statement ``before``, e.g. what Flower's process has imported when it loads the app), and
    by the statement ``then`` after it."""
    code = (f"{before or 'pass'}; import sys; pre = set(sys.modules); import {module}; {then or 'pass'}; "
            f"print(sorted({{m.split('.')[0] for m in set(sys.modules) - pre if m.split('.')[0] in {HEAVY!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PATH": str(Path(sys.executable).parent), "FLWR_TELEMETRY_ENABLED": "0",
                              "PYTHONPATH": str(ROOT), **(env or {})})
    assert out.returncode == 0, out.stderr
    return eval(out.stdout.strip().splitlines()[-1])  # a list literal of module names


def test_client_app_imports_nothing_heavy() -> None:
    assert _loaded_after("app.client_app") == []


def test_what_the_simulation_engine_imports_first_is_light() -> None:
    """The engine's processes load the ClientApp before the first message: Flower's simulation
    process (to check it loads; with SILOFL_FAST_POLL it also applies app.runtime.engine_patches' poll patch
    there) and each Ray actor (to unpickle the first message). None of it loads torch,
    scipy.stats, matplotlib or hydra; the silo's imports wait for the first message."""
    engine = "import flwr.server.superlink.fleet.vce.vce_api"
    assert _loaded_after("app.client_app", before=engine) == []
    assert _loaded_after("app.client_app", before=engine, env={"SILOFL_FAST_POLL": "1"}) == []
    # the in-process sweep: its ServerApp/ClientApp wrappers and engine patches (hydra: only in main)
    assert _loaded_after("app.sweep") == []
    assert _loaded_after("app.runtime.engine_patches") == []  # what the ClientApp imports in the engine's process
    assert _loaded_after("app.launch") == []


def test_client_app_adds_only_its_protocol_to_flower() -> None:
    """Beyond Flower itself, importing the ClientApp loads app.client_app, app.node_context (standard
    library only: is this a deployed process, where is the node's state) and app.runtime.silo_protocol
    (the socket protocol; app.runtime itself is a docstring and a constant), nothing of the silo."""
    code = ("import sys, flwr.app, flwr.clientapp, flwr.common.serde; before = set(sys.modules); "
            "import app.client_app; print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in "
            "('app', 'clients', 'strategies')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout.strip()) == ["app", "app.client_app", "app.node_context", "app.runtime",
                                        "app.runtime.silo_protocol"]


def test_node_runtime_loads_no_torch_nor_accounting_before_a_message_needs_them() -> None:
    """What the first message in a ``flwr-clientapp`` process imports (app.node_runtime: roles,
    settings, the wire, the ledger's types) loads neither torch (the silo imports it when a
    message builds one) nor dp-accounting or scipy (imported where an epsilon is computed)."""
    assert _loaded_after("app.node_runtime") == []
    # the pieces it is made of, each on its own: the wire and the round's sketch spec, the ledger
    for module in ("app.wire", "app.sketch", "app.sketch.broadcast", "app.admission", "app.privacy.ledger",
                   "app.privacy.accounting", "clients.shuffler"):
        assert _loaded_after(module) == [], module


def test_messages_that_need_no_silo_load_no_torch(tmp_path: Path) -> None:
    """A deployed node's ``flwr-clientapp`` process answers one message: the shuffler's keys
    query and a silo's identity query build no silo, so they load no torch, scipy or dp-accounting."""
    contexts = ("from flwr.app import Context, RecordDict; from app.launch import default_run_config; "
                "cfg = default_run_config(); "
                f"shuffler = Context(run_id=7, node_id=1, node_config={{'role': 'shuffler', 'state-dir': {str(tmp_path)!r}}}, "
                "state=RecordDict(), run_config=cfg | {'privacy.mode': 'shuffle'}); "
                "silo = Context(run_id=7, node_id=2, node_config={'partition-id': 0, 'num-partitions': 2}, "
                "state=RecordDict(), run_config=cfg)")
    answers = ("from app.node_runtime import handle; "
               "assert 'keys' in handle('query.keys', RecordDict(), shuffler, deployed=True); "
               "assert 'identity' in handle('query.identity', RecordDict(), silo, deployed=True)")
    assert _loaded_after("app.node_runtime", before=contexts, then=answers) == []


def test_sketch_package_names_resolve_on_first_use() -> None:
    """app.sketch loads its compressors on first access (PEP 562); every public name resolves,
    to the object its submodule defines."""
    import importlib

    import app.sketch as sketch

    for name, module in sketch._WHERE.items():
        assert getattr(sketch, name) is getattr(importlib.import_module(f"app.sketch.{module}"), name), name
    assert sorted(sketch.__all__) == sorted(sketch._WHERE)


def test_query_names_match_the_wire() -> None:
    """client_app spells the query actions itself (app.wire imports torch); they are wire's."""
    import app.client_app as client_app
    from app import node_runtime, wire

    assert (client_app.LEDGER, client_app.IDENTITY, client_app.KEYS, client_app.SHUFFLE) == (
        wire.LEDGER, wire.IDENTITY, wire.KEYS, wire.SHUFFLE)
    registered = set(client_app.app._registered_funcs)  # "train.default", "query.ledger", ...
    served = {t if "." in t else f"{t}.default" for t in node_runtime.HANDLERS}
    assert registered == served


def test_byzantine_silos_load_scipy_only_for_alie() -> None:
    assert "scipy" not in _loaded_after("clients.byzantine")
    assert "scipy" not in _loaded_after("app.attacks")
