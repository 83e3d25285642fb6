"""README.md's printed numbers are what its commands print (issue 35 section 3).

The embedded default (`make run`), the digits example and the SPIDER example are run through the
real ServerApp and ClientApp on the in-process grid, with the seeds the commands use (the
in-process grid and `flwr run` give the same rounds for the same seeds: tests/test_e2e.py), and
the numbers README.md shows are read out of README.md itself and compared with the runs' own
console line (app.server_app.progress_line) and summaries. Wall times are left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import run

README = Path(__file__).resolve().parents[1] / "README.md"


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _example(marker: str) -> str:
    """The README line of the ``make run`` example whose command contains ``marker``."""
    lines = [line for line in _readme().splitlines() if line.startswith("make run RUN_CONFIG=") and marker in line]
    assert len(lines) == 1, f"README.md: expected one `make run` example with {marker!r}"
    return lines[0]


def _without_wall(line: str) -> str:
    return re.sub(r"\s+\d+\.\d+s$", "", line.strip())


def test_the_default_runs_printed_lines(tmp_path: Path) -> None:
    from app.server_app import progress_line

    block = _readme().split("It prints one line per round and a final summary:", 1)[1].split("```", 2)[1]
    shown = [line for line in block.splitlines() if line.startswith("[silofl] round")]
    assert len(shown) == 1, "README.md shows the last round's line of `make run`"
    summary, rows, _ = run(tmp_path, {})
    assert summary["status"] == "completed" and len(rows) == 25
    assert _without_wall(shown[0]) == _without_wall(progress_line(rows[-1], 25))
    done = next(line for line in block.splitlines() if line.startswith("[silofl] done in"))
    error = re.search(r"test error ([\d.]+)%", done).group(1)
    eps = re.search(r"max eps spent ([\d.]+)\.\.\.", done).group(1)
    assert error == f"{100 * summary['test_error']:.2f}"
    assert str(max(s["eps_spent"] for s in summary["silos"])).startswith(eps)


@pytest.mark.slow
def test_the_digits_example_reaches_the_accuracy_it_states(tmp_path: Path) -> None:
    line = _example('dataset="digits"')
    stated = int(re.search(r"(\d+)%", line.split("#", 1)[1]).group(1))
    summary, rows, _ = run(tmp_path, {"dataset": "digits"})
    assert summary["status"] == "completed"
    assert stated == round(100 * (1 - summary["test_error"]))


@pytest.mark.slow
def test_the_spider_example_prints_the_losses_and_error_it_states(tmp_path: Path) -> None:
    line = _example('algorithm="spider"')
    command, comment = line.split("#", 1)
    first, last, error = re.search(r"loss ([\d.]+) -> ([\d.]+), ([\d.]+)%", comment).groups()
    overrides = dict(item.split("=", 1) for item in re.search(r"RUN_CONFIG='([^']*)'", command).group(1).split())
    cfg = {k: (v.strip('"') if v.startswith('"') else float(v) if "." in v else int(v)) for k, v in overrides.items()}
    summary, rows, _ = run(tmp_path, cfg)
    losses = [r["train_loss"] for r in rows if r.get("train_loss") is not None]
    assert (f"{losses[0]:.2f}", f"{losses[-1]:.2f}") == (first, last)
    assert error == f"{100 * summary['test_error']:.{len(error.split('.')[1])}f}"
