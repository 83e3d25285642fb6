"""ISRL-DP algorithms with hyper-parameter selection inside each silo's epsilon (issue 39).

scripts/reproduce/isrl_compare.py picks (lr, clip[, diff-clip]) by the exact validation error
over a grid: that choice is outside epsilon. Here, for each (algorithm, epsilon, seed), the
selection itself is private and charged to the silos:

* each candidate is a federation (isrl_compare's setup and settings) at a hyper-parameter point
  drawn uniformly from the same grid, independently of the data;
* its score (``--score``) is either
  ``private``: the validation error that each silo releases privately with its own Gaussian
  noise: node config ``evaluation = "private"`` (app/privacy/evaluation.py), one evaluation of
  the final model, charged to the silo's ledger and planned in its calibration, at
  ``evaluation-noise-ratio`` = ``--eval-ratio`` times the training releases' noise multiplier
  (WBCD's setup as run here has a 56-record public sample at the server, which would score for
  free; it is not used, so the protocol is the one that works when the server holds nothing); or
  ``public``: the final model's error on the server's public sample
  (app/data/federated.py ``public_sample``: the records the public PCA / scaling is fitted on,
  disjoint from every silo), which reads no silo's record and costs nothing: the candidates run
  without any evaluation request (eval-every = 0), so their releases are the training ones only;
* each silo's ledger is node-scoped across the candidates of one selection, so it records
  every release of every candidate (the noise of two candidates never repeats: it is drawn per
  ledger sequence number);
* the candidate with the lowest noisy validation error is selected; the table reports its test
  error, computed exactly from its final model (an evaluation-only statistic, like every test
  error in docs/results.md).

Two protocols (``--protocols``):

``compose`` (K fixed, ``--k`` distinct grid points). The silo's epsilon covers training + selection
   against the server: the server sees every candidate's releases, so their composition is the
   cost (app/privacy/selection.py ``revealed_rdp``); each candidate is calibrated so that K
   compose to epsilon, and the silo's node ledger (cap = epsilon) accounts and enforces it.
``ps`` (Papernot & Steinke 2022, K ~ truncated negative binomial, ``--eta``, E[K] = ``--mean-k``,
   points drawn with replacement). Each candidate is calibrated so that Theorem 2 puts the
   selection's OUTPUT at epsilon. That covers the selected model and score only: an observer of
   the output alone (the model's users). The server of ISRL-DP sees every candidate, so the
   silo's epsilon against it is the ledger's composition of all K runs, reported beside it.

  python -m scripts.reproduce.isrl_private_tuning --setup wbcd

Writes <out>/selections.csv (one row per selection, with every candidate) and <out>/table.md;
reruns skip the selections already in selections.csv.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import time
from pathlib import Path
import tempfile
from typing import Any

import numpy as np

from scripts.reproduce import isrl_compare as ic  # sets OMP threads and torch threads first

from flwr.app import MessageType  # noqa: E402

from app import wire  # noqa: E402
from app.launch import merged_run_config  # noqa: E402
from app.local_grid import run_local  # noqa: E402
from app.privacy.rdp_orders import RDP_ORDERS  # noqa: E402
from app.privacy.selection import (calibrate_selection, epsilon_from_rdp, revealed_rdp, sample_runs,  # noqa: E402
                                   selection_rdp, tnb_gamma_for_mean)
from app.privacy.wor_gaussian import wor_gaussian_rdp  # noqa: E402
from app.run_health import FINISHED  # noqa: E402
from scripts.reproduce.csv_rows import append_row, read_rows  # noqa: E402

ALGORITHMS = ["mbsgd", "localsgd", "spider", "svrg"]
EPSILONS = [0.75, 1.5, 3.0, 6.0, 18.0]
#: the grids of docs/results.md's tables: (lr, clip) for all, diff-clip C for SPIDER and SVRG
#: (the "with clipped differences" table, whose grid also holds C = 0); Fashion-MNIST's tables
#: used lr in {0.3, 1} only
LRS, CLIPS, DIFF_CLIPS = [0.1, 0.3, 1.0], [0.5, 2.0], [0.0, 0.05, 0.2]
SETUP_LRS = {"fmnist-pairs": [0.3, 1.0]}
#: today's non-private-tuning numbers (docs/results.md, WBCD tables; pooled pre-processing, outside
#: epsilon; 113 test records): MB-SGD and local SGD from the main table, SPIDER and SVRG from the
#: "with clipped differences" table
DOCS_NONPRIVATE_TUNING = {"wbcd": {
    "mbsgd": [8.85, 6.19, 7.96, 5.31, 3.54], "localsgd": [12.39, 9.73, 8.85, 6.19, 4.42],
    "spider": [7.96, 8.85, 6.19, 5.31, 4.42], "svrg": [8.85, 8.85, 7.08, 6.19, 6.19],
}, "fmnist-pairs": {  # the Fashion-MNIST pairs tables (grid on seed 0, the point on seeds 0-4; PCA pooled)
    "mbsgd": [6.91, 5.21, 4.59, 4.37, 4.21], "localsgd": [7.42, 4.70, 4.10, 3.90, 3.74],
    "spider": [5.21, 4.45, 4.21, 4.11, 4.04], "svrg": [4.81, 4.34, 4.19, 4.13, 4.09],
}}
FIELDS = ["setup", "protocol", "score", "algorithm", "epsilon", "seed", "k", "candidate_epsilon", "eval_ratio",
          "selected",
          "val_error", "test_error", "eps_selection_output", "eps_server", "eps_ledger", "eps_covers", "eps_per_silo",
          "candidates", "status", "wall_s", "error"]
#: the ledger cap of a ps selection's node ledger: no refusal, the composition is reported
PS_LEDGER_CAP = 1e4


def grid(algorithm: str, setup: str = "wbcd") -> list[tuple[float, float, float]]:
    """The (lr, clip, diff-clip) points of ``algorithm`` in ``setup``'s table."""
    dcs = DIFF_CLIPS if algorithm in ic.DIFF_ALGORITHMS else [0.0]
    return list(itertools.product(SETUP_LRS.get(setup, LRS), CLIPS, dcs))


def base_config(setup: str, algorithm: str, point: tuple[float, float, float], seed: int, eps: float,
                out: Path, name: str, score: str = "private") -> dict[str, Any]:
    """isrl_compare's run config of one candidate (its setup, algorithm settings, validation split);
    ``score = "public"``: no evaluation request, and the final model kept (checkpoint.npz)."""
    lr, clip, dc = point
    cfg = merged_run_config([]) | ic.SETUPS[setup] | ic.ALGORITHM_SETTINGS[algorithm] | ic.OVERRIDES | {
        "algorithm": algorithm, "lr": lr, "privacy.clip": clip, "seed": seed, "validation-fraction": 0.2,
        "diff-clip": dc, "privacy.epsilon": eps, "privacy.mode": "isrl", "outputs-dir": str(out), "run-name": name,
        "fail-on-client-error": True, "checkpoint": False}
    cfg["eval-every"] = cfg["num-rounds"]  # one (private) evaluation: the final model's
    if score == "public":  # no silo evaluates anything: the server scores the final model on its own records
        cfg |= {"eval-every": 0, "checkpoint": True}
    return cfg


def node_config(score: str, eval_ratio: float) -> dict[str, Any]:
    """The silos' node config for the score: a private evaluation, or none at all."""
    return {"evaluation": "private", "evaluation-noise-ratio": eval_ratio} if score == "private" else {}


# ----------------------------------------------------------------------------- curves

def release_curve(n: int, batch: int, z: float, certified: bool) -> np.ndarray:
    """RDP at RDP_ORDERS of one release (K of n records without replacement, multiplier z):
    dp-accounting's accountant when ``certified``, else its vectorised copy (the search)."""
    if batch >= n:
        return np.asarray(RDP_ORDERS, dtype=np.float64) / (2 * z * z)
    if not certified:
        return wor_gaussian_rdp(batch / n, z, RDP_ORDERS)
    return _certified_sampled(n, batch, z)


@functools.lru_cache(maxsize=4096)
def _certified_sampled(n: int, batch: int, z: float) -> np.ndarray:
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(list(RDP_ORDERS), dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(n, batch, dpa.GaussianDpEvent(z)))
    return np.asarray(acc._rdp, dtype=np.float64)  # dp-accounting keeps the curve here


def planned_curve_at(silo: dict[str, Any]) -> Any:
    """s -> the Renyi curve of one run of ``silo``'s plan (summary.json ``planned``) with every
    kind's multiplier s * (its multiplier / the first kind's): the silo's budget split kept."""
    plan = silo["planned"]
    if any(p.get("disjoint") for p in plan):
        raise ValueError("disjoint releases are not handled here")
    ref = float(plan[0]["noise_multiplier"])
    kinds = [(int(p["batch"]), int(p["count"]), float(p["noise_multiplier"]) / ref) for p in plan]
    n = int(silo["n"])
    return lambda s: sum(c * release_curve(n, b, s * w, certified=False) for b, c, w in kinds)


def ledger_curve(releases: list[dict[str, Any]], per: int = 1) -> np.ndarray:
    """The certified Renyi curve of a ledger's ``releases`` (summary.json), divided by ``per``
    identical runs (each kind's count must divide)."""
    total = np.zeros(len(RDP_ORDERS))
    for r in releases:
        count = int(r["count"])
        if count % per:
            raise ValueError(f"{count} releases of kind {r['kind']!r} are not {per} identical runs")
        total += (count // per) * release_curve(int(r["n"]), int(r["batch"]), float(r["noise_multiplier"]), True)
    return total


# ----------------------------------------------------------------------------- one selection

def final_model(cfg: dict[str, Any], grid_sent: list[Any]) -> dict[str, np.ndarray]:
    """The run's final model: the last evaluation request's arrays, else (a run without
    evaluation) the model of its last checkpoint."""
    ev = [m for m in grid_sent if m.metadata.message_type == MessageType.EVALUATE]
    if ev:
        return dict(wire.EvaluateRequest.decode(ev[-1].content).arrays)
    from app.checkpoint import load_checkpoint

    state = load_checkpoint(Path(cfg["outputs-dir"]) / cfg["run-name"] / "checkpoint.npz")
    return {k: np.asarray(v, dtype=np.float32) for k, v in state["model"].items()}


def _errors(cfg: dict[str, Any], arrays: dict[str, np.ndarray], records: list[tuple[Any, Any]]) -> float:
    """The share of ``records`` ([(x, y), ...]) whose arg-max logit under ``arrays`` is not the label
    (app/server_eval.py ``server_test_metrics`` on them pooled)."""
    import torch

    from app.config import parse_settings
    from app.data.federated import dataset_meta
    from app.models import build_model
    from app.server_eval import server_test_metrics

    s = parse_settings(cfg)
    shape, classes = dataset_meta(s)
    model = build_model(s.model, shape, classes, hidden=s.model_hidden, kwargs=s.model_kwargs)
    pooled = (torch.cat([x for x, _ in records]), torch.cat([y for _, y in records]))
    return server_test_metrics(model, arrays, pooled)["server_test_error"]


def exact_test_error(cfg: dict[str, Any], arrays: dict[str, np.ndarray]) -> float:
    """Test error of ``arrays`` on every silo's test split, computed here from the records: what
    an open evaluation reports, without noise (an evaluation-only statistic, never a score)."""
    from app.config import parse_settings
    from app.data.federated import build_federated_data

    s = parse_settings(cfg)
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    return _errors(cfg, arrays, [(silo.test_x, silo.test_y) for silo in fed.silos])


def public_error(cfg: dict[str, Any], arrays: dict[str, np.ndarray]) -> float:
    """Error of ``arrays`` on the server's public sample: the free score (no silo record read)."""
    from app.config import parse_settings
    from app.data.federated import public_sample

    s = parse_settings(cfg)
    pub = public_sample(s, s.seed, s.robust.trust_size)
    return _errors(cfg, arrays, [(pub.x, pub.y)])


def probe(setup: str, algorithm: str, seed: int, eps: float, ratio: float,
          score: str = "private") -> list[dict[str, Any]]:
    """Each silo's planned releases, n and delta (public: they depend on n, the algorithm and the
    rounds only), from one run's summary; the run's model is not used."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = base_config(setup, algorithm, grid(algorithm, setup)[0], seed, eps, Path(tmp) / "out", "probe", score)
        run_local(cfg, str(Path(tmp) / "state"), node_config=node_config(score, ratio))
        return json.loads((Path(tmp) / "out" / "probe" / "summary.json").read_text())["silos"]


def calibrate(silos: list[dict[str, Any]], eps: float, protocol: str, params: dict[str, float]) -> float:
    """The run epsilon every candidate asks for: per silo, the largest one-run epsilon whose
    selection (``protocol``) fits ``eps`` at the silo's delta (a 0.1% margin for the silo's own
    rounding up); the least over the silos (a silo asked for less calibrates more noise)."""
    out = []
    for silo in silos:
        dist = "fixed" if protocol == "compose" else "tnb"
        cal = calibrate_selection(eps * 0.999, float(silo["delta"]), dist, params, planned_curve_at(silo),
                                  RDP_ORDERS, revealed=protocol == "compose")
        out.append(cal.candidate_epsilon)
    return min(out)


def select_once(setup: str, protocol: str, algorithm: str, eps: float, seed: int, args: argparse.Namespace,
                rng: np.random.Generator) -> dict[str, Any]:
    """One private selection: draw K and the points, run the candidates on node-scoped ledgers,
    pick the lowest noisy validation error, account each silo."""
    points = grid(algorithm, setup)
    if protocol == "compose":
        params: dict[str, float] = {"k": args.k}
        k = args.k
        picks = [points[i] for i in rng.choice(len(points), size=min(k, len(points)), replace=False)]
        cap = eps
    else:
        params = {"eta": args.eta, "gamma": tnb_gamma_for_mean(args.eta, args.mean_k)}
        k = sample_runs("tnb", params, rng)
        picks = [points[i] for i in rng.integers(len(points), size=k)]
        cap = PS_LEDGER_CAP
    silos = probe(setup, algorithm, seed, eps, args.eval_ratio, args.score)
    run_eps = calibrate(silos, eps, protocol, params)
    node = {"epsilon-cap": cap, "ledger-scope": "node", "noise-seed": "run"} | node_config(args.score, args.eval_ratio)
    row: dict[str, Any] = {"setup": setup, "protocol": protocol, "score": args.score, "algorithm": algorithm,
                           "epsilon": eps, "seed": seed, "k": k, "candidate_epsilon": run_eps,
                           "eval_ratio": args.eval_ratio if args.score == "private" else ""}
    cands: list[dict[str, Any]] = []
    best: tuple[float, int] | None = None
    first: list[dict[str, Any]] = []
    last: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for j, point in enumerate(picks):
            cfg = base_config(setup, algorithm, point, seed, run_eps, Path(tmp) / "out", f"c{j}", args.score)
            g = run_local(cfg, str(Path(tmp) / "state"), node_config=node)
            summary = json.loads((Path(tmp) / "out" / f"c{j}" / "summary.json").read_text())
            if summary["status"] not in FINISHED:
                raise RuntimeError(f"candidate {j} {point}: {summary['status']} {summary.get('status_reason')}")
            arrays = final_model(cfg, g.sent)
            score = summary.get("val_error") if args.score == "private" else public_error(cfg, arrays)
            if score is None:
                raise RuntimeError(f"candidate {j} {point}: no validation score in its summary")
            test = exact_test_error(cfg, arrays)
            cands.append({"lr": point[0], "clip": point[1], "diff_clip": point[2],
                          "val_error": score, "test_error": test})
            if best is None or score < best[0]:
                best = (score, j)
            first = first or summary["silos"]
            last = summary["silos"]
    assert best is not None
    sel = cands[best[1]]
    # each silo: the selection's output (Theorem 2 for ps; the composition for compose), the
    # composition of every release the server saw (all K runs), and the ledger's own number
    out_eps, server_eps, ledger_eps = [], [], []
    for one, whole in zip(first, last, strict=True):
        curve = ledger_curve(whole["releases"], per=k)  # one run's curve (all runs share the plan)
        assert np.allclose(curve, ledger_curve(one["releases"]), rtol=1e-12)
        delta = float(whole["delta"])
        server = epsilon_from_rdp(RDP_ORDERS, revealed_rdp(RDP_ORDERS, curve, "fixed", {"k": k}), delta)
        server_eps.append(server)
        out_eps.append(server if protocol == "compose" else
                       epsilon_from_rdp(RDP_ORDERS, selection_rdp(RDP_ORDERS, curve, "tnb", params), delta))
        ledger_eps.append(float(whole["eps_spent"]))
    return row | {"selected": f"lr {sel['lr']:g}, L {sel['clip']:g}" + (f", C {sel['diff_clip']:g}"
                                                                       if algorithm in ic.DIFF_ALGORITHMS else ""),
                  "val_error": sel["val_error"], "test_error": sel["test_error"],
                  "eps_selection_output": max(out_eps), "eps_server": max(server_eps), "eps_ledger": max(ledger_eps),
                  # per silo (its index): what its epsilon covers, and the epsilons of both readings
                  "eps_covers": ("training + selection, against the server" if protocol == "compose" else
                                 "training + selection for the published output only; against the server: "
                                 "the composition of the K runs"),
                  "eps_per_silo": json.dumps([{"silo": i, "output": o, "server": v, "ledger": g} for i, (o, v, g)
                                              in enumerate(zip(out_eps, server_eps, ledger_eps))]),
                  "candidates": json.dumps(cands), "status": "completed"}


# ----------------------------------------------------------------------------- the table

def _cell_rows(rows: list[dict[str, Any]], algo: str, proto: str, eps: float) -> list[dict[str, Any]]:
    """The completed selections of one table cell (algorithm, protocol, epsilon), over the seeds."""
    return [r for r in rows if r["algorithm"] == algo and r["protocol"] == proto and float(r["epsilon"]) == eps
            and r["status"] == "completed"]


def table(rows: list[dict[str, Any]], algorithms: list[str], epsilons: list[float], protocols: list[str],
          setup: str = "wbcd") -> str:
    """Per algorithm and epsilon: today's non-private tuning, then each protocol's median test
    error over the seeds and the epsilons each silo's guarantee has (max over silos and seeds)."""
    head = "| algorithm | tuning | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |"
    lines = [head, "|---|---|" + "---|" * len(epsilons)]
    names = {"compose": "private, K fixed (ε: training + selection, vs server)",
             "ps": "private, PS (ε: output; ε vs server; K)"}
    docs = DOCS_NONPRIVATE_TUNING.get(setup, {})
    for algo in algorithms:
        if algo in docs and epsilons == EPSILONS:
            lines.append(f"| {algo} | non-private (docs; ε: training only) | "
                         + " | ".join(f"{v:.2f}%" for v in docs[algo]) + " |")
        for proto in protocols:
            cells = []
            for eps in epsilons:
                done = _cell_rows(rows, algo, proto, eps)
                if not done:
                    cells.append("n/a")
                    continue
                test = statistics.median(float(r["test_error"]) for r in done)
                out_e = max(float(r["eps_selection_output"]) for r in done)
                srv = max(float(r["eps_server"]) for r in done)
                ks = sorted(int(r["k"]) for r in done)
                cells.append(f"{test:.2%} (ε {out_e:.3g}" + ("" if proto == "compose" else f"; {srv:.3g}")
                             + ("" if proto == "compose" else f"; K {','.join(map(str, ks))}") + ")")
            lines.append(f"| {algo} | {names[proto]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def score_table(rows: list[dict[str, Any]], algorithms: list[str], epsilons: list[float], protocols: list[str]) -> str:
    """What the noisy score costs: per cell, the median test error of the selected candidate, then
    (in brackets) the median of the best test error among the same K candidates (an oracle
    that reads the test split) and the share of selections that picked that best one."""
    lines = ["| algorithm | protocol | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |",
             "|---|---|" + "---|" * len(epsilons)]
    for algo, proto in itertools.product(algorithms, protocols):
        cells = []
        for eps in epsilons:
            done = _cell_rows(rows, algo, proto, eps)
            if not done:
                cells.append("n/a")
                continue
            best = [min(c["test_error"] for c in json.loads(r["candidates"])) for r in done]
            hit = sum(float(r["test_error"]) <= b for r, b in zip(done, best)) / len(done)
            cells.append(f"{statistics.median(float(r['test_error']) for r in done):.2%} "
                         f"({statistics.median(best):.2%}; {hit:.0%})")
        lines.append(f"| {algo} | {proto} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", choices=sorted(ic.SETUPS), default="wbcd")
    ap.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    ap.add_argument("--eps", type=float, nargs="+", default=EPSILONS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--protocols", nargs="+", choices=["compose", "ps"], default=["compose", "ps"])
    ap.add_argument("--k", type=int, default=4, help="compose: the fixed number of candidates (distinct points)")
    ap.add_argument("--eta", type=float, default=0.0, help="ps: TNB shape eta (0: logarithmic, 1: geometric)")
    ap.add_argument("--mean-k", type=float, default=4.0, help="ps: E[K]")
    ap.add_argument("--eval-ratio", type=float, default=0.25,
                    help="the private evaluation's noise multiplier over the training releases' (node config "
                         "evaluation-noise-ratio)")
    ap.add_argument("--score", choices=["private", "public"], default="private",
                    help="private: each silo's noisy validation error (charged); public: the final model's error "
                         "on the server's public sample (free; the setup must have one)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    ic._check_data(args.setup)
    out = args.out or Path("outputs") / "reproduce" / (f"isrl-private-tuning-{args.setup}"
                                                       + ("-public-score" if args.score == "public" else ""))
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "selections.csv"
    rows: list[dict[str, Any]] = [r for r in read_rows(csv_path) if r["status"] == "completed"]
    done = {(r["protocol"], r["algorithm"], float(r["epsilon"]), int(r["seed"])) for r in rows}
    jobs = [(p, a, e, s) for p in args.protocols for a in args.algorithms for e in args.eps for s in args.seeds]
    todo = [j for j in jobs if j not in done]
    print(f"[private-tuning] {args.setup}: {len(todo)} selections to do, {len(jobs) - len(todo)} already in {csv_path}",
          flush=True)
    t_all = time.perf_counter()
    for i, (proto, algo, eps, seed) in enumerate(todo, 1):
        # the selection's own draws (K, the points): from (seed, protocol, algorithm, epsilon), never the data
        rng = np.random.default_rng([seed, ["compose", "ps"].index(proto), ALGORITHMS.index(algo)
                                     if algo in ALGORITHMS else 99, int(round(eps * 100))])
        t0 = time.perf_counter()
        try:
            row = select_once(args.setup, proto, algo, eps, seed, args, rng)
        except Exception as exc:  # a failed selection is recorded and the rest goes on
            row = {"setup": args.setup, "protocol": proto, "algorithm": algo, "epsilon": eps, "seed": seed,
                   "status": "failed", "error": f"{type(exc).__name__}: {exc}"[:300]}
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        append_row(csv_path, row, FIELDS)
        if row["status"] == "completed":
            rows.append({k: str(v) for k, v in row.items()})
        print(f"[private-tuning] {i}/{len(todo)} {proto} {algo} eps={eps:g} seed={seed}: {row['status']} "
              f"K={row.get('k')} run eps {row.get('candidate_epsilon', float('nan')):.3f} -> {row.get('selected')} "
              f"test {row.get('test_error')} eps out {row.get('eps_selection_output')} server {row.get('eps_server')} "
              f"({row['wall_s']}s) {row.get('error') or ''}", flush=True)
    md = (table(rows, args.algorithms, args.eps, args.protocols, args.setup)
          + "\n\nSelected vs the best of the same K candidates (median test error of the selected; in brackets, "
          "of the best by test error, and how often it was selected):\n\n"
          + score_table(rows, args.algorithms, args.eps, args.protocols))
    (out / "table.md").write_text(md + "\n")
    print(md)
    print(f"[private-tuning] wall {time.perf_counter() - t_all:.0f}s for {len(todo)} selections", flush=True)


if __name__ == "__main__":
    main()
