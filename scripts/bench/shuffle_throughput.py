"""Shuffle DP's cost per exchange at a model's size: encode (randomized rounding + binomial
noise), seal, open + check + sum at the shuffler, and debias at the server.

    python -m scripts.bench.shuffle_throughput                      # ResNet-18's d, K = 8, 4 silos
    python -m scripts.bench.shuffle_throughput --dim 100000 --records 64 --silos 10

Prints seconds per stage and the encoder's throughput in coordinates x records per second. The
rows are random vectors clipped to L = 1 (the encoder's cost does not depend on their values).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from app.privacy.contribution import Contribution
from app.privacy.envelope import StaticKeys, seal
from app.privacy.shuffle import ShuffleCode, auto_levels, debias, encode_counts
from clients.shuffler import Shuffler

#: parameters of app.models' ResNet-18 (GroupNorm, CIFAR stem, 10 classes)
RESNET18_DIM = 11_173_962


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=RESNET18_DIM)
    ap.add_argument("--records", type=int, default=8, help="K, records per silo's release")
    ap.add_argument("--silos", type=int, default=4, help="contributions per exchange")
    ap.add_argument("--trials", type=int, default=10**7, help="the exchange's noise trials m")
    args = ap.parse_args(argv)
    d, k, silos = args.dim, args.records, args.silos
    code = ShuffleCode(1.0, auto_levels(d), 0.25)
    b = max(1, math.ceil(args.trials / (silos * k)))
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((k, d)).astype(np.float32)
    rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
    shuffler_keys = StaticKeys.generate()
    senders = [StaticKeys.generate() for _ in range(silos)]
    context = b"bench"

    t0 = time.perf_counter()
    counts = encode_counts(rows, code, b, rng)
    t_encode = time.perf_counter() - t0
    contribution = Contribution(records=k, trials=k * b, required_trials=args.trials, levels=code.levels, counts=counts)
    t0 = time.perf_counter()
    blob = seal(shuffler_keys.public, senders[0], contribution.encode(), context)
    t_seal = time.perf_counter() - t0
    blobs = [blob] + [seal(shuffler_keys.public, s, contribution.encode(), context) for s in senders[1:]]
    shuffler = Shuffler(shuffler_keys, [s.public for s in senders])
    t0 = time.perf_counter()
    result = shuffler.aggregate(blobs, context, d, code.levels)
    t_shuffle = time.perf_counter() - t0
    t0 = time.perf_counter()
    mean = debias(result.totals, result.records, result.trials, code) / result.records
    t_debias = time.perf_counter() - t0
    assert mean.shape == (d,) and result.accepted == silos
    print(f"d = {d:,}, K = {k}, {silos} contributions, g = {code.levels}, b = {b}, sealed {len(blob) / 2**20:.1f} MiB each")
    print(f"| stage | seconds | throughput |\n|---|---|---|")
    print(f"| encode (one silo: rounding + Bin) | {t_encode:.2f} | {d * k / t_encode / 1e6:.1f} M coordinates x records / s |")
    print(f"| seal (one silo) | {t_seal:.2f} | {len(blob) / t_seal / 2**20:.0f} MiB / s |")
    print(f"| shuffler: open + check + sum ({silos}) | {t_shuffle:.2f} | {silos * d / t_shuffle / 1e6:.1f} M coordinates / s |")
    print(f"| server: debias | {t_debias:.2f} | {d / t_debias / 1e6:.0f} M coordinates / s |")


if __name__ == "__main__":
    main()
