"""Names that moved to modules of their own are still reachable where they were (the same objects):
app.sweep (one federation: app.federation; results.csv: app.sweep_results; progress:
app.sweep_progress). The local SuperLink, staging and following a flwr run and the engine patches
are imported from their own modules in app/runtime/ only."""

from __future__ import annotations

import pytest

MOVED = {
    "app.sweep": {
        "app.federation": ["engine_env", "simulation_apps", "engine_backend_config", "run_federation"],
        "app.sweep_results": ["RESULT_FIELDS", "job_key", "ResultsFile", "acting_settings",
                              "same_federation"],
        "app.sweep_progress": ["Progress", "sweep_size"],
    },
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_moved_names_are_the_same_objects_where_they_were(old: str) -> None:
    import importlib

    before = importlib.import_module(old)
    for new, names in MOVED[old].items():
        module = importlib.import_module(new)
        for name in names:
            assert getattr(before, name) is getattr(module, name), f"{old}.{name} is not {new}.{name}"
