"""The Skellam accountant of secure aggregation against independent computations, as tables.

    python -m scripts.audit.skellam_accountant

1. One release: the exact Renyi divergence D_alpha(Sk(mu) + s || Sk(mu)) summed over scipy's
   Skellam pmf, against the bound silofl charges (app/privacy/skellam/accounting.py ``skellam_rdp``).
2. One sampled release (K of n records without replacement, one record's value moves the sum by
   s): the exact divergence of the two mixtures, both directions, against the amplified curve the
   ledger uses (``skellam_curve``, WBK19 Theorem 9).
3. A run: epsilon of R releases by the ledger's accountant (Release ``mechanism = "skellam"``) as
   the noise grows at a fixed noise multiplier z, against dp-accounting's Gaussian mechanism with
   the same z (the limit from above).
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy import stats
from scipy.special import logsumexp


def _logpmf(mu: float, grid: np.ndarray) -> np.ndarray:
    return stats.skellam.logpmf(grid, mu / 2.0, mu / 2.0)


def renyi(logp: np.ndarray, logq: np.ndarray, alpha: float) -> float:
    """D_alpha(P || Q) from log-pmfs on one grid: log(sum p^alpha q^(1 - alpha)) / (alpha - 1), over
    the points where both are representable (beyond them both pmfs are below 1e-300)."""
    ok = np.isfinite(logp) & np.isfinite(logq)
    return float(logsumexp(alpha * logp[ok] + (1 - alpha) * logq[ok]) / (alpha - 1))


def exact_shift(alpha: float, shift: int, mu: float) -> float:
    """max of D_alpha(Sk(mu) + s || Sk(mu)) and the reverse, summed over a window of mass ~1 (the pmfs'
    tails beyond it are below 1e-30)."""
    half = int(12 * np.sqrt(mu + 1) + 20 * abs(shift) + 60)
    grid = np.arange(-half, half + 1)
    p, q = _logpmf(mu, grid - shift), _logpmf(mu, grid)
    return max(renyi(p, q, alpha), renyi(q, p, alpha))


def exact_sampled(alpha: float, shift: int, mu: float, rate: float) -> float:
    """The worst direction of the sampled pair: with probability ``rate`` the changed record is in
    the batch (the sum moves by ``shift``), else not."""
    half = int(12 * np.sqrt(mu + 1) + 20 * abs(shift) + 60)
    grid = np.arange(-half, half + 1)
    q = _logpmf(mu, grid)
    p = np.logaddexp(np.log(rate) + _logpmf(mu, grid - shift), np.log1p(-rate) + q)
    return max(renyi(p, q, alpha), renyi(q, p, alpha))


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from app.privacy.accounting import Release, epsilon_spent
    from app.privacy.skellam.accounting import skellam_curve, skellam_rdp

    print("1. one release, 1-D shift s = l1 = l2: exact D_alpha vs the charged bound (ratio)")
    print("| mu | s | alpha=2 | alpha=8 | alpha=32 |\n|---|---|---|---|---|")
    for mu, s in ((4, 1), (20, 2), (100, 5), (1000, 10), (1e4, 30)):
        cells = []
        for a in (2, 8, 32):
            exact, bound = exact_shift(a, s, mu), skellam_rdp(a, s, s, mu)
            assert exact <= bound * (1 + 1e-9), (mu, s, a, exact, bound)
            cells.append(f"{exact:.4g} / {bound:.4g} ({exact / bound:.3f})")
        print(f"| {mu:g} | {s} | " + " | ".join(cells) + " |")

    print("\n2. one sampled release (rate K/n, shift 1): exact worst mixture divergence vs the ledger's amplified curve")
    print("| mu | K/n | alpha=2 | alpha=4 | alpha=8 | unsampled alpha=8 |\n|---|---|---|---|---|---|")
    for mu, rate in ((4, 0.25), (16, 0.25), (16, 0.1), (64, 0.5)):
        curve = skellam_curve([2, 4, 8], 1.0, 1.0, mu, rate)
        cells = []
        for a, bound in zip((2, 4, 8), curve):
            exact = exact_sampled(a, 1, mu, rate)
            assert exact <= bound * (1 + 1e-9), (mu, rate, a, exact, bound)
            cells.append(f"{exact:.4g} / {bound:.4g}")
        print(f"| {mu:g} | {rate:g} | " + " | ".join(cells) + f" | {skellam_rdp(8, 1, 1, mu):.4g} |")

    print("\n3. a run of R = 50 unsampled releases at z = 5 (delta 1e-5): the ledger's epsilon as the rounding "
          "vanishes (l2 grows) vs dp-accounting's Gaussian with the same z")
    from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
    from dp_accounting.rdp import RdpAccountant

    from app.privacy.accounting import RDP_ORDERS

    acc = RdpAccountant()
    acc.compose(SelfComposedDpEvent(GaussianDpEvent(5.0), 50))
    gauss = acc.get_epsilon(1e-5)
    same = RdpAccountant(list(RDP_ORDERS))  # the ledger's orders (integers from 2)
    same.compose(SelfComposedDpEvent(GaussianDpEvent(5.0), 50))
    gauss_orders = same.get_epsilon(1e-5)
    print(f"dp-accounting's Gaussian: {gauss:.5f} (its default orders), {gauss_orders:.5f} (the ledger's orders)")
    print("| l2 (integer units) | skellam eps | excess over the Gaussian at the same orders |\n|---|---|---|")
    for l2 in (2.0, 8.0, 32.0, 128.0, 1024.0):
        r = Release("grad", 100, 100, 5.0, 50, False, "skellam", dim=64, l1=min(l2 * l2, 8 * l2), l2=l2)
        eps = epsilon_spent([r], 1e-5)
        assert eps >= gauss_orders * (1 - 1e-9)
        print(f"| {l2:g} | {eps:.5f} | {eps - gauss_orders:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
