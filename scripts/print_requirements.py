"""Print the project's dependencies from pyproject.toml, one per line (for `pip install -r`).

``make setup`` installs these first, then the project itself in editable mode without
dependencies (``pip install --no-deps -e .``). ``--dev`` adds the test dependencies, except those
``[tool.silofl] no-deps`` names; ``--no-deps`` prints only those (installed with ``pip install
--no-deps``: byzfl's own requirements include plotting packages its compared parts never import).
"""

import re
import sys
import tomllib
from pathlib import Path

pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
project = pyproject["project"]
no_deps = set(pyproject.get("tool", {}).get("silofl", {}).get("no-deps", []))
dev = project["optional-dependencies"]["dev"]


def name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].strip().lower()


if "--no-deps" in sys.argv:
    deps = [d for d in dev if name(d) in no_deps]
else:
    deps = project["dependencies"] + ([d for d in dev if name(d) not in no_deps] if "--dev" in sys.argv else [])
print("\n".join(deps))
