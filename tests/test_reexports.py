"""Names that moved to modules of their own are still reachable where they were (the same objects):
app.launch (the local SuperLink: app.local_superlink; staging and following a flwr run:
app.flwr_run) and app.sweep (one federation: app.federation; results.csv: app.sweep_results;
progress: app.sweep_progress; the engine patches: tests/test_engine_patches.py)."""

from __future__ import annotations

import pytest

MOVED = {
    "app.launch": {
        "app.local_superlink": ["local_superlinks", "LocalSuperLink", "_cmdline_ports", "_local_superlinks",
                                "own_superlink_fast_poll", "stop_own_superlinks", "_descendants", "end_processes",
                                "LOCAL_PORT_ENV", "FLOWER_LOCAL_PORTS", "PORTS_FILE", "port_free", "free_port",
                                "remembered_ports", "own_local_superlink"],
        "app.flwr_run": ["APP_SOURCES", "stage_app", "copy_app_sources", "run_status", "run_summary", "_Stream",
                         "follow_run"],
    },
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
