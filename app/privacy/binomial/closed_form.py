"""The paper's closed-form parameter choice for the binomial protocol and a table of it against the
exact accountant (app/privacy/binomial/__init__.py's docstring: the method)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from app.privacy.binomial.search import calibrate_trials
from app.privacy.binomial.truncation import check_delta, check_epsilon, check_int


# ---------------------------------------------------------------------------- closed form

def closed_form(epsilon: float, delta: float, messages: int, dim: int) -> tuple[int, int, float]:
    """The paper's parameter choice for the binomial protocol, *the closed form as we read it*
    (Cheu, Joseph, Mao & Peng 2021; Lowy et al., Appendix D): with N = ``messages``,

        g = ceil(max(2 sqrt(N), d, 4)),   p = 1/4,
        b = ceil(24e4 * g^2 * ln(4 (d^2 + 1) / delta)^2 / (epsilon^2 * N))

    noise trials PER MESSAGE, so the exchange carries N * b trials in total. Returns (g, b, p)."""
    epsilon, delta = check_epsilon(epsilon), check_delta(delta)
    n, d = check_int("messages", messages, 1), check_int("dim", dim, 1)
    two_sqrt_n = math.isqrt(4 * n - 1) + 1 if n > 0 else 0  # ceil(2 sqrt(N)) exactly
    g = max(two_sqrt_n, d, 4)
    b = math.ceil(24e4 * g * g * math.log(4 * (d * d + 1) / delta) ** 2 / (epsilon * epsilon * n))
    return g, int(b), 0.25


def calibration_table(epsilons: Sequence[float] = (1.0, 3.0), dims: Sequence[int] = (10, 100, 1000),
                      messages: Sequence[int] = (100, 1000), delta: float = 1e-5, count: int = 1,
                      max_levels: int | None = None) -> list[dict]:
    """Closed form against the exact accountant: for each (epsilon, d, N), the closed form's
    (g, b, N b) and the exact accountant's minimal total trials at the SAME g and p = 1/4 for
    ``count`` releases, with the ratio N b / m. Rows with g > ``max_levels`` get exact_trials None
    (the exact search costs ~g sqrt(m) per evaluation)."""
    rows = []
    for eps in epsilons:
        for d in dims:
            for n in messages:
                g, b, p = closed_form(eps, delta, n, d)
                row = {"epsilon": eps, "dim": d, "messages": n, "levels": g, "p": p,
                       "per_message": b, "closed_total": n * b, "exact_trials": None, "ratio": None}
                if max_levels is None or g <= max_levels:
                    m = calibrate_trials(eps, delta, p, g, d, count)
                    row["exact_trials"] = m
                    row["ratio"] = n * b / m
                rows.append(row)
    return rows
