"""Shuffle DP's calibration: the closed form against the exact accountant at the same certified epsilon.

For each (epsilon, d, N messages) at delta = 1e-5 and one release: the closed form's choice
(Cheu, Joseph, Mao and Peng 2021 as the paper's Appendix D uses it, as we read it:
g = max(2 sqrt(N), d, 4), p = 1/4, b = 24e4 g^2 ln^2(4 (d^2 + 1) / delta) / (epsilon^2 N) noise
bits per message) and the smallest b the exact accountant (app/privacy/binomial/) certifies at
the same g and p. The noise standard deviation scales with sqrt(N b), so sqrt of the ratio is how
much less noise exact accounting adds.

    python -m scripts.reproduce.shuffle_calibration            # about 2 minutes on 2 CPU cores
"""

from __future__ import annotations

import argparse
import math
import time

from app.privacy.binomial import calibration_table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 3.0])
    ap.add_argument("--dim", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--messages", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--delta", type=float, default=1e-5)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = calibration_table(args.epsilon, args.dim, args.messages, args.delta)
    print("| ε | d | N | g | b (closed form) | b (exact) | N·b closed / exact | noise std ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        b_exact = math.ceil(r["exact_trials"] / r["messages"])
        print(f"| {r['epsilon']:g} | {r['dim']} | {r['messages']} | {r['levels']} | {r['per_message']:.3g} | "
              f"{b_exact:,} | {r['ratio']:.3g} | {math.sqrt(r['ratio']):.0f}× |")
    print(f"\n({time.perf_counter() - t0:.0f} s; delta = {args.delta:g}, one release, p = 1/4)")


if __name__ == "__main__":
    main()
