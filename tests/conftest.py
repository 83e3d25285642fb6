"""Shared fixtures. Plain helpers (the in-process federation, the analytic Gaussian delta, the
logistic objective, where the Fashion-MNIST files are) live in tests/helpers.py.

Markers (pyproject.toml, [tool.pytest.ini_options]): ``slow`` for tests that run long or many
in-process federations, ``e2e`` for real Flower federations (``flwr run``, the simulation
engine). ``python -m pytest`` runs everything (as CI does); the fast part alone is
``python -m pytest -m "not slow and not e2e"`` (``make test-fast``).

``needs_data("fashion-mnist")`` (or "cifar10", "mnist", "tv-fashion-mnist") marks a test that
reads an optional data set: where its files are absent the test is skipped with the reason, so
the README's test command passes on a fresh machine. ``SILOFL_REQUIRE_DATA`` (comma-separated
names, or "all"; .ci/run sets it for the data CI installs) makes such a test fail instead.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import FlowerStarted, missing_data, run


def pytest_configure(config: pytest.Config) -> None:
    """Hydra's options for the registered algorithms and rules without a file in conf/ (as app.sweep)."""
    from app.config import ALGORITHMS
    from app.hydra_options import register
    from strategies.options import AGGREGATORS

    register(ALGORITHMS, AGGREGATORS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests whose optional data is absent (those of SILOFL_REQUIRE_DATA run, and fail)."""
    import os

    required = {n.strip() for n in os.environ.get("SILOFL_REQUIRE_DATA", "").split(",") if n.strip()}
    absent: dict[str, str | None] = {}
    for item in items:
        for mark in item.iter_markers("needs_data"):
            for name in mark.args:
                if name not in absent:
                    absent[name] = missing_data(name)
                reason = absent[name]
                if reason is not None and not (name in required or "all" in required):  # required: it runs, and fails
                    item.add_marker(pytest.mark.skip(reason=f"needs {name}: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def _stop_the_local_superlinks_this_session_started():
    """The e2e tests run the launcher, which starts this checkout's local simulation SuperLink
    (Flower starts it detached and leaves it for the next run). At the end of the session the
    ones started during it are stopped, by pid, with their run processes; one that ran before
    the session is left alone, and so is every other checkout's."""
    from app import launch
    from app.runtime import local_superlink

    env = launch.flower_env()
    before = {pid for pid, _ in local_superlink.own_superlink_fast_poll(env)}
    yield
    local_superlink.stop_own_superlinks(env, keep=before)


@pytest.fixture()
def federation(tmp_path: Path):
    """``federation(overrides, hook=None, node_config=None, *, sub="", run_id=1, name="t")``:
    :func:`tests.helpers.run` in this test's ``tmp_path`` (or ``tmp_path / sub``), returning
    (summary, rounds rows, grid)."""

    def _run(overrides: dict[str, Any], hook=None, node_config: dict | None = None, *, sub: str = "",
             run_id: int = 1, name: str = "t") -> tuple[dict, list[dict], Any]:
        return run(tmp_path / sub, overrides, hook, node_config, run_id=run_id, name=name)

    return _run


@pytest.fixture()
def no_flower(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher may validate, but never start a SuperLink or ``flwr run``: each would raise
    FlowerStarted."""
    from app import launch

    def refuse(*a, **k):
        raise FlowerStarted("the launcher started Flower")

    class NoProcesses:  # the launcher's own view of subprocess; torch & co. keep the real one
        def __getattr__(self, name: str) -> Any:
            return getattr(subprocess, name)

    for name in ("Popen", "run", "call", "check_call", "check_output"):
        setattr(NoProcesses, name, staticmethod(refuse))
    for name in ("own_local_superlink", "stage_app"):
        monkeypatch.setattr(launch, name, refuse)
    monkeypatch.setattr(launch, "subprocess", NoProcesses())
