"""Grad-BANT + JL experiments on Fashion-MNIST, 10 silos (the JL + Grad-BANT paper's Tables 3, 5, 6, 8,
scaled to this CPU).

Setup (all tables): Fashion-MNIST, 10 silos, all of them every round, features projected on 50
principal components (fitted on the pooled training records), MLP 50-64-10, non-private; each
silo takes Q = 10 local SGD steps (batch 64, step 0.2) per round and sends the pseudo-gradient
(model change / step); R = 20 rounds; trust set 500 records (stratified, disjoint from the silos)
unless a table varies it; Byzantine silos chosen by seed 0. A CNN (``model=lenet5``) works the
same way but makes the dense sketches (k x n Gaussian blocks per layer) too slow for a CPU table.

  python -m scripts.reproduce.gradbant_tables [--tables 3 5 6 8] [--rounds 20]

1. Table 3: FedAvg (mean) and Grad-BANT x {no sketch, gaussian, rademacher, srht, countsketch, randk} at
   k/n = 0.5, no attack and 60% label flipping: best accuracy, G to 60% and 80%.
2. Table 5: every rule x {none, label flip 60%, sign flip 60%, IPM 70%, ALIE 40%} ("n/a": the rule
   needs an honest majority).
3. Table 6: Grad-BANT + SRHT (k/n = 0.5) under Dirichlet alpha in {10, 1, 0.5, 0.1}, 60% label flipping.
4. Table 8: Grad-BANT, 60% label flipping, trust-set size {100, 500, 2000} and classes {10, 5, 2}.

Each run is the real ServerApp / ClientApp code on an in-process grid (app/local_grid.py).
Writes outputs/reproduce/gradbant/{runs.jsonl,tables.md}; reruns skip runs already done.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

from app.config import ConfigError, parse_settings  # noqa: E402
from app.launch import merged_run_config  # noqa: E402
from app.local_grid import run_local  # noqa: E402
from app.results import load_rounds  # noqa: E402
from scripts.reproduce.job_log import load_runs, run_logged  # noqa: E402
from strategies.options import AGGREGATORS  # noqa: E402

BASE = {"algorithm": "robust", "dataset": "fashion-mnist", "partition": "iid", "num-silos": 10,
        "silos-per-round": 10, "pca": 50, "model": "mlp", "mlp-hidden": "64", "privacy.mode": "off",
        "local-steps": 10, "batch-size": 64, "lr": 0.2, "trust.size": 500, "eval-every": 1}
# "none": a simulation without Byzantine silos states f = 0 (byzantine.f) for the rules that need it
ATTACKS = {"none": {"byzantine.f": 0}, "label flip 60%": {"attack.kind": "label-flip", "attack.fraction": 0.6},
           "sign flip 60%": {"attack.kind": "sign-flip", "attack.fraction": 0.6},
           "IPM 70%": {"attack.kind": "ipm", "attack.fraction": 0.7, "attack.ipm-epsilon": 0.5},
           "ALIE 40%": {"attack.kind": "alie", "attack.fraction": 0.4}}
#: every registered rule (strategies.options.AGGREGATORS), the mean and Grad-BANT first
RULES = ["mean", "gradbant", *(rule for rule in AGGREGATORS if rule not in ("mean", "gradbant"))]
SKETCHES = ["none", "gaussian", "rademacher", "srht", "countsketch", "randk"]


def run_one(overrides: dict[str, Any], rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = merged_run_config([]) | BASE | overrides | {"num-rounds": rounds, "outputs-dir": f"{tmp}/o", "run-name": "r"}
        try:
            parse_settings(cfg)
        except ConfigError as exc:
            return {"status": "n/a", "error": str(exc)}
        t0 = time.perf_counter()
        run_local(cfg, f"{tmp}/s")
        summary = json.loads(Path(f"{tmp}/o/r/summary.json").read_text())
        rows = load_rounds(f"{tmp}/o/r/rounds.jsonl")
    acc = [1 - r["test_error"] for r in rows if r.get("test_error") is not None]
    return {"status": summary["status"], "best_acc": max(acc) if acc else None, "final_acc": acc[-1] if acc else None,
            "G60": summary["uploads_G_to_60"], "G80": summary["uploads_G_to_80"],
            "r60": summary["rounds_to_60"], "r80": summary["rounds_to_80"],
            "byz_weight": sum(r.get("byzantine_weight", 0.0) for r in rows) / len(rows), "wall_s": time.perf_counter() - t0}


def plan(tables: list[int]) -> list[tuple[str, str, dict[str, Any]]]:
    jobs = []
    if 3 in tables:
        for rule in ("mean", "gradbant"):
            for sk in SKETCHES:
                for att in ("none", "label flip 60%"):
                    jobs.append(("3", f"{rule}|{sk}|{att}", {"aggregator": rule, "sketch.kind": sk, "sketch.ratio": 0.5}
                                 | ATTACKS[att]))
    if 5 in tables:
        for rule in RULES:
            for att in ATTACKS:
                jobs.append(("5", f"{rule}|{att}", {"aggregator": rule, "attack.alie-z": 0.0} | ATTACKS[att]))
    if 6 in tables:
        for alpha in (10.0, 1.0, 0.5, 0.1):
            jobs.append(("6", f"alpha={alpha:g}", {"partition": "dirichlet", "dirichlet-alpha": alpha, "sketch.kind": "srht",
                                                   "sketch.ratio": 0.5} | ATTACKS["label flip 60%"]))
    if 8 in tables:
        for size in (100, 500, 2000):
            jobs.append(("8", f"size={size}|classes=10", {"trust.size": size} | ATTACKS["label flip 60%"]))
        for classes in ("0,1,2,3,4", "0,1"):
            n = len(classes.split(","))
            jobs.append(("8", f"size=500|classes={n}", {"trust.classes": classes} | ATTACKS["label flip 60%"]))
    return jobs


def pct(v: Any) -> str:
    return "-" if v is None else f"{v:.1%}"


def num(v: Any) -> str:
    return "never" if v is None else f"{v:g}"


def tables_md(results: dict[str, dict[str, Any]]) -> str:
    out = []
    t3 = {k[2:]: v for k, v in results.items() if k.startswith("3|")}
    if t3:
        out += ["### Table 3 analog: FedAvg vs Grad-BANT with sketches at k/n = 0.5", "",
                "| rule | sketch | attack | best acc | G to 60% | G to 80% | Byzantine weight |", "|---|---|---|---|---|---|---|"]
        for key, r in t3.items():
            rule, sk, att = key.split("|")
            out.append(f"| {rule} | {sk} | {att} | {pct(r.get('best_acc'))} | {num(r.get('G60'))} | {num(r.get('G80'))} | "
                       f"{r.get('byz_weight', 0):.2f} |")
        out.append("")
    t5 = {k[2:]: v for k, v in results.items() if k.startswith("5|")}
    if t5:
        out += ["### Table 5 analog: final accuracy (best) per rule and attack", "",
                "| rule | " + " | ".join(ATTACKS) + " |", "|---|" + "---|" * len(ATTACKS)]
        for rule in RULES:
            cells = []
            for att in ATTACKS:
                r = t5.get(f"{rule}|{att}")
                cells.append("" if r is None else "n/a" if r["status"] == "n/a" else
                             f"{pct(r['final_acc'])} ({pct(r['best_acc'])})")
            out.append(f"| {rule} | " + " | ".join(cells) + " |")
        out.append("")
    for t, title in (("6", "Table 6 analog: Grad-BANT + SRHT (k/n = 0.5), 60% label flipping, Dirichlet(alpha) silos"),
                     ("8", "Table 8 analog: Grad-BANT, 60% label flipping, trust-set size and class coverage")):
        rows = {k[2:]: v for k, v in results.items() if k.startswith(f"{t}|")}
        if rows:
            out += [f"### {title}", "", "| setting | best acc | final acc | G to 60% | G to 80% |", "|---|---|---|---|---|"]
            for key, r in rows.items():
                out.append(f"| {key.replace('|', ', ')} | {pct(r.get('best_acc'))} | {pct(r.get('final_acc'))} | {num(r.get('G60'))} | "
                           f"{num(r.get('G80'))} |")
            out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=int, nargs="+", default=[3, 5, 6, 8])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("outputs/reproduce/gradbant"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "runs.jsonl"
    results = load_runs(path)
    jobs = [(f"{table}|{name}", overrides) for table, name, overrides in plan(args.tables)
            if f"{table}|{name}" not in results]
    print(f"[gradbant-tables] {len(jobs)} runs to do", flush=True)
    run_logged(path, results, jobs, lambda overrides: run_one(overrides, args.rounds), "gradbant-tables",
               lambda res: f"best acc {res.get('best_acc')} ({res.get('wall_s', 0):.0f}s)")
    md = tables_md(results)
    (args.out / "tables.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
