"""JL sketches (app.sketch) against independent facts.

Facts used: E[S^T S] = I for every JL kind and for RandK; the second moments of the dense
Gaussian and Rademacher sketches, E||S^T S x||^2 = (n+k+1)/k ||x||^2 and (n+k-1)/k ||x||^2;
the Dasgupta-Gupta / Achlioptas tail bound (and Chebyshev with Var <= 2/k for CountSketch);
the Kronecker identity against torch.kron; the Walsh-Hadamard matrix from scipy; the rank of a
matrix for PowerSGD. Every Monte Carlo uses fixed seeds, so the tests are deterministic; the
tolerances are stated where they are used.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import sys
from fractions import Fraction

import numpy as np
import pytest
import scipy.linalg
import torch

from app.seeding import derive_seed
from app.sketch import (
    SKETCH_KINDS, PayloadError, PowerSGDState, allocate_energy, allocate_uniform, dht, fwht,
    jl_min_k, layer_energy, make_sketch,
)
from app.sketch import dense as dense_mod
from app.sketch.kronecker import KroneckerOperator

UNBIASED = ["gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch", "randk"]
LINEAR = UNBIASED + ["kronecker", "adaptive"]
# a small model: a matrix, a bias, a conv kernel, a scalar (n = 96 + 12 + 60 + 1 = 169)
LAYOUT = [(8, 12), (12,), (5, 3, 2, 2), (1,)]
N = 169


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread (OpenMP spin-waits make 2 threads on a shared 2-core
    machine many times slower); the previous setting is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def vec(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def kwargs_for(kind: str) -> dict:
    if kind == "adaptive":
        return {"epsilon": 0.5}
    if kind == "powersgd":
        return {"rank": 2}
    return {"ratio": 0.3}


def payloads(kinds, layout, x, seed, rnd) -> dict[str, torch.Tensor]:
    return {kind: make_sketch(kind, layout, seed=seed, round=rnd, **kwargs_for(kind)).compress(x)
            for kind in kinds}


# ------------------------------------------------------------------------------------------
# unbiasedness and second moments


def lifts(kind: str, layout, x: torch.Tensor, trials: int, **kw) -> torch.Tensor:
    """S^T S x for `trials` independent S (one per round), as rows."""
    out = torch.empty(trials, x.numel(), dtype=x.dtype)
    for r in range(trials):
        s = make_sketch(kind, layout, seed=11, round=r, **kw)
        out[r] = s.decompress(s.compress(x))
    return out


@pytest.mark.parametrize("kind,layout,layerwise,trials", [
    # n = 100: not a power of two, so SRHT and FJLT exercise the zero padding
    *[(kind, [(100,)], False, 1500) for kind in UNBIASED],
    # block diagonal over layers of different sizes (fewer trials: the blocks are the same maps)
    *[(kind, [(6, 10), (40,)], True, 600) for kind in UNBIASED],
    ("kronecker", [(10, 10)], True, 1500),
])
def test_lift_is_unbiased(kind, layout, layerwise, trials):
    x = vec(100)
    x[3] = 4.0  # a spike, so that a wrong per-coordinate scaling shows
    z = lifts(kind, layout, x, trials, ratio=0.25, **({} if kind == "kronecker" else {"layerwise": layerwise}))
    mean = z.mean(0)
    se = z.std(0) / math.sqrt(trials)
    # Per coordinate within 5 standard errors (the CLT; P(|N(0,1)| > 5) = 6e-7, times 100
    # coordinates), and globally ||mean - x||^2 <= 2 sum se^2: its expectation is sum se^2, and it
    # is a weighted sum of 100 chi^2_1 terms with no dominant weight (P(> 2x the mean) < 1e-4).
    assert torch.all((mean - x).abs() <= 5 * se), (mean - x).abs().max()
    assert float((mean - x).square().sum()) <= 2 * float(se.square().sum())
    # and the estimator is not trivially exact: it has variance
    assert float(se.max()) > 0


@pytest.mark.parametrize("kind,factor", [
    ("gaussian", lambda n, k: (n + k + 1) / k),
    ("rademacher", lambda n, k: (n + k - 1) / k),
])
def test_second_moment(kind, factor):
    """E||S^T S x||^2 = factor ||x||^2 for every x, so also on average over the basis e_1..e_n:
    per draw we use mean_j ||S^T S e_j||^2 = ||S S^T||_F^2 / n (the same expectation, a much
    smaller variance than a single x: a variance-reduced Monte Carlo)."""
    n, k, trials = 24, 6, 3000
    x = vec(n, seed=5)
    stats = torch.empty(trials, dtype=torch.float64)
    for r in range(trials):
        s = make_sketch(kind, [(n,)], k=k, seed=17, round=r)
        mat = s.blocks[0][3].matrix(dtype=torch.float64)
        if r < 50:  # it is the matrix the sketch uses
            torch.testing.assert_close(s.compress(x), mat @ x)
        stats[r] = (mat @ mat.t()).square().sum() / n
    mean, se = float(stats.mean()), float(stats.std()) / math.sqrt(trials)
    target = factor(n, k)  # 31/6 = 5.17 (Gaussian), 29/6 = 4.83 (Rademacher): 2/k = 0.33 apart
    # within 5 standard errors of the Monte Carlo mean (CLT); se is 0.45% (Gaussian) and 0.11%
    # (Rademacher) of the target, so the relative tolerance is ~2.3% and ~0.6% ...
    assert abs(mean - target) <= 5 * se, (mean, target, se)
    assert 5 * se < 1 / k  # ... below half the gap between the two formulas: it tells them apart


# ------------------------------------------------------------------------------------------
# inner products (the JL property) and RandK's failure


def inner_failures(kind: str, u: torch.Tensor, v: torch.Tensor, k: int, eps: float, trials: int) -> float:
    bad = 0
    for r in range(trials):
        s = make_sketch(kind, [(u.numel(),)], k=k, seed=21, round=r)
        err = float(s.compress(u) @ s.compress(v) - u @ v)
        bad += abs(err) > eps * float(u.norm() * v.norm())
    return bad / trials


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm()


@pytest.mark.parametrize("kind", ["gaussian", "rademacher", "countsketch"])
def test_inner_products_hold_as_often_as_promised(kind):
    n, k, eps, trials = 256, 64, 0.5, 300
    u, v = unit(vec(n, 1)), unit(vec(n, 2) + 0.5 * vec(n, 1))
    if kind == "countsketch":
        promised_failure = 2 / (k * eps**2)  # Chebyshev with Var <Su, Sv> <= 2/k: 0.125
    else:
        # Dasgupta-Gupta (Gaussian) / Achlioptas (Rademacher): each of ||S(u+-v)||^2 is off by more
        # than eps with probability <= 2 exp(-(k/2)(eps^2/2 - eps^3/3)); polarisation: <= 2x that.
        promised_failure = 4 * math.exp(-(k / 2) * (eps**2 / 2 - eps**3 / 3))  # 0.278
    assert inner_failures(kind, u, v, k, eps, trials) <= promised_failure


def test_randk_breaks_inner_products_of_sparse_vectors():
    n, k, eps, trials = 256, 64, 0.5, 300
    e1 = torch.zeros(n, dtype=torch.float64)
    e1[0] = 1.0
    # <S e1, S e1> is n/k = 4 (e1 kept, probability k/n) or 0: never within eps of 1
    assert inner_failures("randk", e1, e1, k, eps, trials) == 1.0
    # a JL sketch of the same size keeps it (bound as above: failure <= 0.278; ||Se1||^2 ~ chi2_64/64)
    assert inner_failures("gaussian", e1, e1, k, eps, trials) <= 4 * math.exp(-(k / 2) * (eps**2 / 2 - eps**3 / 3))


# ------------------------------------------------------------------------------------------
# determinism and seeding


@pytest.mark.parametrize("kind", SKETCH_KINDS)
def test_same_seed_same_sketch_and_different_round_different_sketch(kind):
    x = vec(N)
    a = make_sketch(kind, LAYOUT, seed=7, round=3, **kwargs_for(kind))
    b = make_sketch(kind, LAYOUT, seed=np.int64(7), round=np.int64(3), **kwargs_for(kind))
    c = make_sketch(kind, LAYOUT, seed=7, round=4, **kwargs_for(kind))
    ya, yb, yc = a.compress(x), b.compress(x), c.compress(x)
    assert ya.shape == (a.payload_size,) and a.k == a.payload_size
    assert torch.equal(ya, yb)
    assert torch.equal(a.decompress(ya), b.decompress(ya))
    assert not torch.allclose(ya, yc)
    out = a.decompress(ya)
    assert out.shape == (N,) and out.dtype == torch.float64


@pytest.mark.parametrize("kind,layerwise", [(kind, lw) for kind in LINEAR for lw in (False, True)
                                             if lw or kind != "kronecker"])  # kronecker: per layer only
def test_compress_and_decompress_use_the_same_matrix(kind, layerwise):
    """<S^T S u, v> = <S u, S v>: decompress regenerates exactly the S that compress used."""
    s = make_sketch(kind, LAYOUT, seed=1, round=2, layerwise=layerwise, **kwargs_for(kind))
    u, v = vec(N, 1), vec(N, 2)
    lhs = float(s.decompress(s.compress(u)) @ v)
    rhs = float(s.compress(u) @ s.compress(v))
    assert lhs == pytest.approx(rhs, rel=1e-9)  # the same S (float32 entries, float64 arithmetic)


def test_dense_blocks_are_regenerated_identically(monkeypatch):
    """With many small row blocks, S x and S^T y match the explicit matrix of the same seed."""
    monkeypatch.setattr(dense_mod, "BLOCK_ELEMS", 3 * 40)  # 3 rows per block, 17 rows -> 6 blocks
    s = make_sketch("gaussian", [(40,)], k=17, seed=4, round=0)
    (_, _, _, op), = s.blocks
    assert op.rows_per_block == 3
    mat = op.matrix(dtype=torch.float64)
    x, y = vec(40), vec(17, 3)
    torch.testing.assert_close(s.compress(x), mat @ x)
    torch.testing.assert_close(s.decompress(y), mat.t() @ y)
    assert float(mat.var()) == pytest.approx(1 / 17, rel=0.15)  # N(0, 1/k) entries (680 draws)


def test_blocks_are_seeded_by_seed_round_and_layer():
    """RandK's rows are one randperm from the generator of derive_seed(seed, 'sketch', round, layer)."""
    x = torch.arange(N, dtype=torch.float64)
    whole = make_sketch("randk", LAYOUT, k=20, seed=5, round=9)
    gen = torch.Generator().manual_seed(derive_seed(5, "sketch", 9, "all"))
    idx = torch.randperm(N, generator=gen)[:20]
    torch.testing.assert_close(whole.compress(x), x[idx] * math.sqrt(N / 20))
    per_layer = make_sketch("randk", LAYOUT, k=[4, 3, 2, 1], seed=5, round=9)
    y, expected = per_layer.compress(x), []
    for layer, (off, m, kl) in enumerate([(0, 96, 4), (96, 12, 3), (108, 60, 2), (168, 1, 1)]):
        gen = torch.Generator().manual_seed(derive_seed(5, "sketch", 9, layer))
        expected.append(x[off + torch.randperm(m, generator=gen)[:kl]] * math.sqrt(m / kl))
    torch.testing.assert_close(y, torch.cat(expected))


def _child_payloads(seed: int, rnd: int) -> tuple[dict[str, np.ndarray], bool]:
    torch.set_num_threads(1)
    out = payloads(SKETCH_KINDS, LAYOUT, vec(N), seed, rnd)
    return {k: v.numpy() for k, v in out.items()}, "flwr" in sys.modules


def test_same_payloads_in_another_process_and_no_flower():
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        child, child_has_flwr = pool.apply(_child_payloads, (13, 2))
    mine = payloads(SKETCH_KINDS, LAYOUT, vec(N), 13, 2)
    assert set(child) == set(SKETCH_KINDS)
    for kind in SKETCH_KINDS:
        assert torch.equal(mine[kind], torch.from_numpy(child[kind])), kind
    assert not child_has_flwr  # the base layer never imports Flower


# ------------------------------------------------------------------------------------------
# payload validation


@pytest.mark.parametrize("kind", SKETCH_KINDS)
def test_bad_payloads_raise_payload_error(kind):
    s = make_sketch(kind, LAYOUT, seed=0, round=0, **kwargs_for(kind))
    good = s.compress(vec(N))
    nan, inf = good.clone(), good.clone()
    nan[0] = float("nan")
    inf[-1] = float("-inf")
    bad = [good[:-1], torch.cat([good, good[:1]]), nan, inf, good.view(1, -1),
           good.to(torch.int64), good.tolist(), None, torch.empty(0)]
    for payload in bad:
        with pytest.raises(PayloadError):
            s.decompress(payload)
    with pytest.raises(PayloadError, match="NaN"):
        s.decompress(nan)
    with pytest.raises(PayloadError, match=f"expected {s.payload_size}"):
        s.decompress(good[:-1])
    assert issubclass(PayloadError, ValueError)
    torch.testing.assert_close(s.decompress(good.numpy()), s.decompress(good))  # numpy is fine
    torch.testing.assert_close(s.decompress(good.float()), s.decompress(good).float(), rtol=1e-4, atol=1e-4)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="unknown sketch kind"):
        make_sketch("gausian", LAYOUT, ratio=0.1, seed=0, round=0)
    with pytest.raises(ValueError, match="ratio"):
        make_sketch("gaussian", LAYOUT, ratio=1.5, seed=0, round=0)
    with pytest.raises(ValueError, match="epsilon applies only"):
        make_sketch("gaussian", LAYOUT, epsilon=0.1, seed=0, round=0)
    with pytest.raises(ValueError, match="per layer"):
        make_sketch("kronecker", LAYOUT, ratio=0.1, seed=0, round=0, layerwise=False)
    with pytest.raises(ValueError, match="expects a 1-D update"):
        make_sketch("srht", LAYOUT, ratio=0.1, seed=0, round=0).compress(vec(N + 1))
    assert set(SKETCH_KINDS) == {"gaussian", "rademacher", "srht", "srft", "fjlt", "countsketch",
                                 "randk", "kronecker", "adaptive", "powersgd"}


# ------------------------------------------------------------------------------------------
# transforms


def test_fwht_is_the_normalised_hadamard_matrix_and_dht_is_orthonormal():
    for m in (1, 2, 8, 64):
        x = vec(m, m)
        torch.testing.assert_close(fwht(x), torch.from_numpy(scipy.linalg.hadamard(m) / math.sqrt(m)) @ x)
    m = 12
    j = torch.arange(m, dtype=torch.float64)
    ang = 2 * math.pi * j[:, None] * j[None, :] / m
    cas = (torch.cos(ang) + torch.sin(ang)) / math.sqrt(m)
    x = vec(m)
    torch.testing.assert_close(dht(x), cas @ x)
    torch.testing.assert_close(cas @ cas, torch.eye(m, dtype=torch.float64))


def test_fjlt_core_has_the_requested_density():
    s = make_sketch("fjlt", [(1000,)], k=100, q=0.05, seed=0, round=0)
    (_, _, _, op), = s.blocks
    assert op.m_pad == 1024
    # nnz ~ Binomial(100 * 1024, 0.05): mean 5120, sd 70; 5 sd
    assert abs(op.nnz - 5120) <= 5 * 70


# ------------------------------------------------------------------------------------------
# per-layer allocation


def test_uniform_allocation():
    sizes = [1000, 10, 1, 3, 250]
    for k in (5, 6, 50, 333, 1264):
        ks = allocate_uniform(sizes, k)
        assert sum(ks) == k and all(1 <= a <= b for a, b in zip(ks, sizes))
    assert allocate_uniform(sizes, 5) == [1] * 5
    assert allocate_uniform(sizes, sum(sizes)) == sizes
    assert allocate_uniform([300, 100], 40) == [30, 10]  # exactly proportional
    assert allocate_uniform([50, 30, 20], 7) == [4, 2, 1]  # quotas 3.5, 2.1, 1.4: largest remainder
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        sizes = rng.integers(1, 500, size=rng.integers(1, 8)).tolist()
        k = int(rng.integers(len(sizes), sum(sizes) + 1))
        ks = allocate_uniform(sizes, k)
        assert sum(ks) == k and all(1 <= a <= b for a, b in zip(ks, sizes))
        # where no bound binds, it is Hamilton's largest-remainder apportionment (exact fractions)
        quotas = [Fraction(k * m, sum(sizes)) for m in sizes]
        rems = [q - math.floor(q) for q in quotas]
        if min(quotas) >= 1 and len(set(rems)) == len(rems):
            hamilton = [math.floor(q) for q in quotas]
            for i in sorted(range(len(sizes)), key=lambda i: -rems[i])[: k - sum(hamilton)]:
                hamilton[i] += 1
            assert ks == hamilton
            checked += 1
    assert checked > 100


def test_energy_allocation_favours_the_high_energy_layer():
    assert allocate_energy([100, 100], 40, [9.0, 1.0]) == [36, 4]
    assert allocate_energy([100, 100], 40, [1.0, 0.0], min_k=5) == [35, 5]  # floored at min_k
    assert allocate_energy([10, 1000], 100, [1000.0, 1.0]) == [10, 90]  # capped at n_l
    assert allocate_energy([50, 50], 20, [0.0, 0.0]) == [10, 10]  # no profile: uniform
    rng = np.random.default_rng(1)
    for _ in range(200):
        sizes = rng.integers(1, 500, size=rng.integers(1, 8)).tolist()
        energy = (rng.random(len(sizes)) * (rng.random(len(sizes)) > 0.3)).tolist()
        k = int(rng.integers(len(sizes), sum(sizes) + 1))
        ks = allocate_energy(sizes, k, energy)
        assert sum(ks) == k and all(1 <= a <= b for a, b in zip(ks, sizes))


def test_layerwise_sketch_uses_the_allocation():
    layout = [(40, 10), (400,)]
    g = torch.cat([torch.full((400,), 0.1), torch.full((400,), 1.0)]).double()
    energy = layer_energy(g, layout)  # what the server computes from the last aggregate
    assert energy == pytest.approx([4.0, 400.0])
    s = make_sketch("gaussian", layout, ratio=0.1, seed=0, round=0, layerwise=True,
                    allocation="energy", energy=energy)
    assert s.k_per_block == allocate_energy([400, 400], 80, energy) and s.k == 80
    assert s.k_per_block[1] > s.k_per_block[0]
    u = make_sketch("srht", layout, ratio=0.1, seed=0, round=0, layerwise=True)
    assert u.k_per_block == [40, 40]


# ------------------------------------------------------------------------------------------
# Kronecker


def test_kronecker_identity():
    gen = torch.Generator().manual_seed(0)
    k1, n1, k2, n2 = 2, 3, 3, 4
    a = torch.randn(k1, n1, generator=gen, dtype=torch.float64)
    b = torch.randn(k2, n2, generator=gen, dtype=torch.float64)
    x = torch.randn(n2, n1, generator=gen, dtype=torch.float64)
    col_vec = lambda m: m.t().reshape(-1)  # column-major vec
    torch.testing.assert_close(torch.kron(a, b) @ col_vec(x), col_vec(b @ x @ a.t()))


def test_kronecker_sketch_is_a_kron_of_its_factors():
    layout = [(6, 2, 2), (5,)]
    s = make_sketch("kronecker", layout, ratio=0.25, seed=3, round=1)
    op = s.blocks[0][3]
    assert isinstance(op, KroneckerOperator) and (op.r, op.c) == (6, 4)
    st = op.structures(torch.device("cpu"), torch.float64)
    full = torch.kron(st["A"], st["B"])  # (k1 k2) x (r c), on the row-major flattening
    x = vec(29)
    y = s.compress(x)
    torch.testing.assert_close(y[:op.k], full @ x[:24])
    torch.testing.assert_close(s.decompress(y)[:24], full.t() @ y[:op.k])
    assert s.k == op.k + s.blocks[1][3].k  # the bias falls back to a dense Gaussian block


# ------------------------------------------------------------------------------------------
# adaptive k


def test_adaptive_k_follows_the_jl_bound():
    eps, delta = 0.5, 0.1
    k = jl_min_k(eps, delta)
    bound = lambda kk: 2 * math.exp(-(kk / 2) * (eps**2 / 2 - eps**3 / 3))
    assert bound(k) <= delta < bound(k - 1)  # the smallest such k (= 72)
    layout = [(20, 20), (30,)]
    s = make_sketch("adaptive", layout, epsilon=eps, delta=delta, seed=0, round=0)
    assert s.k_per_layer == [k, 30] and s.k == k + 30
    assert s.chosen_ratio == pytest.approx((k + 30) / 430)
    x = vec(430)
    fails = 0
    for r in range(200):
        s = make_sketch("adaptive", layout, epsilon=eps, delta=delta, seed=0, round=r)
        y = s.compress(x)
        torch.testing.assert_close(y[k:], x[400:])  # the small layer is sent as is
        fails += abs(float(y[:k].square().sum() / x[:400].square().sum()) - 1) > eps
    assert fails / 200 <= delta  # the norm is kept within eps at least 1 - delta of the time


# ------------------------------------------------------------------------------------------
# PowerSGD


def test_powersgd_is_exact_on_a_rank_r_matrix():
    gen = torch.Generator().manual_seed(0)
    layout = [(20, 30), (7,)]
    low = torch.randn(20, 3, generator=gen, dtype=torch.float64) @ torch.randn(3, 30, generator=gen, dtype=torch.float64)
    x = torch.cat([low.reshape(-1), vec(7)])
    s = make_sketch("powersgd", layout, rank=3, seed=0, round=0)  # fresh state: random warm start
    y = s.compress(x)
    assert y.numel() == s.payload_size == 3 * (20 + 30) + 7
    torch.testing.assert_close(s.decompress(y), x, rtol=1e-9, atol=1e-9)
    assert float(s.state.error[0].abs().max()) < 1e-9  # nothing left for error feedback
    # the server needs no state to lift it
    torch.testing.assert_close(make_sketch("powersgd", layout, rank=3, seed=0, round=0).decompress(y), x,
                               rtol=1e-9, atol=1e-9)


def test_powersgd_error_feedback_accumulates_the_residual():
    layout = [(12, 16)]
    g1, g2, g3 = vec(192, 1), vec(192, 2), vec(192, 3)
    state = PowerSGDState(layout)
    lifted = []
    for r, g in enumerate((g1, g2, g3)):
        before = state.error.get(0, torch.zeros(12, 16, dtype=torch.float64)).clone()
        s = make_sketch("powersgd", layout, rank=2, seed=0, round=r, state=state)
        d = s.decompress(s.compress(g))
        lifted.append(d)
        # E_t = g_t + E_{t-1} - lift_t
        torch.testing.assert_close(state.error[0].reshape(-1), g + before.reshape(-1) - d)
        assert s.state_bytes == (16 * 2 + 12 * 16) * 8  # Q (16 x 2) and E (12 x 16), float64
    # telescoping: everything sent plus what is left equals everything computed
    torch.testing.assert_close(sum(lifted) + state.error[0].reshape(-1), g1 + g2 + g3)
    # without error feedback nothing is stored but Q
    s = make_sketch("powersgd", layout, rank=2, seed=0, round=0, error_feedback=False)
    s.compress(g1)
    assert s.state.error == {} and s.state_bytes == 16 * 2 * 8


def test_powersgd_warm_start_converges_and_state_can_be_saved():
    gen = torch.Generator().manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(24, 24, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(32, 24, generator=gen, dtype=torch.float64))
    sing = torch.tensor([10.0, 8.0] + [1.0 / (i + 1) for i in range(22)], dtype=torch.float64)
    m = (u * sing) @ v.t()
    x = m.reshape(-1)
    best = float(sing[2:].square().sum().sqrt())  # Eckart-Young: the best rank-2 error
    state = PowerSGDState([(24, 32)])
    for r in range(12):  # subspace iteration, one step per round, warm started
        s = make_sketch("powersgd", [(24, 32)], rank=2, seed=0, round=r, state=state, error_feedback=False)
        err = float((s.decompress(s.compress(x)) - x).norm())
    assert err == pytest.approx(best, rel=1e-6)
    # a saved and restored state continues exactly like the original
    saved = PowerSGDState.from_state_dict(state.state_dict())
    y1 = make_sketch("powersgd", [(24, 32)], rank=2, seed=0, round=12, state=state).compress(x)
    y2 = make_sketch("powersgd", [(24, 32)], rank=2, seed=0, round=12, state=saved).compress(x)
    assert torch.equal(y1, y2)


# ------------------------------------------------------------------------------------------
# accelerator (skipped without one): same S on the device, output on the input's device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", SKETCH_KINDS)
def test_cuda_matches_cpu(kind):
    x = vec(N)
    cpu = make_sketch(kind, LAYOUT, seed=2, round=1, **kwargs_for(kind))
    gpu = make_sketch(kind, LAYOUT, seed=2, round=1, device="cuda", **kwargs_for(kind))
    yc, yg = cpu.compress(x), gpu.compress(x.cuda())
    assert yg.device.type == "cuda"
    tol = dict(rtol=1e-6, atol=1e-8)
    if kind == "powersgd":  # QR may pick other signs per column: compare the lifts
        torch.testing.assert_close(gpu.decompress(yg).cpu(), cpu.decompress(yc), **tol)
        return
    torch.testing.assert_close(yg.cpu(), yc, **tol)
    zg = gpu.decompress(yg)
    assert zg.device.type == "cuda"
    torch.testing.assert_close(zg.cpu(), cpu.decompress(yc), **tol)
