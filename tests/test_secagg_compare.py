"""scripts/reproduce/secagg_compare.py's central bound and scripts/bench/secagg_cost.py's byte
counts, against independent facts: the analytic Gaussian mechanism of Balle & Wang (2018) solved
here with scipy, and the arrays' sizes on the wire."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy.optimize import brentq

from tests.helpers import analytic_gaussian_delta

ROUNDS = 25  # WBCD's setup: R full-batch Gaussian releases per silo


def _z_for(eps: float, delta: float) -> float:
    """z of R composed full-batch Gaussian releases at (eps, delta): R releases of sensitivity D
    and noise z D are one Gaussian of sensitivity D sqrt(R) (Balle & Wang's exact delta)."""
    return brentq(lambda z: analytic_gaussian_delta(z, math.sqrt(ROUNDS), eps) - delta, 0.05, 500.0, xtol=1e-12)


def _eps_for(z: float, delta: float) -> float:
    return brentq(lambda e: analytic_gaussian_delta(z, math.sqrt(ROUNDS), e) - delta, 1e-3, 200.0, xtol=1e-12)


def test_central_bound_of_equal_silos_is_isrl_at_z_c_over_sqrt_m(tmp_path: Path) -> None:
    from scripts.reproduce.secagg_compare import base_config, central_epsilon

    n, m, eps = 200, 4, 3.0
    delta = 1.0 / n**2
    cfg = base_config("wbcd", "mbsgd", 0, tmp_path)  # K = n: no sampling
    eps_prime, z_c = central_epsilon(cfg, [n] * m, eps)
    z_central = _z_for(eps, delta)
    assert z_c == pytest.approx(z_central, rel=2e-3)  # the library rounds z up by at most 1e-3
    # ISRL at eps' puts noise z' 2L/n on each silo's mean with z' = z_c / sqrt(M)
    assert eps_prime == pytest.approx(_eps_for(z_central / math.sqrt(m), delta), rel=1e-2)
    assert eps_prime > eps


def test_central_bound_of_unequal_silos_covers_the_smallest_silo(tmp_path: Path) -> None:
    from scripts.reproduce.secagg_compare import base_config, central_epsilon

    sizes, eps = [100, 300], 3.0
    cfg = base_config("wbcd", "mbsgd", 0, tmp_path)
    eps_prime, _ = central_epsilon(cfg, sizes, eps)
    # uniform mean of the silos' means: noise sqrt(sum (z'_j 2L/n_j)^2) / M must equal the central
    # Gaussian's z_c,i 2L/(n_i M) for the silo that needs most (the smallest)
    noise = math.sqrt(sum((_z_for(eps_prime, 1.0 / n**2) / n) ** 2 for n in sizes))
    need = max(_z_for(eps, 1.0 / n**2) / n for n in sizes)
    assert noise / need == pytest.approx(1.0, abs=3e-3)


@pytest.mark.parametrize("mode", ["isrl", "secagg"])
def test_bench_counts_what_a_silo_sends(mode: str) -> None:
    from scripts.bench.secagg_cost import run_mode

    r = run_mode(mode, 3, 2, "digits", "logistic", 0)
    assert r["status"] == "completed"
    d = 64 * 10 + 10  # digits' logistic regression
    train = r["up_by_type"]["train"]
    if mode == "isrl":  # the noisy update: d float32, plus keys and metrics
        assert 4 * d <= train < 4 * d + 2048
    else:  # the masked vector: D = 1024 (next power of two) uint16, plus keys
        assert 2 * 1024 <= train < 2 * 1024 + 2048
        assert r["up_by_type"]["query.secagg_keys"] > 32  # an X25519 public key at least
        assert r["up_by_type"]["query.secagg_share"] > 2 * 32  # a sealed payload per neighbour
        assert r["up_by_type"]["query.secagg_unmask"] > 0
    assert r["up"] == pytest.approx(sum(r["up_by_type"].values()))
