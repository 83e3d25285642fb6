"""Lazy Renyi curves for the calibration search: one binomial noise's curve computed only at the
orders a search needs, bit-identical to :func:`app.privacy.binomial.release_curve` and
:func:`app.privacy.binomial.amplified_release_curve` there, with cheap lower bounds elsewhere.

A column of the divergence table costs 2 g * |W| expm1 (|W| ~ 27 sqrt(m p (1 - p))), so the
search asks for as few as it can: :class:`LazyCurve` computes the exact columns it is asked for
in one pass over the log-PMF table (the differences x formed once per block of rows for all of
them), and :class:`AmplifiedView` keeps, per (dim, gamma, exact or lower), the amplified bound
at every integer order (:func:`app.privacy.amplification.wor_subsampled_rdp`) once for all the
Renyi orders that read it."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np

from app.privacy import amplification
from app.privacy.binomial.divergence import block_of, columns, prelude
from app.privacy.binomial.truncation import (MAX_LEVELS, ORDERS, REL_SLACK, check_int, check_prob, effective_trials,
                                             sensitivity)

#: relative margin taken off a lower bound computed from a few rows (a matrix-vector product
#: over fewer rows may round differently in the last bits)
_LB_MARGIN = 1e-6
#: relative guard for comparing an amplified term from lower columns with an exact value (the
#: term is monotone in its inputs up to a few ulps of its log-sum-exp)
_TERM_GUARD = 1e-12


#: (p, g, order index) -> the shift k that attained max_k f(k) / k^2 in the last exact column
#: computed there (the neighbouring m of a search has it at the same k, nearly always)
_ARGMAX: dict[tuple[float, int, int], int] = {}


class LazyCurve:
    """:func:`release_curve` of (trials, p, levels) computed one order at a time, for searches
    that need only a few orders: ``ratio(o)`` is max_k f_alpha(k) / k^2 at ORDERS[o], bit-identical
    to the whole table's column (:func:`columns`); ``ratio_lower(o)`` is a cheap lower bound of it
    from the shifts k in {1, 2, g/2, g} only (max over fewer k; minus a relative margin)."""

    def __init__(self, m: int, p: float, g: int) -> None:
        self.m, self.p, self.g = m, p, g
        self.pre = prelude(effective_trials(m, p, g), p, g)
        self._exact: dict[int, float] = {}
        self._lower: dict[int, float] = {}
        self._rows: dict[int, float] = {}
        self._views: dict[tuple, AmplifiedView] = {}

    @property
    def empty(self) -> bool:
        return self.pre is None

    def _ratio_of(self, out: np.ndarray, ks: np.ndarray) -> np.ndarray:
        n = len(ks)
        f = np.maximum(out[:n], out[n:])  # s = +1 rows, then s = -1 rows, same k order
        return (f / (ks.astype(float) ** 2)[:, None]).max(axis=0)

    def prefetch(self, orders: Iterable[int]) -> None:
        """Compute the exact columns of ``orders`` not computed yet, all in one pass."""
        todo = sorted({o for o in orders if o not in self._exact and 0 <= o < len(ORDERS)})
        if not todo:
            return
        g = self.g
        out = columns(self.pre, todo)
        f = np.maximum(out[:g][::-1], out[g:])
        k2 = np.arange(1, g + 1, dtype=float) ** 2
        for c, o in enumerate(todo):
            r = f[:, c:c + 1] / k2[:, None]
            self._exact[o] = float(r.max(axis=0)[0])
            _ARGMAX[(self.p, self.g, o)] = int(r[:, 0].argmax()) + 1

    def ratio_rows(self, o: int) -> float:
        """A lower bound of ratio(o) with no margin: f(k)/k^2 at the shift k that attained the
        maximum in the last exact column at this (p, g, order), its two rows computed in their
        blocks of the whole table (:func:`block_of`), so each is the table's number bit for bit
        and the value is <= the table's maximum exactly (the lower-bound rows otherwise)."""
        if o in self._exact:
            return self._exact[o]
        if o not in self._rows:
            k = _ARGMAX.get((self.p, self.g, o))
            if k is None:
                return self.ratio_lower(o)
            g, vals = self.g, {}
            for j in (g - k, g + k):
                if j not in vals:
                    block = block_of(self.pre, j)
                    out = columns(self.pre, (o,), block)
                    vals.update({int(b): out[i, 0] for i, b in enumerate(block)})
            f = np.maximum(np.array([vals[g - k]]), np.array([vals[g + k]]))
            k2 = np.arange(1, g + 1, dtype=float) ** 2
            self._rows[o] = max(float((f / k2[k - 1:k])[0]), self.ratio_lower(o))
        return self._rows[o]

    def ratio(self, o: int) -> float:
        if o not in self._exact:
            self.prefetch((o,))
        return self._exact[o]

    def ratio_lower(self, o: int) -> float:
        if o not in self._lower:
            self.prefetch_lower(o2 for o2 in range(len(ORDERS)) if o2 not in self._lower)
        return self._lower[o] * (1.0 - _LB_MARGIN)

    def prefetch_lower(self, orders: Iterable[int]) -> None:
        """The few-rows columns of ``orders`` (all in one pass; each column as in the whole table)."""
        todo = sorted({o for o in orders if o not in self._lower})
        if not todo:
            return
        g = self.g
        ks = np.array(sorted({k for k in (1, 2, g // 2, g) if 1 <= k <= g}))
        rows = np.concatenate((g - ks, g + ks))
        ratios = self._ratio_of(columns(self.pre, todo, rows), ks)
        for c, o in enumerate(todo):
            self._lower[o] = float(ratios[c])

    def ratio_guess(self, o: int) -> float:
        """ratio_lower without the margin (the search's cheap stand-in: no bound is claimed)."""
        self.ratio_lower(o)
        return self._lower[o]

    def rho(self, o: int, dim: int, lower: bool | str = False) -> float:
        """rho(alpha) of :func:`release_curve` at ORDERS[o] (``lower``: a lower bound of it;
        "rows": the tighter lower bound of :meth:`ratio_rows`; "guess": the few rows without the
        margin)."""
        b = sensitivity(self.g, dim)
        ratio = (self.ratio_guess(o) if lower == "guess" else self.ratio_rows(o) if lower == "rows"
                 else self.ratio_lower(o) if lower else self.ratio(o))
        return float((b * b * np.float64(ratio) + dim * self.pre.c0) * (1.0 + REL_SLACK))

    def tail(self, dim: int) -> float:
        return 1.0 if self.pre is None else float(dim * self.pre.q)

    def amplified(self, dim: int, gamma: float, lower: bool | str) -> AmplifiedView:
        """The cached :class:`AmplifiedView` of this curve at (dim, gamma, lower)."""
        key = (dim, gamma, lower)
        if key not in self._views:
            self._views[key] = AmplifiedView(self, dim, gamma, lower)
        return self._views[key]


@functools.lru_cache(maxsize=64)
def lazy_curve(trials: int, p: float, levels: int) -> LazyCurve:
    """The cached :class:`LazyCurve` of Bin(trials, p) noise on ``levels`` levels."""
    return LazyCurve(check_int("trials", trials, 1), check_prob(p), check_int("levels", levels, 1, MAX_LEVELS))


def next_order(j: int) -> int:
    """Index of the smallest order in ORDERS >= j (len(ORDERS) if none)."""
    for i, a in enumerate(ORDERS):
        if a >= j:
            return i
    return len(ORDERS)


#: next_order(j) for j = 0..ceil(max ORDERS)
_NEXT = tuple(next_order(j) for j in range(int(math.ceil(ORDERS[-1])) + 1))


def dependencies(o: int) -> set[int]:
    """The orders whose columns the amplified value at ORDERS[o] reads: o itself and the step-up
    orders of j = 2..ceil(alpha) (amplification.amplified_curve)."""
    top = max(2, int(math.ceil(ORDERS[o])))
    return {o} | {_NEXT[j] for j in range(2, top + 1) if _NEXT[j] < len(ORDERS)}


class AmplifiedView:
    """ORDERS[o]'s value of :func:`amplified_release_curve` from a :class:`LazyCurve` at (dim,
    gamma, lower): the same numbers as the whole curve when ``lower`` is False; a lower bound when
    True (the bound is non-decreasing in every rho(j)); "guess": the search's stand-in. The
    amplified bound at each integer order is computed once and shared by every order that reads it."""

    def __init__(self, curve: LazyCurve, dim: int, gamma: float, lower: bool | str) -> None:
        self.curve, self.dim, self.gamma, self.lower = curve, dim, gamma, lower
        self.log_c = dim * (-math.log1p(-curve.pre.q))
        self._at: dict[int, float] = {}  # amplification.amplified_curve's cache, shared
        self._values: dict[int, float] = {}
        self._terms: dict[int, float] = {}

    def term(self, alpha: int) -> float:
        """amplification.wor_subsampled_term at the integer ``alpha`` from this view's columns (cached)."""
        if alpha not in self._terms:
            self._terms[alpha] = amplification.wor_subsampled_term(self._rho_at, alpha, self.gamma, self.log_c)
        return self._terms[alpha]

    def _rho_at(self, j: int) -> float:
        i = _NEXT[j] if j < len(_NEXT) else len(ORDERS)
        return math.inf if i == len(ORDERS) else self.curve.rho(i, self.dim, self.lower)

    def value(self, o: int) -> float:
        if o in self._values:
            return self._values[o]
        curve, dim, gamma, lower = self.curve, self.dim, self.gamma, self.lower
        plain = curve.rho(o, dim, lower)
        if gamma >= 1.0:
            out = plain
        else:
            if lower is False:
                # the amplified value from the lower-bound columns bounds it from below: when that is
                # already >= the plain value, the answer is the plain value (no other exact column needed)
                low = curve.amplified(dim, gamma, True)
                alpha = ORDERS[o]
                if alpha >= 2 and float(alpha).is_integer() and low.term(int(alpha)) >= plain * (1.0 + _TERM_GUARD):
                    # integer order: the value is min(plain, min(rho(alpha) = plain, term)) and the
                    # term is non-decreasing in every rho(j): from the lower columns it already is >= plain
                    self._values[o] = plain
                    return plain
                floor = amplification.amplified_curve([ORDERS[o]], [plain], gamma, self.log_c, rho_at=low._rho_at,
                                                      cache=low._at)[0]
                if floor >= plain:
                    self._values[o] = plain
                    return plain
                curve.prefetch(dependencies(o))
            out = amplification.amplified_curve([ORDERS[o]], [plain], gamma, self.log_c, rho_at=self._rho_at,
                                                cache=self._at)[0]
        self._values[o] = out
        return out
