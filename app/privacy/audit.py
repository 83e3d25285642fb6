"""Empirical privacy audit of the two release mechanisms (Jagielski, Ullman & Oprea 2020; Nasr,
Song, Thakurta, Papernot & Carlini 2021): a statistically valid LOWER bound on the epsilon of one
release, to compare with the epsilon its accountant claims.

Set-up. Neighbouring silo datasets D and D' of K records differ in ONE canary record: record 0 is
+L e_1 in D and -L e_1 in D' (both of norm L, the clip: the pair that achieves the replace-one
sensitivity in the canary coordinate); the other K - 1 records are fixed, the same in both. The
REAL release function is run ``trials`` times on D and ``trials`` times on D' (fresh randomness
each time):

* Gaussian (ISRL-DP): ``GaussianMechanism(sigma).release(clip_rows(rows, L), generator)``, the
  mean plus N(0, sigma^2 I), sigma = z * 2L / K, claimed epsilon
  ``epsilon_spent([Release("grad", K, K, z)], delta)`` (the analytic Gaussian mechanism).
* Shuffle DP: the target silo's ``encode_counts`` of D or D' plus the counts of ``count_on - 1``
  other silos (fixed records, K each, K b noise trials each), summed as the shuffler does, then
  ``debias``-ed as the server does; claimed epsilon ``binomial_epsilon(m, p, g, d, 1, delta)`` with
  m = count_on * K * b the exchange's total trials.

A threshold test guesses "D" when the released canary coordinate exceeds a threshold t. The
threshold is chosen on a separate CALIBRATION split (extra trials of each dataset, used for
nothing else), then the test is run on the held-out trials: TP = its hits on D, FP = its false
alarms on D'. A (eps, delta)-DP release forces, for every test,

    TPR <= e^eps FPR + delta    and    1 - FPR <= e^eps (1 - TPR) + delta,

so with TPR_lo, FPR_hi the ends of two-sided (1 - alpha) Clopper-Pearson intervals,

    eps_lower = max( ln((TPR_lo - delta) / FPR_hi), ln((1 - FPR_hi - delta) / (1 - TPR_lo)) )

(0 where neither is positive or defined). Each of the two one-sided events TPR >= TPR_lo and
FPR <= FPR_hi fails with probability <= alpha / 2, and both branches use only these two events,
so with probability >= 1 - alpha (95% at the default alpha = 0.05) the true epsilon of the release
is >= eps_lower. It is a LOWER bound: a sound mechanism with a correct accountant has
eps_lower <= eps_claimed, except with probability <= alpha; eps_lower > eps_claimed shows the
claim broken (a bug in the mechanism, its calibration or its accountant). A small eps_lower
proves nothing by itself: this audit only sees one canary direction and one test, so it can be
loose (e.g. for shuffle DP with d > 1 the accountant's L2 sensitivity g + sqrt(d) exceeds the
shift g this canary makes in one coordinate).

Note: ``scripts/audit/privacy_attacks.py`` has an older ``epsilon_lower`` with ONE-sided
(1 - alpha) bounds for each rate (joint confidence 1 - 2 alpha); it equals this module's
``epsilon_lower`` at 2 alpha.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from scipy.stats import beta

from app.privacy.accounting import Release, epsilon_spent
from app.privacy.clipping import clip_rows
from app.privacy.mechanism import GaussianMechanism
from app.privacy.shuffle import ShuffleCode, auto_levels, debias, encode_counts, trials_per_record

#: a Gaussian release function: (clipped rows [K, d], torch generator) -> released vector [d]
GaussianRelease = Callable[[torch.Tensor, torch.Generator], torch.Tensor]
#: a shuffle encoder with encode_counts' signature: (rows, code, b, rng) -> int64 counts [d]
ShuffleEncoder = Callable[[np.ndarray, ShuffleCode, int, np.random.Generator], np.ndarray]


# ---------------------------------------------------------------------------- statistics

def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The two-sided (1 - alpha) Clopper-Pearson ("exact") interval for a binomial proportion
    after k successes in n trials: (lo, hi) with P(p < lo) <= alpha / 2 and P(p > hi) <= alpha / 2
    (scipy's ``binomtest(k, n).proportion_ci(1 - alpha, method="exact")``)."""
    k, n = int(k), int(n)
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    lo = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _eps_from_bounds(tpr_lo: np.ndarray, fpr_hi: np.ndarray, delta: float) -> np.ndarray:
    """max(ln((TPR_lo - delta) / FPR_hi), ln((1 - FPR_hi - delta) / (1 - TPR_lo))), 0 where neither
    is positive and defined (vectorised; +inf where a denominator is 0 and its numerator > 0)."""
    tpr_lo, fpr_hi = np.asarray(tpr_lo, dtype=np.float64), np.asarray(fpr_hi, dtype=np.float64)
    best = np.zeros(np.broadcast(tpr_lo, fpr_hi).shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        for num, den in ((tpr_lo - delta, fpr_hi), (1.0 - fpr_hi - delta, 1.0 - tpr_lo)):
            ok = num > 0
            val = np.where(ok & (den > 0), np.log(np.where(ok, num, 1.0) / np.where(den > 0, den, 1.0)), 0.0)
            val = np.where(ok & (den <= 0), np.inf, val)
            best = np.maximum(best, val)
    return best


def _cp_lo(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k)
    with np.errstate(invalid="ignore"):
        return np.where(k == 0, 0.0, beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1))


def _cp_hi(k: np.ndarray, n: int, alpha: float) -> np.ndarray:
    k = np.asarray(k)
    with np.errstate(invalid="ignore"):
        return np.where(k == n, 1.0, beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1)))


def epsilon_lower(tp: int, fp: int, trials: int, delta: float, alpha: float = 0.05) -> float:
    """The (1 - alpha)-confidence lower bound on epsilon from a test's TP hits among ``trials``
    runs on D and FP false alarms among ``trials`` runs on D' (see the module docstring)."""
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta}")
    tpr_lo, _ = clopper_pearson(tp, trials, alpha)
    _, fpr_hi = clopper_pearson(fp, trials, alpha)
    return float(_eps_from_bounds(tpr_lo, fpr_hi, delta))


# ---------------------------------------------------------------------------- the test

@dataclass
class AuditResult:
    """One audited mechanism: the held-out ``trials`` per dataset, the test's TP (on D) and FP (on
    D'), its threshold (guess D when the canary coordinate > threshold), the (1 - alpha) lower
    bound eps_lower and the accountant's eps_claimed at ``delta``; ``params`` the set-up."""

    mechanism: str
    trials: int
    tp: int
    fp: int
    threshold: float
    eps_lower: float
    eps_claimed: float
    delta: float
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def sound(self) -> bool:
        """Whether the claim survives the audit (eps_lower <= eps_claimed)."""
        return self.eps_lower <= self.eps_claimed

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_threshold(out_d: np.ndarray, out_p: np.ndarray, delta: float, alpha: float) -> float:
    """The threshold t (guess D when output > t) whose bound ``epsilon_lower`` on these
    CALIBRATION outputs is largest (ties: the smallest t). Bounding at the calibration size, not
    plugging raw rates in, keeps the choice away from far tails where a few lucky draws would
    look best (the winner's curse). Uses only these outputs, so a held-out bound stays valid."""
    out_d, out_p = np.sort(np.asarray(out_d, dtype=np.float64)), np.sort(np.asarray(out_p, dtype=np.float64))
    cand = np.unique(np.concatenate([out_d, out_p]))
    cand = np.concatenate([[cand[0] - 1.0], cand])
    tp = len(out_d) - np.searchsorted(out_d, cand, side="right")
    fp = len(out_p) - np.searchsorted(out_p, cand, side="right")
    score = _eps_from_bounds(_cp_lo(tp, len(out_d), alpha), _cp_hi(fp, len(out_p), alpha), delta)
    score = np.where(np.isfinite(score), score, np.finfo(np.float64).max)
    return float(cand[int(np.argmax(score))])


def threshold_audit(out_d: np.ndarray, out_p: np.ndarray, calibration: int, delta: float, alpha: float
                    ) -> tuple[int, int, int, float, float]:
    """Split each side's outputs into the first ``calibration`` (to choose the threshold) and the
    rest (held out); returns (held-out trials, TP, FP, threshold, eps_lower)."""
    out_d, out_p = np.asarray(out_d, dtype=np.float64), np.asarray(out_p, dtype=np.float64)
    if len(out_d) != len(out_p) or not 0 < calibration < len(out_d):
        raise ValueError("need as many outputs on D as on D', more than ``calibration`` of each")
    trials = len(out_d) - calibration
    t = choose_threshold(out_d[:calibration], out_p[:calibration], delta, alpha)
    tp, fp = int((out_d[calibration:] > t).sum()), int((out_p[calibration:] > t).sum())
    return trials, tp, fp, t, epsilon_lower(tp, fp, trials, delta, alpha)


def _calibration(trials: int, calibration: int | None) -> int:
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    return max(50, trials // 5) if calibration is None else int(calibration)


def _seeds(seed: int, side: int, n: int) -> np.ndarray:
    """n per-trial seeds for one side (0: D, 1: D'), independent across sides and base seeds."""
    return np.random.SeedSequence([int(seed), side]).generate_state(n, dtype=np.uint64) >> np.uint64(1)


def neighbours(k: int, d: int, clip: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The pair (D, D') of [K, d] float64 record sets: record 0 is +L e_1 in D and -L e_1 in D';
    records 1..K-1 are the same fixed random vectors (norm <= L/2, clipped to L) in both."""
    if k < 1 or d < 1 or not clip > 0:
        raise ValueError(f"need K, d >= 1 and L > 0, got K={k}, d={d}, L={clip}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 7]))
    rows = rng.normal(size=(k, d))
    rows *= (0.5 * clip) * rng.random((k, 1)) / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
    rows = clip_rows(torch.from_numpy(rows), clip).numpy()
    d_rows, p_rows = rows.copy(), rows.copy()
    d_rows[0], p_rows[0] = 0.0, 0.0
    d_rows[0, 0], p_rows[0, 0] = clip, -clip
    return d_rows, p_rows


# ---------------------------------------------------------------------------- Gaussian

def audit_gaussian(z: float, K: int, d: int = 4, L: float = 1.0, delta: float = 1e-5, trials: int = 2000,
                   seed: int = 0, *, alpha: float = 0.05, calibration: int | None = None,
                   release: GaussianRelease | None = None) -> AuditResult:
    """Audit ISRL-DP's Gaussian release of the mean of K rows clipped to L with noise multiplier z
    (sigma = z * 2L / K). ``trials`` held-out runs per dataset plus ``calibration`` (default
    max(50, trials // 5)) to choose the threshold, each a call of the real
    ``GaussianMechanism(sigma).release`` with its own seeded torch generator. ``release`` replaces
    the release function (to audit a deliberately broken one; the claim stays z's)."""
    if not z > 0:
        raise ValueError(f"noise multiplier z must be > 0, got {z}")
    cal = _calibration(trials, calibration)
    sigma = z * 2.0 * L / K
    fn = release if release is not None else GaussianMechanism(sigma).release
    outs = []
    for side, rows in enumerate(neighbours(K, d, L, seed)):
        clipped = clip_rows(torch.from_numpy(rows).to(torch.float32), L)
        out = np.empty(trials + cal)
        for i, s in enumerate(_seeds(seed, side, trials + cal)):
            out[i] = float(fn(clipped, torch.Generator().manual_seed(int(s)))[0])
        outs.append(out)
    n, tp, fp, t, lower = threshold_audit(outs[0], outs[1], cal, delta, alpha)
    claimed = epsilon_spent([Release("grad", n=K, batch=K, noise_multiplier=z, count=1)], delta)
    return AuditResult("gaussian", n, tp, fp, t, lower, float(claimed), delta,
                       {"z": z, "K": K, "d": d, "L": L, "sigma": sigma, "calibration": cal, "alpha": alpha,
                        "seed": seed})


# ---------------------------------------------------------------------------- shuffle DP

def audit_shuffle(epsilon_target: float | None = None, m: int | None = None, g: int | None = None, p: float = 0.25,
                  K: int = 50, d: int = 4, L: float = 1.0, count_on: int = 4, delta: float = 1e-5,
                  trials: int = 2000, seed: int = 0, *, alpha: float = 0.05, calibration: int | None = None,
                  encode: ShuffleEncoder | None = None) -> AuditResult:
    """Audit one shuffle-DP exchange of the binomial protocol (app/privacy/shuffle.py) with bound
    R = L, g levels (default ``auto_levels(d)``), bit probability p and ``count_on`` silos of K
    records each. The exchange needs m noise trials: given, or the smallest reaching
    ``epsilon_target`` (``binomial.calibrate_trials``); each silo adds b = ceil(m / (count_on K))
    per record, so the exchange has m_total = count_on K b >= m, whose epsilon is the claim.

    Each trial: the target silo's ``encode_counts`` of D (or D'), plus the other count_on - 1
    silos' ``encode_counts`` of their fixed records, summed (the shuffler's totals), ``debias``-ed
    (the server's estimate of the sum of the count_on K records); the canary coordinate goes to
    the threshold test. Every encode call has its own seeded numpy Generator. ``encode`` replaces
    the silos' encoder (to audit a broken one; the claim and the debiasing stay m_total's)."""
    from app.privacy import binomial  # written alongside; imported when needed

    if count_on < 1:
        raise ValueError(f"count_on must be >= 1, got {count_on}")
    g = auto_levels(d) if g is None else int(g)
    if m is None:
        if epsilon_target is None:
            raise ValueError("give epsilon_target or m")
        m = binomial.calibrate_trials(epsilon_target, delta, p, g, d, 1)
    b = trials_per_record(int(m), count_on, K)
    m_total = count_on * K * b
    code = ShuffleCode(bound=float(L), levels=g, p=float(p))
    fn = encode if encode is not None else encode_counts
    cal = _calibration(trials, calibration)
    d_rows, p_rows = neighbours(K, d, L, seed)
    # the canary coordinate of the other records on the level grid (no rounding noise there), so
    # the test sees only the binomial noise: the strongest case for this canary
    grid = -L + code.step * math.floor(g / 2)
    d_rows[1:, 0] = p_rows[1:, 0] = grid
    others = []
    for j in range(count_on - 1):
        rows, _ = neighbours(K, d, L, seed + 1000 + j)
        rows[:, 0] = grid
        others.append(rows)
    outs = []
    for side, target in enumerate((d_rows, p_rows)):
        out = np.empty(trials + cal)
        for i, s in enumerate(_seeds(seed, side, trials + cal)):
            rngs = [np.random.default_rng(c) for c in np.random.SeedSequence(int(s)).spawn(count_on)]
            totals = fn(target, code, b, rngs[0]).astype(np.int64)
            for rows, rng in zip(others, rngs[1:]):
                totals = totals + fn(rows, code, b, rng)
            out[i] = debias(totals, count_on * K, m_total, code)[0]
        outs.append(out)
    n, tp, fp, t, lower = threshold_audit(outs[0], outs[1], cal, delta, alpha)
    claimed = binomial.binomial_epsilon(trials=m_total, p=p, levels=g, dim=d, count=1, delta=delta)
    return AuditResult("shuffle", n, tp, fp, t, lower, float(claimed), delta,
                       {"m": int(m), "m_total": m_total, "b": b, "g": g, "p": p, "K": K, "d": d, "L": L,
                        "count_on": count_on, "calibration": cal, "alpha": alpha, "seed": seed,
                        "epsilon_target": epsilon_target})
