"""edge-of-score (issue 39): the message of largest damage whose Grad-BANT score stays positive.

Checked against independent facts: the rule's own score (strategies/phase_noise.py
``noise_aware_scores``, and ``gradbant_step``'s weights) on the crafted vector; a brute-force grid
over the plane's radius and angle (the score's definition, s = x ||g0|| - (L gamma / 2) max(x^2 + y^2
- c, 0)) and random vectors of the whole space; a line search over the crafted vector's scale; the
disc's closed form D* = R ||h|| - <h, g0> / (L gamma); a real SRHT sketch built column by column;
and a short federation through the ServerApp where the Byzantine silos get weight."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from app.edge_attack import EDGE_FRACTIONS, edge_in_span, edge_of_score
from strategies.gradbant import gradbant_step
from strategies.phase_noise import noise_aware_scores

L, GAMMA = 1.0, 0.2


def _case(name: str) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(g0, h, c, m) of a named case, d = 12; m as a fraction of the largest score (closed form below)."""
    rng = np.random.default_rng(39)
    g = rng.normal(size=12)
    h = rng.normal(size=12) + 0.5 * g
    gn, lg = float(np.linalg.norm(g)), L * GAMMA
    if name == "paper score, kept margin":  # c = 0: the disc
        c, frac = 0.0, 0.1
    elif name == "noise allowance, h near g0":  # the optimum on the allowance ball
        h, c, frac = g + 0.05 * rng.normal(size=12), 400.0 * gn ** 2, 0.01
    elif name == "moderate allowance":
        c, frac = 3.0 * gn ** 2, 0.3
    else:  # h along +g0: every feasible message helps; the least helpful one
        h, c, frac = 2.0 * g, 1.0, 0.2
    top = gn ** 2 / (2 * lg) + lg * c / 2 if gn / lg >= math.sqrt(c) else gn * math.sqrt(c)
    return g, h, c, frac * top


CASES = ["paper score, kept margin", "noise allowance, h near g0", "moderate allowance", "h along g0"]


def _rule_score(g: np.ndarray, u: np.ndarray, c: float) -> float:
    return float(noise_aware_scores(g, u[None, :], L, GAMMA, c)[0])


@pytest.mark.parametrize("name", CASES)
def test_the_crafted_update_scores_above_its_margin_and_no_feasible_update_does_more_damage(name):
    g, h, c, m = _case(name)
    craft = edge_of_score(g, h, L, GAMMA, c, m)
    s = _rule_score(g, craft.vector, c)
    assert s > 0 and s >= m * (1 - 1e-9)
    damage = -float(h @ craft.vector)
    assert damage == pytest.approx(craft.damage, rel=1e-12, abs=1e-12)
    scale = float(np.linalg.norm(h)) * (float(np.linalg.norm(g)) + math.sqrt(c) + 1) / (L * GAMMA)
    # brute force in the plane (g^, e), x along g0 and y along the part of h orthogonal to it
    gn = float(np.linalg.norm(g))
    g_hat = g / gn
    perp = h - (h @ g_hat) * g_hat
    h_p = float(np.linalg.norm(perp))
    r_max = (gn + math.sqrt(gn ** 2 + (L * GAMMA) ** 2 * c)) / (L * GAMMA)  # no r beyond scores >= 0
    x, y = np.meshgrid(np.linspace(-r_max, r_max, 1601), np.linspace(-r_max, r_max, 1601))
    sc = x * gn - 0.5 * L * GAMMA * np.maximum(x * x + y * y - c, 0.0)
    dmg = -(x * float(h @ g_hat) + y * h_p)
    best = float(np.max(np.where(sc >= m, dmg, -np.inf)))
    assert damage >= best - 1e-9 * scale  # at least as good as every feasible grid point
    assert damage <= best + 2e-3 * scale  # and the grid comes close: not an infeasible overstatement
    # random vectors of the whole space (any direction, any radius) do no better
    rng = np.random.default_rng(1)
    dirs = rng.normal(size=(40_000, 12))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    u = dirs * rng.uniform(0, r_max, size=(40_000, 1))
    ok = noise_aware_scores(g, u, L, GAMMA, c) >= m
    assert ok.any() and float(np.max(-(u[ok] @ h))) <= damage + 1e-9 * scale
    # a line search over the crafted vector's scale: the crafted scale is the best feasible one
    ts = np.linspace(0.0, 1.5, 3001)
    feasible = [t for t in ts if _rule_score(g, t * craft.vector, c) >= m * (1 - 1e-9)]
    t_best = max(feasible, key=lambda t: -float(h @ (t * craft.vector)))
    assert t_best == pytest.approx(1.0, abs=1e-3)


def test_the_paper_score_s_edge_has_the_disc_s_closed_form():
    """c = 0, m = 0: {s >= 0} is the ball of centre and radius ||g0|| / (L gamma) around g0 / (L gamma),
    so D* = (||g0|| / (L gamma)) (||h|| - <h, g0>/||g0||), at u* = g0/(L gamma) - (||g0||/(L gamma)) h/||h||."""
    rng = np.random.default_rng(5)
    g, h = rng.normal(size=30), rng.normal(size=30)
    craft = edge_of_score(g, h, L, GAMMA)
    gn, hn, lg = np.linalg.norm(g), np.linalg.norm(h), L * GAMMA
    assert craft.damage == pytest.approx(gn / lg * (hn - h @ g / gn), rel=1e-9)
    np.testing.assert_allclose(craft.vector, g / lg - gn / lg * h / hn, atol=1e-6 * gn / lg)


def test_the_rule_gives_the_crafted_update_weight_among_honest_silos():
    """gradbant_step (the rule itself): 4 copies of the crafted update with a kept margin score > 0
    and get a positive share of the weight next to 6 honest updates."""
    rng = np.random.default_rng(7)
    g = rng.normal(size=20)
    honest = g + 0.8 * rng.normal(size=(6, 20))
    c = 5.0
    craft = edge_of_score(g, honest.mean(axis=0), L, GAMMA, c, margin=0.5)
    rows = np.concatenate([honest, np.repeat(craft.vector[None], 4, axis=0)])
    direction, _, a, theta = gradbant_step(g, rows, np.full(10, 0.1), np.arange(10), 0.5, L, GAMMA, c)
    assert direction is not None and np.all(theta[6:] > 0) and a[6:].sum() > 0
    assert theta[6] == pytest.approx(craft.score, rel=1e-9)


def _sketch_matrix(layout: list[tuple[int, ...]]):
    from app.sketch import make_sketch

    sketch = make_sketch("srht", layout, ratio=0.5, seed=11, round=4)
    d = sum(int(np.prod(v)) for v in layout)
    cols = [sketch.compress(torch.nn.functional.one_hot(torch.tensor(j), d).float()).numpy() for j in range(d)]
    return sketch, np.stack(cols, axis=1).astype(np.float64)


def test_a_sketched_round_the_server_reads_a_positive_score_and_the_damage_is_the_plane_s_best():
    """A real SRHT sketch (S column by column): the payload edge_message sends is read by the
    server as S^T y, whose score (the rule's own) is > 0; against gradbant_step on the lifts, the
    kept fraction maximises the aggregate's damage over EDGE_FRACTIONS (each recomputed here), and
    the crafted update is the plane's best at that margin (brute force over its coefficients)."""
    from strategies.byzantine_harness import edge_message

    _, S = _sketch_matrix([(6, 5), (5,)])  # d = 35, k = 18
    rng = np.random.default_rng(3)
    g0 = rng.normal(size=35)
    x = g0 + 1.5 * rng.normal(size=(6, 35))
    y = (x @ S.T).astype(np.float32).astype(np.float64)  # the honest payloads as sent
    ybar = y.mean(axis=0)
    payloads = np.stack([S @ g0, ybar], axis=1)
    basis = S.T @ payloads  # the server's reading S^T y of each
    harm = S.T @ ybar
    c = 50.0

    def aggregate(rows: np.ndarray) -> np.ndarray:
        out = gradbant_step(g0, rows @ S, np.full(10, 0.1), np.arange(10), 0.5, L, GAMMA, c)[0]
        return np.zeros(35) if out is None else out

    report: dict[str, float] = {}
    sent = edge_message(y, 4, payloads, basis, g0, harm, (L, GAMMA, c), aggregate, lambda v: v, report)
    u = S.T @ sent.astype(np.float64)  # what the server reads
    assert _rule_score(g0, u, c) > 0
    rows = np.concatenate([y, np.repeat(sent[None].astype(np.float64), 4, axis=0)])
    _, _, a, theta = gradbant_step(g0, rows @ S, np.full(10, 0.1), np.arange(10), 0.5, L, GAMMA, c)
    assert np.all(theta[6:] > 0) and a[6:].sum() > 0
    assert report["attack_scale"] in EDGE_FRACTIONS
    # the kept fraction is the best of the fractions for the aggregate's damage
    q, _ = np.linalg.qr(basis)
    gq = float(np.linalg.norm(q.T @ g0))
    lg = L * GAMMA
    top = gq ** 2 / (2 * lg) + lg * c / 2 if gq / lg >= math.sqrt(c) else gq * math.sqrt(c)
    damages = {}
    for tau in EDGE_FRACTIONS:
        w, _ = edge_in_span(basis, g0, harm, L, GAMMA, c, tau * top)
        b = (payloads @ w).astype(np.float32).astype(np.float64)
        damages[tau] = -float(harm @ aggregate(np.concatenate([y, np.repeat(b[None], 4, axis=0)])))
    assert damages[report["attack_scale"]] == pytest.approx(max(damages.values()), rel=1e-9)
    assert report["attack_aggregate_damage"] == pytest.approx(max(damages.values()), rel=1e-6)
    # brute force over the plane's coefficients at the kept margin: nothing feasible does more damage
    m = report["attack_scale"] * top
    w_craft = np.linalg.lstsq(basis, u, rcond=None)[0]
    spread = 3 * float(np.max(np.abs(w_craft))) + 1.0
    grid_best = -np.inf
    for lo, hi in ((-spread, spread), (0.97, 1.03)):  # wide, then fine around the crafted coefficients
        a1 = np.linspace(lo, hi, 801) if lo < 0 else w_craft[0] * np.linspace(lo, hi, 801)
        a2 = np.linspace(lo, hi, 801) if lo < 0 else w_craft[1] * np.linspace(lo, hi, 801)
        w1, w2 = np.meshgrid(a1, a2)
        cand = np.stack([w1.ravel(), w2.ravel()], axis=1) @ basis.T
        ok = noise_aware_scores(g0, cand, L, GAMMA, c) >= m
        grid_best = max(grid_best, float(np.max(-(cand[ok] @ harm))))
    assert report["attack_damage"] >= grid_best - 1e-6 * abs(grid_best)
    assert report["attack_damage"] <= grid_best * (1 + 1e-3) + 1e-9
    assert -float(harm @ u) == pytest.approx(report["attack_damage"], rel=1e-4)


def test_edge_of_score_runs_through_the_server_app_and_its_messages_get_weight(tmp_path: Path):
    """A short federation through the real ServerApp (digits, 10 silos, 4 Byzantine, ISRL-DP
    eps = 8, SRHT k/n = 0.5, noise-aware Grad-BANT): every round the edge messages score > 0 on
    the server (they get weight) and the row reports the kept fraction."""
    from tests.helpers import run

    cfg = {"algorithm": "robust", "aggregator": "gradbant", "gradbant.noise-aware": True, "dataset": "digits",
           "partition": "iid", "num-silos": 10, "silos-per-round": 10, "privacy.mode": "isrl",
           "privacy.epsilon": 8.0, "sketch.kind": "srht", "sketch.ratio": 0.5, "attack.kind": "edge-of-score",
           "attack.fraction": 0.4, "num-rounds": 3, "batch-size": 32, "local-steps": 2, "trust.size": 60}
    summary, rows, _ = run(tmp_path, cfg)
    assert summary["status"] == "completed" and len(rows) == 3
    for r in rows:
        assert r["byzantine_answered"] == 4 and r["attack_scale"] in EDGE_FRACTIONS
        assert r["byzantine_weight"] > 0 and r["attack_score"] > 0
