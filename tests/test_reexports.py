"""Each name lives in one place and is imported from there (architecture v4): no module of the
library re-exports names it does not use (``noqa: F401`` lines), no private name is imported
across modules, and no import circle crosses packages. Names that moved (app.sweep's
federation, results and progress pieces; the runtime wing's) are imported from their owners.
Measured by scripts/arch_metrics.py, the project's structure numbers."""

from __future__ import annotations

import pytest

from scripts.arch_metrics import measure


@pytest.fixture(scope="module")
def structure() -> dict:
    return measure()


def test_no_module_re_exports_what_it_does_not_use(structure: dict) -> None:
    assert structure["noqa_f401_lines"] == 0


def test_no_private_name_is_imported_across_modules(structure: dict) -> None:
    assert structure["_private"] == [], structure["_private"][:5]


def test_no_import_circle_crosses_packages(structure: dict) -> None:
    assert structure["import_circles_across_packages"] == 0, structure["_circles"]


def test_moved_names_are_imported_from_their_owners() -> None:
    import app.sweep

    for name in ("engine_env", "simulation_apps", "engine_backend_config", "acting_settings"):
        assert not hasattr(app.sweep, name), f"app.sweep.{name}: import it from its owner"
