"""WBCD, several seeds: median test error of (ISRL-DP) MB-SGD at certified epsilons.

Runs each configuration as a real federation through ``python -m app.launch`` (flwr run, local
SuperLink, simulation) and reads ``summary.json``. Prints a markdown table.

    python -m scripts.reproduce.wbcd_seeds --eps 0.75 3 18 inf --seeds 0 1 2 3 4 [--extra "lr=0.5"]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--eps", nargs="+", default=["0.75", "3", "18", "inf"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--algorithm", default="mbsgd")
    ap.add_argument("--extra", default="", help="extra run-config overrides")
    ap.add_argument("--out", default="outputs/wbcd-seeds")
    args = ap.parse_args()
    rows = []
    for eps in args.eps:
        errors = []
        for seed in args.seeds:
            name = f"{args.algorithm}-eps{eps}-seed{seed}"
            mode = 'privacy.mode="off"' if eps == "inf" else f"privacy.epsilon={eps}"
            cfg = f'algorithm="{args.algorithm}" {mode} seed={seed} outputs-dir="{ROOT / args.out}" run-name="{name}" {args.extra}'
            proc = subprocess.run([sys.executable, "-m", "app.launch", "--run-config", cfg], cwd=ROOT,
                                  capture_output=True, text=True)
            summary = ROOT / args.out / name / "summary.json"
            if proc.returncode != 0 or not summary.exists():
                print(f"{name}: FAILED (exit {proc.returncode})\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            s = json.loads(summary.read_text())
            errors.append(float(s["test_error"]))
            print(f"{name}: test error {s['test_error']:.4f}, max eps spent {s['eps_max_spent']}", flush=True)
        rows.append((eps, errors))
    print("\n| algorithm | epsilon | seeds | median test error | min | max |\n|---|---|---|---|---|---|")
    for eps, errors in rows:
        if errors:
            print(f"| {args.algorithm} | {eps} | {len(errors)} | {statistics.median(errors):.2%} | {min(errors):.2%} | {max(errors):.2%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
