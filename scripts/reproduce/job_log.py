"""A reproduction script's runs as a JSON-lines log (``runs.jsonl``): one line per finished run,
keyed, so that a rerun skips what is done; shared by the scripts that keep one."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def load_runs(path: Path) -> dict[str, dict[str, Any]]:
    """key -> the run's line, of every run ``path`` holds (empty when it does not exist)."""
    results: dict[str, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            results[row["key"]] = row
    return results


def run_logged(path: Path, results: dict[str, dict[str, Any]], jobs: list[tuple[str, Any]],
               run: Callable[[Any], dict[str, Any]], label: str, describe: Callable[[dict[str, Any]], str]) -> None:
    """Run each (key, job) of ``jobs`` with ``run``; a run that raises is recorded as failed and the
    others go on. Each result goes into ``results`` and, flushed, onto ``path``, with one progress
    line ``[label] i/n key: status <describe(result)>``."""
    with path.open("a") as fh:
        for i, (key, job) in enumerate(jobs, 1):
            try:
                res = run(job)
            except Exception as exc:  # recorded; the other runs go on
                res = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
            results[key] = {"key": key} | res
            fh.write(json.dumps(results[key]) + "\n")
            fh.flush()
            print(f"[{label}] {i}/{len(jobs)} {key}: {res.get('status')} {describe(res)}", flush=True)
