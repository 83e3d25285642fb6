"""Inner-product and angle distortion of every sketch kind (the paper's Tables 2 and 10; issue #4).

For a pair of vectors ``u, v`` in R^n and a sketch S drawn from a seed, with ``Su``, ``Sv`` the
payloads (``sketch.compress``) of the two vectors under the *same* S:

* ``Delta_ip = |<Su, Sv> - <u, v>| / (||u|| ||v||)`` (dimensionless);
* ``Delta_theta = |angle(Su, Sv) - angle(u, v)|`` in **degrees**, where
  ``angle(a, b) = arccos(<a, b> / (||a|| ||b||))`` (clamped to [-1, 1]) in [0, 180].

Inner products and norms are accumulated in float64 (the sketches themselves run in float32).
Every linear kind is scaled so that ``E[S^T S] = I``, and ``<Su, Sv> = <S^T S u, v>``: the payload
inner product *is* the inner product of the lifted (unbiased) estimate with the other vector.
For RandK the payload is ``sqrt(n_l/k_l) u[idx]`` per layer, so ``<Su, Sv> = sum_l (n_l/k_l)
sum_{i in idx_l} u_i v_i``, the unbiased importance-sampling estimate of ``<u, v>``; its
"sketch-space" norms are the matching estimates of ``||u||``, ``||v||``. PowerSGD is not a linear
map: for it ``Su``, ``Sv`` are the lifted low-rank approximations ``P Q^T`` (decompress of each
vector's own compress, each with a fresh ``PowerSGDState``, i.e. round 0: one power iteration from
the seeded Q, error feedback not yet active). ``adaptive`` picks k from ``--epsilon`` (0.3; its
k/n is reported). All linear kinds are layer-wise (case (a) has a single layer, so layer-wise =
whole vector there).

Case (a): ``u``, ``v`` two independent random 4096 x 4096 matrices (i.i.d. N(0, 1) entries), one
layer of n = 16,777,216; a new pair and a new sketch seed for every pair index.
Case (b): ``u`` a stochastic gradient (mean cross-entropy, ``--batch`` = 64 Fashion-MNIST images,
a different batch for every pair) and ``v`` the trust-set gradient (``--trust`` = 500 other
images, fixed) of a ResNet-18 (torchvision, ``num_classes=10``, conv1 replaced by a 1-channel
7x7 conv; n = 11,175,370) after ``--train-steps`` (300) SGD steps (batch 64, lr 0.05, momentum 0.9)
on the remaining images; BatchNorm in training mode (batch statistics), inputs standardised with
Fashion-MNIST's mean/std. Fashion-MNIST comes from ``app.data.sources`` (offline idx files).
A new sketch seed for every pair index.

Pairs: up to ``--pairs`` (100) per cell; the first pair of every cell is timed, and a cell whose
pair costs more than ``--cell-budget / --pairs`` seconds runs ``max(--min-pairs,
--cell-budget // cost)`` pairs instead (the table says how many). A cell that cannot run on this
CPU is shown as such, with the estimate: dense Gaussian/Rademacher whose estimated time per pair
(2 sum_l k_l n_l multiply-adds at the measured dense rate) exceeds ``--max-pair-seconds``, and FJLT
whose default core (``q = log2(m')^2 / m'``, ~ k log^2 m' nonzeros) needs more than
``--fjlt-max-gib`` GiB.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python -m scripts.bench.sketch_distortion [--pairs 100]
        [--ratios 0.5,0.3,0.1] [--cases a,b] [--json out.json] [--quick]

The full run takes about 16 minutes on one thread of the project's 2-core machine. ``--quick``
(a smoke test, seconds): 64 x 64 matrices and the gradients of an MLP 784-8-10 after 5 steps,
3 pairs per cell. ``--render out.json`` prints the tables of an earlier ``--json`` run again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from app.seeding import derive_seed, np_rng
from app.sketch import SKETCH_KINDS, Sketch, make_sketch

from scripts.bench.sketch_cost import dense_rate, dense_work, fjlt_nnz  # the sibling benchmark

FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
FJLT_BYTES_PER_NNZ = 28  # int64 row + int64 col + float32 value cached, + int64 position at build


# --------------------------------------------------------------------------------------------
# metrics (pure)


def pair_stats(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """``(<a, b>, ||a||, ||b||)`` accumulated in float64."""
    a64, b64 = a.double(), b.double()
    return float(a64 @ b64), float(a64.norm()), float(b64.norm())


def angle_deg(ip: float, norm_a: float, norm_b: float) -> float:
    """``arccos(<a, b> / (||a|| ||b||))`` in degrees (cosine clamped to [-1, 1]; 90 if a norm is 0)."""
    if norm_a == 0.0 or norm_b == 0.0:
        return 90.0
    return math.degrees(math.acos(max(-1.0, min(1.0, ip / (norm_a * norm_b)))))


def delta_ip(sketched: tuple[float, float, float], true: tuple[float, float, float]) -> float:
    """``|<Su, Sv> - <u, v>| / (||u|| ||v||)`` from ``pair_stats(Su, Sv)`` and ``pair_stats(u, v)``."""
    return abs(sketched[0] - true[0]) / (true[1] * true[2])


def delta_theta(sketched: tuple[float, float, float], true: tuple[float, float, float]) -> float:
    """``|angle(Su, Sv) - angle(u, v)|`` in degrees."""
    return abs(angle_deg(*sketched) - angle_deg(*true))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    vals = list(values)
    if not vals:
        return math.nan, math.nan
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


# --------------------------------------------------------------------------------------------
# sketching one pair


@dataclass
class Cell:
    """One table row: a kind at a k/n (or adaptive at an epsilon) on one case."""

    kind: str
    ratio: float | None = None
    epsilon: float | None = None
    k_over_n: float = math.nan
    skip: str = ""
    pairs: int = 0
    cost: float = math.nan
    dip: list[float] = field(default_factory=list)
    dth: list[float] = field(default_factory=list)

    def make(self, layout: Sequence[Sequence[int]], seed: int) -> Sketch:
        if self.kind == "adaptive":
            return make_sketch("adaptive", layout, epsilon=self.epsilon, seed=seed, round=0)
        if self.kind == "powersgd":
            return make_sketch("powersgd", layout, ratio=self.ratio, seed=seed, round=0)
        return make_sketch(self.kind, layout, ratio=self.ratio, seed=seed, round=0, layerwise=True)


def sketch_pair(cell: Cell, layout: Sequence[Sequence[int]], u: torch.Tensor, v: torch.Tensor,
                seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Su, Sv)`` under one S drawn from ``seed``: payloads for the linear kinds, lifted
    ``P Q^T`` for PowerSGD (each vector with its own fresh state)."""
    if cell.kind == "powersgd":
        su_s, sv_s = cell.make(layout, seed), cell.make(layout, seed)
        return su_s.decompress(su_s.compress(u)), sv_s.decompress(sv_s.compress(v))
    sk = cell.make(layout, seed)
    return sk.compress(u), sk.compress(v)


def feasibility(cell: Cell, layout: Sequence[Sequence[int]], rate: float,
                args: argparse.Namespace) -> str:
    """Why ``cell`` cannot run on this CPU ('' if it can), with the estimate."""
    sk = cell.make(layout, 0)
    cell.k_over_n = sk.k / sk.n
    seconds = 2 * dense_work(sk) / rate
    if seconds > args.max_pair_seconds:
        return (f"too slow on CPU: est. {seconds / 3600:,.1f} h per pair "
                f"(2 x {dense_work(sk):.2g} multiply-adds at {rate / 1e6:.0f}M/s)")
    nnz = fjlt_nnz(sk)
    if nnz * FJLT_BYTES_PER_NNZ > args.fjlt_max_gib * (1 << 30):
        return (f"not run: default q = log2(m')^2/m' gives {nnz:.2g} nonzeros "
                f"(~{nnz * FJLT_BYTES_PER_NNZ / (1 << 30):,.0f} GiB)")
    return ""


# --------------------------------------------------------------------------------------------
# the two cases


class Case:
    """A source of ``(u, v)`` pairs on a fixed layout."""

    name: str = ""
    layout: list[tuple[int, ...]] = []
    description: str = ""

    def pair(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class RandomMatrices(Case):
    """Case (a): two independent ``side x side`` N(0, 1) matrices, one layer."""

    def __init__(self, side: int, seed: int) -> None:
        self.name, self.side, self.seed = "a", side, seed
        self.layout = [(side, side)]
        self.description = (f"(a) two random {side}x{side} matrices, i.i.d. N(0,1) entries, one layer "
                            f"(n = {side * side:,}); a new pair per pair index")

    def pair(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "distortion", "a", i))
        n = self.side * self.side
        return torch.randn(n, generator=gen), torch.randn(n, generator=gen)


def resnet18_1ch(num_classes: int = 10) -> nn.Module:
    """torchvision ResNet-18 with conv1 replaced by a 1-channel 7x7 stride-2 conv (28x28 inputs)."""
    import torchvision

    model = torchvision.models.resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def flat_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of the mean cross-entropy on ``(x, y)``, flattened in ``named_parameters`` order."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for _, p in model.named_parameters()]).detach()


class GradientPairs(Case):
    """Case (b): a stochastic minibatch gradient against the trust-set gradient."""

    def __init__(self, args: argparse.Namespace) -> None:
        from app.data.sources import load_source

        self.name = "b"
        ds = load_source("fashion-mnist")
        x = (torch.from_numpy(ds.x) - FASHION_MEAN) / FASHION_STD
        y = torch.from_numpy(ds.y)
        perm = torch.from_numpy(np_rng(args.seed, "distortion", "split").permutation(len(ds)))
        trust = perm[:args.trust]
        self.pool = perm[args.trust:args.trust + args.pairs * args.batch]
        train = perm[args.trust + args.pairs * args.batch:]
        self.x, self.y, self.batch = x, y, args.batch
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(args.seed, "distortion", "model") % (1 << 31))
            if args.quick:
                from app.models.zoo import build_model

                model = build_model("mlp", (1, 28, 28), 10, hidden=(8,))
                name = "MLP 784-8-10 (--quick)"
            else:
                model = resnet18_1ch()
                name = "ResNet-18 (1-channel conv1)"
        self.layout = [tuple(p.shape) for _, p in model.named_parameters()]
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        order = np_rng(args.seed, "distortion", "train").integers(0, len(train), (args.train_steps, args.batch))
        losses = []
        t0 = time.perf_counter()
        for step in range(args.train_steps):
            idx = train[torch.from_numpy(order[step])]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.train_seconds = time.perf_counter() - t0
        self.model = model
        self.v = flat_grad(model, x[trust], y[trust])
        tail = losses[-20:]
        loss_txt = f"training loss (mean of the last {len(tail)} steps) {statistics.fmean(tail):.3f}; " if tail else ""
        self.description = (
            f"(b) {name}, n = {self.v.numel():,} in {len(self.layout)} tensors, after "
            f"{args.train_steps} SGD steps (batch {args.batch}, lr {args.lr}, momentum 0.9; "
            f"{loss_txt}{self.train_seconds:.0f} s); u = gradient on {args.batch} Fashion-MNIST images "
            f"(a different batch per pair), v = gradient on {args.trust} other images (fixed trust set)")

    def pair(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.pool[i * self.batch:(i + 1) * self.batch]
        return flat_grad(self.model, self.x[idx], self.y[idx]), self.v


# --------------------------------------------------------------------------------------------
# running and printing


def cells_for(kinds: Sequence[str], ratios: Sequence[float], epsilon: float) -> list[Cell]:
    out = []
    for kind in kinds:
        if kind == "adaptive":
            out.append(Cell(kind, epsilon=epsilon))
        else:
            out.extend(Cell(kind, ratio=r) for r in ratios)
    return out


def run_case(case: Case, cells: list[Cell], args: argparse.Namespace, rate: float,
             log: Callable[[str], None]) -> dict[str, Any]:
    """Fill every cell's Delta lists; returns the case's summary (true cosines and angles)."""
    for cell in cells:
        cell.skip = feasibility(cell, case.layout, rate, args)
    live = [c for c in cells if not c.skip]
    cos_uv, ang_uv = [], []
    i = 0
    t_start = time.perf_counter()
    while i < args.pairs:
        todo = [c for c in live if i == 0 or c.pairs > i]
        if not todo:
            break
        u, v = case.pair(i)
        true = pair_stats(u, v)
        cos_uv.append(true[0] / (true[1] * true[2]))
        ang_uv.append(angle_deg(*true))
        seed = derive_seed(args.seed, "distortion", "sketch", case.name, i)
        for cell in todo:
            t0 = time.perf_counter()
            su, sv = sketch_pair(cell, case.layout, u, v, seed)
            dt = time.perf_counter() - t0
            sketched = pair_stats(su, sv)
            cell.dip.append(delta_ip(sketched, true))
            cell.dth.append(delta_theta(sketched, true))
            if i == 0:
                cell.cost = dt
                cell.pairs = min(args.pairs, max(args.min_pairs, int(args.cell_budget // max(dt, 1e-9))))
                log(f"#   case ({case.name}) {label(cell)}: {dt:.2f} s per pair -> {cell.pairs} pairs")
            del su, sv
        i += 1
    for cell in live:
        cell.pairs = len(cell.dip)
    return {"cos_uv": mean_std(cos_uv), "angle_uv": mean_std(ang_uv), "pairs": len(cos_uv),
            "seconds": time.perf_counter() - t_start}


def label(cell: Cell) -> str:
    if cell.kind == "adaptive":
        return f"adaptive (eps = {cell.epsilon:g})"
    return f"{cell.kind} @ {cell.ratio:g}"


def fmt(m: float, s: float, deg: bool = False) -> str:
    if deg:
        return f"{m:.3g} ± {s:.2g}"
    return f"{m:.2e} ± {s:.1e}"


def relative_to_randk(dip: Sequence[float], randk_dip: Sequence[float]) -> tuple[float, int]:
    """Mean Delta_ip over mean RandK Delta_ip on the pairs both have (the first ``m`` pair
    indices: every cell runs pairs 0, 1, ... in order), and ``m``."""
    m = min(len(dip), len(randk_dip))
    if m == 0 or statistics.fmean(randk_dip[:m]) == 0:
        return math.nan, m
    return statistics.fmean(dip[:m]) / statistics.fmean(randk_dip[:m]), m


def render(cells: list[Cell], pairs: int) -> str:
    """Markdown: one row per cell, with the mean Delta_ip relative to RandK's at the same k/n
    on the same pairs."""
    randk = {c.ratio: c.dip for c in cells if c.kind == "randk" and c.dip}
    lines = ["| kind | k/n | pairs | Δ_ip (mean ± std) | Δ_θ in degrees (mean ± std) "
             "| Δ_ip / RandK's (same pairs) |",
             "|---|---|---|---|---|---|"]
    for c in cells:
        name = c.kind if c.kind != "adaptive" else f"adaptive, ε = {c.epsilon:g}"
        if c.kind == "powersgd":
            name = "powersgd (lifted PQᵀ)"
        kn = f"{c.ratio:g}" if c.kind != "adaptive" else f"{c.k_over_n:.3g} (picked)"
        if c.kind not in ("adaptive", "powersgd") and not math.isnan(c.k_over_n) \
                and abs(c.k_over_n - c.ratio) > 1e-3:
            kn += f" ({c.k_over_n:.3g})"
        if c.skip:
            lines.append(f"| {name} | {kn} | 0 | {c.skip} | — | — |")
            continue
        m_ip, s_ip = mean_std(c.dip)
        m_th, s_th = mean_std(c.dth)
        rel = "—"
        if c.kind not in ("adaptive", "randk") and c.ratio in randk:
            r, m = relative_to_randk(c.dip, randk[c.ratio])
            rel = f"{r:.2f}" + ("" if m == len(c.dip) == len(randk[c.ratio]) else f" ({m} pairs)")
        elif c.kind == "randk":
            rel = "1"
        npairs = f"{c.pairs}" + ("" if c.pairs == pairs else f" of {pairs}")
        lines.append(f"| {name} | {kn} | {npairs} | {fmt(m_ip, s_ip)} | {fmt(m_th, s_th, True)} | {rel} |")
    return "\n".join(lines)


def report(description: str, summary: dict[str, Any], table: str, seconds: float | None) -> None:
    """Print one case: its description, the true cosines/angles of its pairs, and its table."""
    ca, cs = summary["cos_uv"]
    aa, as_ = summary["angle_uv"]
    took = "" if seconds is None else f"; case took {seconds:.0f} s"
    print(f"\n## Case {description}")
    print(f"cos(u, v) = {ca:.3g} ± {cs:.2g}, angle(u, v) = {aa:.4g} ± {as_:.2g} degrees "
          f"over {summary['pairs']} pairs{took}\n")
    print(table, flush=True)


def render_json(path: str) -> dict[str, Any]:
    """Print the tables of an earlier ``--json`` run again (same data, current ``render``)."""
    data = json.loads(Path(path).read_text())
    for case in data.values():
        cells = [Cell(c["kind"], ratio=c["ratio"], epsilon=c["epsilon"], k_over_n=c["k_over_n"],
                      skip=c["skip"], pairs=c["pairs"], cost=c["cost_first_pair_s"], dip=c["dip"],
                      dth=c["dth"]) for c in case["cells"]]
        case["table"] = render(cells, case.get("max_pairs", 100))
        report(case["description"], case["summary"], case["table"], case["summary"].get("seconds"))
    return data


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=100, help="pairs per cell at most (100)")
    p.add_argument("--ratios", default="0.5,0.3,0.1", help="k/n values (0.5,0.3,0.1)")
    p.add_argument("--epsilon", type=float, default=0.3, help="target distortion of adaptive (0.3)")
    p.add_argument("--kinds", default=",".join(SKETCH_KINDS), help="comma-separated kinds (all)")
    p.add_argument("--cases", default="a,b", help="a (random matrices), b (ResNet-18 gradients)")
    p.add_argument("--side", type=int, default=4096, help="case (a): side of the matrices (4096)")
    p.add_argument("--batch", type=int, default=64, help="case (b): images per stochastic gradient")
    p.add_argument("--trust", type=int, default=500, help="case (b): images of the trust set")
    p.add_argument("--train-steps", type=int, default=300, help="case (b): SGD steps before measuring")
    p.add_argument("--lr", type=float, default=0.05, help="case (b): SGD step size")
    p.add_argument("--cell-budget", type=float, default=20.0,
                   help="seconds of sketching per cell; fewer pairs where one pair costs more")
    p.add_argument("--min-pairs", type=int, default=3, help="pairs per cell at least (3)")
    p.add_argument("--max-pair-seconds", type=float, default=60.0,
                   help="estimated seconds per pair beyond which a dense cell is not run (60)")
    p.add_argument("--fjlt-max-gib", type=float, default=2.0, help="FJLT core size limit (2 GiB)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 64x64 matrices, MLP 784-8-10 gradients, 3 pairs, seconds")
    p.add_argument("--json", default="", help="also write the results to this JSON file")
    p.add_argument("--render", default="", metavar="JSON",
                   help="only print the tables of an earlier --json run again")
    args = p.parse_args(argv)
    args.ratios = [float(r) for r in str(args.ratios).split(",") if r.strip()]
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [k for k in args.kinds if k not in SKETCH_KINDS]
    if bad or any(c not in ("a", "b") for c in args.cases):
        p.error(f"unknown kinds {bad} or cases {args.cases}")
    if args.quick:
        args.side, args.batch, args.trust, args.train_steps = 64, 16, 64, 5
        args.pairs = min(args.pairs, 3)
        args.min_pairs = min(args.min_pairs, args.pairs)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns ``{case: {"cells": [...], "summary": ..., "table": str}}``."""
    args = parse_args(argv)
    if args.render:
        return render_json(args.render)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    try:
        rate = dense_rate()
        print(f"# Sketch distortion, {datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
              f"torch {torch.__version__}, 1 thread; up to {args.pairs} pairs per cell, "
              f"cell budget {args.cell_budget:g} s, k/n in {args.ratios}, adaptive eps = {args.epsilon}",
              flush=True)
        out: dict[str, Any] = {}
        for name in args.cases:
            t0 = time.perf_counter()
            case: Case = RandomMatrices(args.side, args.seed) if name == "a" else GradientPairs(args)
            cells = cells_for(args.kinds, args.ratios, args.epsilon)
            summary = run_case(case, cells, args, rate, log)
            table = render(cells, args.pairs)
            report(case.description, summary, table, time.perf_counter() - t0)
            out[name] = {"description": case.description, "summary": summary, "table": table,
                         "max_pairs": args.pairs,
                         "cells": [{"kind": c.kind, "ratio": c.ratio, "epsilon": c.epsilon,
                                    "k_over_n": c.k_over_n, "skip": c.skip, "pairs": c.pairs,
                                    "cost_first_pair_s": c.cost, "dip": c.dip, "dth": c.dth}
                                   for c in cells]}
            del case
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=str))
        return out
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    main(sys.argv[1:])
