"""Secure aggregation (distributed Skellam) against shuffle DP, ISRL-DP and the central bound:
test error vs epsilon at one fixed (lr, clip) per data set (issue 38).

Modes, every run the real ServerApp and silos on the in-process grid (app/local_grid.py):

* ``isrl``: each silo's Gaussian release at epsilon (privacy.mode isrl);
* ``shuffle``: binomial encodings through the shuffler node (privacy.mode shuffle, count-on all);
* ``secagg16`` (and ``secagg12``, ``secagg20``): privacy.mode secagg at secagg.bits 16 (12, 20),
  count-on = silos-per-round;
* ``central``: the bound of a Gaussian added once at the server. For M silos whose releases carry
  noise multiplier z, the mean carries noise z 2L / (K sqrt(M)); a central mechanism at epsilon
  needs z_c = the silo plan's own calibration at epsilon (app.privacy.release_plan.ReleasePlan),
  i.e. noise z_c 2L / (K M) on the mean. So an ISRL run at the epsilon' whose calibrated z equals
  z_c / sqrt(M) puts exactly that noise on the mean; :func:`central_epsilon` finds epsilon' by
  bisection on the calibration. With unequal silos (WBCD's label split, K = n) it asks, per kind
  of release, that the uniform mean's noise std sqrt(sum_j (z'_j D_j)^2) / M reach every silo's
  central requirement max_i z_c,i D_i / M (D_i: silo i's replace-one sensitivity of its release),
  which is the formula above when the silos are equal. No library code: only the silo's plan and
  its calibration are called.

Sampled batches (Fashion-MNIST pairs, K = 64): ISRL's Gaussian is accounted by dp-accounting's
sampled Gaussian whatever the noise seed; shuffle and secagg claim amplification only for secret
batches, so they run with privacy.noise-seed = os and {shuffle,secagg}.amplification = sampling
(secagg: Theorem 9 of Wang, Balle & Kasiviswanathan 2019 as published on the Skellam RDP; shuffle:
the same theorem's truncated ideal-vs-real form on the exact binomial curve). WBCD runs full
batches (batch-size 0: K = n), so nothing is amplified anywhere.

z_agg (per run, in runs.csv and the tables): the noise std of the released aggregate over the
largest replace-one sensitivity of one record on it -- the noise multiplier a central Gaussian
would have. isrl / central: sqrt(sum_j (z_j D_j)^2) / max_i D_i (uniform mean of the silos);
secagg: sqrt(sum_j z_add,j^2) (the Skellam shares add); shuffle: sqrt(p (1 - p) sum_j K_j b_j) / g
(noise trials carried, b_j per record). Rounding noise (shuffle, secagg) is not in z_agg.

  python -m scripts.reproduce.secagg_compare --setup wbcd
  python -m scripts.reproduce.secagg_compare --setup fmnist-pairs --algorithms mbsgd --seeds 0 1 2 --bits-seeds 0
  python -m scripts.reproduce.secagg_compare --setup fmnist-pairs --algorithms svrg --seeds 0
  python -m scripts.reproduce.secagg_compare --setup wbcd --report     # tables from runs.csv only

Each seed also gets one non-private run (privacy.mode off, the same point) for reference.

Writes <out>/runs.csv (one row per run; reruns skip the runs already there) and <out>/table.md.
"""

from __future__ import annotations

import argparse
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
from scripts.reproduce.isrl_compare import ALGORITHM_SETTINGS, SETUPS, _check_data  # noqa: E402

#: the fixed (lr, clip) per data set, from docs/results.md's validation-tuned points; WBCD runs full
#: batches (K = n); SVRG clips its differences at C = 0.05 (the tuned diff-clip)
POINTS: dict[str, dict[str, Any]] = {
    # WBCD table (K = 64): MB-SGD selected lr 0.3, L 0.5 at eps 0.75 and 1.5; SVRG with clipped
    # differences lr 0.3, L 0.5, C 0.05 at eps 0.75 and 1.5
    "wbcd": {"lr": 0.3, "privacy.clip": 0.5, "batch-size": 0},
    # Fashion-MNIST pairs: MB-SGD selected lr 1, L 2 at every eps; SVRG lr 1, L 2, C 0.05 at eps <= 6
    "fmnist-pairs": {"lr": 1.0, "privacy.clip": 2.0},
}
ALGORITHMS: dict[str, dict[str, Any]] = {
    "mbsgd": ALGORITHM_SETTINGS["mbsgd"],
    "svrg": ALGORITHM_SETTINGS["svrg"] | {"diff-clip": 0.05},
}
#: the table's rows in order; the bits rows (12, 20) run for MB-SGD only
MODES = ("isrl", "shuffle", "secagg16", "central", "secagg12", "secagg20")
BITS_MODES = ("secagg12", "secagg20")
LABELS = {"isrl": "ISRL-DP (Gaussian per silo)", "shuffle": "shuffle DP (binomial, count-on all)",
          "secagg16": "secagg 16 bits (Skellam, count-on M)", "central": "central (Gaussian at the server, bound)",
          "secagg12": "secagg 12 bits", "secagg20": "secagg 20 bits"}
FIELDS = ["setup", "algorithm", "mode", "epsilon", "seed", "status", "test_error", "eps_max_spent", "eps_run",
          "z_silo", "z_central", "z_agg", "trials", "levels", "bits", "uplink_floats_per_silo", "gamma",
          "wrap_bound", "rounds_answered", "silo_n", "wall_s", "cpu_s", "error"]


def sampled(setup: str) -> bool:
    """Whether the setup's releases sample their batches (K < n): then amplification is claimed."""
    return int(POINTS[setup].get("batch-size", SETUPS[setup].get("batch-size", 0))) > 0


def mode_config(setup: str, mode: str) -> dict[str, Any]:
    """The run-config keys of ``mode`` (module docstring)."""
    if mode == "off":
        return {"privacy.mode": "off"}
    if mode in ("isrl", "central"):
        return {"privacy.mode": "isrl"}
    secret = {"privacy.noise-seed": "os"} if sampled(setup) else {}
    if mode == "shuffle":
        return {"privacy.mode": "shuffle"} | ({"shuffle.amplification": "sampling"} | secret if secret else {})
    bits = int(mode.removeprefix("secagg"))
    return {"privacy.mode": "secagg", "secagg.bits": bits} | (
        {"secagg.amplification": "sampling"} | secret if secret else {})


def base_config(setup: str, algorithm: str, seed: int, work: Path) -> dict[str, Any]:
    cfg = merged_run_config([]) | SETUPS[setup] | ALGORITHMS[algorithm] | POINTS[setup] | {
        "algorithm": algorithm, "seed": seed, "validation-fraction": 0.2, "outputs-dir": str(work / "out"),
        "run-name": "r", "fail-on-client-error": True, "checkpoint": False}
    cfg["eval-every"] = cfg["num-rounds"]  # evaluate the final model only
    return cfg


# -- the central bound --------------------------------------------------------------------------------
def silo_plans(cfg: dict[str, Any], sizes: list[int], epsilon: float):
    """Each silo's release plan at ``epsilon`` (app.privacy.release_plan.ReleasePlan.of, as the
    silo builds it: clients/silo.py)."""
    from app.algorithms import get_algorithm
    from app.config import parse_settings
    from app.privacy.release_plan import ReleasePlan

    s = parse_settings(cfg)
    return [ReleasePlan.of(get_algorithm(s.algorithm), s.algorithm_options(), n, s.privacy.clip, epsilon,
                           s.delta_for(n)) for n in sizes]


def _calibrated(plans) -> list[dict[str, tuple[float, float]]]:
    """Per silo, per kind: (z, replace-one sensitivity D) at the plan's own calibration."""
    out = []
    for plan in plans:
        z = plan.calibrate()
        out.append({str(r.phase): (r.noise_multiplier, r.sensitivity) for r in plan.calibrated(z).values()})
    return out


def mean_ratio(isrl: list[dict[str, tuple[float, float]]], central: list[dict[str, tuple[float, float]]]) -> float:
    """min over kinds of sqrt(sum_j (z'_j D_j)^2) / max_i (z_c,i D_i): at >= 1 the uniform mean of
    the ISRL releases carries at least the noise a central Gaussian needs for every silo."""
    ratios = []
    for kind in central[0]:
        noise = math.sqrt(sum((s[kind][0] * s[kind][1]) ** 2 for s in isrl))
        need = max(c[kind][0] * c[kind][1] for c in central)
        ratios.append(noise / need)
    return min(ratios)


def central_epsilon(cfg: dict[str, Any], sizes: list[int], epsilon: float, rtol: float = 1e-4) -> tuple[float, float]:
    """(epsilon', z_c): the smallest ISRL epsilon' whose releases' mean carries the central
    Gaussian's noise at ``epsilon`` (module docstring), by geometric bisection on the
    calibration; z_c: the central requirement in units of the largest sensitivity on the mean."""
    central = _calibrated(silo_plans(cfg, sizes, epsilon))

    def ratio(eps: float) -> float:
        return mean_ratio(_calibrated(silo_plans(cfg, sizes, eps)), central)

    lo, hi = epsilon, epsilon * 2
    while ratio(hi) >= 1:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValueError("no epsilon' reaches the central bound")
    while ratio(lo) < 1:  # lo = epsilon has ratio sqrt(M) > 1 unless there is one silo
        hi, lo = lo, lo / 2
    while hi - lo > rtol * hi:
        mid = math.sqrt(lo * hi)
        if ratio(mid) >= 1:
            lo = mid
        else:
            hi = mid
    kind = next(iter(central[0]))
    z_c = max(c[kind][0] * c[kind][1] for c in central) / max(c[kind][1] for c in central)
    return lo, z_c


# -- what a run's summary says about its noise ---------------------------------------------------------
def noise_terms(mode: str, summary: dict[str, Any]) -> dict[str, Any]:
    """z_silo (median over silos of the calibrated scale), z_agg (module docstring) and, for shuffle,
    the trials and levels of the largest planned release."""
    silos = [s for s in summary.get("silos") or [] if s]
    if not silos or mode == "off":
        return {}
    if mode.startswith("secagg"):
        zs = [max(p["noise_multiplier"] for p in s["planned"]) for s in silos]
        adds = [max(p["z_add"] for p in s["planned"]) for s in silos]
        return {"z_silo": statistics.median(zs), "z_agg": math.sqrt(sum(a * a for a in adds))}
    if mode == "shuffle":
        top = [max(s["planned"], key=lambda p: int(p["trials"])) for s in silos]
        rel = silos[0]["releases"][0]
        g, p = int(rel["levels"]), float(rel["p"])
        carried = sum(int(t["trials_per_record"]) * int(t["batch"]) for t in top)
        return {"trials": max(int(t["trials"]) for t in top), "levels": g,
                "z_agg": math.sqrt(p * (1 - p) * carried) / g}
    kinds = {p["phase"] for p in silos[0]["planned"]}
    per_kind = []
    for kind in kinds:
        zd = [(p["noise_multiplier"], p["sensitivity"]) for s in silos for p in s["planned"] if p["phase"] == kind]
        per_kind.append(math.sqrt(sum((z * d) ** 2 for z, d in zd)) / max(d for _, d in zd))
    return {"z_silo": statistics.median(max(p["noise_multiplier"] for p in s["planned"]) for s in silos),
            "z_agg": min(per_kind)}


def run_one(setup: str, algorithm: str, mode: str, eps: float, seed: int, central: tuple[float, float] | None,
            work: Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One federation; returns its runs.csv row and its summary (None when it failed)."""
    cfg = base_config(setup, algorithm, seed, work)
    eps_run = central[0] if central is not None else eps
    cfg |= mode_config(setup, mode) | {"privacy.epsilon": "inf" if math.isinf(eps_run) else eps_run}
    row: dict[str, Any] = {"setup": setup, "algorithm": algorithm, "mode": mode, "epsilon": eps, "seed": seed,
                           "eps_run": eps_run}
    if central is not None:
        row["z_central"] = central[1]
    if mode.startswith("secagg"):
        row["bits"] = int(mode.removeprefix("secagg"))
    t0, c0 = time.perf_counter(), time.process_time()
    summary = None
    try:
        run_local(cfg, str(work / "state"))
        out = work / "out" / "r"
        summary = json.loads((out / "summary.json").read_text())
        rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()]
        answered = sum(int(r.get("answered") or 0) for r in rounds)
        row |= {"status": summary["status"], "test_error": summary["test_error"],
                "eps_max_spent": summary["eps_max_spent"], "rounds_answered": answered,
                "uplink_floats_per_silo": (sum(float(r.get("uplink_floats") or 0) for r in rounds) / answered
                                           if answered else "")}
        row |= noise_terms(mode, summary) | {"silo_n": ";".join(str(int(s["n"])) for s in summary["silos"] if s)}
        gammas = [r["secagg_gamma"] for r in rounds if r.get("secagg_gamma") is not None]
        if gammas:
            row |= {"gamma": statistics.median(gammas), "wrap_bound": max(r["secagg_wrap_bound"] for r in rounds)}
    except Exception as exc:  # a failed job is recorded and the sweep goes on
        row |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
    row |= {"wall_s": round(time.perf_counter() - t0, 2), "cpu_s": round(time.process_time() - c0, 2)}
    return row, summary


# -- the sweep -----------------------------------------------------------------------------------------
def jobs(algorithms: list[str], epsilons: list[float], seeds: list[int], bits_seeds: list[int]) -> list[tuple]:
    """(algorithm, mode, epsilon, seed) in run order: isrl before central (central needs its sizes);
    first the non-private runs (mode off, epsilon inf), one per seed."""
    out = [(algo, "off", math.inf, seed) for algo in algorithms for seed in seeds]  # the non-private reference
    for algo in algorithms:
        for seed in sorted(set(seeds) | set(bits_seeds if algo == "mbsgd" else [])):
            for eps in epsilons:
                for mode in MODES:
                    if mode in BITS_MODES and (algo != "mbsgd" or seed not in bits_seeds):
                        continue
                    if mode not in BITS_MODES and seed not in seeds:
                        continue
                    out.append((algo, mode, eps, seed))
    return out


def sweep(setup: str, todo: list[tuple], rows: list[dict[str, Any]], csv_path: Path) -> None:
    done = {(r["algorithm"], r["mode"], float(r["epsilon"]), int(r["seed"])) for r in rows}
    left = [j for j in todo if j not in done]
    print(f"[secagg-compare] {setup}: {len(left)} runs to do, {len(todo) - len(left)} already in {csv_path}", flush=True)
    sizes: dict[tuple[str, int], list[int]] = {(r["algorithm"], int(r["seed"])): [int(n) for n in r["silo_n"].split(";")]
                                               for r in rows if r["mode"] == "isrl" and r.get("silo_n")}
    for i, (algo, mode, eps, seed) in enumerate(left, 1):
        central = None
        if mode == "central":
            key = (algo, seed)
            if key not in sizes:  # the silos' n, from this seed's ISRL run (it precedes central)
                with tempfile.TemporaryDirectory() as tmp:
                    _, summary = run_one(setup, algo, "isrl", eps, seed, None, Path(tmp))
                sizes[key] = [int(s["n"]) for s in summary["silos"]] if summary else []
            if not sizes[key]:
                continue
            with tempfile.TemporaryDirectory() as tmp:
                central = central_epsilon(base_config(setup, algo, seed, Path(tmp)), sizes[key], eps)
        with tempfile.TemporaryDirectory() as tmp:
            row, summary = run_one(setup, algo, mode, eps, seed, central, Path(tmp))
        if mode == "isrl" and summary:
            sizes[(algo, seed)] = [int(s["n"]) for s in summary["silos"]]
        append_row(csv_path, row, FIELDS)
        rows.append({k: str(v) for k, v in row.items()})
        print(f"[secagg-compare] {i}/{len(left)} {algo} {mode} eps={eps:g} seed={seed} (run at {row['eps_run']:.4g}): "
              f"{row['status']} test {row.get('test_error')} z_agg {row.get('z_agg')} "
              f"({row['wall_s']}s wall, {row['cpu_s']}s CPU)", flush=True)


# -- the tables ----------------------------------------------------------------------------------------
def _f(r: dict[str, Any], key: str) -> float | None:
    v = r.get(key)
    return float(v) if v not in (None, "") else None


def table(rows: list[dict[str, Any]], setup: str, epsilons: list[float]) -> str:
    """Per algorithm: median test error (and median z_agg, runs) per mode and epsilon, bits per
    model coordinate uplink (the masked vector / update / encoding only), median wall and CPU s."""
    ok = [r for r in rows if r["setup"] == setup and r["status"] in FINISHED and r["test_error"] not in ("", None)]
    lines = []
    for algo in ALGORITHMS:
        mine = [r for r in ok if r["algorithm"] == algo]
        if not mine:
            continue
        isrl_up = [_f(r, "uplink_floats_per_silo") for r in mine if r["mode"] == "isrl"]
        dim = statistics.median(isrl_up) if isrl_up else None  # ISRL sends d float32 per release
        lines += [f"**{setup}, {algo}** (median test error; z_agg; runs)", "",
                  "| mode | " + " | ".join(f"ε={e:g}" for e in epsilons) + " | uplink bits / coordinate | wall s | CPU s |",
                  "|---|" + "---|" * (len(epsilons) + 3)]
        for mode in MODES:
            cells, runs = [], [r for r in mine if r["mode"] == mode]
            if not runs:
                continue
            for eps in epsilons:
                at = [r for r in runs if float(r["epsilon"]) == eps]
                if not at:
                    cells.append("n/a")
                    continue
                err = statistics.median(float(r["test_error"]) for r in at)
                z = statistics.median(_f(r, "z_agg") for r in at if _f(r, "z_agg") is not None)
                extra = f", ε' {statistics.median(float(r['eps_run']) for r in at):.3g}" if mode == "central" else ""
                cells.append(f"{err:.2%} (z {z:.3g}{extra}; {len(at)})")
            up = [_f(r, "uplink_floats_per_silo") for r in runs]
            bits = f"{32 * statistics.median(up) / dim:.1f}" if dim and all(u is not None for u in up) else "n/a"
            wall = statistics.median(float(r["wall_s"]) for r in runs)
            cpu = statistics.median(float(r["cpu_s"]) for r in runs)
            lines.append(f"| {LABELS[mode]} | " + " | ".join(cells) + f" | {bits} | {wall:.1f} | {cpu:.1f} |")
        off = [float(r["test_error"]) for r in mine if r["mode"] == "off"]
        if off:
            lines.append(f"| non-private (privacy off, same point) | {statistics.median(off):.2%} ({len(off)} runs) |"
                         + " |" * (len(epsilons) + 2))
        lines.append("")
    failed = [r for r in rows if r["setup"] == setup and r["status"] not in FINISHED]
    if failed:
        lines.append(f"Not finished: {len(failed)} run(s): " + "; ".join(
            f"{r['algorithm']} {r['mode']} ε={r['epsilon']} seed {r['seed']}: {r['status']} {r.get('error', '')}"[:200]
            for r in failed))
    total_cpu = sum(float(r["cpu_s"]) for r in rows if r["setup"] == setup)
    total_wall = sum(float(r["wall_s"]) for r in rows if r["setup"] == setup)
    lines.append(f"{len([r for r in rows if r['setup'] == setup])} runs: {total_cpu / 60:.1f} min CPU, "
                 f"{total_wall / 60:.1f} min wall (summed over runs).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", choices=sorted(POINTS), default="wbcd")
    ap.add_argument("--algorithms", nargs="+", choices=sorted(ALGORITHMS), default=list(ALGORITHMS))
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--bits-seeds", type=int, nargs="*", default=None,
                    help="seeds of the 12- and 20-bit secagg rows (MB-SGD; default: --seeds)")
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                    help="other run-config keys over the setup (e.g. num-rounds=15)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", action="store_true", help="only write the tables from runs.csv")
    args = ap.parse_args(argv)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"[secagg-compare] --set wants KEY=VALUE, got {item!r}")
        try:
            POINTS[args.setup][key] = json.loads(value)
        except json.JSONDecodeError:
            POINTS[args.setup][key] = value
    out = args.out or Path("outputs") / "reproduce" / "secagg" / args.setup
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "runs.csv"
    rows: list[dict[str, Any]] = read_rows(csv_path)
    if not args.report:
        try:
            _check_data(args.setup)
        except SystemExit as exc:  # e.g. Fashion-MNIST absent: say why and skip the setup
            print(f"[secagg-compare] skipped: {exc}")
            return
        bits_seeds = args.seeds if args.bits_seeds is None else args.bits_seeds
        sweep(args.setup, jobs(args.algorithms, args.eps, args.seeds, bits_seeds), rows, csv_path)
    md = table(rows, args.setup, args.eps)
    (out / "table.md").write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
