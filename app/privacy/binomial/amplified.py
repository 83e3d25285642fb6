"""The Renyi curve of a binomial release whose batch is sampled without replacement (the bound of
app/privacy/amplification.py applied to :func:`app.privacy.binomial.release_curve`)."""

from __future__ import annotations

import functools
import math

from app.privacy import amplification
from app.privacy.binomial.divergence import cached_release_curve, divergence_table
from app.privacy.binomial.truncation import MAX_LEVELS, ORDERS, BinomialCurve, check_int, check_prob, effective_trials


@functools.lru_cache(maxsize=4096)
def cached_amplified_curve(m: int, p: float, g: int, d: int, gamma: float) -> BinomialCurve:
    """:func:`amplified_release_curve` on checked arguments (its cached core): the plain curve's
    Renyi values amplified by sampling at rate gamma, log c = d * c0 (app/privacy/amplification.py)."""
    plain = cached_release_curve(m, p, g, d)
    if gamma >= 1.0:
        return plain
    res = divergence_table(effective_trials(m, p, g), p, g)
    if res is None:
        return plain
    log_c = d * (-math.log1p(-res[1]))
    rdp = amplification.amplified_curve(ORDERS, plain.rdp, gamma, log_c)
    return BinomialCurve(rdp=tuple(float(v) for v in rdp), tail=plain.tail)


def amplified_release_curve(trials: int, p: float, levels: int, dim: int, gamma: float) -> BinomialCurve:
    """:func:`release_curve` of a release whose batch of K records is drawn without replacement
    from the silo's n, gamma = K / n: the same tail (charged once per release), the Renyi curve
    amplified by sampling (app/privacy/amplification.py; gamma = 1: the plain curve). Cached."""
    gamma = float(gamma)
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    return cached_amplified_curve(check_int("trials", trials, 1), check_prob(p),
                                  check_int("levels", levels, 1, MAX_LEVELS), check_int("dim", dim, 1), gamma)

