"""Structure metrics of the library, from its own source (nothing is imported or run).

    python -m scripts.arch_metrics            # a table
    python -m scripts.arch_metrics --json     # the same numbers as JSON
    python -m scripts.arch_metrics --cycles   # also list every import circle

What it counts (app/, strategies/, clients/; tests and scripts are not the library):
- **import circles**: strongly connected components of the module import graph (every
  ``import``/``from ... import``, at module level, inside functions and under TYPE_CHECKING: each
  is a dependency a reader must hold); ``across packages``: circles whose modules live in more than
  one package folder.
- **arrows back up**: imports against the layers of ../shared/DESIGN.md §2/§7, from the bottom:
  the base layer (``app/``), ``strategies/`` and ``clients/`` (which never import each other), the
  assembler of the root Settings (``app/config.py`` and its companions) and the entrypoints. An
  arrow from a lower layer to a higher one, or between strategies and clients, runs back up.
- **library functions taking the root Settings**: functions outside the entrypoints and the
  assembler with a parameter annotated ``Settings`` (the root class of app/config.py).
- **private names imported across modules**: ``from m import _name`` between project modules.
- lines (library and entrypoints), the largest module and the largest function.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "strategies", "clients")

#: modules that parse the run/node config and build the objects (DESIGN.md §7's entrypoints)
#: and the operator commands; ``*`` ends a prefix
ENTRYPOINTS = (
    "app.server_app", "app.client_app", "app.node_runtime", "app.launch", "app.sweep", "app.federation",
    "app.local_grid", "app.ledger", "app.data.__main__", "app.report.__main__", "app.silo_service",
    "app.runtime.silo_service", "app.runtime.executor", "app.executor",
)
#: the assembler of the root Settings from the owners' declarations
ASSEMBLER = ("app.config", "app.config_robust", "app.config_sync", "app.hydra_options")

LAYER_NAMES = {0: "base", 1: "strategies", 2: "clients", 3: "assembler", 4: "entrypoints"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[module_name(path)] = path
    return out


def layer(mod: str) -> int:
    if mod in ENTRYPOINTS:
        return 4
    if mod in ASSEMBLER:
        return 3
    if mod.startswith("strategies"):
        return 1
    if mod.startswith("clients"):
        return 2
    return 0


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(mod: str, path: Path, known: Iterable[str]) -> tuple[set[str], list[tuple[str, str]]]:
    """The project modules ``mod`` imports, and the private names it takes from them."""
    known = set(known)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    targets: set[str] = set()
    private: list[tuple[str, str]] = []

    def nearest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (hit := nearest(alias.name)) and hit != mod:
                    targets.add(hit)
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(mod, is_pkg, node)
            if src.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                sub = f"{src}.{alias.name}"
                hit = sub if sub in known else nearest(src)
                if hit and hit != mod:
                    targets.add(hit)
                if alias.name.startswith("_") and not alias.name.startswith("__") and sub not in known:
                    private.append((src, alias.name))
    return targets, private


def sccs(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out, key=len, reverse=True)


def settings_functions(mod: str, path: Path) -> list[str]:
    """Functions of ``mod`` with a parameter annotated with the root ``Settings``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for a in args:
                ann = a.annotation
                text = ast.unparse(ann) if ann is not None else ""
                if text.strip("'\"").split("|")[0].strip() in ("Settings", "config.Settings", "app.config.Settings"):
                    found.append(f"{mod}.{node.name}")
                    break
    return found


def functions(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(n.end_lineno - n.lineno + 1, n.name) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def measure() -> dict:
    mods = modules()
    graph: dict[str, set[str]] = {}
    private: list[str] = []
    for mod, path in mods.items():
        targets, priv = imports(mod, path, mods)
        graph[mod] = targets
        private += [f"{mod} <- {src}.{name}" for src, name in priv]
    circles = sccs(graph)
    across = [c for c in circles if len({m.rpartition(".")[0] or m for m in c}) > 1]
    back = sorted(f"{a} -> {b}" for a, ts in graph.items() for b in ts
                  if layer(b) > layer(a) or {layer(a), layer(b)} == {1, 2})
    library = [m for m in mods if layer(m) < 3]
    takes = [f for m in library for f in settings_functions(m, mods[m])]
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in mods.items()}
    funcs = [(n, f"{m}.{name}") for m, p in mods.items() for n, name in functions(p)]
    largest_fn = max(funcs)
    noqa = sum(p.read_text(encoding="utf-8").count("noqa: F401") for p in mods.values())
    return {
        "modules": len(mods),
        "lines_total": sum(lines.values()),
        "lines_library": sum(lines[m] for m in library),
        "import_circles": len(circles),
        "import_circle_sizes": [len(c) for c in circles],
        "import_circles_across_packages": len(across),
        "arrows_back_up": len(back),
        "library_modules_importing_config": sorted(m for m in library if "app.config" in graph[m]),
        "library_functions_taking_settings": len(takes),
        "private_names_imported_across_modules": len(private),
        "noqa_f401_lines": noqa,
        "largest_module": max((n, m) for m, n in lines.items()),
        "largest_function": largest_fn,
        "_circles": circles,
        "_back": back,
        "_takes": takes,
        "_private": private,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cycles", action="store_true", help="list every circle, back arrow, Settings taker and private import")
    args = ap.parse_args(argv)
    m = measure()
    if args.json:
        print(json.dumps({k: v for k, v in m.items() if args.cycles or not k.startswith("_")}, indent=1))
        return 0
    for key, value in m.items():
        if key.startswith("_"):
            continue
        if key == "library_modules_importing_config":
            value = f"{len(value)}  {', '.join(value)}" if value else 0
        print(f"{key:40s} {value}")
    if args.cycles:
        for title, key in (("circle", "_circles"), ("back", "_back"), ("settings", "_takes"), ("private", "_private")):
            for item in m[key]:
                print(f"{title}: {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
