"""Shuffle DP against ISRL-DP: tables and figures from the runs of scripts/reproduce/isrl_compare.py.

    python -m scripts.reproduce.isrl_compare --setup wbcd --mode isrl    --algorithms mbsgd proxsgd svrg spider \\
        --eps 0.75 1.5 3 6 18 inf --tune-seeds 0 --out outputs/reproduce/sdp/isrl-wbcd
    python -m scripts.reproduce.isrl_compare --setup wbcd --mode shuffle --algorithms mbsgd proxsgd svrg spider \\
        --eps 0.75 1.5 3 6 18 --tune-seeds 0 --out outputs/reproduce/sdp/shuffle-wbcd
    (the same for --setup fmnist-pairs; and for error vs N: --setup fmnist-iid --num-silos N
     --algorithms mbsgd --eps 1 --lr 0.3 1.0 --clip 2.0 --seeds 0 1 2 --out outputs/reproduce/sdp/<mode>-fmnist-iid-n<N>)
    python -m scripts.reproduce.sdp_report --setups wbcd fmnist-pairs --n 5 10 25 50

Trust and amplification variants (--variants-setup, default fmnist-pairs; each variant's runs in
outputs/reproduce/sdp/<mode>-<setup><suffix>, written by isrl_compare.py with --count-on 1 and / or
--amplification sampling): a table of test error, a table of the noise trials and the figure
docs/img/sdp-amplified-error-vs-epsilon.png.

Per (mode, algorithm, epsilon) the (lr, clip) with the lowest validation error on the tuning
seed is selected (isrl_compare.select) and its test error over all seeds reported (mean ± std).
Figures: docs/img/sdp-<setup>-error-vs-epsilon.png and docs/img/sdp-error-vs-n.png.

Other run directories: ``--root DIR`` reads DIR/<mode>-<tag><suffix>; ``--variants-setup TAG``
may be any tag there (``--silos N`` then gives the silos per round of the trials table);
``--n-tag 'fiid{n}'`` / ``--n-eps 3`` / ``--n-variants`` make the error-vs-N table from
DIR/<mode>-fiid<N><suffix> at epsilon 3 with every variant; ``--variants-figure`` and
``--n-figure`` name the figures (PNG and PDF). Issue 24's runs:

    python -m scripts.reproduce.sdp_report --root outputs/reproduce/sdp24 --setups --algorithms proxsgd svrg spider \
        --variants-setup fiid10 --silos 10 --variants-figure sdp24-variants-error-vs-epsilon \
        --n 5 10 25 50 --n-tag 'fiid{n}' --n-eps 3 --n-variants --n-figure sdp24-error-vs-n
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
from pathlib import Path
from typing import Any

from scripts.reproduce.isrl_compare import SETUPS, select

ROOT = Path("outputs") / "reproduce" / "sdp"
IMG = Path("docs") / "img"


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with path.open() as fh:
        return list(csv.DictReader(fh))


def _best(mode: str, tag: str, tune: set[int]) -> dict:
    return select(_rows(ROOT / f"{mode}-{tag}" / "runs.csv"), tune)


def _cell(b: dict | None) -> str:
    if b is None:
        return "n/a"
    errs = [float(r["test_error"]) for r in b["runs"]]
    sd = statistics.stdev(errs) if len(errs) > 1 else 0.0
    return f"{statistics.mean(errs):.1%} ± {sd:.1%} ({len(errs)})"


def epsilon_table(setup: str, algorithms: list[str], epsilons: list[float], tune: set[int]) -> str:
    isrl, sdp = _best("isrl", setup, tune), _best("shuffle", setup, tune)
    head = "| algorithm | mode | " + " | ".join(f"ε={e:g}" for e in epsilons) + " | non-private |"
    lines = [head, "|---|---|" + "---|" * (len(epsilons) + 1)]
    for algo in algorithms:
        for mode, best in (("ISRL-DP", isrl), ("SDP", sdp)):
            cells = [_cell(best.get((algo, e))) for e in epsilons]
            lines.append(f"| {algo} | {mode} | " + " | ".join(cells) + f" | {_cell(isrl.get((algo, math.inf)))} |")
    return "\n".join(lines)


def epsilon_figure(setup: str, algorithms: list[str], epsilons: list[float], tune: set[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    isrl, sdp = _best("isrl", setup, tune), _best("shuffle", setup, tune)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, algo in enumerate(algorithms):
        for best, ls, label in ((sdp, "-", "SDP"), (isrl, "--", "ISRL-DP")):
            xs = [e for e in epsilons if (algo, e) in best]
            if not xs:
                continue
            errs = [[float(r["test_error"]) for r in best[(algo, e)]["runs"]] for e in xs]
            ax.errorbar(xs, [statistics.mean(v) for v in errs],
                        yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in errs], ls=ls, marker="o",
                        capsize=3, color=f"C{i}", label=f"{algo} {label}")
    ax.set_xscale("log")
    ax.set_xlabel("ε (each silo, certified)")
    ax.set_ylabel("test error (mean ± std over seeds)")
    ax.set_title(f"{setup}: shuffle DP (solid) vs ISRL-DP (dashed)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def n_table_and_figure(ns: list[int], tune: set[int], path: Path, tag: str = "fmnist-iid-n{n}", eps: float = 1.0,
                       variants: bool = False, xlabel: str = "N silos (6,000 training records split among them)",
                       ylabel: str = "test error, full-batch MB-SGD at ε = 1") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = VARIANTS if variants else [("ISRL-DP", "isrl", "", "--"), ("SDP", "shuffle", "", "-")]
    lines = ["| N silos | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    series: dict[str, list[tuple[int, list[float]]]] = {c[0]: [] for c in cols}
    for n in ns:
        cells = []
        for label, mode, suffix, _ in cols:
            best = _best(mode, tag.format(n=n) + suffix, tune).get(("mbsgd", float(eps)))
            cells.append(_cell(best))
            if best is not None:
                series[label].append((n, [float(r["test_error"]) for r in best["runs"]]))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    fig, ax = plt.subplots(figsize=(6.4, 4.2) if variants else (5.6, 3.8))
    for i, ((label, pts), (_, _, _, ls)) in enumerate(zip(series.items(), cols)):
        if pts:
            ax.errorbar([n for n, _ in pts], [statistics.mean(v) for _, v in pts],
                        yerr=[statistics.stdev(v) if len(v) > 1 else 0 for _, v in pts], ls=ls, marker="os^vD"[i % 5],
                        capsize=3, color=f"C{i}", label=label)
    ax.set_xscale("log")
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if variants:
        from matplotlib.ticker import NullLocator, PercentFormatter

        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_title(f"Fashion-MNIST IID, logistic regression, K = 64, ε = {eps:g}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    if variants:
        fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return "\n".join(lines)


#: (label, mode, directory suffix, line style) of the trust / amplification comparison
VARIANTS: list[tuple[str, str, str, str]] = [
    ("ISRL-DP", "isrl", "", "--"),
    ("SDP count-on all", "shuffle", "", "-"),
    ("SDP count-on all, amplified", "shuffle", "-amp", "-"),
    ("SDP count-on 1", "shuffle", "-c1", ":"),
    ("SDP count-on 1, amplified", "shuffle", "-c1-amp", ":"),
]
#: panel titles of run tags that are not setups of isrl_compare.py
SETUP_TITLES = {"fiid10": "Fashion-MNIST IID, 10 silos"}
#: binomial success probability of the shuffle levels (docs/privacy.md: p = 1/4)
P_BINOMIAL = 0.25


def _variants(setup: str, tune: set[int]) -> list[tuple[str, str, dict]]:
    return [(label, ls, _best(mode, setup + suffix, tune)) for label, mode, suffix, ls in VARIANTS]


def variants_table(setup: str, algorithms: list[str], epsilons: list[float], tune: set[int]) -> str:
    """Test error (mean ± std (n seeds)) per algorithm, variant and epsilon."""
    variants = _variants(setup, tune)
    lines = ["| algorithm | variant | " + " | ".join(f"ε={e:g}" for e in epsilons) + " |",
             "|---|---|" + "---|" * len(epsilons)]
    for algo in algorithms:
        for label, _, best in variants:
            if any((algo, e) in best for e in epsilons):
                lines.append(f"| {algo} | {label} | " + " | ".join(_cell(best.get((algo, e))) for e in epsilons) + " |")
    return "\n".join(lines)


def trials_table(setup: str, algorithms: list[str], epsilons: list[float], tune: set[int],
                 silos: int | None = None) -> str:
    """Per shuffle variant and epsilon: the trials m a release's sum needs, the trials one silo carries,
    and the noise std per coordinate (levels) of one silo's share and of the sum over N silos
    (N = ``silos``, default the setup's silos per round)."""
    n_silos = int(silos or SETUPS[setup]["silos-per-round"])
    var = P_BINOMIAL * (1 - P_BINOMIAL)
    lines = [f"| algorithm | variant | ε | trials needed m | trials per silo | std per silo | std of the sum of {n_silos} |",
             "|---|---|---|---|---|---|---|"]
    for algo in algorithms:
        for label, _, best in _variants(setup, tune):
            for e in epsilons:
                b = best.get((algo, e))
                runs = [r for r in (b or {}).get("runs", []) if r.get("trials_max")]
                if not runs:
                    continue
                need = max(int(r["trials_max"]) for r in runs)
                need_lo = min(int(r["trials_min"]) for r in runs)
                silo = max(int(r["silo_trials_max"]) for r in runs)
                m = f"{need:.3g}" if need == need_lo else f"{need_lo:.3g}–{need:.3g}"
                lines.append(f"| {algo} | {label} | {e:g} | {m} | {silo:.3g} | {math.sqrt(silo * var):.3g} | "
                             f"{math.sqrt(n_silos * silo * var):.3g} |")
    return "\n".join(lines)


def variants_figure(setup: str, algorithms: list[str], epsilons: list[float], tune: set[int], path: Path,
                    title: str | None = None) -> None:
    """One panel per algorithm with data: test error (%) vs epsilon, mean ± std over seeds, per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullLocator, PercentFormatter

    variants = _variants(setup, tune)
    title_setup = SETUP_TITLES.get(setup)
    algos = [a for a in algorithms if any((a, e) in best for _, _, best in variants for e in epsilons)]
    if not algos:
        return
    cols = min(2, len(algos))
    rows = math.ceil(len(algos) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.4 * rows), squeeze=False)
    for ax in axes.flat[len(algos):]:
        ax.set_visible(False)
    for ax, algo in zip(axes.flat, algos):
        for i, (label, ls, best) in enumerate(variants):
            xs = [e for e in epsilons if (algo, e) in best]
            if not xs:
                continue
            errs = [[100 * float(r["test_error"]) for r in best[(algo, e)]["runs"]] for e in xs]
            n = min(len(v) for v in errs)
            ax.errorbar(xs, [statistics.mean(v) for v in errs],
                        yerr=[statistics.stdev(v) if len(v) > 1 else 0 for v in errs], ls=ls, marker="os^vD"[i % 5],
                        capsize=3, color=f"C{i}", label=f"{label} (n={n})")
        ax.set_xscale("log")
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.set_yscale("log")  # errors from ~4% to ~50%: equal ratios, equal heights
        ax.yaxis.set_major_locator(FixedLocator([3, 4, 5, 7, 10, 15, 20, 25, 30, 40, 50, 70, 90]))
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
        ax.set_xlabel("ε (each silo, certified)")
        ax.set_ylabel("test error (%, mean ± std over seeds; log scale)")
        ax.set_title(f"{title_setup or setup}, {algo}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title or "Shuffle DP vs ISRL-DP: count-on and record-level amplification", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    if path.stem != "sdp-amplified-error-vs-epsilon":
        fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setups", nargs="*", default=["wbcd", "fmnist-pairs"], help="setups of the two-mode tables (none: skip)")
    ap.add_argument("--algorithms", nargs="+", default=["mbsgd", "proxsgd", "svrg", "spider"])
    ap.add_argument("--eps", type=float, nargs="+", default=[0.75, 1.5, 3.0, 6.0, 18.0])
    ap.add_argument("--n", type=int, nargs="*", default=[5, 10, 25, 50], help="N of the error-vs-N runs (none: skip)")
    ap.add_argument("--tune-seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--variants-setup", nargs="*", default=["fmnist-pairs"],
                    help="setups of the count-on / amplification comparison (none: skip)")
    ap.add_argument("--root", type=Path, default=None, help="the run directories' parent (default outputs/reproduce/sdp)")
    ap.add_argument("--silos", type=int, default=None, help="silos per round of the variants setup (default: the setup's)")
    ap.add_argument("--variants-figure", default="sdp-amplified-error-vs-epsilon", help="figure name in docs/img")
    ap.add_argument("--n-tag", default="fmnist-iid-n{n}", help="run tag of the error-vs-N runs ({n}: N)")
    ap.add_argument("--n-eps", type=float, default=1.0, help="epsilon of the error-vs-N runs")
    ap.add_argument("--n-variants", action="store_true", help="error vs N for every variant, not ISRL-DP and SDP only")
    ap.add_argument("--n-figure", default="sdp-error-vs-n", help="figure name in docs/img")
    args = ap.parse_args(argv)
    global ROOT
    if args.root is not None:
        ROOT = args.root
    IMG.mkdir(parents=True, exist_ok=True)
    tune = set(args.tune_seeds)
    for setup in args.setups:
        print(f"### {setup}\n")
        print(epsilon_table(setup, args.algorithms, args.eps, tune) + "\n")
        epsilon_figure(setup, args.algorithms, args.eps, tune, IMG / f"sdp-{setup}-error-vs-epsilon.png")
    for setup in args.variants_setup:
        print(f"### {setup}: count-on and amplification\n")
        print(variants_table(setup, args.algorithms, args.eps, tune) + "\n")
        print(trials_table(setup, args.algorithms, args.eps, tune, args.silos) + "\n")
        variants_figure(setup, args.algorithms, args.eps, tune, IMG / f"{args.variants_figure}.png")
    if args.n and args.n_variants:
        print(f"### error vs N (run tag {args.n_tag}, MB-SGD, ε = {args.n_eps:g}, every variant)\n")
        print(n_table_and_figure(args.n, tune, IMG / f"{args.n_figure}.png", args.n_tag, args.n_eps, True,
                                 "N silos (35,000 records split among them)",
                                 f"test error, MB-SGD (mean ± std over seeds)"))
    elif args.n:
        print("### error vs N (Fashion-MNIST IID, 6,000 training records, PCA 50, logistic regression, full-batch MB-SGD, ε = 1)\n")
        print(n_table_and_figure(args.n, tune, IMG / f"{args.n_figure}.png", args.n_tag, args.n_eps))


if __name__ == "__main__":
    main()
