"""Shared fixtures. Plain helpers (the in-process federation, the analytic Gaussian delta, the
logistic objective, where the Fashion-MNIST files are) live in tests/helpers.py.

Markers (pyproject.toml, [tool.pytest.ini_options]): ``slow`` for tests that run long or many
in-process federations, ``e2e`` for real Flower federations (``flwr run``, the simulation
engine). ``python -m pytest`` runs everything (as CI does); the fast part alone is
``python -m pytest -m "not slow and not e2e"`` (``make test-fast``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run


@pytest.fixture()
def federation(tmp_path: Path):
    """``federation(overrides, hook=None, node_config=None, *, sub="", run_id=1, name="t")``:
    :func:`tests.helpers.run` in this test's ``tmp_path`` (or ``tmp_path / sub``), returning
    (summary, rounds rows, grid)."""

    def _run(overrides: dict[str, Any], hook=None, node_config: dict | None = None, *, sub: str = "",
             run_id: int = 1, name: str = "t") -> tuple[dict, list[dict], Any]:
        return run(tmp_path / sub, overrides, hook, node_config, run_id=run_id, name=name)

    return _run
