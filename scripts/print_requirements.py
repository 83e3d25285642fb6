"""Print the project's dependencies from pyproject.toml, one per line (for `pip install -r`).

``make setup`` installs these first, then the project itself in editable mode without
dependencies (``pip install --no-deps -e .``). ``--dev`` adds the test dependencies.
"""

import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
deps = project["dependencies"] + (project["optional-dependencies"]["dev"] if "--dev" in sys.argv else [])
print("\n".join(deps))
