"""pyproject.toml, conf/config.yaml and docs/configuration.md against the options' declarations
(app.config.OPTIONS): every mismatch as one line, and the lines to paste for a new option.

    python -m app.config_sync                 # list the mismatches (exit 1 if any), with the fix of each
    python -m app.config_sync --write         # pyproject's [tool.flwr.app.config] from the declarations, and
                                              # the keys conf/config.yaml and the docs table lack added

tests/test_options.py runs the same checks. Pure Python (tomllib, yaml): no torch, no Flower.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from app.config import GROUPS, OPTIONS, Settings, flatten_run_config
from app.options import OPTION, Option

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT_TABLE = "[tool.flwr.app.config]"
DOC_SECTION = "## Run-config keys"


def toml_literal(value: Any) -> str:
    """``value`` as a TOML literal (pyproject.toml, the docs table's default column)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same kind (3 is not 3.0: Flower passes the type on)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def owner(key: str) -> str:
    """The file that declares ``key`` (named in the messages)."""
    for cls in (*Settings.__mro__[1:-1], *GROUPS.values()):
        if any(f.metadata.get(OPTION) is OPTIONS[key] for f in fields(cls)):
            return str(Path(inspect.getsourcefile(cls) or "?").resolve().relative_to(ROOT))
    return "app/config.py"


def _compare(where: str, found: dict[str, Any], fix: Callable[[str, Option], str]) -> list[str]:
    out = []
    for key, opt in OPTIONS.items():
        if key not in found:
            out.append(f"{where} lacks {key} (declared in {owner(key)}); add: {fix(key, opt)}")
        elif not _same(found[key], opt.default):
            out.append(f"{where}: {key} = {found[key]!r} but {owner(key)} declares {opt.default!r}; write: "
                       f"{fix(key, opt)}")
    out += [f"{where} has {key}, which no option declares (app.config.OPTIONS)" for key in found if key not in OPTIONS]
    return out


def pyproject_values(root: Path = ROOT) -> dict[str, Any]:
    with (root / "pyproject.toml").open("rb") as fh:
        return flatten_run_config(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def conf_values(root: Path = ROOT) -> dict[str, Any]:
    """conf/config.yaml's run-config nodes (not ``defaults``, ``sweep``, ``hydra``), flattened."""
    import yaml

    raw = yaml.safe_load((root / "conf" / "config.yaml").read_text(encoding="utf-8"))
    raw.pop("defaults", None)
    return flatten_run_config(raw)


def doc_values(root: Path = ROOT) -> dict[str, Any]:
    """The docs table's key -> default (its TOML literal read); an unreadable cell is a string
    that matches nothing."""
    text = (root / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = text.split(DOC_SECTION, 1)[1].split("\n## ", 1)[0]
    out: dict[str, Any] = {}
    for m in re.finditer(r"^\| `([^`]+)` \| `([^`]*)` \|", section, re.M):
        try:
            out[m.group(1)] = tomllib.loads(f"v = {m.group(2)}")["v"]
        except tomllib.TOMLDecodeError:
            out[m.group(1)] = f"<not a TOML literal: {m.group(2)}>"
    return out


def mismatches(root: Path = ROOT) -> list[str]:
    """Every place that disagrees with a declaration, one line each, with the line to write."""
    def yaml_line(key: str, opt: Option) -> str:
        prefix, _, leaf = key.rpartition(".")
        return f"{leaf}: {json.dumps(opt.default)}" + (f" (under {prefix}:)" if prefix else "")

    return (_compare("pyproject.toml [tool.flwr.app.config]", pyproject_values(root),
                     lambda k, o: f"{k} = {toml_literal(o.default)}")
            + _compare("conf/config.yaml", conf_values(root), yaml_line)
            + _compare("docs/configuration.md (Run-config keys)", doc_values(root),
                       lambda k, o: f"| `{k}` | `{toml_literal(o.default)}` | {o.doc} |"))


def pyproject_block(current: dict[str, Any] | None = None) -> str:
    """[tool.flwr.app.config] as the declarations make it: the keys in ``current``'s order (the
    file's), then the new ones in declaration order."""
    keys = [k for k in (current or {}) if k in OPTIONS] + [k for k in OPTIONS if k not in (current or {})]
    return "\n".join([PYPROJECT_TABLE, *(f"{k} = {toml_literal(OPTIONS[k].default)}" for k in keys)]) + "\n"


def write_pyproject(root: Path = ROOT) -> None:
    """Rewrite pyproject's [tool.flwr.app.config] (nothing else) from the declarations."""
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    start = text.index(PYPROJECT_TABLE)
    end = text.find("\n[", start + 1)
    end = len(text) if end < 0 else end + 1
    block = pyproject_block(pyproject_values(root))
    path.write_text(text[:start] + block + "\n" + text[end:].lstrip("\n"), encoding="utf-8")


def yaml_literal(value: Any) -> str:
    """``value`` as a YAML scalar (strings double-quoted, as JSON writes them)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else toml_literal(value)


def write_conf(root: Path = ROOT) -> list[str]:
    """Add the declared keys conf/config.yaml lacks (a ``a.b`` key under its ``a:`` node, made if
    missing) before its sweep settings; values it has are left (a mismatch stays reported)."""
    path = root / "conf" / "config.yaml"
    lines = path.read_text(encoding="utf-8").splitlines()
    have, added = conf_values(root), []
    for key, opt in OPTIONS.items():
        if key in have:
            continue
        node, _, leaf = key.rpartition(".")
        end = next(i for i, line in enumerate(lines) if line.startswith("# The sweep's own settings"))
        while end > 0 and not lines[end - 1].strip():
            end -= 1
        node_line = re.compile(rf"{re.escape(node)}:\s*(#.*)?$")
        head = next((i for i, line in enumerate(lines[:end]) if node and node_line.match(line)), None)
        if head is None:
            new = ([f"{node}:", f"  {leaf}: {yaml_literal(opt.default)}"] if node
                   else [f"{leaf}: {yaml_literal(opt.default)}"])
            lines[end:end] = new
        else:
            last = head
            while last + 1 < len(lines) and lines[last + 1].startswith("  "):
                last += 1
            lines.insert(last + 1, f"  {leaf}: {yaml_literal(opt.default)}")
        added.append(key)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return added


def write_docs(root: Path = ROOT) -> list[str]:
    """Add a row (key, default, the declared one-line doc) for each declared key the docs table
    lacks: after the rows of its group (``spider.*``), else at the end of the table holding its
    switch (``algorithm``), else of the last table; better words are the author's to write."""
    path = root / "docs" / "configuration.md"
    lines = path.read_text(encoding="utf-8").splitlines()
    have, added = doc_values(root), []
    start = lines.index(DOC_SECTION)
    stop = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    for key, opt in OPTIONS.items():
        if key in have:
            continue
        rows = {i: m.group(1) for i in range(start, stop) if (m := re.match(r"\| `([^`]+)` \|", lines[i]))}
        node = key.rpartition(".")[0]
        near = [i for i, k in rows.items() if node and k.startswith(node + ".")]
        if not near and opt.switch is not None:
            near = [i for i, k in rows.items() if k == opt.switch]
            while near and near[-1] + 1 < stop and lines[near[-1] + 1].startswith("|"):
                near.append(near[-1] + 1)
        at = (max(near) if near else max(rows)) + 1
        lines.insert(at, f"| `{key}` | `{toml_literal(opt.default)}` | {opt.doc} |")
        stop += 1
        added.append(key)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return added


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.config_sync", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite pyproject's [tool.flwr.app.config], add the "
                    "keys conf/config.yaml and the docs table lack")
    args = ap.parse_args(argv)
    if args.write:
        write_pyproject()
        for what, keys in (("conf/config.yaml", write_conf()), ("docs/configuration.md", write_docs())):
            if keys:
                print(f"added to {what}: {', '.join(keys)}")
    found = mismatches()
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
