"""Which releases each round of each algorithm asks a silo for (one source of truth).

The server's strategies follow this schedule (apart from the extra anchors they ask for after a
round in which no silo answered), and each silo counts it to plan and calibrate its noise before
the first round. Rounds are numbered from 1.

* ``mbsgd``: ``grad`` every round;  ``localsgd``: ``local`` (Q noisy local steps) every round.
* ``proxsgd`` (Algorithm 6): ``disjoint`` every round: a gradient on the round's own block of
  K = floor(n / R) records, so each record is used in one round only.
* ``spider`` (Algorithm 3): ``anchor`` in rounds 1, q + 1, 2q + 1, ...; ``diff`` otherwise.
* ``svrg`` (Algorithm 1): epochs of Q + 1 rounds; the first round of an epoch is the snapshot
  ``anchor`` (K = n), the Q others are inner-step ``diff`` releases.
* ``plsvrg`` (Algorithm 2): the rounds split into S stages of ceil(R / S) rounds, each an SVRG run
  restarted at the previous stage's output, so each stage starts with an ``anchor``.
* ``gradbant`` (Byzantine-robust line): ``grad`` every round, or ``local`` with Q > 1 local steps.
* ``spider-alt`` (Algorithm 11): round 1 is one fresh ``grad`` release; every later round has two
  uploads, a ``diff`` (w^1 vs w^0) then a fresh ``grad`` at w^2.
"""

from __future__ import annotations

import math
from collections import Counter

from app.config import Settings


def stage_length(s: Settings) -> int:
    """Rounds per PL-SVRG stage: ceil(R / S)."""
    return math.ceil(s.num_rounds / s.plsvrg_restarts)


def round_phases(s: Settings, rnd: int) -> tuple[str, ...]:
    """The releases round ``rnd`` asks each sampled silo for, in order (no dropout)."""
    if rnd < 1:
        raise ValueError(f"rounds are numbered from 1, got {rnd}")
    algo = s.algorithm
    if algo == "mbsgd":
        return ("grad",)
    if algo == "localsgd":
        return ("local",)
    if algo == "proxsgd":
        return ("disjoint",)
    if algo == "spider":
        return ("anchor",) if (rnd - 1) % s.spider_q == 0 else ("diff",)
    if algo in ("svrg", "plsvrg"):
        pos = (rnd - 1) % stage_length(s) if algo == "plsvrg" else rnd - 1
        return ("anchor",) if pos % (s.svrg_inner_steps + 1) == 0 else ("diff",)
    if algo == "spider-alt":
        return ("grad",) if rnd == 1 else ("diff", "grad")
    if algo == "gradbant":  # a gradient, or Q local steps whose change is a pseudo-gradient
        return ("local",) if s.local_steps > 1 else ("grad",)
    raise ValueError(f"no release schedule for algorithm {algo!r}")


def planned_release_counts(s: Settings, rounds: int) -> Counter[str]:
    """How many releases of each phase a silo sampled in every one of ``rounds`` rounds makes."""
    counts: Counter[str] = Counter()
    for rnd in range(1, rounds + 1):
        counts.update(round_phases(s, rnd))
    return counts


def evaluation_rounds(s: Settings) -> list[int]:
    """The rounds after which the server evaluates the model (``eval-every``; always the last)."""
    if not s.eval_every:
        return []
    return [r for r in range(1, s.num_rounds + 1) if r % s.eval_every == 0 or r == s.num_rounds]


def planned_evaluations(s: Settings) -> int:
    """How many evaluation requests a silo plans for: one per evaluation round, plus one of the
    output iterate when ``output`` = random. A silo answering privately calibrates for these."""
    rounds = len(evaluation_rounds(s))
    return rounds + (1 if rounds and s.output == "random" else 0)
