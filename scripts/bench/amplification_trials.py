"""What record-level amplification buys shuffle DP (issue 24): the noise trials a silo calibrates
with ``shuffle.amplification`` = none and = sampling, and the server-side noise of the aggregated
mean next to ISRL-DP's, for representative MB-SGD plans (no training):

    python -m scripts.bench.amplification_trials [--eps 0.75 1.5 3 6 18]

Plans (one silo each; delta = 1/n^2 as the silos use by default):
  * fmnist-pairs: Fashion-MNIST even/odd pairs of docs/results.md, 25 silos of ~1,900 records,
    K = 64, 25 rounds, MLP 50-64-2 (d = 3394, g = ceil(4 sqrt(d)) = 234), all 25 silos per round;
  * digits: the digits preset (10 silos, silo 0 has n = 142), MLP 64-64-10 (d = 4810, g = 278),
    15 rounds, full batches (K = n: nothing to amplify) and K = 32 and K = 16.

Server-side noise std per coordinate of the aggregated mean gradient (M silos of K records):
ISRL-DP sigma / sqrt(M) with sigma = z 2L/K (z from calibrate_noise_multiplier); SDP
(2L/g) sqrt(1.1 m p (1 - p)) / (M K) (the shuffler's total is (1 + headroom) m trials; the
rounding's variance is left out). Both in units of L.
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

PLANS = [
    # name, n, K, rounds, d, M
    ("fmnist-pairs K=64", 1900, 64, 25, 3394, 25),
    ("digits K=n", 142, 142, 15, 4810, 10),
    ("digits K=32", 142, 32, 15, 4810, 10),
    ("digits K=16", 142, 16, 15, 4810, 10),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eps", type=float, nargs="*", default=[0.75, 1.5, 3.0, 6.0, 18.0])
    ap.add_argument("--plans", nargs="*", default=None, help="plan names (default: all)")
    args = ap.parse_args()
    from app.privacy.accounting import PlannedRelease, calibrate_noise_multiplier, calibrate_trial_scale
    from app.privacy.shuffle import auto_levels

    p, headroom = 0.25, 0.1
    print("| plan | eps | trials (none) | trials (sampling) | fewer | SDP noise (none) | SDP noise (sampling) "
          "| ISRL-DP noise | SDP/ISRL (none) | SDP/ISRL (sampling) | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, n, k, rounds, d, m_silos in PLANS:
        if args.plans and name not in args.plans:
            continue
        g = auto_levels(d)
        plan = [PlannedRelease("grad", n, k, rounds)]
        delta = 1.0 / (n * n)
        for eps in args.eps:
            t0 = time.perf_counter()
            trials = {amp: calibrate_trial_scale(plan, eps, delta, p=p, levels=g, dim=d, amplification=amp)
                      for amp in ("none", "sampling")}
            z = calibrate_noise_multiplier(plan, eps, delta)
            isrl = z * 2.0 / k / math.sqrt(m_silos)
            sdp = {a: (2.0 / g) * math.sqrt((1 + headroom) * t * p * (1 - p)) / (m_silos * k) for a, t in trials.items()}
            print(f"| {name} | {eps:g} | {trials['none']:,} | {trials['sampling']:,} | "
                  f"{trials['none'] / trials['sampling']:.1f}x | {sdp['none']:.4g} | {sdp['sampling']:.4g} | "
                  f"{isrl:.4g} | {sdp['none'] / isrl:.2f} | {sdp['sampling'] / isrl:.2f} | "
                  f"{time.perf_counter() - t0:.1f} |", flush=True)


if __name__ == "__main__":
    main()
