"""One ``flwr run``: the staged app bundle it ships, and its ``--stream`` output followed until the
run's own summary.json is written (app.launch decides from that summary)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


#: What the app bundle needs: the packages Flower imports and the project file.
APP_SOURCES = ("pyproject.toml", "README.md", ".gitignore", "app", "strategies", "clients")


def stage_app(env: dict[str, str], root: Path = ROOT) -> Path:
    """Copy the app's sources to ``$FLWR_HOME/silofl-app`` (replacing an older copy) and return it."""
    stage = Path(env["FLWR_HOME"]) / "silofl-app"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    copy_app_sources(stage, root)
    return stage


def copy_app_sources(dst: Path, root: Path = ROOT) -> None:
    """Copy :data:`APP_SOURCES` of ``root`` into the existing folder ``dst`` (no caches)."""
    for name in APP_SOURCES:
        src = root / name
        if src.is_dir():
            shutil.copytree(src, dst / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif src.exists():
            shutil.copy2(src, dst / name)


def run_status(run_id: str, env: dict[str, str], superlink: str | None) -> str:
    cmd = ["flwr", "ls", *( [superlink] if superlink else []), "--run-id", run_id, "--format", "json"]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    try:
        runs = json.loads(out.stdout)["runs"]
        return str(runs[0]["status"])
    except (ValueError, KeyError, IndexError):
        return f"unknown ({out.stdout.strip()[:200]} {out.stderr.strip()[:200]})"


def run_summary(path: Path, run_id: str | None) -> dict[str, Any] | None:
    """``path``'s summary if the ServerApp of Flower run ``run_id`` wrote it (a resumed run's
    folder may hold the summary of an earlier attempt), else None."""
    if run_id is None:
        return None
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):  # not there yet, or being replaced
        return None
    return summary if str(summary.get("run_id")) == run_id else None


class RunStream:
    """``flwr run --stream``'s output, echoed line by line from a thread; notes the run id and
    whether the ServerApp's last line (``silofl run NAME completed`` (or ``diverged``,
    ``no-progress``) / ``run FAILED``) went by. ``simulation``: the run is on this checkout's
    local simulation SuperLink (its stage lines name the engine, Ray); on a named SuperLink (a
    deployment's) they name the SuperNodes instead."""

    def __init__(self, proc: subprocess.Popen, name: str, simulation: bool = True) -> None:
        import threading

        self.proc, self.name, self.run_id, self.simulation = proc, name, None, simulation
        self.t0, self.server_started = time.monotonic(), False
        self.last_line = threading.Event()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        from app.run_health import FINISHED

        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if self.run_id is None and (m := re.search(r"Successfully started run (\d+)", line)):
                self.run_id = m.group(1)
                self._stage(f"run {self.run_id} accepted by the SuperLink; starting "
                            + ("the simulation engine (Ray) and the ServerApp" if self.simulation else "the ServerApp"))
            elif not self.server_started and f"[silofl] run {self.name}:" in line:
                self.server_started = True
                self._stage("ServerApp running; " + ("the engine starts the silos' ClientApps for round 1"
                                                      if self.simulation else "the SuperNodes run the silos' ClientApps "
                                                      "for round 1"))
            if any(f"silofl run {self.name} {st}" in line for st in FINISHED) or "[silofl] run FAILED" in line:
                self.last_line.set()

    def _stage(self, what: str) -> None:
        """A start-up stage line (the seconds before round 1 are otherwise silent)."""
        sys.stdout.write(f"[silofl] stage +{time.monotonic() - self.t0:.1f}s: {what}\n")
        sys.stdout.flush()


def follow_run(proc: subprocess.Popen, name: str, summary_path: Path, poll_s: float = 0.1,
               tail_s: float = 5.0, simulation: bool = True) -> tuple[int | None, str | None, dict[str, Any] | None]:
    """Echo ``flwr run --stream`` until the run's summary is written and its last line streamed
    (at most ``tail_s`` after the summary), then end the CLI (only a log stream: the run itself
    has finished and its engine shuts down inside the SuperLink). Returns the CLI's exit code
    (None when it was ended here), the Flower run id and this run's summary (None if none).
    ``simulation``: as :class:`RunStream`."""
    stream = RunStream(proc, name, simulation)
    summary, seen_at = None, None
    while proc.poll() is None:
        if summary is None and (summary := run_summary(summary_path, stream.run_id)) is not None:
            seen_at = time.monotonic()
        if summary is not None and (stream.last_line.is_set() or time.monotonic() - seen_at > tail_s):
            break
        stream.last_line.wait(poll_s) if summary is not None else time.sleep(poll_s)
    rc = proc.poll()
    if rc is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    else:
        stream.thread.join(timeout=5)
    return rc, stream.run_id, summary or run_summary(summary_path, stream.run_id)
