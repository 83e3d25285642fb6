"""ISRL-DP (or shuffle-DP) algorithms compared at certified epsilon, with hyper-parameters chosen on a validation split.

For each algorithm and epsilon, every (lr, clip) of the grid is run for every seed; the grid
point with the lowest mean VALIDATION error over the seeds is selected (the validation records
are carved from each silo's training split and never trained on); the table reports the median
TEST error over the seeds of that point only, and the median ||G_eta|| (non-private evaluation).
Hyper-parameter selection itself is not private (as the paper's Appendix I admits).

Each run is the real ServerApp / ClientApp code (strategies, silos, ledgers, dp-accounting) on
an in-process grid (app/local_grid.py), not Flower's transport, so hundreds of runs fit on a CPU.

  python -m scripts.reproduce.isrl_compare --setup wbcd
  python -m scripts.reproduce.isrl_compare --setup fmnist-pairs --seeds 0 1 2
  python -m scripts.reproduce.isrl_compare --setup wbcd --algorithms spider spider-alt svrg --diff-clip 0 0.05 0.2
  python -m scripts.reproduce.isrl_compare --setup wbcd --mode shuffle --algorithms mbsgd proxsgd svrg spider

``--mode shuffle`` runs the same grid in shuffle DP (privacy.mode = shuffle, with the shuffler
node); ``--num-silos N`` overrides the setup's federation size (all N silos every round).
``--count-on K``, ``--amplification sampling`` and ``--headroom H`` set shuffle.count-on,
shuffle.amplification and shuffle.headroom; ``--set key=value`` any other run-config key. Shuffle
runs also record each silo's planned noise trials (min / max over the silos) in runs.csv.

  python -m scripts.reproduce.isrl_compare --setup fmnist-pairs --mode shuffle --algorithms mbsgd \
      --count-on 1 --amplification sampling --out outputs/reproduce/sdp/shuffle-fmnist-pairs-c1-amp

Writes <out>/runs.csv (one row per run) and <out>/table.md; reruns skip runs already in runs.csv.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # tiny models: threads only contend

import torch  # noqa: E402

torch.set_num_threads(1)

from app.launch import merged_run_config  # noqa: E402
from app.local_grid import run_local  # noqa: E402
from app.run_health import FINISHED  # noqa: E402
from scripts.reproduce.csv_rows import append_row, read_rows  # noqa: E402

#: the paper's setups (scaled where stated): data, federation, model, rounds.
SETUPS: dict[str, dict[str, Any]] = {
    # WBCD: 2 silos split by label, MLP 30-5-2, R = 25 (the paper's setting)
    "wbcd": {"dataset": "wbcd", "num-silos": 2, "silos-per-round": 2, "mlp-hidden": "5", "num-rounds": 25,
             "batch-size": 64},
    # Fashion-MNIST even/odd digit pairs (the paper's MNIST setup, offline): 25 silos, PCA to 50
    # features, MLP 50-64-2; R = 25 rounds with all 25 silos per round
    "fmnist-pairs": {"dataset": "fashion-mnist", "partition": "even-odd-pairs", "num-silos": 25,
                     "silos-per-round": 25, "pca": 50, "mlp-hidden": "64", "num-rounds": 25, "batch-size": 64},
    # Fashion-MNIST, IID silos sharing 10% of the records for training (6,000; --num-silos N:
    # n = 6000 / N each, 20% of it held out for validation), PCA to 50 features, logistic regression
    # (10 classes), full batches (K = n): the error-vs-N comparison of shuffle DP and ISRL-DP
    "fmnist-iid": {"dataset": "fashion-mnist", "partition": "iid", "num-silos": 10, "silos-per-round": 10, "pca": 50,
                   "model": "logistic", "num-rounds": 25, "batch-size": 0, "test-fraction": 0.9},
    # issue 24's measurements: Fashion-MNIST IID silos sharing half of the 70,000 records (35,000;
    # 20% of each silo's held out for validation), PCA 50, logistic regression, R = 15, K = 64
    # (sampled batches, so record-level amplification applies; Prox-SGD keeps K = n/R)
    "fmnist-iid-k64": {"dataset": "fashion-mnist", "partition": "iid", "num-silos": 10, "silos-per-round": 10,
                       "pca": 50, "model": "logistic", "num-rounds": 15, "batch-size": 64, "test-fraction": 0.5},
    # MNIST even/odd pairs, where the MNIST idx files are present (data-dir)
    "mnist-pairs": {"dataset": "mnist", "partition": "even-odd-pairs", "num-silos": 25, "silos-per-round": 25,
                    "pca": 50, "mlp-hidden": "64", "num-rounds": 25, "batch-size": 64},
    # CIFAR-10: 10 silos of one class each, LeNet-5, all silos every round (needs the CIFAR-10 files)
    "cifar10": {"dataset": "cifar10", "partition": "label", "num-silos": 10, "silos-per-round": 10,
                "model": "lenet5", "num-rounds": 50, "batch-size": 64},
}
ALGORITHM_SETTINGS: dict[str, dict[str, Any]] = {
    "mbsgd": {}, "localsgd": {"local-steps": 5}, "spider": {"spider.q": 5}, "spider-alt": {},
    "svrg": {"svrg.inner-steps": 4}, "proxsgd": {"batch-size": 0}, "plsvrg": {"svrg.inner-steps": 4},
}
#: algorithms that send gradient differences (the ones ``--diff-clip`` applies to)
DIFF_ALGORITHMS = ("spider", "spider-alt", "svrg", "plsvrg")
FIELDS = ["setup", "algorithm", "epsilon", "lr", "clip", "diff_clip", "seed", "status", "val_error", "test_error",
          "grad_mapping_norm", "eps_max_spent", "wall_s", "error", "trials_min", "trials_max",
          "silo_trials_min", "silo_trials_max"]


MODE = "isrl"  # --mode: the privacy mode of finite-epsilon runs
OVERRIDES: dict[str, Any] = {}  # --num-silos and the like, over the setup


def run_one(setup: str, algorithm: str, eps: float, lr: float, clip: float, seed: int, work: Path,
            diff_clip: float = 0.0) -> dict[str, Any]:
    cfg = merged_run_config([]) | SETUPS[setup] | ALGORITHM_SETTINGS[algorithm] | OVERRIDES | {
        "algorithm": algorithm, "lr": lr, "privacy.clip": clip, "seed": seed, "validation-fraction": 0.2,
        "diff-clip": diff_clip,
        "privacy.epsilon": "inf" if math.isinf(eps) else eps, "privacy.mode": "off" if math.isinf(eps) else MODE,
        "outputs-dir": str(work / "out"), "run-name": "r", "fail-on-client-error": True,
        # a grid run is a few seconds long and is rerun (runs.csv skips the finished ones), never
        # resumed: no per-round checkpoint (its encoding and fsync were 16% of a run's CPU)
        "checkpoint": False,
    }
    cfg["eval-every"] = cfg["num-rounds"]  # evaluate the final model only
    row: dict[str, Any] = {"setup": setup, "algorithm": algorithm, "epsilon": eps, "lr": lr, "clip": clip,
                           "diff_clip": diff_clip, "seed": seed}
    t0 = time.perf_counter()
    try:
        run_local(cfg, str(work / "state"))
        summary = json.loads((work / "out" / "r" / "summary.json").read_text())
        row |= {"status": summary["status"], "val_error": summary["val_error"], "test_error": summary["test_error"],
                "grad_mapping_norm": summary["grad_mapping_norm_eval"], "eps_max_spent": summary["eps_max_spent"]}
        row |= _trials(summary)
    except Exception as exc:  # a failed job is recorded and the sweep goes on
        row |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
    row["wall_s"] = round(time.perf_counter() - t0, 2)
    return row


def _trials(summary: dict[str, Any]) -> dict[str, Any]:
    """Shuffle runs: over the silos, min / max of the binomial trials m that the sum of one release
    must hold (its largest planned release) and the trials one silo carries for it (messages' trials,
    (1 + headroom) m / count-on); the noise std of a coordinate is sqrt(trials p (1 - p)) levels."""
    need, carried = [], []
    for silo in summary.get("silos") or []:
        planned = [p for p in (silo or {}).get("planned") or [] if isinstance(p, dict) and p.get("trials")]
        if planned:
            top = max(planned, key=lambda p: int(p["trials"]))
            need.append(int(top["trials"]))
            carried.append(int(top.get("trials_per_record") or 0) * int(top.get("batch") or 0))
    if not need:
        return {}
    return {"trials_min": min(need), "trials_max": max(need), "silo_trials_min": min(carried),
            "silo_trials_max": max(carried)}


def _dc(row: dict[str, Any]) -> float:
    """The run's diff-clip (0 in CSVs written before the column existed)."""
    return float(row.get("diff_clip") or 0.0)


def select(rows: list[dict[str, Any]], tune_seeds: set[int] | None = None) -> dict[tuple[str, float], dict[str, Any]]:
    """Per (algorithm, epsilon): the (lr, clip) with the lowest mean validation error over the
    tuning seeds (all seeds if None); ``runs`` holds that point's runs over every seed."""
    by_point: dict[tuple, list[dict]] = {}
    for r in rows:
        if tune_seeds is not None and int(r["seed"]) not in tune_seeds:
            continue
        if r["status"] in FINISHED and r["val_error"] not in ("", None):
            by_point.setdefault((r["algorithm"], float(r["epsilon"]), float(r["lr"]), float(r["clip"]), _dc(r)),
                                []).append(r)
    best: dict[tuple[str, float], dict[str, Any]] = {}
    for (algo, eps, lr, clip, dc), runs in by_point.items():
        val = statistics.mean(float(r["val_error"]) for r in runs)
        if (algo, eps) not in best or val < best[(algo, eps)]["val"]:
            best[(algo, eps)] = {"val": val, "lr": lr, "clip": clip, "diff_clip": dc, "runs": runs}
    for (algo, eps), b in best.items():
        b["runs"] = [r for r in rows if r["status"] in FINISHED and r["algorithm"] == algo
                     and float(r["epsilon"]) == eps and float(r["lr"]) == b["lr"] and float(r["clip"]) == b["clip"]
                     and _dc(r) == b["diff_clip"]]
    return best


def table(best: dict[tuple[str, float], dict[str, Any]], algorithms: list[str], epsilons: list[float]) -> str:
    lines = ["| algorithm | " + " | ".join("ε=∞ (non-private)" if math.isinf(e) else f"ε={e:g}" for e in epsilons) + " |",
             "|---|" + "---|" * len(epsilons)]
    for algo in algorithms:
        cells = []
        for eps in epsilons:
            b = best.get((algo, eps))
            if b is None:
                cells.append("n/a")
                continue
            test = statistics.median(float(r["test_error"]) for r in b["runs"])
            gmap = statistics.median(float(r["grad_mapping_norm"]) for r in b["runs"])
            dc = f", C {b['diff_clip']:g}" if b["diff_clip"] else ""
            cells.append(f"{test:.2%} (‖G‖ {gmap:.3f}; lr {b['lr']:g}, L {b['clip']:g}{dc})")
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _check_data(setup: str) -> None:
    """Stop with a clear message when the setup's data files are not on this machine."""
    from app.data.sources import load_source

    cfg = SETUPS[setup]
    try:
        load_source(cfg["dataset"], cfg.get("data-dir") or None)
    except Exception as exc:  # missing files: nothing to run
        raise SystemExit(f"[isrl-compare] setup {setup!r} needs dataset {cfg['dataset']!r}, which is not "
                         f"available here: {exc}\nPut the files in place and pass --data-dir.") from None


def plot(best: dict[tuple[str, float], dict[str, Any]], algorithms: list[str], epsilons: list[float], path: Path) -> None:
    """Test error vs epsilon at each selected point, mean +- std over seeds (non-private: dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, algo in enumerate(algorithms):
        finite = [e for e in epsilons if not math.isinf(e) and (algo, e) in best]
        errs = [[float(r["test_error"]) for r in best[(algo, e)]["runs"]] for e in finite]
        if finite:
            ax.errorbar(finite, [statistics.mean(v) for v in errs],
                        yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in errs], marker="o", capsize=3,
                        color=f"C{i}", label=algo)
        if (algo, math.inf) in best:
            ax.axhline(statistics.mean(float(r["test_error"]) for r in best[(algo, math.inf)]["runs"]),
                       color=f"C{i}", ls="--", alpha=0.6)
    ax.set_xscale("log")
    ax.set_xlabel("ε (each silo, certified)")
    ax.set_ylabel("test error (mean ± std over seeds)")
    ax.set_title("dashed: non-private", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _run_jobs(jobs: list[tuple], rows: list[dict[str, Any]], csv_path: Path, setup: str, what: str) -> None:
    """Run the jobs not yet in ``rows``, appending each result to the CSV as it finishes."""
    done = {(r["algorithm"], float(r["epsilon"]), float(r["lr"]), float(r["clip"]), _dc(r), int(r["seed"])) for r in rows}
    todo = [j for j in jobs if j not in done]
    print(f"[isrl-compare] {setup} {what}: {len(todo)} runs to do, {len(jobs) - len(todo)} already in {csv_path}",
          flush=True)
    for i, (algo, eps, lr, clip, dc, seed) in enumerate(todo, 1):
        with tempfile.TemporaryDirectory() as tmp:
            row = run_one(setup, algo, eps, lr, clip, seed, Path(tmp), dc)
        append_row(csv_path, row, FIELDS)
        rows.append({k: str(v) for k, v in row.items()})
        print(f"[isrl-compare] {i}/{len(todo)} {algo} eps={eps:g} lr={lr:g} L={clip:g} C={dc:g} seed={seed}: "
              f"{row['status']} val {row.get('val_error')} test {row.get('test_error')} ({row['wall_s']}s)", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", choices=sorted(SETUPS), default="wbcd")
    ap.add_argument("--algorithms", nargs="+", default=["mbsgd", "localsgd", "spider", "spider-alt", "svrg"])
    ap.add_argument("--eps", type=float, nargs="+", default=[0.75, 1.5, 3.0, 6.0, 18.0, math.inf])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--lr", type=float, nargs="+", default=[0.1, 0.3, 1.0])
    ap.add_argument("--clip", type=float, nargs="+", default=[0.5, 2.0])
    ap.add_argument("--diff-clip", type=float, nargs="+", default=[0.0],
                    help="diff-clip values for the difference-based algorithms (0: the paper's 4L/K2 bound)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--retry-failed", action="store_true", help="run again the jobs recorded as failed")
    ap.add_argument("--tune-seeds", type=int, nargs="+", default=None,
                    help="run the whole grid on these seeds only, then the selected point on the other seeds")
    ap.add_argument("--data-dir", default="", help="where the MNIST / CIFAR-10 files are")
    ap.add_argument("--mode", choices=["isrl", "shuffle"], default="isrl", help="privacy mode of the finite-epsilon runs")
    ap.add_argument("--num-silos", type=int, default=0, help="override the setup's num-silos (all sampled every round)")
    ap.add_argument("--count-on", type=int, default=None, help="shuffle.count-on (0: all sampled silos)")
    ap.add_argument("--amplification", choices=["none", "sampling"], default=None, help="shuffle.amplification")
    ap.add_argument("--headroom", type=float, default=None, help="shuffle.headroom")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="other run-config keys over the setup (values parsed as JSON where they parse)")
    args = ap.parse_args(argv)
    global MODE
    MODE = args.mode
    OVERRIDES.clear()  # main() may be called again in one process (scripts/reproduce/sdp24_runs.py)
    for key, value in (("shuffle.count-on", args.count_on), ("shuffle.amplification", args.amplification),
                       ("shuffle.headroom", args.headroom)):
        if value is not None:
            OVERRIDES[key] = value
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"[isrl-compare] --set wants KEY=VALUE, got {item!r}")
        try:
            OVERRIDES[key] = json.loads(value)
        except json.JSONDecodeError:
            OVERRIDES[key] = value
    if args.num_silos:
        OVERRIDES.update({"num-silos": args.num_silos, "silos-per-round": args.num_silos})
    if args.data_dir:
        SETUPS[args.setup]["data-dir"] = args.data_dir
    _check_data(args.setup)
    tag = args.setup + (f"-n{args.num_silos}" if args.num_silos else "")
    out = args.out or Path("outputs") / "reproduce" / f"{args.mode}-{tag}"
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "runs.csv"
    rows: list[dict[str, Any]] = read_rows(csv_path)
    if args.retry_failed and any(r["status"] not in FINISHED for r in rows):
        rows = [r for r in rows if r["status"] in FINISHED]
        with csv_path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
    tune = args.tune_seeds if args.tune_seeds is not None else args.seeds
    grid = [(a, e, lr, c, dc, seed) for a, e, lr, c in itertools.product(args.algorithms, args.eps, args.lr, args.clip)
            for dc in (args.diff_clip if a in DIFF_ALGORITHMS else [0.0]) for seed in tune]
    _run_jobs(grid, rows, csv_path, args.setup, "tuning grid")
    best = select(rows, set(tune))
    rest = [(a, e, best[(a, e)]["lr"], best[(a, e)]["clip"], best[(a, e)]["diff_clip"], seed)
            for a in args.algorithms for e in args.eps
            if (a, e) in best for seed in args.seeds if seed not in tune]
    _run_jobs(rest, rows, csv_path, args.setup, "selected points, remaining seeds")
    best = select(rows, set(tune))
    md = table(best, args.algorithms, args.eps)
    (out / "table.md").write_text(md + "\n")
    plot(best, args.algorithms, args.eps, out / "error_vs_epsilon.png")
    print(md)


if __name__ == "__main__":
    main()
