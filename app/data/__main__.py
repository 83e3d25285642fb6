"""``python -m app.data check``: what a silo would say about its own records, told to its operator.

A silo that cannot use its records for a run tells the server only that (app/refusal.py: a fixed
code and reason, whatever the records hold); the detail goes to the node's log and to this
command, which its operator runs on the node, with the node's own file and the run's schema::

    python -m app.data check --schema schema.json --data-file /srv/silofl/records.csv
    python -m app.data check --schema schema.json --data-file records.csv \\
        --run-config 'standardize="local" test-fraction=0.2' --node-config 'data-max-records=100000'

It runs the silo's own code (app/node_runtime.py ``silo_records``: the schema check, the node's
data limits, the split and the pre-processing) and prints ``OK`` with the counts, or the reason
in full. Exit codes: 0 the records fit, 1 they do not, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def check(schema: str, data_file: str, data_format: str = "", run_config: dict[str, Any] | None = None,
          node_config: dict[str, Any] | None = None) -> str:
    """A one-line summary of the records a silo would train on (ValueError/SchemaError/... with
    the full reason when it would refuse them)."""
    from app.config import parse_settings
    from app.data.schema import inlined
    from app.node_runtime import silo_records

    s = parse_settings(dict(run_config or {}) | {"data.schema": inlined(schema)})
    node = dict(node_config or {}) | {"data-file": data_file, "data-format": data_format}
    data, classes, shape = silo_records(s, node, 0, deployed=True)
    return (f"OK: {data_file} fits the schema: {data.n} training, {len(data.test_y)} test"
            f"{'' if data.val_y is None else f', {len(data.val_y)} validation'} records; {classes} classes, "
            f"records of shape {tuple(shape)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.data", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check this node's own records against a run's data.schema")
    c.add_argument("--schema", required=True, help="the run's data.schema (a .json/.yaml file or inline JSON)")
    c.add_argument("--data-file", required=True, help="this silo's records (node config data-file)")
    c.add_argument("--data-format", default="", help="node config data-format, when the name does not tell")
    c.add_argument("--run-config", action="append", default=[],
                   help="run-config keys that shape the records (standardize, test-fraction, ...), as for app.launch")
    c.add_argument("--node-config", default="", help="this node's config (its data limits), as for the SuperNode")
    args = ap.parse_args(argv)
    from app.launch import parse_config_overrides

    try:
        run = parse_config_overrides(args.run_config)
        node = parse_config_overrides([args.node_config]) if args.node_config.strip() else {}
    except Exception as exc:  # noqa: BLE001 - a malformed argument: one line
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(check(args.schema, args.data_file, args.data_format, run, node))
    except Exception as exc:  # noqa: BLE001 - what the silo would refuse, in full, for its operator
        print(f"REFUSED: {type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
