"""The scripts are modules of the ``scripts`` package, run from the repository root as
``python -m scripts.<folder>.<name>``: none edits ``sys.path``, none imports a sibling by its bare
name (which works only when the script's own folder happens to be ``sys.path[0]``), and every
command the docs give names a module that exists."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "scripts").rglob("*.py") if "noop_app" not in p.parts)
DOCS = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md"))]


def _edits_sys_path(tree: ast.AST) -> list[int]:
    """Lines that change sys.path: sys.path.insert/append/extend/remove/... or sys.path = ..."""
    def is_sys_path(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys")

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value):
            lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines += [node.lineno for t in targets if is_sys_path(t)]
    return sorted(lines)


def test_no_script_edits_sys_path_or_imports_a_sibling_by_bare_name() -> None:
    edits, bare = [], []
    for path in SCRIPTS:
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(ROOT)
        edits += [f"{rel}:{n}" for n in _edits_sys_path(tree)]
        siblings = {p.stem for p in path.parent.glob("*.py")} - {"__init__"}
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            bare += [f"{rel}:{node.lineno} {n}" for n in names if n.split(".")[0] in siblings]
    assert edits == [], f"sys.path edited in {edits}"
    assert bare == [], f"siblings imported by bare name (use scripts.<folder>.<name>): {bare}"


def test_the_checks_see_a_sys_path_edit() -> None:
    code = "import sys\nsys.path.insert(0, 'x')\nsys.path = []\nsys.path += ['y']\nprint(sys.path[0])\n"
    assert _edits_sys_path(ast.parse(code)) == [2, 3, 4]


def test_every_script_command_in_the_docs_names_an_existing_module() -> None:
    """``python -m scripts.bench.startup`` names scripts/bench/startup.py; no page still gives the
    file form ``python scripts/<folder>/<name>.py``."""
    missing, file_form = [], []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for folder, name in re.findall(r"-m scripts\.(\w+)\.(\w+)", text):
            if not (ROOT / "scripts" / folder / f"{name}.py").is_file():
                missing.append(f"{doc.name}: scripts.{folder}.{name}")
        file_form += [f"{doc.name}: {m}" for m in re.findall(r"python3?\s+scripts/\w+/\w+\.py", text)]
    assert missing == [] and file_form == [], (missing, file_form)


@pytest.mark.parametrize("module", ["scripts.deploy.make_node_key", "scripts.bench.startup",
                                    "scripts.bench.deployed_round", "scripts.bench.gpu_run"])
def test_a_script_runs_as_a_module_from_the_repository_root(module: str) -> None:
    """The scripts that used to edit sys.path (or lean on their folder being on it) start as modules
    with no PYTHONPATH; sdp_report and sketch_distortion (heavy imports) are covered by the import
    check above and by tests/test_bench_smoke.py."""
    env = {"PATH": str(Path(sys.executable).parent), "FLWR_TELEMETRY_ENABLED": "0"}
    out = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout
