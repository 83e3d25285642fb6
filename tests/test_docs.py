"""The documentation cannot drift from the code: the run-config reference in
docs/configuration.md has exactly the keys of ``app.config.SCHEMA`` with the defaults of
pyproject.toml's ``[tool.flwr.app.config]``, the node-config keys match what the ClientApp and the
node policy read, the README stays a short front door with the test command CI runs, and every
relative link resolves to a file (and heading) inside the repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from app.config import SCHEMA
from app.privacy.policy import POLICY_KEYS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIG_DOC = DOCS / "configuration.md"
DOC_FILES = [README, *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TICKED = re.compile(r"`([^`]+)`")


# ----------------------------------------------------------------------------- helpers

def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next level-2 heading)."""
    lines = text.splitlines()
    try:
        start = lines.index(f"## {heading}")
    except ValueError:
        pytest.fail(f"docs/configuration.md has no '## {heading}' section")
    body = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        body.append(line)
    return "\n".join(body)


def _table_rows(section: str) -> list[list[str]]:
    """Data rows of every markdown table in ``section`` (header and separator rows dropped)."""
    rows = []
    lines = section.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            continue
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", nxt.strip()):
            continue  # a header row (the separator follows it)
        rows.append(cells)
    return rows


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def _pyproject_defaults() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        return _flatten(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def _run_config_rows() -> list[list[str]]:
    rows = _table_rows(_section(CONFIG_DOC.read_text(encoding="utf-8"), "Run-config keys"))
    assert len(rows) >= 10, "docs/configuration.md: the run-config key table was not found"
    return rows


def _single_ticked(cell: str, what: str, row: list[str]) -> str:
    ticked = TICKED.findall(cell)
    assert len(ticked) == 1 and cell == f"`{ticked[0]}`", (
        f"docs/configuration.md: the {what} cell of row {row} must be exactly one backticked value, got {cell!r}")
    return ticked[0]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = _slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    return LINK.findall(text) + IMAGE.findall(text)


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I))


# ----------------------------------------------------------------------------- (1) keys

def test_run_config_table_has_exactly_the_schema_keys():
    keys = [_single_ticked(row[0], "key", row) for row in _run_config_rows()]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    assert not dupes, f"docs/configuration.md lists these keys twice: {dupes}"
    unknown = sorted(set(keys) - set(SCHEMA))
    assert not unknown, f"docs/configuration.md documents keys that app.config.SCHEMA does not have: {unknown}"
    missing = [k for k in SCHEMA if k not in keys]
    assert not missing, f"docs/configuration.md does not document these SCHEMA keys: {missing}"


def test_every_dotted_or_dashed_key_in_the_first_column_is_a_schema_key():
    for row in _run_config_rows():
        for token in TICKED.findall(row[0]):
            if "." in token or "-" in token:
                assert token in SCHEMA, f"docs/configuration.md: {token!r} is not a run-config key"


# ----------------------------------------------------------------------------- (2) defaults

def test_run_config_table_defaults_are_the_pyproject_literals():
    defaults = _pyproject_defaults()
    assert set(defaults) == set(SCHEMA), "pyproject.toml's [tool.flwr.app.config] and app.config.SCHEMA differ"
    for row in _run_config_rows():
        assert len(row) >= 3, f"docs/configuration.md: row {row} needs key, default and meaning"
        key = _single_ticked(row[0], "key", row)
        literal = _single_ticked(row[1], "default", row)
        try:
            documented = tomllib.loads(f"v = {literal}")["v"]
        except tomllib.TOMLDecodeError:
            pytest.fail(f"docs/configuration.md: the default of {key} ({literal!r}) is not a TOML literal")
        actual = defaults[key]
        assert type(documented) is type(actual) and documented == actual, (
            f"docs/configuration.md: {key} defaults to {literal} there but to {actual!r} in pyproject.toml")
        assert row[2], f"docs/configuration.md: {key} has no meaning"


def test_the_literal_check_is_strict():
    """The comparison distinguishes the TOML literals a careless edit would confuse."""
    parse = lambda lit: tomllib.loads(f"v = {lit}")["v"]  # noqa: E731
    same = lambda a, b: type(a) is type(b) and a == b  # noqa: E731
    assert not same(parse('"auto"'), parse('"Auto"'))
    assert not same(parse("0"), parse("0.0"))
    assert not same(parse("true"), parse('"true"'))
    assert not same(parse("1"), parse("true"))
    assert same(parse("600.0"), 600.0)


# ----------------------------------------------------------------------------- node config

def _node_keys_read_by_the_code() -> set[str]:
    src = "\n".join((ROOT / "app" / name).read_text(encoding="utf-8")
                    for name in ("client_app.py", "node_context.py", "node_runtime.py", "runtime/silo_service.py",
                                 "runtime/silo_protocol.py"))
    read = set(re.findall(r"node(?:_config)?(?:\.get\(|\[)\s*\"([a-z][a-z-]*)\"", src))
    read |= set(re.findall(r"\"([a-z][a-z-]*)\" not in node\b", src))
    assert {"partition-id", "state-dir"} <= read, "could not find the node-config keys in app/node_runtime.py"
    return read | set(POLICY_KEYS)


def test_node_config_keys_are_documented_and_real():
    known = _node_keys_read_by_the_code()
    rows = _table_rows(_section(CONFIG_DOC.read_text(encoding="utf-8"), "Node-config keys"))
    documented = {t for row in rows for t in TICKED.findall(row[0])}
    assert documented - known == set(), f"docs/configuration.md: unknown node-config keys {documented - known}"
    assert known - documented == set(), f"docs/configuration.md: undocumented node-config keys {known - documented}"
    deploy = (DOCS / "deployment.md").read_text(encoding="utf-8")
    policy_rows = [r for r in _table_rows(deploy) if r and TICKED.findall(r[0])]
    in_policy_table = {t for row in policy_rows for t in TICKED.findall(row[0])}
    assert set(POLICY_KEYS) <= in_policy_table, (
        f"docs/deployment.md's policy table misses {set(POLICY_KEYS) - in_policy_table}")


# ----------------------------------------------------------------------------- (3), (6) README

def test_readme_is_a_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; keep it at most 150 and move reference to docs/"


def test_readme_has_the_two_commands():
    text = README.read_text(encoding="utf-8")
    blocks = [m.group(0) for m in FENCE.finditer(text)]
    commands = [line.strip() for b in blocks for line in b.splitlines()]
    assert any(re.match(r"make test(\s|$)", c) for c in commands), "README.md lost its `make test` command"
    assert any(re.match(r"make run(\s|$)", c) for c in commands), "README.md lost its `make run` command"
    assert "make test   # creates .venv when missing, installs, runs the test suite" in text


def test_readme_maps_every_docs_page():
    targets = {(README.parent / t.split("#", 1)[0]).resolve() for t in _links(README) if not _is_external(t)}
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in targets and p.name != "README.md"]
    assert not unlinked, f"README.md's docs map does not link {unlinked}"


def test_privacy_page_links_the_threat_model():
    assert "threat-model.md" in _links(DOCS / "privacy.md")


# ----------------------------------------------------------------------------- (4), (5) links

@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(doc: Path):
    links = _links(doc)
    for target in links:
        if _is_external(target):
            continue
        path_part, _, anchor = target.partition("#")
        assert not path_part.startswith("/"), f"{doc.name}: absolute link {target!r}"
        dest = (doc.parent / path_part).resolve() if path_part else doc.resolve()
        assert dest.is_relative_to(ROOT), f"{doc.name}: link {target!r} points outside the repository"
        assert dest.exists(), f"{doc.name}: link {target!r} does not resolve ({dest} is missing)"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{doc.name}: link {target!r}: no heading #{anchor} in {dest.name}"


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_reference_to_paths_outside_the_repository(doc: Path):
    text = doc.read_text(encoding="utf-8")
    depth = len(doc.parent.relative_to(ROOT).parts)
    outside = "../" * (depth + 1)
    assert outside not in text, f"{doc.name} refers to {outside!r}: a path outside the repository"


REPO_PATH = re.compile(r"^(?:app|strategies|clients|scripts|tests|conf|docs)/[A-Za-z0-9_./-]*$")


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_backticked_repository_paths_exist(doc: Path):
    """A page that names a module (`app/schedule.py`, `strategies/`) names one that exists."""
    named = {t for t in TICKED.findall(doc.read_text(encoding="utf-8")) if REPO_PATH.match(t)}
    missing = sorted(t for t in named if not (ROOT / t).exists())
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def test_the_link_checks_catch_bad_links(tmp_path: Path):
    """The link helpers see what a broken or escaping link looks like (so the tests above can fail)."""
    doc = tmp_path / "x.md"
    doc.write_text("# Top\n[a](../shared/DESIGN.md) [b](missing.md) ![i](img.png) `[c](not-a-link.md)`\n"
                   "```\n[d](in-code.md)\n```\n[e](https://flower.ai) [f](#top)\n", encoding="utf-8")
    assert _links(doc) == ["../shared/DESIGN.md", "missing.md", "https://flower.ai", "#top", "img.png"]
    assert _anchors(doc) == {"top"}
    assert _slug("Hydra config groups, sweeps, tables and plots") == "hydra-config-groups-sweeps-tables-and-plots"
