"""A sweep's progress lines: jobs done of the sweep's total (Hydra's basic sweeper's count),
failed, skipped, an ETA from the jobs that ran, and the closing lines."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from typing import Any


class Progress:
    """The sweep's progress in this process (Hydra's basic launcher runs jobs one after another in
    it): jobs done, failed and skipped, the failed ones, and an ETA from the jobs that ran."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.t0 = time.perf_counter()
        self.rows: list[dict[str, Any]] = []
        self.ran_s: list[float] = []

    def record(self, row: Mapping[str, Any], overrides: list[str], seconds: float) -> str:
        """Note one finished job; returns its progress line."""
        self.rows.append(dict(row) | {"overrides": " ".join(overrides)})
        if row.get("status") != "skipped":
            self.ran_s.append(seconds)
        done = len(self.rows)
        counts = {st: sum(r.get("status") == st for r in self.rows) for st in ("failed", "skipped")}
        finished = done - counts["failed"] - counts["skipped"]
        eta = ""
        if self.total is not None and self.ran_s:
            left = max(self.total - done, 0)
            eta = f", ETA {_duration(left * statistics.mean(self.ran_s))}"
        of = f"/{self.total}" if self.total is not None else ""
        return (f"[sweep] progress {done}{of} jobs: {finished} ran to their end, {counts['failed']} failed, "
                f"{counts['skipped']} skipped; elapsed {_duration(time.perf_counter() - self.t0)}{eta}")

    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("status") == "failed"]

    def closing(self) -> list[str]:
        """The sweep's last lines: counts, and one line per failed job (its overrides, its error)."""
        failed = self.failed()
        statuses = sorted({str(r.get("status")) for r in self.rows})
        counts = ", ".join(f"{sum(r.get('status') == st for r in self.rows)} {st}" for st in statuses)
        lines = [f"[sweep] done: {len(self.rows)} jobs ({counts or 'none'}) in "
                 f"{_duration(time.perf_counter() - self.t0)}"]
        for r in failed[:20]:
            lines.append(f"[sweep] FAILED job {r.get('job')} ({r['overrides'] or 'no overrides'}): {r.get('error')}")
        if len(failed) > 20:
            lines.append(f"[sweep] ... and {len(failed) - 20} more failed jobs (status failed in results.csv)")
        return lines


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def sweep_size(argv: list[str], params: Mapping[str, Any] | None) -> int | None:
    """How many jobs Hydra's basic sweeper makes of the config's ``hydra.sweeper.params`` and the
    command line's overrides (their product); None when it cannot tell."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        args = [f"{k}={v}" for k, v in (params or {}).items()]
        args += [a for a in argv if "=" in a and not a.startswith("-")]
        overrides = OverridesParser.create().parse_overrides(args)
        return len(BasicSweeper.split_arguments(overrides, None)[0])
    except Exception:  # a sweep type only Hydra's config loader can expand: no total
        return None
