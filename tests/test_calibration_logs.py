"""The log-PMF table of the binomial accountant (app/privacy/binomial/divergence.py, prelude) reads
its longdouble logs from a cache shared by nearby trial counts: it must hold the numbers of the
direct formula, log P(a + i) - log P(a) = cumsum(log(m - t + 1) - log(t) + log(p / (1 - p))) over
fresh arrays, bit for bit, whether the cache is cold, hit by a slice, or hit by an overlapping m."""

from __future__ import annotations

import numpy as np

from app.privacy.binomial import divergence as BD
from app.privacy.binomial.truncation import cached_window


def _direct_table(m: int, p: float, g: int) -> np.ndarray:
    lo, hi, _ = cached_window(m, p, g)
    a = lo - g
    t = np.arange(a + 1, hi + g + 1, dtype=np.longdouble)
    ld = np.longdouble
    step = np.log(ld(m) - t + 1) - np.log(t) + (np.log(ld(p)) - np.log1p(-ld(p)))
    return np.concatenate(([ld(0)], np.cumsum(step)))


def test_prelude_tables_match_the_direct_formula_through_the_cache():
    BD.log_ints.cache_clear()
    BD.prelude.cache_clear()
    # a cold start, nearby m (cache hits by slices), a far m (a new range), tiny windows
    cases = [(4_000_000, 0.25, 64), (4_000_001, 0.25, 64), (3_999_000, 0.25, 64), (4_100_000, 0.25, 64),
             (2_000, 0.5, 4), (50_000, 0.1, 30), (4_000_002, 0.25, 64)]
    for m, p, g in cases:
        pre = BD.prelude(m, p, g)
        table = _direct_table(m, p, g)
        hi64 = table.astype(np.float64)
        lo64 = (table - hi64.astype(np.longdouble)).astype(np.float64)
        assert np.array_equal(pre.hi64, hi64), (m, p, g)
        assert np.array_equal(pre.lo64, lo64), (m, p, g)
    BD.log_ints.cache_clear()
    BD.prelude.cache_clear()
