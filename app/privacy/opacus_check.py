"""Optional cross-check with Opacus's RDP accountant. Never used for calibration.

Opacus analyses **Poisson** sampling (each record independently with probability q = K/n) under
add/remove-one adjacency, while silofl samples a **fixed-size** batch without replacement under
replace-one adjacency. We pass Opacus the same ratio z = sigma / Delta with Delta the replace-one
shift, so for q = 1 both analyse the same Gaussian mechanism and Opacus's Renyi bound must be at
least the exact epsilon silofl reports; for q < 1 the numbers answer a different sampling scheme
and only show the order of magnitude.
"""

from __future__ import annotations

from app.privacy.accounting import Release


def opacus_epsilon(releases: list[Release], delta: float) -> float:
    """Epsilon from ``opacus.accountants.RDPAccountant`` treating each release as a Poisson-
    sampled Gaussian with sample rate K/n and noise multiplier z."""
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(r.noise_multiplier, r.batch / r.n, r.count) for r in releases if r.count > 0]
    return float(accountant.get_epsilon(delta))
