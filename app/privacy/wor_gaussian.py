"""The Renyi DP of the subsampled Gaussian mechanism, batch sampled without replacement,
replace-one neighbours (Wang, Balle & Kasiviswanathan 2019, Theorem 27), computed as
dp-accounting computes it, bit for bit, but vectorised (app/privacy/accounting.py uses it)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


#: dp-accounting switches to its O(alpha) bound above this order (``max_alpha`` there)
_WOR_EXACT_MAX_ORDER = 256


def wor_gaussian_rdp(q: float, sigma: float, orders: Sequence[int]) -> np.ndarray:
    """RDP at integer ``orders`` (>= 2) of the Gaussian mechanism with multiplier ``sigma`` on a
    batch sampled without replacement at rate ``q`` = K/n, under replace-one: the bound of
    Wang, Balle & Kasiviswanathan 2019, Theorem 27, computed as dp-accounting's
    ``_compute_rdp_sample_wor_gaussian`` computes it: the same terms, the same forward
    differences in log space with the same floating-point operations (``math.exp`` and
    ``math.log1p`` where it uses them, numpy's where it uses numpy's: the high-order differences
    cancel catastrophically, so an ulp anywhere shows in the result), the same term-by-term sum
    and the same O(alpha) bound above order 256. What makes it fast: the forward differences of
    exp(cgf) at 0 do not depend on the order, so they are computed once, for the largest order,
    each difference level as one array operation, instead of once per order in scalar Python.
    tests/test_accounting.py checks it against dp-accounting, bit for bit."""
    from scipy import special  # scipy: loaded when an epsilon is computed, not when the ledger loads

    alphas = np.asarray(orders)
    if alphas.ndim != 1 or not np.all(alphas == np.floor(alphas)) or np.any(alphas < 2):
        raise ValueError(f"orders must be integers >= 2, got {orders}")
    if not 0 <= q <= 1:
        raise ValueError(f"sampling rate must be in [0, 1], got {q}")
    if q == 0:
        return np.zeros(len(alphas))
    if sigma == 0:
        return np.full(len(alphas), math.inf)
    if q == 1.0:
        return alphas.astype(np.float64) / (2 * sigma**2)
    alphas = alphas.astype(np.int64)
    a_max = int(alphas.max())
    two_var = 2.0 * sigma**2
    i = np.arange(a_max + 1, dtype=np.float64)  # term index 0..a_max
    cgf_prev = (i - 1) * 1.0 * i / two_var  # cgf(i - 1) = (i - 1) i / (2 sigma^2)
    log_q, log2, log4 = np.log(q), np.log(2), np.log(4)
    f2 = 2.0 / two_var
    log_f2m1 = f2 + math.log1p(-np.exp(-f2))
    s2_tail = np.minimum(log4 + log_f2m1, f2 + log2)
    # the order-independent part of term i >= 3: for the exact bound (orders <= 256) ...
    exact_top = min(a_max, _WOR_EXACT_MAX_ORDER)
    head = np.full(a_max + 1, -np.inf)
    if exact_top >= 3:
        deltas = _wor_forward_diffs(two_var, exact_top)
        ii = np.arange(3, exact_top + 1)
        lo_idx, hi_idx = 2 * (ii // 2) - 1, 2 * ((ii + 1) // 2) - 1
        head[3:exact_top + 1] = np.minimum(log4 + 0.5 * (deltas[lo_idx] + deltas[hi_idx]),
                                           log2 + cgf_prev[3:exact_top + 1])
    # ... and for the O(alpha) bound (orders > 256)
    head_big = log2 + cgf_prev
    out = np.empty(len(alphas))
    for k, alpha in enumerate(alphas.tolist()):
        j = np.arange(2, alpha + 1)
        log_comb = special.gammaln(alpha + 1) - special.gammaln(j + 1) - special.gammaln(alpha - j + 1)
        if alpha <= _WOR_EXACT_MAX_ORDER:
            terms = head[2:alpha + 1] + (j * log_q + log_comb)
        else:
            terms = head_big[2:alpha + 1] + j * log_q + log_comb
        terms[0] = 2 * log_q + log_comb[0] + s2_tail
        log_a = 0.0
        for s in terms.tolist():  # dp-accounting's _log_add, one term at a time
            lo, hi = (log_a, s) if log_a <= s else (s, log_a)
            log_a = hi if lo == -math.inf else math.log1p(math.exp(lo - hi)) + hi
        out[k] = log_a / (alpha - 1)
    return out


def _wor_forward_diffs(two_var: float, n: int) -> np.ndarray:
    """dp-accounting's ``_get_forward_diffs(cgf, n)``, one array operation per difference level:
    log|k-th forward difference| at 0 of the sequence 1, exp(cgf(0)), exp(cgf(1)), ..., with
    its sign, for k = 1..n+2; the same operations as ``_stable_inplace_diff_in_log``."""
    x = np.arange(n + 2, dtype=np.float64)
    vec = np.empty(n + 3)
    vec[0] = 0.0
    vec[1:] = x * 1.0 * (x + 1) / two_var
    signs = np.ones(n + 3, dtype=bool)
    deltas = np.empty(n + 2)
    for k in range(n + 2):
        m = n + 2 - k
        a, b, sa, sb = vec[1:m + 1], vec[:m], signs[1:m + 1], signs[:m]
        new = np.empty(m)
        same = sa == sb
        # same signs: _log_sub_sign(a, b) = log|e^a - e^b|, its sign flipped when both are negative
        up, down = same & (a > b), same & (a < b)
        if up.any():  # a + math.log1p(-np.exp(b - a))
            new[up] = a[up] + _map(math.log1p, -np.exp(b[up] - a[up]))
        if down.any():  # b + np.log1p(-np.exp(a - b))
            new[down] = b[down] + np.log1p(-np.exp(a[down] - b[down]))
        new[same & (a == b)] = -np.inf
        new_signs = np.where(same, (a >= b) ^ ~sa, sa)
        # different signs: _log_add(b, a) = log(e^a + e^b), with a's sign
        add = ~same
        if add.any():
            lo, hi = np.minimum(a[add], b[add]), np.maximum(a[add], b[add])
            finite = lo != -np.inf
            added = hi.copy()
            added[finite] = _map(math.log1p, _map(math.exp, lo[finite] - hi[finite])) + hi[finite]
            new[add] = added
        vec[:m] = new
        signs[:m] = new_signs
        deltas[k] = vec[0]
    return deltas


def _map(fn: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    """``fn`` (a ``math`` function: libm, not numpy's SIMD kernels) on every element of ``x``."""
    return np.fromiter(map(fn, x.tolist()), dtype=np.float64, count=len(x))
