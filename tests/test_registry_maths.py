"""Every registered rule, pre-aggregator and optimiser checked against its paper's formula.

The test cases are derived from the registries themselves: one case per entry of
``strategies.aggregation.RULES`` (and ``strategies.options.AGGREGATORS``, which adds Grad-BANT),
``strategies.preaggregation.PRE_AGGREGATORS`` and ``strategies.STRATEGIES`` (= the algorithms of
``app/algorithms/``). Each compares the module's result with an independent computation written
here from the paper's formula (plain loops, sorted lists, brute force; never the module's own
helpers), on seeded random inputs with outliers and a few (n, f). A registry entry without a
reference here fails, telling where to add one; a reference whose entry was removed fails too.

A rule that returns the wrong statistic (a "MeaMed" returning the coordinate median, a trimmed
mean that trims nothing) fails its case here, whatever its other tests check.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from app import wire
from app.algorithms import ALGORITHMS, Phase
from app.config import parse_settings
from strategies import STRATEGIES
from strategies.aggregation import RULES
from strategies.options import AGGREGATORS
from strategies.preaggregation import PRE_AGGREGATORS, arc, bucketing, nnm
from strategies.replies import Updates

HERE = "tests/test_registry_maths.py"
D = 5  # dimension of the rules' inputs
#: (n, f): n updates of which the last f are outliers; every one satisfies Krum's n > 2f + 2
CASES = [(4, 0), (5, 1), (6, 1), (7, 2), (9, 2), (10, 3)]
SEEDS = (0, 1, 2)


def _stack(n: int, f: int, seed: int, d: int = D) -> np.ndarray:
    """n rows: n - f honest ones around (1, ..., 1), then f outliers, alternately far in the
    opposite direction (-8) and far along it (+25), each with its own noise (no ties)."""
    rng = np.random.default_rng(seed)
    rows = [1.0 + rng.normal(size=d) for _ in range(n - f)]
    for j in range(f):
        rows.append((-8.0 if j % 2 == 0 else 25.0) + 3.0 * rng.normal(size=d))
    return np.array(rows)


def _missing(kind: str, name: str, table: str) -> str:
    return (f"{kind} {name!r} is registered but has no maths test: add an independent reference for it (its "
            f"paper's formula in plain numpy, not the module's helpers) to {table} in {HERE}")


# =============================================================================================
# aggregation rules (strategies/aggregation.py RULES): independent references
# =============================================================================================

def ref_mean(u: np.ndarray) -> np.ndarray:
    """(1/m) sum_i u_i, summed row by row."""
    total = np.zeros(u.shape[1])
    for row in u:
        total = total + row
    return total / len(u)


def ref_fltrust(u: np.ndarray, trust_update: np.ndarray) -> np.ndarray:
    """Cao et al. 2021, Alg. 1: s_i = ReLU(cos(u_i, g0)); sum_i s_i (||g0|| / ||u_i||) u_i / sum_i s_i."""
    g0_norm = math.sqrt(sum(x * x for x in trust_update))
    num, den = np.zeros(u.shape[1]), 0.0
    for row in u:
        norm = math.sqrt(sum(x * x for x in row))
        s = max(0.0, sum(a * b for a, b in zip(row, trust_update)) / (norm * g0_norm))
        num = num + s * (g0_norm / norm) * row
        den += s
    return num / den if den > 0 else np.zeros(u.shape[1])


def _krum_scores(u: np.ndarray, f: int) -> list[float]:
    """Blanchard et al. 2017: score_i = sum of the n - f - 2 smallest ||u_i - u_j||^2, j != i."""
    n = len(u)
    scores = []
    for i in range(n):
        dists = sorted(sum((a - b) ** 2 for a, b in zip(u[i], u[j])) for j in range(n) if j != i)
        scores.append(sum(dists[:n - f - 2]))
    return scores


def ref_krum(u: np.ndarray, f: int) -> np.ndarray:
    """The row with the lowest Krum score (ties: lowest index)."""
    scores = _krum_scores(u, f)
    return u[min(range(len(u)), key=lambda i: (scores[i], i))]


def ref_multi_krum(u: np.ndarray, f: int) -> np.ndarray:
    """The mean of the n - f rows with the lowest Krum scores."""
    scores = _krum_scores(u, f)
    chosen = sorted(range(len(u)), key=lambda i: (scores[i], i))[:len(u) - f]
    return ref_mean(u[chosen])


def ref_trimmed_mean(u: np.ndarray, f: int) -> np.ndarray:
    """Yin et al. 2018: per coordinate, sort, drop the f smallest and the f largest, average the rest."""
    n = len(u)
    out = []
    for k in range(u.shape[1]):
        values = sorted(u[:, k])
        kept = values[f:n - f]
        out.append(sum(kept) / len(kept))
    return np.array(out)


def ref_median(u: np.ndarray, f: int = 0) -> np.ndarray:
    """Per coordinate: the middle value of the sorted list (even n: the mean of the two middle ones)."""
    n = len(u)
    out = []
    for k in range(u.shape[1]):
        values = sorted(u[:, k])
        out.append(values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2]))
    return np.array(out)


def _sum_of_distances(z: np.ndarray, u: np.ndarray) -> float:
    return sum(math.sqrt(sum((a - b) ** 2 for a, b in zip(z, row))) for row in u)


def ref_geometric_median(u: np.ndarray, f: int = 0) -> np.ndarray:
    """argmin_z sum_i ||z - u_i||, by plain Weiszfeld iterations run far past the module's
    stopping rule (z <- sum_i u_i / ||z - u_i|| / sum_i 1 / ||z - u_i||)."""
    z = u.mean(axis=0)
    for _ in range(20_000):
        inv = [1.0 / max(1e-15, math.sqrt(sum((a - b) ** 2 for a, b in zip(z, row)))) for row in u]
        z_new = sum(w * row for w, row in zip(inv, u)) / sum(inv)
        if np.max(np.abs(z_new - z)) < 1e-13:
            return z_new
        z = z_new
    return z


def ref_centered_clipping(u: np.ndarray, center: np.ndarray, tau: float, f: int = 0, iters: int = 1) -> np.ndarray:
    """Karimireddy et al. 2021: v <- v + (1/n) sum_i (u_i - v) min(1, tau / ||u_i - v||), from v = center."""
    v = np.array(center, dtype=np.float64)
    for _ in range(iters):
        step = np.zeros_like(v)
        for row in u:
            dist = math.sqrt(sum((a - b) ** 2 for a, b in zip(row, v)))
            step = step + (row - v) * (min(1.0, tau / dist) if dist > 0 else 1.0)
        v = v + step / len(u)
    return v


def ref_smea(u: np.ndarray, f: int) -> np.ndarray:
    """Allouah et al. 2023: over every subset S of n - f rows, the one whose empirical covariance
    (1/|S|) sum (u_i - mu_S)(u_i - mu_S)^T has the smallest top eigenvalue (first in
    combinations order on ties); its mean. The d x d covariance, built directly."""
    n = len(u)
    best, best_lam = None, math.inf
    for subset in itertools.combinations(range(n), n - f):
        rows = u[list(subset)]
        mu = rows.mean(axis=0)
        cov = sum(np.outer(r - mu, r - mu) for r in rows) / len(rows)
        lam = max(np.linalg.eigvalsh(cov))
        if lam < best_lam * (1 - 1e-12):
            best, best_lam = subset, lam
    assert best is not None
    return u[list(best)].mean(axis=0)


#: rule name -> its independent reference (called with the rule's registry inputs besides ``updates``)
RULE_REFERENCES: dict[str, Callable[..., np.ndarray]] = {
    "mean": ref_mean,
    "fltrust": ref_fltrust,
    "krum": ref_krum,
    "multi-krum": ref_multi_krum,
    "trimmed-mean": ref_trimmed_mean,
    "median": ref_median,
    "geometric-median": ref_geometric_median,
    "centered-clipping": ref_centered_clipping,
    "smea": ref_smea,
}
#: how close a rule's result must be to its reference (the geometric median is iterative: the
#: module stops at a relative step of 1e-6, the reference runs to 1e-13)
RULE_TOLERANCE = {"geometric-median": {"rtol": 0.0, "atol": 1e-4}}


def _rule_inputs(name: str, u: np.ndarray, f: int, seed: int) -> dict[str, Any]:
    """The rule's declared inputs (``Rule.inputs``) for this case, drawn from the seed."""
    rng = np.random.default_rng(1000 + seed)
    kwargs: dict[str, Any] = {}
    for inp in RULES[name].inputs:
        if inp == "f":
            kwargs["f"] = f
        elif inp == "trust_update":
            kwargs["trust_update"] = 1.0 + 0.5 * rng.normal(size=u.shape[1])  # the honest direction
        elif inp == "center":
            kwargs["center"] = 0.5 * rng.normal(size=u.shape[1])
        elif inp == "tau":
            kwargs["tau"] = 1.5  # some honest rows inside, the outliers clipped
        else:
            pytest.fail(f"rule {name!r} declares input {inp!r}, which _rule_inputs in {HERE} cannot draw yet: "
                        "teach it to")
    return kwargs


@pytest.mark.parametrize("name", sorted(RULES))
def test_rule_matches_its_paper_formula(name: str) -> None:
    """Every registered rule equals its independent reference on every case."""
    if name not in RULE_REFERENCES:
        pytest.fail(_missing("aggregation rule", name, "RULE_REFERENCES"))
    rule, ref = RULES[name], RULE_REFERENCES[name]
    tol = RULE_TOLERANCE.get(name, {"rtol": 1e-10, "atol": 1e-10})
    checked = 0
    for n, f in CASES:
        if rule.krum_bound and n <= 2 * f + 2:
            continue
        for seed in SEEDS:
            u = _stack(n, f, seed)
            kwargs = _rule_inputs(name, u, f, seed)
            got = rule.fn(u, **kwargs).vector
            np.testing.assert_allclose(got, ref(u, **kwargs), **tol,
                                       err_msg=f"rule {name!r}, n = {n}, f = {f}, seed = {seed}")
            checked += 1
    assert checked >= 12


def test_geometric_median_first_order_optimality() -> None:
    """At the geometric median the unit vectors from z to the rows sum to ~0 (none of them is z),
    and no row or the coordinate median has a smaller sum of distances."""
    for n, f in CASES:
        for seed in SEEDS:
            u = _stack(n, f, seed)
            z = RULES["geometric-median"].fn(u, f=f).vector
            pull = sum((row - z) / math.sqrt(sum((a - b) ** 2 for a, b in zip(row, z))) for row in u)
            assert np.linalg.norm(pull) < 1e-3, (n, f, seed, pull)
            for other in [*u, ref_median(u), ref_mean(u)]:
                assert _sum_of_distances(z, u) <= _sum_of_distances(other, u) + 1e-9


def test_centered_clipping_several_iterations_and_no_clip() -> None:
    """iters > 1 repeats the clipped step from the new centre; tau = inf is the mean."""
    clip = RULES["centered-clipping"].fn
    for n, f in CASES:
        u = _stack(n, f, 7)
        center = np.full(D, 0.3)
        np.testing.assert_allclose(clip(u, center, 1.5, 4, f=f).vector,
                                   ref_centered_clipping(u, center, 1.5, iters=4), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(clip(u, center, math.inf, f=f).vector, ref_mean(u), rtol=1e-10, atol=1e-10)


def test_krum_and_multi_krum_select_the_brute_force_rows() -> None:
    """Krum's weights are one-hot on the brute-force argmin; Multi-Krum's 1/(n - f) on its n - f lowest."""
    for n, f in CASES:
        u = _stack(n, f, 3)
        scores = _krum_scores(u, f)
        order = sorted(range(n), key=lambda i: (scores[i], i))
        assert np.flatnonzero(RULES["krum"].fn(u, f=f).weights).tolist() == [order[0]]
        np.testing.assert_allclose(RULES["multi-krum"].fn(u, f=f).weights,
                                   [1.0 / (n - f) if i in order[:n - f] else 0.0 for i in range(n)])


def test_fltrust_ignores_rows_against_the_root_update() -> None:
    """Rows with a negative cosine to g0 get trust 0: the result is the honest rows' rescaled mix."""
    u = _stack(7, 2, 0)  # outlier 0 is at -8: cosine < 0 with g0 ~ (1, ..., 1)
    g0 = np.ones(D)
    out = RULES["fltrust"].fn(u, g0)
    assert out.weights[5] == 0.0
    np.testing.assert_allclose(out.vector, ref_fltrust(u, g0), rtol=1e-12)


# ---------------------------------------------------------------------------------------------
# Grad-BANT (the one aggregator of strategies.options.AGGREGATORS outside RULES)
# ---------------------------------------------------------------------------------------------

def ref_gradbant(g0: np.ndarray, u: np.ndarray, p: np.ndarray, idx: list[int], beta: float, smooth: float,
                 gamma: float, c: float = 0.0) -> tuple[np.ndarray | None, np.ndarray]:
    """The JL + Grad-BANT paper's step: theta_i = [<g0, u_i> - (L gamma / 2) max(||u_i||^2 - c, 0)]_+
    (c = 0: ||u_i||^2); p <- (1 - beta) p + beta theta / sum theta (over the silos ``idx``);
    a_i = p_i 1[theta_i > 0] renormalised; direction sum_i a_i u_i. Every theta 0: p <- (1 - beta) p
    + beta / N and no direction."""
    theta = []
    for row in u:
        energy = sum(x * x for x in row)
        if c > 0:
            energy = max(energy - c, 0.0)
        theta.append(max(0.0, sum(a * b for a, b in zip(g0, row)) - 0.5 * smooth * gamma * energy))
    total = sum(theta)
    if total <= 0:
        return None, (1 - beta) * p + beta / len(p)
    share = np.zeros(len(p))
    for i, t in zip(idx, theta):
        share[i] += t / total
    p_new = (1 - beta) * p + beta * share
    active = [p_new[i] if t > 0 else 0.0 for i, t in zip(idx, theta)]
    return sum(a / sum(active) * row for a, row in zip(active, u)), p_new


def test_gradbant_step_matches_its_paper_formula() -> None:
    """strategies.gradbant.gradbant_step over several rounds (the momentum p carried), with and
    without the noise-aware allowance c, against :func:`ref_gradbant`."""
    from strategies.gradbant import gradbant_step

    rng = np.random.default_rng(11)
    N = 8
    for c in (0.0, 2.0):
        p = ref_p = np.full(N, 1.0 / N)
        for rnd in range(6):
            idx = sorted(rng.choice(N, size=5, replace=False).tolist())
            u = _stack(5, 2, 100 + rnd) * 0.3
            g0 = 0.3 + 0.1 * rng.normal(size=D)
            got, p, a, _ = gradbant_step(g0, u, p, np.array(idx), 0.3, 2.0, 0.5, c)
            want, ref_p = ref_gradbant(g0, u, ref_p, idx, 0.3, 2.0, 0.5, c)
            np.testing.assert_allclose(p, ref_p, rtol=1e-12, atol=1e-15)
            assert (got is None) == (want is None)
            if want is not None:
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    # every score 0 (all rows against g0): no direction, p relaxes towards uniform
    u = -np.abs(_stack(4, 0, 5))
    got, p, _, _ = gradbant_step(np.ones(D), u, np.full(N, 1.0 / N), np.arange(4), 0.3, 1.0, 0.5)
    assert got is None and ref_gradbant(np.ones(D), u, np.full(N, 1.0 / N), [0, 1, 2, 3], 0.3, 1.0, 0.5)[0] is None


#: aggregators of strategies.options.AGGREGATORS that are not RULES entries, and their maths test
OTHER_AGGREGATOR_TESTS = {"gradbant": test_gradbant_step_matches_its_paper_formula}


# =============================================================================================
# pre-aggregators (strategies/preaggregation.py PRE_AGGREGATORS)
# =============================================================================================

def check_nnm(u: np.ndarray, f: int, seed: int) -> None:
    """Allouah et al. 2023: y_i = mean of the n - f rows nearest to u_i (u_i included; ties by index)."""
    n = len(u)
    want = []
    for i in range(n):
        near = sorted(range(n), key=lambda j: (math.sqrt(sum((a - b) ** 2 for a, b in zip(u[i], u[j]))), j))
        want.append(ref_mean(u[near[:n - f]]))
    np.testing.assert_allclose(nnm(u, f).rows, np.array(want), rtol=1e-12, atol=1e-12)


def check_bucketing(u: np.ndarray, f: int, seed: int) -> None:
    """Karimireddy et al. 2022: pi from the same seeded generator; bucket j = mean of rows
    pi(js), ..., pi(min((j + 1)s, n) - 1) (the last bucket holds the leftovers)."""
    n = len(u)
    for s in (1, 2, 3, n):
        perm = list(np.random.default_rng(seed).permutation(n))
        want = [ref_mean(u[perm[j:j + s]]) for j in range(0, n, s)]
        got = bucketing(u, s, np.random.default_rng(seed)).rows
        assert got.shape == (math.ceil(n / s), u.shape[1])
        np.testing.assert_allclose(got, np.array(want), rtol=1e-12, atol=1e-12)


def check_arc(u: np.ndarray, f: int, seed: int) -> None:
    """Allouah et al. 2024: k = floor(2 f (n - f) / n); the k largest-norm rows are scaled to the
    (n - k)-th smallest norm; the others stay."""
    n = len(u)
    k = (2 * f * (n - f)) // n
    norms = [math.sqrt(sum(x * x for x in row)) for row in u]
    order = sorted(range(n), key=lambda i: (norms[i], i))
    want = u.copy()
    if k > 0:
        tau = norms[order[n - k - 1]]
        for i in order[n - k:]:
            want[i] = u[i] * (tau / norms[i])
    np.testing.assert_allclose(arc(u, f).rows, want, rtol=1e-12, atol=1e-12)


#: pre-aggregator name -> its independent check (updates, f, seed)
PRE_AGGREGATOR_CHECKS: dict[str, Callable[[np.ndarray, int, int], None]] = {
    "nnm": check_nnm,
    "bucketing": check_bucketing,
    "arc": check_arc,
}


@pytest.mark.parametrize("name", sorted(PRE_AGGREGATORS))
def test_pre_aggregator_matches_its_paper_formula(name: str) -> None:
    if name not in PRE_AGGREGATOR_CHECKS:
        pytest.fail(_missing("pre-aggregator", name, "PRE_AGGREGATOR_CHECKS"))
    for n, f in CASES:
        for seed in SEEDS:
            PRE_AGGREGATOR_CHECKS[name](_stack(n, f, seed), f, seed)


def test_arc_clips_exactly_k_rows() -> None:
    """ARC at n = 10, f = 3 clips floor(2 * 3 * 7 / 10) = 4 rows, to the 6th smallest norm."""
    u = _stack(10, 3, 4)
    norms = sorted(np.linalg.norm(u, axis=1))
    out = np.linalg.norm(arc(u, 3).rows, axis=1)
    assert sorted(out)[-5:] == pytest.approx([norms[5]] * 5)  # the 6th row and the 4 clipped to it
    assert sorted(out)[:6] == pytest.approx(norms[:6])


# =============================================================================================
# optimisers (strategies.STRATEGIES: every FederatedOptimizer subclass, every algorithm name)
# =============================================================================================

LAYOUT = {"a": (2, 3), "b": (4,)}
DIM = 10
W0 = np.linspace(-1.0, 1.0, DIM)
LR, L1 = 0.3, 0.5  # step size and the l1 prox strength (soft threshold lr * L1 = 0.15)


def _params(flat: np.ndarray) -> dict[str, np.ndarray]:
    return {"a": np.asarray(flat[:6], dtype=np.float32).reshape(2, 3),
            "b": np.asarray(flat[6:], dtype=np.float32)}


def _flat(w: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(w["a"], dtype=np.float64).ravel(), np.asarray(w["b"], dtype=np.float64)])


def soft(z: np.ndarray, t: float) -> np.ndarray:
    """prox of t ||.||_1: sign(z) max(|z| - t, 0), coordinate by coordinate."""
    return np.array([math.copysign(max(abs(x) - t, 0.0), x) for x in z])


class Silos:
    """Answers every exchange with ``m`` fresh random rows (the last ``outliers`` far off) and
    records (phase, at, prev, rows) for the independent replay."""

    def __init__(self, seed: int, m: int = 4, outliers: int = 0) -> None:
        self.rng, self.m, self.outliers = np.random.default_rng(seed), m, outliers
        self.asked: list[tuple[Phase, np.ndarray, np.ndarray | None, np.ndarray]] = []

    def __call__(self, phase: Phase, at: dict, prev: dict | None = None) -> Updates:
        rows = self.rng.normal(size=(self.m, DIM)).astype(np.float32)
        rows[self.m - self.outliers:] += np.float32(40.0)
        self.asked.append((phase, _flat(at), None if prev is None else _flat(prev), rows.astype(np.float64)))
        ups = [_params(r) for r in rows]
        nodes = [1000 + i for i in range(self.m)]
        return Updates(nodes=nodes, updates=ups, metrics=[wire.TrainReply(u, 0.0) for u in ups],
                       messages={nd: r for nd, r in zip(nodes, rows)}, lift=lambda m: wire.unflatten(m, LAYOUT))


def _run(algorithm: str, rounds: int, silos: Silos, draws: dict[int, int] | None = None,
         **cfg: Any) -> list[np.ndarray]:
    """``rounds`` server steps from W0 as the loop takes them (a None model keeps w; with
    ``output = random`` each new iterate offered to the output sampler); the models w_1..w_R.
    ``draws`` gets, before each round, the round of the iterate the output sampler holds."""
    s = parse_settings({"algorithm": algorithm, "lr": LR, "privacy.mode": "off", "num-rounds": rounds} | cfg)
    opt = STRATEGIES[algorithm](s, LAYOUT)
    w, out = _params(W0), []
    for rnd in range(1, rounds + 1):
        if draws is not None and opt.sampler.round is not None:
            draws[rnd] = opt.sampler.round
        model = opt.step(rnd, w, silos).model
        if model is not None:
            w = {k: np.asarray(v, dtype=np.float32) for k, v in model.items()}
        if s.output == "random":  # as strategies/loop.py's run does
            opt.sampler.offer(rnd, w)
        out.append(_flat(w))
    return out


def _close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=what)


def _asked(silos: Silos, i: int, phase: Phase, at: np.ndarray, prev: np.ndarray | None = None) -> np.ndarray:
    """The i-th exchange asked ``phase`` at ``at`` (against ``prev``); its rows' plain mean."""
    got_phase, got_at, got_prev, rows = silos.asked[i]
    assert got_phase == phase, f"exchange {i}: asked {got_phase}, the algorithm's formula needs {phase}"
    _close(got_at, at, f"exchange {i}: the point asked")
    if prev is None:
        assert got_prev is None, f"exchange {i}: a second point was sent"
    else:
        assert got_prev is not None, f"exchange {i}: no second point was sent"
        _close(got_prev, prev, f"exchange {i}: the second point")
    return ref_mean(rows)


def check_prox_gradient(algorithm: str, phase: Phase) -> Callable[[], None]:
    def check() -> None:
        """MB-SGD / Prox-SGD: w_{r+1} = prox_{lr f1}(w_r - lr (1/M) sum_i g_i), f1 = L1 ||.||_1."""
        silos = Silos(1)
        models = _run(algorithm, 4, silos, **{"prox.kind": "l1", "prox.strength": L1})
        w = W0.copy()
        for r in range(4):
            g = _asked(silos, r, phase, w)
            w = soft(w - LR * g, LR * L1)
            _close(models[r], w, f"{algorithm} round {r + 1}")
    return check


def check_localsgd() -> None:
    """Local SGD / FedAvg: w_{r+1} = w_r + (1/M) sum_i Delta_i."""
    silos = Silos(2)
    models = _run("localsgd", 3, silos, **{"local-steps": 3})
    w = W0.copy()
    for r in range(3):
        w = w + _asked(silos, r, Phase.LOCAL, w)
        _close(models[r], w, f"localsgd round {r + 1}")


def check_spider() -> None:
    """FedProx-SPIDER (Alg. 3), q = 3: anchor rounds 1, 4, 7 set h = mean(g); the others
    h = h + mean(H), H the difference between w_r and the previous point; w_{r+1} = prox(w_r - lr h)."""
    silos = Silos(3)
    models = _run("spider", 7, silos, **{"spider.q": 3, "prox.kind": "l1", "prox.strength": L1})
    w, prev, h = W0.copy(), None, None
    for r in range(7):
        if r % 3 == 0:
            h = _asked(silos, r, Phase.ANCHOR, w)
        else:
            h = h + _asked(silos, r, Phase.DIFF, w, prev)
        prev, w = w, soft(w - LR * h, LR * L1)
        _close(models[r], w, f"spider round {r + 1}")


def _svrg_replay(silos: Silos, models: list[np.ndarray], anchors: set[int], name: str,
                 starts: dict[int, np.ndarray] | None = None) -> None:
    """SVRG (Alg. 1): an anchor round takes the snapshot w_bar = w, g~ = mean(g), v = g~; the others
    v = g~ + mean(difference against w_bar); w_{r+1} = prox(w_r - lr v). ``starts``: round index
    -> the point a PL-SVRG stage restarts from instead of w_r."""
    w, snap, g = W0.copy(), None, None
    for r in range(len(models)):
        w = (starts or {}).get(r, w)
        if r in anchors:
            snap, g = w, _asked(silos, r, Phase.ANCHOR, w)
            v = g
        else:
            v = g + _asked(silos, r, Phase.DIFF, w, snap)
        w = soft(w - LR * v, LR * L1)
        _close(models[r], w, f"{name} round {r + 1}")


def check_svrg() -> None:
    """Q = 2 inner steps: epochs of 3 rounds, snapshots at rounds 1, 4, 7."""
    silos = Silos(4)
    models = _run("svrg", 7, silos, **{"svrg.inner-steps": 2, "prox.kind": "l1", "prox.strength": L1})
    _svrg_replay(silos, models, {0, 3, 6}, "svrg")


def check_plsvrg() -> None:
    """PL-SVRG (Alg. 2): R = 6 rounds, S = 2 restarts, so stages of 3 rounds; Q = 5 inner steps
    would not take a snapshot before round 7, but each stage restarts SVRG (from its last iterate,
    output = last) with a fresh snapshot: snapshots at rounds 1 and 4."""
    silos = Silos(5)
    models = _run("plsvrg", 6, silos, **{"plsvrg.restarts": 2, "svrg.inner-steps": 5, "prox.kind": "l1",
                                          "prox.strength": L1})
    _svrg_replay(silos, models, {0, 3}, "plsvrg")


def check_plsvrg_random_restart() -> None:
    """PL-SVRG with output = random: stage 2 restarts from the iterate of stage 1 drawn uniformly
    (the loop's output sampler), not from the last one. The seed is one whose draw is w_1 or w_2,
    so a restart from the last iterate would be caught."""
    silos, draws = Silos(8), {}
    models = _run("plsvrg", 6, silos, draws, **{"plsvrg.restarts": 2, "svrg.inner-steps": 5, "output": "random",
                                                 "seed": 3, "prox.kind": "l1", "prox.strength": L1})
    drawn = draws[4]
    assert drawn in (1, 2), f"seed 3 drew round {drawn}'s iterate: pick a seed whose draw is not the last one"
    _svrg_replay(silos, models, {0, 3}, "plsvrg (output = random)", starts={3: models[drawn - 1]})


def check_spider_alt() -> None:
    """Fed-SPIDER, the alternate form (Alg. 11): round 1 g = mean(g~(w_1)), model unchanged; round r:
    w1 = prox(w - lr g); D = mean difference at (w1, w); v = g + D; w2 = prox(w1 - lr v);
    g = mean(g~(w2)); w_{r+1} = w2."""
    silos = Silos(6)
    models = _run("spider-alt", 4, silos, **{"prox.kind": "l1", "prox.strength": L1})
    w = W0.copy()
    g = _asked(silos, 0, Phase.GRAD, w)
    _close(models[0], w, "spider-alt round 1 (no step)")
    i = 1
    for r in range(1, 4):
        w1 = soft(w - LR * g, LR * L1)
        v = g + _asked(silos, i, Phase.DIFF, w1, w)
        w2 = soft(w1 - LR * v, LR * L1)
        g = _asked(silos, i + 1, Phase.GRAD, w2)
        i += 2
        w = w2
        _close(models[r], w, f"spider-alt round {r + 1}")


def check_robust() -> None:
    """Byzantine-robust MB-SGD: x_{t+1} = x_t - gamma rule(u_1..u_m) (here the trimmed mean with
    f = 1 over 5 replies, one far off); with Q > 1 local steps the rule reads the pseudo-gradients
    -d / gamma, so x_{t+1} = x_t - gamma TM(-d / gamma) = x_t + TM(d)."""
    cfg = {"aggregator": "trimmed-mean", "byzantine.f": 1, "num-silos": 5, "silos-per-round": 5}
    for local_steps in (1, 2):
        silos = Silos(7, m=5, outliers=1)
        models = _run("robust", 3, silos, **cfg, **{"local-steps": local_steps})
        w = W0.copy()
        for r in range(3):
            phase, _, _, rows = silos.asked[r]
            assert phase == (Phase.GRAD if local_steps == 1 else Phase.LOCAL)
            _close(silos.asked[r][1], w, f"robust round {r + 1}: the point asked")
            tm = ref_trimmed_mean(rows, 1)
            w = w - LR * tm if local_steps == 1 else w + tm
            _close(models[r], w, f"robust (local-steps = {local_steps}) round {r + 1}")


#: algorithm name -> its independent replay (app/algorithms/ and strategies.STRATEGIES)
OPTIMISER_CHECKS: dict[str, Callable[[], None]] = {
    "mbsgd": check_prox_gradient("mbsgd", Phase.GRAD),
    "proxsgd": check_prox_gradient("proxsgd", Phase.DISJOINT),
    "localsgd": check_localsgd,
    "spider": check_spider,
    "svrg": check_svrg,
    "plsvrg": lambda: (check_plsvrg(), check_plsvrg_random_restart()),
    "spider-alt": check_spider_alt,
    "robust": check_robust,
}


@pytest.mark.parametrize("algorithm", sorted(STRATEGIES))
def test_optimiser_step_matches_its_paper_formula(algorithm: str) -> None:
    """Each optimiser's server steps, fed seeded random replies, equal the paper's update rule
    replayed here on the same replies (the points and phases it asked for included)."""
    if algorithm not in OPTIMISER_CHECKS:
        pytest.fail(_missing("optimiser (algorithm)", algorithm, "OPTIMISER_CHECKS"))
    OPTIMISER_CHECKS[algorithm]()


# =============================================================================================
# the guard: the registries and the maths tests name the same entries
# =============================================================================================

def test_every_registry_entry_has_a_maths_test() -> None:
    """A new rule, pre-aggregator or optimiser needs a maths test here; a removed one takes its test along."""
    tables = [
        ("aggregation rule (strategies/aggregation.py RULES)", set(RULES), set(RULE_REFERENCES),
         "RULE_REFERENCES"),
        ("aggregator (strategies/options.py AGGREGATORS)", set(AGGREGATORS),
         set(RULE_REFERENCES) | set(OTHER_AGGREGATOR_TESTS), "RULE_REFERENCES or OTHER_AGGREGATOR_TESTS"),
        ("pre-aggregator (strategies/preaggregation.py PRE_AGGREGATORS)", set(PRE_AGGREGATORS),
         set(PRE_AGGREGATOR_CHECKS), "PRE_AGGREGATOR_CHECKS"),
        ("optimiser (strategies.STRATEGIES)", set(STRATEGIES), set(OPTIMISER_CHECKS), "OPTIMISER_CHECKS"),
        ("algorithm (app/algorithms/)", set(ALGORITHMS), set(OPTIMISER_CHECKS), "OPTIMISER_CHECKS"),
    ]
    problems = []
    for kind, registered, tested, table in tables:
        for name in sorted(registered - tested):
            problems.append(_missing(kind, name, table))
        for name in sorted(tested - registered):
            problems.append(f"{table} in {HERE} tests {name!r}, which is no longer a registered {kind}: remove it")
    assert not problems, "\n".join(problems)
    # every FederatedOptimizer subclass that serves an algorithm is reached through its names
    assert {cls for cls in STRATEGIES.values()} == {STRATEGIES[name] for name in OPTIMISER_CHECKS}
