"""An attack aimed at Grad-BANT's score itself: "the edge of the score" (issue 39).

Grad-BANT (strategies/gradbant.py) weights a message u, as the server reads it (lifted S^T y, in
the rule's space: a gradient or a pseudo-gradient -d / gamma), only when its score is positive:

    s(u) = <g0, u> - (L gamma / 2) max(||u||^2 - c, 0)       (c = 0: the paper's; c > 0: noise-aware)

An attacker who knows the rule, g0, L, gamma and c (white box: more than the trust-set gradient's
distribution) and a harmful direction h (the model moves by -gamma a u, so the step moves it along
h by gamma a D(u)) sends

    u*(m) = argmax_u  D(u) = -<h, u>   subject to   s(u) >= m      (m > 0: just inside the edge)

**The plane.** With g^ = g0 / ||g0||, h = h_g g^ + h_p e (e a unit vector orthogonal to g^,
h_p >= 0): a component of u outside span{g^, e} changes neither <g0, u> nor D and only adds to
||u||^2, so u* lies in the plane: u = r (cos phi g^ - sin phi e), r >= 0, phi in [0, pi/2), and

    s = r a - (L gamma / 2) max(r^2 - c, 0),   a = ||g0|| cos phi;      D = r (h_p sin phi - h_g cos phi).

**The radius.** For a fixed phi, s is concave in r with s(0) = 0, so {r : s >= m} is an interval
[r_lo, r_hi] (empty when phi is too wide). With Delta = a^2 - 2 L gamma m + (L gamma)^2 c:

    r_hi = (a + sqrt(Delta)) / (L gamma)                 feasible iff Delta >= 0 and (a sqrt(c) >= m or r_hi >= sqrt(c))
    r_lo = m / a  when m <= a sqrt(c),  else (a - sqrt(Delta)) / (L gamma)

(at r = sqrt(c) the quadratic equals a sqrt(c), so a sqrt(c) >= m puts its larger root beyond the
allowance). D is linear in r: its maximum over [r_lo, r_hi] is at an end. phi is searched on a
grid of ``grid`` angles, then zoomed twice around the best (:func:`edge_of_score`).

**Closed forms (the tests' independent facts).** Outside the allowance ball (always when c = 0)
{s >= m} is the disc of centre g0 / (L gamma) and radius R = sqrt(||g0||^2 / (L gamma)^2 + c -
2 m / (L gamma)), so there u* = g0 / (L gamma) - R h / ||h|| and D* = R ||h|| - <h, g0> / (L gamma);
with c = m = 0: D* = (||g0|| / (L gamma)) (||h|| - <h, g^>), zero only for h along +g0. With a
large noise allowance c (ISRL-DP, noise-aware score) the optimum sits on the allowance ball
instead: <g0, u> = m, ||u|| = sqrt(c), the rest of its energy along -e, nearly orthogonal to g0.
So with a true L and c = 0 every positive-score message still descends the trust loss (the
descent lemma); the attacker's room is the angle between g0 and h, the allowance c, and the
weight it takes from honest silos (a larger kept score m buys more weight: the harness,
strategies/byzantine_harness.py ``edge_message``, searches m against the rule in use).

**A sketched round.** The server reads u = S^T y, so u lies in range(S^T): the harness solves the
problem in the plane spanned by two reachable lifts (:func:`edge_in_span`), e.g. S^T S g0 and
S^T ybar, and sends the payload with that lift. Pure numpy, no randomness.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

#: the attacker's kept score m as fractions of the largest score any message can have in its plane
#: (:func:`max_score`); the harness keeps the fraction that damages the rule's aggregate most
EDGE_FRACTIONS = (0.01, 0.03, 0.1, 0.2, 0.35, 0.5, 0.75)
#: what the edge attacker moves the model along (attack.edge-target)
EDGE_TARGETS = ("honest-mean", "class-bias")


class EdgeCraft(NamedTuple):
    """The crafted message: ``vector`` (in the space of g0 and h), its score s(u) and damage
    D = -<h, u>, the angle phi from g0 and the radius r = ||u||."""

    vector: np.ndarray
    score: float
    damage: float
    phi: float
    radius: float


def score(g0: np.ndarray, u: np.ndarray, smoothness: float, gamma: float, noise_energy: float = 0.0) -> float:
    """s(u) = <g0, u> - (L gamma / 2) max(||u||^2 - c, 0) (the module docstring's score)."""
    u = np.asarray(u, dtype=np.float64)
    energy = float(u @ u)
    return float(np.asarray(g0, dtype=np.float64) @ u) - 0.5 * smoothness * gamma * max(energy - noise_energy, 0.0)


def max_score(g0_norm: float, smoothness: float, gamma: float, noise_energy: float = 0.0) -> float:
    """sup_u s(u): along g0, s(r) = r ||g0|| - (L gamma / 2) max(r^2 - c, 0) peaks at r = ||g0|| / (L gamma)
    when that is beyond sqrt(c) (value ||g0||^2 / (2 L gamma) + L gamma c / 2), else at r = sqrt(c)
    (value ||g0|| sqrt(c))."""
    lg, c = smoothness * gamma, max(noise_energy, 0.0)
    if g0_norm / lg >= math.sqrt(c):
        return g0_norm ** 2 / (2 * lg) + lg * c / 2
    return g0_norm * math.sqrt(c)


def _radii(a: np.ndarray, lg: float, c: float, m: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(r_lo, r_hi, feasible) for the directions with alignment a = ||g0|| cos phi (docstring)."""
    disc = a * a - 2 * lg * m + lg * lg * c
    root = np.sqrt(np.maximum(disc, 0.0))
    r_hi = (a + root) / lg
    sqrt_c = math.sqrt(c)
    inside = a * sqrt_c >= m  # the allowance ball reaches the level m
    feasible = (a > 0) & (disc >= 0) & (inside | (r_hi >= sqrt_c))
    with np.errstate(divide="ignore", invalid="ignore"):
        r_lo = np.where(inside, m / np.where(a > 0, a, 1.0), (a - root) / lg)
    return np.maximum(r_lo, 0.0), r_hi, feasible


def edge_of_score(g0: np.ndarray, harm: np.ndarray, smoothness: float, gamma: float, noise_energy: float = 0.0,
                  margin: float = 0.0, grid: int = 2048) -> EdgeCraft:
    """u*(m): the message of largest damage D = -<harm, u> whose score s(u) >= ``margin`` (module
    docstring), in the space of ``g0`` and ``harm`` (any dimension). ValueError when L gamma <= 0 (no
    penalty: the edge is at infinity), g0 = 0 or ``margin`` is beyond :func:`max_score`."""
    g = np.asarray(g0, dtype=np.float64)
    h = np.asarray(harm, dtype=np.float64)
    lg, c, m = float(smoothness) * float(gamma), max(float(noise_energy), 0.0), max(float(margin), 0.0)
    if not (lg > 0 and math.isfinite(lg)):
        raise ValueError(f"the score needs L gamma > 0 (a penalty), got L = {smoothness}, gamma = {gamma}")
    gn = float(np.linalg.norm(g))
    if gn == 0 or not math.isfinite(gn):
        raise ValueError("g0 = 0: no message has a positive score")
    if m > max_score(gn, smoothness, gamma, c) * (1 - 1e-12):
        raise ValueError(f"margin {m:g} is beyond the largest score {max_score(gn, smoothness, gamma, c):g}")
    g_hat = g / gn
    h_g = float(h @ g_hat)
    perp = h - h_g * g_hat
    h_p = float(np.linalg.norm(perp))
    if h_p > 1e-12 * max(float(np.linalg.norm(h)), 1e-300):
        e = perp / h_p
    else:  # h along g0: any orthogonal direction does as well (D does not see it); take none
        h_p, e = 0.0, np.zeros_like(g)

    def best(phis: np.ndarray) -> tuple[float, float]:
        a = gn * np.cos(phis)
        r_lo, r_hi, ok = _radii(a, lg, c, m)
        gain = h_p * np.sin(phis) - h_g * np.cos(phis)  # D per unit radius
        d_hi, d_lo = r_hi * gain, r_lo * gain
        d = np.where(ok, np.maximum(d_hi, d_lo), -np.inf)
        k = int(np.argmax(d))
        return float(phis[k]), float(r_hi[k] if d_hi[k] >= d_lo[k] else r_lo[k])

    top = math.pi / 2 * (1 - 1e-12)
    phis = np.linspace(0.0, top, grid)
    phi, r = best(phis)
    step = phis[1] - phis[0]
    for _ in range(2):  # zoom around the best angle
        phis = np.linspace(max(phi - step, 0.0), min(phi + step, top), 257)
        phi, r = best(phis)
        step = phis[1] - phis[0]
    u = r * (math.cos(phi) * g_hat - math.sin(phi) * e)
    return EdgeCraft(u, score(g, u, smoothness, gamma, c), float(-(h @ u)), phi, r)


def _orthonormal(basis: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(Q, R, kept columns): Q R = basis[:, kept], Q orthonormal; a column nearly in the span of
    those kept before it (relative residual <= 1e-9) or zero is dropped."""
    b = np.asarray(basis, dtype=np.float64)
    norms = np.linalg.norm(b, axis=0)
    keep: list[int] = []
    for j in range(b.shape[1]):
        if norms[j] == 0:
            continue
        if keep:
            q, _ = np.linalg.qr(b[:, keep])
            rest = b[:, j] - q @ (q.T @ b[:, j])
            if np.linalg.norm(rest) <= 1e-9 * norms[j]:
                continue
        keep.append(j)
    if not keep:
        raise ValueError("the basis has no non-zero column")
    q, r = np.linalg.qr(b[:, keep])
    return q, r, keep


def span_max_score(basis: np.ndarray, g0: np.ndarray, smoothness: float, gamma: float,
                   noise_energy: float = 0.0) -> float:
    """The largest score of a message in span(``basis``): :func:`max_score` of ||Q^T g0||."""
    q, _, _ = _orthonormal(basis)
    return max_score(float(np.linalg.norm(q.T @ np.asarray(g0, dtype=np.float64))), smoothness, gamma, noise_energy)


def edge_in_span(basis: np.ndarray, g0: np.ndarray, harm: np.ndarray, smoothness: float, gamma: float,
                 noise_energy: float = 0.0, margin: float = 0.0) -> tuple[np.ndarray, EdgeCraft]:
    """:func:`edge_of_score` restricted to u in span(``basis`` [d, j]), the messages the attacker can
    make the server read: with Q R = basis (Q orthonormal; a column that adds no direction is
    dropped), u = Q z and z = edge_of_score(Q^T g0, Q^T harm) in R^j (<g0, Qz> = <Q^T g0, z>,
    ||Qz|| = ||z||). Returns (w, craft) with basis @ w = u (zero weight on a dropped column) and
    ``craft.vector`` = u in R^d. ``margin`` is capped at :func:`span_max_score` (times 1 - 1e-9)."""
    q, r, keep = _orthonormal(basis)
    g_in = q.T @ np.asarray(g0, dtype=np.float64)
    cap = max_score(float(np.linalg.norm(g_in)), smoothness, gamma, noise_energy) * (1 - 1e-9)
    z = edge_of_score(g_in, q.T @ np.asarray(harm, dtype=np.float64), smoothness, gamma, noise_energy,
                      min(margin, cap))
    w = np.zeros(np.shape(basis)[1])
    w[keep] = np.linalg.solve(r, z.vector)
    u = q @ z.vector
    return w, z._replace(vector=u)


__all__ = ["EDGE_FRACTIONS", "EDGE_TARGETS", "EdgeCraft", "edge_in_span", "edge_of_score", "max_score", "score",
           "span_max_score"]
