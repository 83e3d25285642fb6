"""Silo sampling by the shuffler: the mixture bound against brute-force divergences of tiny
discrete distributions, the seal tag, and the shuffler refusing a rate it does not apply."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from app.privacy import silo_sampling as ss
from app.privacy.binomial import ORDERS, release_curve


def _renyi(p: np.ndarray, q: np.ndarray, a: float) -> float:
    """D_a(p || q) = log sum p^a q^(1-a) / (a - 1), by direct summation (q > 0 where p > 0)."""
    mask = p > 0
    return math.log(float(np.sum(p[mask] ** a * q[mask] ** (1 - a)))) / (a - 1)


def _pair(size: int, shift: int, trials: int) -> tuple[np.ndarray, np.ndarray]:
    """B(D), B(D'): a count plus Bin(trials, 1/2) noise, the count differing by ``shift``."""
    base = binom.pmf(np.arange(trials + 1), trials, 0.5)
    b, b2 = np.zeros(size), np.zeros(size)
    b[:trials + 1] = base
    b2[shift:shift + trials + 1] = base
    flat = np.full(size, 1.0 / size)  # full support, so D_a(B || B') is finite
    return 0.97 * b + 0.03 * flat, 0.97 * b2 + 0.03 * flat


@pytest.mark.parametrize("q", [0.05, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("a", [1.5, 2.0, 4.0, 10.0])
def test_bound_holds_for_any_a_and_is_attained_for_disjoint_a(q: float, a: float) -> None:
    rng = np.random.default_rng(7)
    size, trials, shift = 40, 12, 2
    b, b2 = _pair(size, shift, trials)
    for src, dst in ((b, b2), (b2, b)):  # both directions
        eps_b = _renyi(src, dst, a)
        bound = ss.silo_sampled_rdp(eps_b, a, q)
        others = [b2 if src is b else b, rng.dirichlet(np.ones(size)), 0.5 * (b + b2)]
        for other in others:  # A = B(D') (a neighbour), a random A, the midpoint
            mu, mu2 = (1 - q) * other + q * src, (1 - q) * other + q * dst
            assert _renyi(mu, mu2, a) <= bound + 1e-12
        # A on a support disjoint from B's (the server tells the cases apart): the bound is exact
        disjoint = rng.dirichlet(np.ones(size))
        mu = np.concatenate([(1 - q) * disjoint, q * src])
        mu2 = np.concatenate([(1 - q) * disjoint, q * dst])
        assert _renyi(mu, mu2, a) == pytest.approx(bound, rel=1e-9)
        assert bound < eps_b


def test_formula_limits() -> None:
    """q = 1: no gain; small (a-1) eps: ~ q eps; large: eps + log(q) / (a - 1)."""
    assert ss.silo_sampled_rdp(0.7, 3.0, 1.0) == 0.7
    assert ss.silo_sampled_rdp(1e-6, 2.0, 0.1) == pytest.approx(1e-7, rel=1e-5)
    assert ss.silo_sampled_rdp(1000.0, 2.0, 0.1) == pytest.approx(1000.0 + math.log(0.1), rel=1e-9)
    assert ss.silo_sampled_rdp(math.inf, 2.0, 0.1) == math.inf


def test_curve_keeps_tail_and_lowers_every_order() -> None:
    plain = release_curve(20_000, 0.5, 16, 30)
    sampled = ss.silo_sampled_curve(ORDERS, plain, 0.25)
    assert sampled.tail == plain.tail
    for a, r, s in zip(ORDERS, plain.rdp, sampled.rdp):
        assert s <= r
        if math.isfinite(r):
            assert s == pytest.approx(np.logaddexp(math.log(0.75), math.log(0.25) + (a - 1) * r) / (a - 1), rel=1e-9)


def test_count_on_above_one_is_refused() -> None:
    assert ss.count_on_violation(1) is None
    assert "count-on = 1" in ss.count_on_violation(2)


def test_tag_round_trip_and_mismatch() -> None:
    base = bytes(40)
    assert ss.parse_tag(base) is None
    assert ss.parse_tag(base + ss.tag(3, 10)) == (3, 10)
    assert ss.tag_mismatch(base, 0, 10) is None  # no claim: always fine
    assert ss.tag_mismatch(base + ss.tag(3, 10), 3, 10) is None
    assert "does not sample" in ss.tag_mismatch(base + ss.tag(3, 10), 0, 10)
    assert "keeps 5 of 10" in ss.tag_mismatch(base + ss.tag(3, 10), 5, 10)
    assert "malformed" in ss.tag_mismatch(base + b"junk", 3, 10)
    with pytest.raises(ValueError):
        ss.tag(0, 10)


def test_kept_senders_is_uniform() -> None:
    """Each of N = 5 senders is kept with frequency M / N = 2/5 (independent check by counting)."""
    senders = [bytes([i]) * 32 for i in range(5)]
    rng = np.random.default_rng(3)
    hits = {s: 0 for s in senders}
    runs = 20_000
    for _ in range(runs):
        kept = ss.kept_senders(senders, 2, rng)
        assert len(kept) == 2
        for s in kept:
            hits[s] += 1
    for s in senders:
        assert abs(hits[s] / runs - 0.4) < 0.015


def test_ledger_row_records_q_and_the_accountant_applies_it() -> None:
    """A release with silo_sampling = q: its ledger row says q (absent at q = 1, so old rows read
    the same), and epsilon_spent equals the conversion of the mixture curve computed here."""
    from app.privacy.accounting import Release, epsilon_spent
    from app.privacy.binomial import epsilon_from_curves
    from app.privacy.binomial import BinomialCurve
    from app.privacy.ledger.chain import release_of_row, row_of_release

    plain = Release("grad", 100, 10, 0.0, 20, False, "binomial", 20_000, 16, 0.5, 30)
    sampled = Release("grad", 100, 10, 0.0, 20, False, "binomial", 20_000, 16, 0.5, 30, silo_sampling=0.2)
    assert "silo_sampling" not in row_of_release(plain)
    assert row_of_release(sampled)["silo_sampling"] == 0.2 and release_of_row(row_of_release(sampled)) == sampled
    curve = release_curve(20_000, 0.5, 16, 30)
    mixed = [float(np.logaddexp(math.log(0.8), math.log(0.2) + (a - 1) * r) / (a - 1)) if math.isfinite(r) else r
             for a, r in zip(ORDERS, curve.rdp)]
    expected = epsilon_from_curves([(BinomialCurve(rdp=tuple(mixed), tail=curve.tail), 20)], 1e-5)
    assert epsilon_spent([sampled], 1e-5) == pytest.approx(expected, rel=1e-9)
    assert epsilon_spent([sampled], 1e-5) < epsilon_spent([plain], 1e-5)
    with pytest.raises(ValueError, match="silo sampling"):
        Release("grad", 100, 10, 1.0, silo_sampling=0.5)  # Gaussian: never claimed


def test_claim_needs_the_run_the_node_trust_a_pinned_shuffler_and_count_on_one() -> None:
    assert ss.claim(2, 5, True, 1)[:2] == (0.4, ss.tag(2, 5))
    for args in [(0, 5, True, 1, True), (2, 5, False, 1, True), (2, 5, True, 2, True), (2, 5, True, 1, False)]:
        q, tag, why = ss.claim(*args)
        assert (q, tag) == (1.0, b"") and why.startswith("not claimed")
