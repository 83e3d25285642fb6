"""How much privacy the paper's own noise constants actually certify (its Appendix H / code).

The authors' code (DP_FL2.py, ``get_iid_gauss_noise``) adds to each silo's minibatch mean
gradient Gaussian noise with standard deviation

    sigma = sqrt(c * L^2 * R * log(2/delta) / (n^2 * eps^2)),   c = 8 (gradients), 32 (SPIDER differences),

with K = n * sqrt(24) / (2 sqrt(R)) records per step and delta = 1/n^2. The constants come from a
moments-accountant bound that holds under conditions on eps and K; and its Fed-SPIDER (the
alternate form, Algorithm 11) calibrates BOTH of its per-round uploads as if each were the only
one, so R fresh gradients and R - 1 differences share one budget meant for R releases.

This script feeds those sigmas to silofl's accountant (dp-accounting RDP, replace-one, K of n
sampled without replacement; the paper samples with replacement, whose amplification is no
better) and prints the epsilon each configuration really spends next to the one it claims.
Run: ``python -m scripts.reproduce.appendix_h [--n 170 286 1920] [--rounds 25 50]``.
"""

from __future__ import annotations

import argparse
import math

from app.privacy.accounting import Release, epsilon_spent


def paper_sigma(c: float, clip: float, rounds: int, delta: float, n: int, eps: float) -> float:
    """The noise std of the authors' ``get_iid_gauss_noise`` (K argument = 1, as they call it)."""
    return math.sqrt(c * clip**2 * rounds * math.log(2 / delta) / (n**2 * eps**2))


def paper_batch(n: int, rounds: int, k_constant: float = 24.0) -> int:
    """K = n sqrt(24) / (2 sqrt(R)), as in the authors' ``main``."""
    return int(max(1, n * math.sqrt(k_constant) / (2 * math.sqrt(rounds))))


def certified(n: int, rounds: int, eps: float, algorithm: str, clip: float = 1.0) -> float:
    """epsilon that dp-accounting certifies for the paper's noise at delta = 1/n^2."""
    delta = 1.0 / n**2
    k = min(paper_batch(n, rounds), n)
    z_grad = paper_sigma(8, clip, rounds, delta, n, eps) / (2 * clip / k)
    releases = [Release("grad", n, k, z_grad, rounds)]
    if algorithm == "spider-alt":
        z_diff = paper_sigma(32, clip, rounds, delta, n, eps) / (4 * clip / k)
        releases.append(Release("diff", n, k, z_diff, rounds - 1))
    return epsilon_spent(releases, delta)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[170, 286, 1920])
    ap.add_argument("--rounds", type=int, nargs="+", default=[25, 50])
    ap.add_argument("--eps", type=float, nargs="+", default=[0.75, 1.5, 3.0, 6.0, 18.0])
    args = ap.parse_args(argv)
    print("| n | R | K | claimed eps | MB-SGD certified | Fed-SPIDER (alt) certified |")
    print("|---|---|---|---|---|---|")
    for n in args.n:
        for rounds in args.rounds:
            for eps in args.eps:
                mb, alt = certified(n, rounds, eps, "mbsgd"), certified(n, rounds, eps, "spider-alt")
                print(f"| {n} | {rounds} | {min(paper_batch(n, rounds), n)} | {eps:g} | {mb:.3f} | {alt:.3f} |")


if __name__ == "__main__":
    main()
