"""pyproject.toml, conf/config.yaml and docs/configuration.md against the options' declarations
(app.config.OPTIONS): every mismatch as one line, and the lines to paste for a new option.

    python -m app.config_sync                 # list the mismatches (exit 1 if any), with the fix of each
    python -m app.config_sync --write         # rewrite pyproject's [tool.flwr.app.config] from the declarations

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.config_sync", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rewrite pyproject's [tool.flwr.app.config]")
    args = ap.parse_args(argv)
    if args.write:
        write_pyproject()
    found = mismatches()
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
