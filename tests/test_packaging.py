"""What a pip-installed silofl holds, and what a checkout keeps out of git (issue 35)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def wheel_packages() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]


def test_every_module_the_docs_run_is_in_the_wheel() -> None:
    """Every `python -m <pkg>.…` of README.md and docs/ whose package is this repository's is
    installed with it. Before: scripts/ was not, so a pip-installed user could not run `python
    -m scripts.deploy.make_certs` (docs/deployment-security.md)."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    ours = {m for m in re.findall(r"python -m ([A-Za-z_]\w*)\.", text) if (ROOT / m / "__init__.py").exists()}
    assert "scripts" in ours and ours <= set(wheel_packages()), sorted(ours - set(wheel_packages()))


def test_the_wheel_holds_the_deployment_scripts() -> None:
    """Hatchling's own file selection for the wheel (no build): the deployment scripts, Python
    and shell, are in it; the tests and run outputs are not."""
    wheel = pytest.importorskip("hatchling.builders.wheel", reason="hatchling builds the wheel (pip install hatchling)")
    files = {f.distribution_path for f in wheel.WheelBuilder(str(ROOT)).recurse_included_files()}
    assert {"scripts/deploy/make_certs.py", "scripts/deploy/supernode.sh", "scripts/__init__.py",
            "app/launch.py"} <= files
    assert not any(f.startswith(("tests/", "outputs/", "mlruns/")) for f in files)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_the_local_tracking_store_is_not_committed() -> None:
    """./mlruns (app.tracking's default store) and mlflow.db (MLflow 3's default) are ignored."""
    for path in ("mlruns/0/meta.yaml", "mlflow.db"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0, path
