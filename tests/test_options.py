"""Each run-config option is declared once (app/options.py ``option``, next to the code that owns
it); pyproject.toml, conf/config.yaml and docs/configuration.md are checked against the
declarations, each mismatch named in one line; the report and the sweep read one relevance."""

from __future__ import annotations

import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from app import config_sync
from app.algorithms import ALGORITHMS
from app.config import GROUPS, OPTIONS, SCHEMA, ConfigError, Settings, inert_options, parse_settings
from app.options import ConfigError as OptionsConfigError
from app.options import declared, number, option
from app.presets import PRESET, PRESET_KEYS, preset_values

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_conf_and_docs_agree_with_the_declarations() -> None:
    found = config_sync.mismatches()
    assert not found, "\n" + "\n".join(found)


def _copy(tmp_path: Path) -> Path:
    for rel in ("pyproject.toml", "conf/config.yaml", "docs/configuration.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_each_mismatch_is_one_line_naming_the_key_and_the_declaring_file(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    py = root / "pyproject.toml"
    py.write_text(py.read_text().replace("spider.q = 5\n", "spider.q = 7\n").replace("seed = 0\n", ""))
    yml = root / "conf" / "config.yaml"
    yml.write_text(yml.read_text().replace("  ratio: 0.5\n", "  ratio: 0.25\n"))
    doc = root / "docs" / "configuration.md"
    doc.write_text(doc.read_text().replace("| `cc.tau` | `1.0` |", "| `cc.tau` | `1` |"))
    found = config_sync.mismatches(root)
    assert len(found) == 4 and all("\n" not in line for line in found), found
    expected = ["pyproject.toml [tool.flwr.app.config] lacks seed (declared in app/algorithms/options.py); "
                "add: seed = 0",
                "pyproject.toml [tool.flwr.app.config]: spider.q = 7 but app/algorithms/spider.py declares 5",
                "conf/config.yaml: sketch.ratio = 0.25 but app/sketch_settings.py declares 0.5",
                "docs/configuration.md (Run-config keys): cc.tau = 1 but strategies/options.py declares 1.0"]
    assert all(line.startswith(want) for line, want in zip(found, expected)), found
    config_sync.write_pyproject(root)  # the pyproject block is generated from the declarations
    assert not [m for m in config_sync.mismatches(root) if m.startswith("pyproject")]


def test_every_option_has_a_key_parser_default_and_one_line_doc() -> None:
    assert list(SCHEMA) == list(OPTIONS) and len(OPTIONS) >= 70
    for key, opt in OPTIONS.items():
        assert opt.key == key and opt.doc and "\n" not in opt.doc, key
        if opt.default != PRESET:
            opt.parse(key, opt.default)  # the declared default is a valid value
    assert {k for k, o in OPTIONS.items() if o.default == PRESET} == set(PRESET_KEYS)


def test_field_defaults_are_the_parsed_declarations_and_presets_the_wbcd_run() -> None:
    """Settings() (no run config) is what parse_settings makes of the declared defaults, and a
    "preset" option's field holds the WBCD preset's value."""
    assert parse_settings({}) == Settings()
    wbcd = preset_values("wbcd")
    flat = Settings().to_dict()
    for key, (attr, opt) in declared(Settings).items():
        group, _, name = attr.rpartition(".")
        value = (flat[group] if group else flat)[name]
        if opt.default == PRESET:
            assert value == (list(opt.parse(key, wbcd[key])) if isinstance(value, list) else opt.parse(key, wbcd[key]))


def test_switches_name_real_keys_and_allowed_values() -> None:
    for key, opt in OPTIONS.items():
        if opt.switch is None:
            continue
        assert opt.switch in OPTIONS and OPTIONS[opt.switch].switch is None, key
        for value in opt.values:
            OPTIONS[opt.switch].parse(opt.switch, value)  # ConfigError if the switch cannot take it
        if opt.switch == "algorithm":
            assert set(opt.values) <= set(ALGORITHMS), key


def test_a_declaration_refuses_a_mutable_default_and_a_bad_default() -> None:
    with pytest.raises(TypeError, match="mutable default"):
        option("x.y", lambda k, v: [1], 1, "doc")
    with pytest.raises(OptionsConfigError, match="x.y = -1 is out of range"):
        option("x.y", number(0, 1), -1, "doc")
    assert ConfigError is OptionsConfigError


@pytest.mark.parametrize("row", [
    {"privacy.mode": "off", "sketch.kind": "none", "algorithm": "mbsgd"},
    {"privacy.mode": "isrl", "sketch.kind": "srht", "algorithm": "spider"},
    {"privacy.mode": "", "sketch.kind": "", "algorithm": "plsvrg"},
])
def test_report_and_sweep_drop_the_same_settings(row: dict[str, str]) -> None:
    """app.report.effective_settings blanks exactly the settings app.sweep_results.acting_settings drops
    (privacy.epsilon excepted: the report shows inf), from the one declared relevance."""
    pd = pytest.importorskip("pandas")
    from app.report import effective_settings
    from app.sweep_results import acting_settings

    full = {k: str(o.default) for k, o in OPTIONS.items()} | row
    blank = {k for k, v in effective_settings(pd.DataFrame([full])).iloc[0].items() if v == ""}
    dropped = set(full) - set(acting_settings(full))
    assert dropped - {"privacy.epsilon"} == blank - {k for k, v in full.items() if v == ""}
    assert dropped == inert_options(full)
    off = (row["privacy.mode"] == "off", row["sketch.kind"] in ("none", ""), row["algorithm"] != "spider")
    assert ("privacy.clip" in dropped, "sketch.ratio" in dropped, "spider.q" in dropped) == off
    assert ("svrg.inner-steps" in dropped) == (row["algorithm"] not in ("svrg", "plsvrg"))


def test_group_and_top_level_options_are_collected_from_their_owners() -> None:
    """Settings has only option() fields (its mixins') and group() fields; each key once."""
    keys = [k for k in declared(Settings)]
    assert len(keys) == len(set(keys))
    own = {f.name for f in fields(Settings)} - {f.name for base in Settings.__mro__[1:-1] for f in fields(base)}
    assert own == set(GROUPS) and GROUPS["privacy"] is type(Settings().privacy)


def test_write_adds_a_new_option_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m app.config_sync --write``: a declared key that pyproject, conf/ and the docs lack
    is added to each (a new group's node made in conf/config.yaml), and a removed one put back."""
    from app.options import Option, number

    root = _copy(tmp_path)
    new = Option("example.knob", number(0, 1), 0.9, "an example knob", "algorithm", ("example",), True)
    monkeypatch.setattr(config_sync, "OPTIONS", dict(OPTIONS) | {"example.knob": new})
    yml = root / "conf" / "config.yaml"
    yml.write_text(yml.read_text().replace("  q: 5\n", ""))
    doc = root / "docs" / "configuration.md"
    doc.write_text("\n".join(line for line in doc.read_text().splitlines() if not line.startswith("| `spider.q`")))
    assert len(config_sync.mismatches(root)) == 5
    config_sync.write_pyproject(root)
    assert config_sync.write_conf(root) == ["spider.q", "example.knob"]
    assert config_sync.write_docs(root) == ["spider.q", "example.knob"]
    assert config_sync.mismatches(root) == []
    text = doc.read_text()
    assert text.index("| `spider.q` | `5` |") > text.index("| `spider.anchor-batch`")  # with its group
    row = "| `example.knob` | `0.9` | an example knob |"
    assert row in text.split("### Compression")[0]  # in its switch's (algorithm's) table
    assert "example:\n  knob: 0.9\n" in yml.read_text()
