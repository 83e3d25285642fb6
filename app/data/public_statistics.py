"""Public statistics for ``data.schema``: the per-feature mean and standard deviation of a file
that is *public to whoever runs this* (the server's own trust or test file, a published
reference set), written into the schema as ``statistics`` so every silo standardises its own
records with them, (x - mean) / std, without reading anyone else's records and inside its ε
(``standardize = "auto"`` or ``"public"``; docs/your-data.md).

    python -m app.data.public_statistics /srv/server/trust.csv --schema schema.json --out schema.json

Never run it on a silo's records: statistics of private records would put them outside the
guarantee. Prints one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from app.data.own_files import read_records
from app.data.schema import SchemaError, load_schema, parse_schema, schema_path


def public_statistics(x: np.ndarray, features: tuple[str, ...]) -> dict[str, Any]:
    """``{"mean": ..., "std": ...}`` of the records ``x`` per feature (population std; a constant
    feature gets std 1, so it maps to a constant): per column name for tables, else one list."""
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    if len(flat) < 2:
        raise ValueError(f"public statistics need at least 2 records, got {len(flat)}")
    mean, std = flat.mean(axis=0), flat.std(axis=0)
    std = np.where(std > 1e-12, std, 1.0)
    if features:
        return {"mean": dict(zip(features, mean.tolist(), strict=True)),
                "std": dict(zip(features, std.tolist(), strict=True))}
    return {"mean": mean.tolist(), "std": std.tolist()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", help="a file public to you (CSV, Parquet, npz, image folder), matching the schema")
    ap.add_argument("--schema", required=True, help="the run's data.schema (a .json/.yaml file or inline JSON)")
    ap.add_argument("--out", type=Path, required=True, help="where to write the schema with its statistics (JSON)")
    args = ap.parse_args(argv)
    try:
        schema = load_schema(args.schema)
        x, _ = read_records(args.file, schema)
        text = args.schema.strip()
        doc = json.loads(text) if text.startswith("{") else _read_doc(schema_path(text))
        doc["statistics"] = public_statistics(x, schema.features)
        parse_schema(doc)  # what the silos will read
    except (SchemaError, ValueError, OSError) as exc:
        print(f"public_statistics: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{args.out}: statistics of {len(x)} records of {args.file} for {int(np.prod(schema.feature_shape))} "
          "features")
    return 0


def _read_doc(path: Path) -> dict[str, Any]:
    raw = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        return dict(yaml.safe_load(raw))
    return dict(json.loads(raw))


if __name__ == "__main__":
    raise SystemExit(main())
