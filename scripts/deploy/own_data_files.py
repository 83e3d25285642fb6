"""Write the own-data smoke run's files from scikit-learn's WBCD (569 records, 30 features).

    python -m scripts.deploy.own_data_files OUT_DIR [--silos 3] [--seed 0]

OUT_DIR/schema.json (the run's data.schema: the 30 column names, label column "diagnosis",
classes malignant/benign, and the public per-feature mean and std of the server's trust file),
OUT_DIR/server/trust.csv (60 records) and OUT_DIR/server/test.csv (100 records), and OUT_DIR/silo<i>/records.csv for each
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

from app.data.public_statistics import public_statistics


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
    schema = {"features": names, "label": "diagnosis", "classes": ["malignant", "benign"]}
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
    # the server's own trust file is public to the server: its per-feature mean and std go into the
    # schema (as python -m app.data.public_statistics writes them), so every silo standardises its
    # records with public numbers, inside its epsilon (standardize = "auto")
    schema["statistics"] = public_statistics(files[out / "server" / "trust.csv"][names].to_numpy(), tuple(names))
    (out / "schema.json").write_text(json.dumps(schema, indent=1) + "\n")
    print(f"{out / 'schema.json'}: {len(names)} features, label diagnosis, classes malignant, benign, public "
          "statistics of the server's trust file")


if __name__ == "__main__":
    main()
