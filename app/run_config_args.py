"""The operator's ``--run-config`` text, checked before Flower's parser sees it (app/launch.py)."""

from __future__ import annotations

from app.options import ConfigError

#: one ``key=value`` of Flower's ``--run-config`` (flwr.common.config.parse_config_args, flwr 1.42):
#: a key, ``=``, and a '...' or "..." quoted value or one without spaces. Flower keeps what this
#: finds and silently drops everything else in the string ("num-rounds=", "num-rounds = 3").
RUN_CONFIG_PAIR = r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)"


def check_run_config_args(args: list[str]) -> None:
    """ConfigError (one line naming the fragment) unless every ``--run-config`` string is made of
    ``key=value`` pairs that Flower's parser keeps, separated by spaces, each value a TOML value
    (a string in double quotes, a number, true/false). A lone ``.toml`` path is Flower's file form
    and is left to it."""
    import re
    import tomllib

    pair = re.compile(RUN_CONFIG_PAIR)
    if len(args) == 1 and args[0].endswith(".toml"):
        return
    for text in args:
        pos = 0
        while True:
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if pos >= len(text):
                break
            m = pair.match(text, pos)
            end = m.end() if m else pos
            if m is None or (end < len(text) and not text[end].isspace()):
                fragment = text[pos:].split()[0] if m is None else text[pos:].split(None, 1)[0]
                raise ConfigError(f"--run-config: cannot parse {fragment!r} (in {text!r}); write key=value pairs "
                                  f"without spaces around '=', separated by spaces, e.g. 'num-rounds=3 "
                                  f"dataset=\"digits\"'{_fragment_hint(fragment)}")
            key, value = m.group(1), m.group(2)
            try:
                tomllib.loads(f"v = {value}")
            except tomllib.TOMLDecodeError:
                raise ConfigError(f"--run-config: {key}={value} is not a value Flower can read; "
                                  f"{_value_hint(key, value)}") from None
            pos = end


def _fragment_hint(fragment: str) -> str:
    if fragment.count('"') % 2 or fragment.count("'") % 2:
        return " (a quote is not closed)"
    if fragment.endswith("="):
        return f" ({fragment[:-1]} has no value)"
    if "=" not in fragment:
        return " (no '=' in it)"
    return ""


def _value_hint(key: str, value: str) -> str:
    if value.lower() in ("true", "false"):
        return f"write {key}={value.lower()} (TOML booleans are lower case)"
    if value[:1] in "\"'" and value[-1:] != value[:1] or len(value) == 1 and value in "\"'":
        return "a quote is not closed"
    if value[:1].isdigit() or value[:1] in "+-.":
        return "not a number TOML reads (e.g. 3, 0.5, 1e-3, inf)"
    shown = value.strip("\"'")
    return (f"a string needs double quotes: {key}=\"{shown}\" (in a shell, quote the whole option: "
            f"--run-config '{key}=\"{shown}\"')")
