"""Run-config options, declared once: each is a field of a settings dataclass that lives next to
the code that owns it, made with :func:`option`::

    epsilon: float = option("privacy.epsilon", number(0, None, lo_open=True, allow_inf=True), 3.0,
                            "each silo's epsilon budget", inert=("privacy.mode", ("off",)))

One declaration gives the run-config key, its parser (a bad value: :class:`ConfigError`, one line
naming key, value and what is allowed), its default as ``pyproject.toml``, ``conf/config.yaml``
and docs/configuration.md write it (``"preset"``: the dataset's, app/presets.py; the field then
holds the WBCD preset's value), a one-line doc and when it acts (``inert=(switch, values)`` or
``only=(switch, values)``: app.report and app.sweep leave out a setting that did not act).
``app/config.py`` collects every declaration into ``SCHEMA`` and ``OPTIONS``; tests/test_options.py
checks pyproject, conf/ and the docs table against them (``python -m app.config_sync --write``
fills them in). Pure Python: no torch, no Flower.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from app.presets import PRESET

#: the metadata key of a declared field
OPTION = "silofl.option"
#: the dataset whose preset gives a "preset" option's field default (the embedded WBCD run)
DEFAULT_DATASET = "wbcd"

Parser = Callable[[str, Any], Any]


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class Option:
    """One run-config key: ``parse(key, value)`` -> the field's value; ``default`` the TOML value
    of pyproject.toml (and conf/, docs); ``switch``/``values``/``acts_in``: the option acts only
    while the run-config key ``switch`` has one of ``values`` (``acts_in``) or none of them."""

    key: str
    parse: Parser
    default: Any
    doc: str
    switch: str | None = None
    values: tuple[str, ...] = ()
    acts_in: bool = False

    def inert_under(self, switch_value: Any) -> bool:
        """Whether the option does not act when its switch has ``switch_value`` (a string)."""
        return self.switch is not None and (str(switch_value) in self.values) != self.acts_in


def option(key: str, parse: Parser, default: Any, doc: str, *, inert: tuple[str, tuple[str, ...]] | None = None,
           only: tuple[str, tuple[str, ...]] | None = None) -> Any:
    """A settings field declaring run-config ``key`` (see the module docstring). The field's
    default is ``parse(key, default)``; for ``"preset"`` the WBCD preset's value, parsed.
    ``inert=(switch, values)``: it does not act while ``switch`` is one of ``values``;
    ``only=(switch, values)``: it acts only then (e.g. ``only=("algorithm", ("spider",))``)."""
    if default == PRESET:
        from app.presets import preset_values

        value = parse(key, preset_values(DEFAULT_DATASET)[key])
    else:
        value = parse(key, default)
    if isinstance(value, (list, dict, set)):
        raise TypeError(f"{key}: a mutable default {value!r}; parse to a tuple")
    if inert and only:
        raise TypeError(f"{key}: inert= or only=, not both")
    switch, values = inert or only or (None, ())
    meta = Option(key, parse, default, doc, switch, tuple(values), only is not None)
    return field(default=value, metadata={OPTION: meta})


def group(cls: type) -> Any:
    """A nested group of options (``Settings.privacy``): a field made by ``cls()``."""
    return field(default_factory=cls)


def declared(settings_cls: type, prefix: str = "") -> dict[str, tuple[str, Option]]:
    """Every option of ``settings_cls`` and its groups, in field order: key -> (attribute path,
    e.g. ``"privacy.epsilon"``, its :class:`Option`). A key declared twice is an error."""
    out: dict[str, tuple[str, Option]] = {}
    for f in fields(settings_cls):
        if OPTION in f.metadata:
            found = {f.metadata[OPTION].key: (prefix + f.name, f.metadata[OPTION])}
        elif f.default_factory is not MISSING:
            found = declared(type(f.default_factory()), f"{prefix}{f.name}.")
        else:
            raise TypeError(f"{settings_cls.__name__}.{f.name} is neither an option() nor a group()")
        twice = sorted(set(found) & set(out))
        if twice:
            raise TypeError(f"run-config key {twice[0]!r} is declared twice")
        out |= found
    return out


def groups(settings_cls: type) -> dict[str, type]:
    """The nested groups of ``settings_cls``, by attribute name."""
    return {f.name: type(f.default_factory()) for f in fields(settings_cls)  # type: ignore[misc]
            if OPTION not in f.metadata and f.default_factory is not MISSING}


def switch_value(options: Mapping[str, Option], switch: str, values: Mapping[str, Any]) -> str:
    """``values[switch]`` as a string; absent or ``""`` (an old results.csv): the switch's default."""
    value = values.get(switch, "")
    return str(options[switch].default if value in ("", None) else value)


def inert_keys(options: Mapping[str, Option], values: Mapping[str, Any]) -> set[str]:
    """The keys of ``options`` that do not act under ``values`` (a flat run config or a
    results.csv row), by each option's declared switch."""
    return {key for key, opt in options.items()
            if opt.switch is not None and opt.inert_under(switch_value(options, opt.switch, values))}


# -- parsers: (key, value) -> the parsed value, or ConfigError (one line) ------------------------

def choice(choices: tuple[str, ...] | None = None, planned: tuple[str, ...] = ()) -> Parser:
    """A string, one of ``choices`` (None: any string); ``planned`` ones are "not implemented yet"."""
    def parse(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r} must be a string")
        if choices is not None and value not in choices:
            if value in planned:
                raise ConfigError(f"{key} = {value!r} is not implemented yet; allowed: {', '.join(choices)}")
            raise ConfigError(f"{key} = {value!r} is not allowed; allowed: {', '.join(choices)}")
        return value

    parse.hostile = tuple(choices) if choices is not None else HOSTILE_STRINGS  # type: ignore[attr-defined]
    return parse


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False,
           integer: bool = False, allow_inf: bool = False) -> Parser:
    """A number in [lo, hi] (``lo_open``/``hi_open``: the bound excluded); ``allow_inf``: "inf" too."""
    def parse(key: str, value: Any) -> float | int:
        if isinstance(value, str) and allow_inf and value.strip().lower() in ("inf", "infinity"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} = {value!r} must be a number; allowed: {_range(lo, hi, lo_open, hi_open)}")
        if integer and (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{key} = {value!r} must be an integer; allowed: {_range(lo, hi, lo_open, hi_open)}")
        v = float(value)
        bad = math.isnan(v) or (math.isinf(v) and not allow_inf)
        if lo is not None and (v < lo or (lo_open and v == lo)):
            bad = True
        if hi is not None and (v > hi or (hi_open and v == hi)):
            bad = True
        if bad:
            raise ConfigError(f"{key} = {value!r} is out of range; allowed: {_range(lo, hi, lo_open, hi_open)}")
        return int(v) if integer else v

    parse.hostile = _number_edges(lo, hi, lo_open, hi_open, integer, allow_inf)  # type: ignore[attr-defined]
    return parse


#: what a hostile server may write into a free-form string key (tests/test_hostile_run_config.py)
HOSTILE_STRINGS: tuple[str, ...] = ("", "/etc/hostname", "../../../../etc/passwd", "{}", "x" * 300)


def _number_edges(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool, integer: bool,
                  allow_inf: bool) -> tuple[Any, ...]:
    """The values at the edges of a number option's range (both ends, the smallest step inside an
    open end, a huge value for an unbounded end): what a hostile run config would try."""
    step = 1 if integer else None
    out: list[Any] = []
    if lo is not None:
        out.append(lo + step if lo_open and step else math.nextafter(lo, math.inf) if lo_open else lo)
    else:
        out.append(-(2**31 - 1) if integer else -1e12)
    if hi is not None:
        out.append(hi - step if hi_open and step else math.nextafter(hi, -math.inf) if hi_open else hi)
    else:
        out.append(2**31 - 1 if integer else 1e12)
    if allow_inf:
        out.append("inf")
    return tuple(int(v) if integer and not isinstance(v, str) else v for v in dict.fromkeys(out))


def _range(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    left = "(" if lo_open or lo is None else "["
    right = ")" if hi_open or hi is None else "]"
    lo_s = "-inf" if lo is None else f"{lo:g}"
    hi_s = "inf" if hi is None else f"{hi:g}"
    return f"{left}{lo_s}, {hi_s}{right}"


def number_or_word(parse_number: Parser, word: str) -> Parser:
    """A number as ``parse_number`` parses it, or the string ``word`` (e.g. "auto")."""
    def parse(key: str, value: Any) -> float | int | str:
        if isinstance(value, str) and value.strip().lower() == word:
            return word
        try:
            return parse_number(key, value)
        except ConfigError as exc:
            raise ConfigError(f"{exc}, or {word!r}") from None

    parse.hostile = (word, *getattr(parse_number, "hostile", ()))  # type: ignore[attr-defined]
    return parse


def boolean(key: str, value: Any) -> bool:
    """true or false (a TOML boolean, or the strings "true"/"false")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"{key} = {value!r} must be true or false")


boolean.hostile = (True, False)  # type: ignore[attr-defined]


def int_list(lo: int, example: str, what: str) -> Parser:
    """A comma-separated list of integers >= ``lo`` (e.g. layer widths, class indices), as a tuple."""
    def parse(key: str, value: Any) -> tuple[int, ...]:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r} must be a comma-separated list of {what}, e.g. {example}")
        try:
            out = tuple(int(v) for v in value.split(",") if v.strip())
        except ValueError:
            raise ConfigError(f"{key} = {value!r} must be a comma-separated list of {what}") from None
        if any(v < lo for v in out):
            raise ConfigError(f"{key} = {value!r} must be a comma-separated list of {what}")
        return out

    parse.hostile = ("", str(lo), ",".join([str(max(lo, 4096))] * 3))  # type: ignore[attr-defined]
    return parse
