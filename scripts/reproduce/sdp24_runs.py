"""Issue 24's shuffle-DP measurements: ISRL-DP and four shuffle-DP variants (count-on all or 1,
record-level amplification none or sampling, both set explicitly) on one setup, through
scripts/reproduce/isrl_compare.py (called once per variant in one process, so the data is
loaded once). The tables and figures: scripts/reproduce/sdp_report.py (see its docstring).

Setup ``fmnist-iid-k64`` (isrl_compare.SETUPS): Fashion-MNIST, IID silos sharing half of the
70,000 records, PCA 50, logistic regression, R = 15, K = 64; one hyper-parameter point for every
row (lr 1, L 2; not tuned), seeds 0-2.

    python -m scripts.reproduce.sdp24_runs eps --algorithms svrg          # vs epsilon, 10 silos
    python -m scripts.reproduce.sdp24_runs n --n 5 10 25 50               # MB-SGD vs N at epsilon 3

Runs go to <root>/<mode>-<tag><suffix> (tag fiid10 for ``eps``, nfiid<N> for ``n``); reruns skip
the runs already in each runs.csv.
"""

from __future__ import annotations

import argparse

from scripts.reproduce import isrl_compare

#: (suffix, mode, extra isrl_compare arguments); the suffixes are sdp_report.VARIANTS'
VARIANTS = {
    "isrl": ("", "isrl", []),
    "all": ("", "shuffle", ["--count-on", "0", "--amplification", "none"]),
    "all-amp": ("-amp", "shuffle", ["--count-on", "0", "--amplification", "sampling"]),
    "c1": ("-c1", "shuffle", ["--count-on", "1", "--amplification", "none"]),
    "c1-amp": ("-c1-amp", "shuffle", ["--count-on", "1", "--amplification", "sampling"]),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["eps", "n"])
    ap.add_argument("--algorithms", nargs="+", default=["proxsgd", "svrg", "spider"])
    ap.add_argument("--eps", nargs="+", default=["0.75", "1.5", "3", "6", "18"])
    ap.add_argument("--n", type=int, nargs="+", default=[5, 10, 25, 50])
    ap.add_argument("--n-eps", default="3")
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--seeds", nargs="+", default=["0", "1", "2"])
    ap.add_argument("--root", default="outputs/reproduce/sdp24")
    a = ap.parse_args(argv)
    common = ["--setup", "fmnist-iid-k64", "--lr", "1", "--clip", "2", "--seeds", *a.seeds]
    plan = []
    if a.what == "eps":
        plan = [(10, "fiid10", ["--algorithms", *a.algorithms, "--eps", *a.eps])]
    else:
        plan = [(n, f"nfiid{n}", ["--algorithms", "mbsgd", "--eps", a.n_eps]) for n in a.n]
    for n, tag, args in plan:
        for v in a.variants:
            suffix, mode, extra = VARIANTS[v]
            if v.endswith("amp") and "proxsgd" in args:  # disjoint blocks: amplification does not apply
                args = [x for x in args if x != "proxsgd"]
                if args[1] == "--eps":
                    continue
            out = f"{a.root}/{mode}-{tag}{suffix}"
            print(f"[sdp24] {tag} {v} -> {out}", flush=True)
            isrl_compare.main(common + args + ["--num-silos", str(n), "--mode", mode, *extra, "--out", out])


if __name__ == "__main__":
    main()
