"""Write the own-data smoke run's files from scikit-learn's WBCD (569 records, 30 features).

    python -m scripts.deploy.own_data_files OUT_DIR [--silos 3] [--seed 0]

OUT_DIR/schema.json (the run's data.schema: the 30 column names, label column "diagnosis",
classes malignant/benign, public per-feature ranges [0, the published maximum + 10%]), OUT_DIR/server/trust.csv (60
records) and OUT_DIR/server/test.csv (100 records), and OUT_DIR/silo<i>/records.csv for each
silo: the remaining records shuffled and split into --silos parts of unequal size. Each
file stands for records a party holds on its own; nothing here is read by the run except
through those paths. Prints one line per file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--silos", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from sklearn.datasets import load_breast_cancer

    b = load_breast_cancer()
    names = [str(n) for n in b.feature_names]
    df = pd.DataFrame(b.data, columns=names)
    df["diagnosis"] = np.array(["malignant", "benign"])[b.target]  # sklearn's target: 0 = malignant
    df = df.sample(frac=1.0, random_state=args.seed).reset_index(drop=True)
    out = args.out
    (out / "server").mkdir(parents=True, exist_ok=True)
    # public per-feature bounds: WBCD is a published data set, so its features' ranges are public facts
    # (every feature is >= 0; the upper bound is the published maximum with a 10% margin, rounded up)
    highs = [float(f"{h:.2g}") if float(f"{h:.2g}") >= h else float(f"{h * 1.05:.2g}") for h in b.data.max(axis=0) * 1.1]
    ranges = {n: [0.0, hi] for n, hi in zip(names, highs, strict=True)}
    schema = {"features": names, "label": "diagnosis", "classes": ["malignant", "benign"], "ranges": ranges}
    (out / "schema.json").write_text(json.dumps(schema, indent=1) + "\n")
    files = {out / "server" / "test.csv": df.iloc[:100], out / "server" / "trust.csv": df.iloc[100:160]}
    rest = df.iloc[160:]
    weights = np.arange(args.silos, 0, -1) + args.silos  # unequal sizes: each silo's n (and delta) is its own
    cuts = np.floor(np.cumsum(weights) / weights.sum() * len(rest)).astype(int)
    for i, (start, end) in enumerate(zip(np.r_[0, cuts[:-1]], cuts, strict=True)):
        (out / f"silo{i}").mkdir(exist_ok=True)
        files[out / f"silo{i}" / "records.csv"] = rest.iloc[start:end]
    for path, part in files.items():
        part.to_csv(path, index=False)
        print(f"{path}: {len(part)} records")
    print(f"{out / 'schema.json'}: {len(names)} features, label diagnosis, classes malignant, benign")


if __name__ == "__main__":
    main()
