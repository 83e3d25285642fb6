"""Private hyper-parameter selection by random stopping (Papernot & Steinke, "Hyperparameter
Tuning with Renyi Differential Privacy", ICLR 2022, arXiv 2110.03620v2), and what repeated runs
cost when every run is seen.

The selection ``A``: draw K ~ D, run a base mechanism ``Q`` (one candidate: a hyper-parameter
drawn from a data-independent grid, a private training run, a private score) K times
independently, and output only the best run (by its score). Two distributions of K:

* **truncated negative binomial** D_{eta,gamma}, eta in (-1, inf), gamma in (0, 1), on {1, 2, ...}
  (the paper's Definition, Section 3):
      eta != 0:  P[K=k] = (1-gamma)^k / (gamma^-eta - 1) * prod_{l=0}^{k-1} (l+eta)/(l+1),
                 E[K] = eta (1-gamma) / (gamma (1 - gamma^eta));
      eta = 0 (logarithmic):  P[K=k] = (1-gamma)^k / (k log(1/gamma)),
                 E[K] = (1/gamma - 1) / log(1/gamma);
  eta = 1 is the geometric distribution gamma (1-gamma)^(k-1), E[K] = 1/gamma.
* **Poisson**(mu), on {0, 1, ...}; K = 0 outputs nothing (the paper's "bottom").

Bounds (``selection_rdp``), for Q with Renyi curve eps(lambda) at the base orders:

* Theorem 2 (TNB): if Q is (lambda, eps)- and (lambda_hat, eps_hat)-RDP (lambda > 1,
  lambda_hat >= 1), A is (lambda, eps')-RDP with
      eps' = eps + (1+eta)(1 - 1/lambda_hat) eps_hat + (1+eta) log(1/gamma)/lambda_hat + log E[K]/(lambda-1);
  we take the best lambda_hat among the base orders.
* Theorem 6 (Poisson): if Q is (lambda, eps)-RDP and (eps_hat, delta_hat)-DP with
  e^eps_hat <= 1 + 1/(lambda-1), A is (lambda, eps')-RDP with
      eps' = eps + mu delta_hat + log(mu)/(lambda-1);
  we take eps_hat = log(1 + 1/(lambda-1)) and delta_hat from Q's curve by dp-accounting's
  conversion (``compute_delta``). Used for mu >= 1 only, as dp-accounting does: at mu = 0.5 the
  formula is below the exact divergence of a three-output mechanism (measured in the tests).

Both then use that a Renyi divergence does not decrease with its order: the bound at lambda is
the least bound at any order >= lambda. dp-accounting's ``RepeatAndSelectDpEvent`` implements
the same two theorems (``_compute_rdp_repeat_and_select``); tests/test_selection.py checks this
module against it and against exact Renyi divergences of small discrete mechanisms.

**What these bounds cover.** Only the OUTPUT of A (the best run: its hyper-parameters, model and
score). They say nothing about an observer who also sees the runs that were not selected. In
ISRL-DP the server is such an observer: it receives every release of every candidate run. Against
it, K runs cost their composition, whatever is selected: ``revealed_rdp`` (K fixed, or random and
seen) is that cost, exactly (Renyi divergence tensorises; a mixture over a revealed K has
divergence (1/(lambda-1)) log E[exp((lambda-1) K eps(lambda))]). A silo's node-scope ledger,
which records every release of every run, accounts exactly this.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

#: the distributions of the number of runs: "tnb" (params eta, gamma), "poisson" (mu), and,
#: for :func:`revealed_rdp` only, "fixed" (k)
DISTRIBUTIONS = ("tnb", "poisson", "fixed")


# ----------------------------------------------------------------------------- the distributions

def _check_tnb(eta: float, gamma: float) -> None:
    if not (eta > -1 and math.isfinite(eta)):
        raise ValueError(f"TNB needs eta in (-1, inf), got {eta!r}")
    if not 0 < gamma < 1:
        raise ValueError(f"TNB needs gamma in (0, 1), got {gamma!r}")


def tnb_log_pmf(k: np.ndarray | Sequence[int] | int, eta: float, gamma: float) -> np.ndarray:
    """log P[K = k] of the truncated negative binomial D_{eta,gamma} (k >= 1; -inf below 1)."""
    _check_tnb(eta, gamma)
    from scipy.special import gammaln

    k = np.atleast_1d(np.asarray(k, dtype=np.float64))
    out = np.full(k.shape, -math.inf)
    ok = k >= 1
    kk = k[ok]
    log1m = math.log1p(-gamma)
    if eta == 0:
        out[ok] = kk * log1m - np.log(kk) - math.log(math.log(1 / gamma))
        return out
    # prod_{l<k} (l+eta)/(l+1) = Gamma(k+eta) / (Gamma(eta) k!), of the sign of eta (eta in (-1, 0))
    # over gamma^-eta - 1, also of the sign of eta: the ratio is positive
    log_prod = gammaln(kk + eta) - gammaln(eta if eta > 0 else eta + 1) - gammaln(kk + 1)
    if eta < 0:  # Gamma(eta) = Gamma(eta+1)/eta: |prod| = Gamma(k+eta) / (Gamma(eta+1) |1/eta| k!)
        log_prod += math.log(-eta)
    out[ok] = kk * log1m + log_prod - math.log(abs(math.expm1(-eta * math.log(gamma))))
    return out


def tnb_mean(eta: float, gamma: float) -> float:
    """E[K] under D_{eta,gamma} (the paper's Section 3)."""
    _check_tnb(eta, gamma)
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * (1 - gamma**eta))


def tnb_gamma_for_mean(eta: float, mean: float, *, tol: float = 1e-12) -> float:
    """The gamma whose D_{eta,gamma} has E[K] = ``mean`` (> 1), by bisection (E[K] falls as
    gamma grows); the returned gamma's mean is >= ``mean`` (the smaller gamma, as dp-accounting's
    ``_gamma_truncated_negative_binomial`` returns)."""
    if not mean > 1:
        raise ValueError(f"a TNB mean must be > 1, got {mean!r}")
    lo, hi = 1e-300, 1.0 - 1e-15
    if tnb_mean(eta, lo) < mean:
        raise ValueError(f"no gamma gives E[K] = {mean} at eta = {eta}")
    while hi - lo > tol * hi:
        mid = 0.5 * (lo + hi) if hi / lo < 4 else math.sqrt(lo * hi)
        if tnb_mean(eta, mid) >= mean:
            lo = mid
        else:
            hi = mid
    return lo


def sample_tnb(eta: float, gamma: float, rng: np.random.Generator) -> int:
    """One draw of K ~ D_{eta,gamma}: inverse CDF on the pmf (P[K=k+1]/P[K=k] = (1-gamma)(k+eta)/(k+1))."""
    _check_tnb(eta, gamma)
    u = rng.random()
    k, p = 1, math.exp(float(tnb_log_pmf(1, eta, gamma)[0]))
    cdf = p
    while cdf < u and p > 0:
        p *= (1 - gamma) * (k + eta) / (k + 1)
        k += 1
        cdf += p
    return k


def sample_poisson(mu: float, rng: np.random.Generator) -> int:
    """One draw of K ~ Poisson(mu)."""
    if not mu > 0:
        raise ValueError(f"Poisson needs mu > 0, got {mu!r}")
    return int(rng.poisson(mu))


def sample_runs(distribution: str, params: Mapping[str, float], rng: np.random.Generator) -> int:
    """One draw of the number of runs K under ``distribution`` with ``params``."""
    if distribution == "tnb":
        return sample_tnb(float(params["eta"]), float(params["gamma"]), rng)
    if distribution == "poisson":
        return sample_poisson(float(params["mu"]), rng)
    if distribution == "fixed":
        return int(params["k"])
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")


def expected_runs(distribution: str, params: Mapping[str, float]) -> float:
    """E[K]."""
    if distribution == "tnb":
        return tnb_mean(float(params["eta"]), float(params["gamma"]))
    if distribution == "poisson":
        return float(params["mu"])
    if distribution == "fixed":
        return float(params["k"])
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")


def log_mgf(distribution: str, params: Mapping[str, float], t: float) -> float:
    """log E[exp(t K)] (inf where it diverges): TNB ((1-(1-gamma)e^t)^-eta - 1)/(gamma^-eta - 1)
    (eta = 0: log(1-(1-gamma)e^t)/log(gamma)); Poisson mu (e^t - 1); fixed t k."""
    if distribution == "fixed":
        return t * float(params["k"])
    if distribution == "poisson":
        mu = float(params["mu"])
        return mu * math.expm1(t) if t < 700 else math.inf
    if distribution != "tnb":
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    eta, gamma = float(params["eta"]), float(params["gamma"])
    _check_tnb(eta, gamma)
    log_x = math.log1p(-gamma) + t  # log((1-gamma) e^t)
    if log_x >= 0:
        return math.inf
    one_minus = -math.expm1(log_x)  # 1 - (1-gamma) e^t, in (0, 1]
    if eta == 0:
        return math.log(math.log(one_minus) / math.log(gamma))
    num = math.expm1(-eta * math.log(one_minus))
    den = math.expm1(-eta * math.log(gamma))
    return math.log(num / den)


# ----------------------------------------------------------------------------- the bounds

def _upper_at(base_orders: np.ndarray, base_rdp: np.ndarray, lam: float) -> float:
    """eps(lambda) from the base curve: its value at the least base order >= lambda (a Renyi
    divergence does not decrease with its order); inf when every base order is below lambda."""
    idx = np.nonzero(base_orders >= lam)[0]
    return float(np.min(base_rdp[idx])) if len(idx) else math.inf


def _monotone(orders: np.ndarray, rdp: np.ndarray) -> np.ndarray:
    """rdp[i] -> min over j with orders[j] >= orders[i] (the divergence grows with the order)."""
    out = rdp.copy()
    for i, lam in enumerate(orders):
        out[i] = float(np.min(rdp[orders >= lam]))
    return out


def _curve(base_orders: Sequence[float], base_rdp: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    o = np.asarray(base_orders, dtype=np.float64)
    r = np.asarray(base_rdp, dtype=np.float64)
    if o.ndim != 1 or o.shape != r.shape or len(o) == 0:
        raise ValueError("base_orders and base_rdp must be 1-d and of one length")
    if np.any(o < 1) or np.any(r < 0) or np.any(np.isnan(r)):
        raise ValueError("base orders must be >= 1 and base RDP values >= 0")
    return o, r


def selection_rdp(base_orders: Sequence[float], base_rdp: Sequence[float], distribution: str,
                  params: Mapping[str, float], orders: Sequence[float] | None = None) -> np.ndarray:
    """RDP at ``orders`` (> 1; default: the base orders above 1) of "run Q K ~ D times, output the
    best", Q having Renyi curve ``base_rdp`` at ``base_orders`` (order 1 may be included: the KL
    bound, usable as lambda_hat). Theorem 2 (``distribution`` "tnb", params eta, gamma) or
    Theorem 6 ("poisson", params mu) of Papernot & Steinke (2022); see the module docstring.
    Covers the selected run's output only, not the runs a server also sees (:func:`revealed_rdp`)."""
    o, r = _curve(base_orders, base_rdp)
    out_orders = np.asarray([x for x in o if x > 1] if orders is None else orders, dtype=np.float64)
    if np.any(out_orders <= 1):
        raise ValueError("selection orders must be > 1")
    eps = np.array([_upper_at(o, r, lam) for lam in out_orders])
    if distribution == "tnb":
        eta, gamma = float(params["eta"]), float(params["gamma"])
        _check_tnb(eta, gamma)
        mean = tnb_mean(eta, gamma)
        # (1+eta) min over lambda_hat of [(1 - 1/lambda_hat) eps_hat + log(1/gamma)/lambda_hat]
        with np.errstate(invalid="ignore"):
            lead = np.where(o == 1, 0.0, (1 - 1 / o) * r)  # order 1: (1 - 1/1) eps_hat = 0 even if eps_hat = inf
        c = (1 + eta) * float(np.min(lead + math.log(1 / gamma) / o))
        bound = eps + c + math.log(mean) / (out_orders - 1)
    elif distribution == "poisson":
        from dp_accounting.rdp.rdp_privacy_accountant import compute_delta

        mu = float(params["mu"])
        if not mu >= 1:  # as dp-accounting's RepeatAndSelect; below 1, log(mu)/(lambda-1) < 0 and the
            # bound falls under the exact divergence (tests/test_selection.py, mu = 0.5)
            raise ValueError(f"the Poisson bound needs mu >= 1, got {mu!r}")
        above = o > 1  # (eps_hat, delta_hat)-DP of Q from its curve at the orders where it converts
        bound = np.empty(len(out_orders))
        for i, lam in enumerate(out_orders):
            eps_hat = math.log1p(1 / (lam - 1))
            delta_hat = float(compute_delta(o[above], r[above], eps_hat)[0]) if above.any() else 1.0
            bound[i] = eps[i] + mu * delta_hat + math.log(mu) / (lam - 1)
    else:
        raise ValueError(f"selection distribution must be 'tnb' or 'poisson', got {distribution!r}")
    bound = np.where(np.isnan(bound), math.inf, bound)
    return _monotone(out_orders, np.maximum(bound, 0.0))


def revealed_rdp(base_orders: Sequence[float], base_rdp: Sequence[float], distribution: str,
                 params: Mapping[str, float], orders: Sequence[float] | None = None) -> np.ndarray:
    """RDP at ``orders`` of K ~ D independent runs of Q when the observer sees K and EVERY run
    (the ISRL-DP server): (1/(lambda-1)) log E[exp((lambda-1) K eps(lambda))], which is K eps(lambda)
    for a fixed K ("fixed", params k). Exact for a revealed K when ``base_rdp`` is Q's exact curve
    (RDP tensorises over independent runs; a mixture with revealed, shared weights)."""
    o, r = _curve(base_orders, base_rdp)
    out_orders = np.asarray([x for x in o if x > 1] if orders is None else orders, dtype=np.float64)
    if np.any(out_orders <= 1):
        raise ValueError("orders must be > 1")
    out = np.empty(len(out_orders))
    for i, lam in enumerate(out_orders):
        eps = _upper_at(o, r, lam)
        out[i] = math.inf if math.isinf(eps) else log_mgf(distribution, params, (lam - 1) * eps) / (lam - 1)
    return out


def epsilon_from_rdp(orders: Sequence[float], rdp: Sequence[float], delta: float) -> float:
    """(epsilon at ``delta``) of a Renyi curve, by dp-accounting's conversion (``compute_epsilon``)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    r = np.asarray(rdp, dtype=np.float64)
    if np.all(np.isinf(r)):
        return math.inf
    return float(compute_epsilon(list(orders), list(r), delta)[0])


def selection_epsilon(base_orders: Sequence[float], base_rdp: Sequence[float], distribution: str,
                      params: Mapping[str, float], delta: float, *, revealed: bool = False) -> float:
    """The (epsilon, ``delta``) of the selection's output (:func:`selection_rdp`), or with
    ``revealed`` of all its runs (:func:`revealed_rdp`), at the base orders above 1."""
    fn = revealed_rdp if revealed else selection_rdp
    orders = [x for x in base_orders if x > 1]
    return epsilon_from_rdp(orders, fn(base_orders, base_rdp, distribution, params, orders), delta)


@dataclass(frozen=True)
class SelectionCalibration:
    """The noise of one candidate run that keeps the whole selection within (epsilon, delta):
    ``noise_multiplier``; ``candidate_epsilon``: one run's own epsilon at ``delta`` (its curve
    converted alone); ``total_epsilon``: the selection's at that noise."""

    noise_multiplier: float
    candidate_epsilon: float
    total_epsilon: float


def calibrate_selection(epsilon: float, delta: float, distribution: str, params: Mapping[str, float],
                        base_rdp_at: Callable[[float], np.ndarray], orders: Sequence[float], *,
                        revealed: bool = False, rtol: float = 1e-3) -> SelectionCalibration:
    """The smallest noise multiplier s (to relative ``rtol``, rounded up) such that the selection
    whose candidate run has Renyi curve ``base_rdp_at(s)`` at ``orders`` spends at most ``epsilon``
    at ``delta`` (:func:`selection_epsilon`, ``revealed`` as there): doubling, then geometric
    bisection (app/privacy/accounting.py ``bisect_scale``). A run at a larger s spends less: the
    candidate's own epsilon at s is the largest per-run budget the selection affords."""
    from app.privacy.accounting import bisect_scale

    def total(s: float) -> float:
        return selection_epsilon(orders, base_rdp_at(s), distribution, params, delta, revealed=revealed)

    s = bisect_scale(total, float(epsilon), float(delta), float(rtol))
    above = [x for x in orders if x > 1]
    curve = np.asarray(base_rdp_at(s), dtype=np.float64)
    cand = epsilon_from_rdp(above, curve[[i for i, x in enumerate(orders) if x > 1]], delta)
    return SelectionCalibration(s, cand, total(s))
