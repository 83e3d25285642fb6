"""The pre-flight's noise plan: before anything is spent, each silo's planned Gaussian noise
against its signal, and a warning when the plan cannot learn (docs/configuration.md#pre-flight).

Each silo's noise comes from its own release plan and calibration, computed here as the silo will
compute it (app/algorithms ``release_plan``, app/privacy/accounting.py
``calibrate_noise_multiplier``; the same call strategies/phase_noise.py makes for noise-aware
Grad-BANT), from public settings and the silo's n. A release of phase P is the mean of K clipped
per-record rows plus N(0, sigma^2 I_d) with sigma = z * weight * sensitivity; it is printed as

    sigma            the noise per coordinate;
    clip/K           one record's largest contribution to the mean (what sigma is calibrated against);
    ratio            sigma / (clip/K): the noise in units of one record's contribution;
    noise/signal     rho = sigma sqrt(d) / clip: the noise's norm over the largest norm the mean's
                     signal can have (a mean of rows clipped to clip has norm <= clip).

The criterion (:func:`cannot_learn`), for each training phase of the plan:

* a rule that looks at each silo's message alone (every aggregator but the mean: Grad-BANT's
  score, Krum's distances, a median, ...): rho > 1 -- every message's noise outweighs the most
  signal it can carry, so the rule compares noise (Grad-BANT's paper score then gives weight 0);
* the mean: rho_run = sqrt(sum_i sigma_i^2) / M * sqrt(d R) / (R clip) > 1 -- over the R planned
  rounds the averaged noise the steps add up (norm sqrt(sum_i sigma_i^2)/M sqrt(d R), times lr)
  outweighs the most signal they can add up (R clip, times lr).

Both are necessary conditions for learning, not sufficient ones (the signal is usually well below
clip). What is assumed is said: n (the partition's, ``gradbant.silo-records``, or, when the server
cannot know it, a few illustrative sizes), no private evaluations and no ``standardize = "dp"``
release (either only adds noise), the run's privacy.epsilon (a silo's lifetime cap may be less).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

#: illustrative silo sizes when the server cannot know n (the silos' own records)
ILLUSTRATIVE_N = (30, 100, 300, 1000)


@dataclass(frozen=True)
class PhaseNoise:
    """One kind of release a silo with ``n`` records plans: K, how many, sigma per coordinate."""

    n: int
    phase: str
    batch: int
    count: int
    sigma: float
    clip: float
    dim: int

    @property
    def contribution(self) -> float:
        """clip / K: one record's largest contribution to the batch mean."""
        return self.clip / self.batch

    @property
    def ratio(self) -> float:
        """sigma / (clip/K)."""
        return self.sigma / self.contribution

    @property
    def noise_to_signal(self) -> float:
        """rho = sigma sqrt(d) / clip."""
        return self.sigma * math.sqrt(self.dim) / self.clip


def silo_noise(s: Any, n: int, dim: int) -> list[PhaseNoise]:
    """The training releases a silo with ``n`` records plans for the run ``s`` and their sigma,
    calibrated as clients/silo.py calibrates (no private evaluations, no pre-processing release)."""
    from app.algorithms import TRAINING_PHASES, get_algorithm, release_plan
    from app.privacy.accounting import PlannedRelease, calibrate_noise_multiplier

    plan = release_plan(get_algorithm(s.algorithm), s, n, s.privacy.clip)
    z = calibrate_noise_multiplier([PlannedRelease(r.phase, n, r.batch, r.count, r.weight, r.disjoint) for r in plan],
                                   s.privacy.epsilon, s.delta_for(n))
    return [PhaseNoise(n, str(r.phase), r.batch, r.count, z * r.weight * r.sensitivity, s.privacy.clip, dim)
            for r in plan if r.phase in TRAINING_PHASES]


def cannot_learn(s: Any, silos: Sequence[Sequence[PhaseNoise]]) -> list[str]:
    """Why the plan cannot learn (empty: no warning), by the module docstring's criterion, for
    ``silos`` (each silo's :func:`silo_noise`)."""
    from app.config import effective_aggregator

    rule = effective_aggregator(s)
    per_message = rule != "mean" or s.algorithm == "robust"
    why = []
    phases = sorted({p.phase for silo in silos for p in silo})
    for phase in phases:
        rows = [p for silo in silos for p in silo if p.phase == phase]
        if not rows:
            continue
        if per_message:
            worst = min(rows, key=lambda p: p.noise_to_signal)  # even the least noisy silo
            if worst.noise_to_signal > 1:
                why.append(f"{phase}: every silo's message carries noise sigma*sqrt(d)/clip >= "
                           f"{worst.noise_to_signal:.3g} times the most signal it can hold, so aggregator={rule} "
                           "weighs noise (criterion: > 1)")
        else:
            m = min(s.silos_per_round, len(rows))
            rounds = max(p.count for p in rows)
            sigmas = sorted(p.sigma for p in rows)[:m]  # the M least noisy silos: the best case
            rho = math.sqrt(sum(x * x for x in sigmas)) / m * math.sqrt(rows[0].dim * rounds) / (rounds * rows[0].clip)
            if rho > 1:
                why.append(f"{phase}: over its {rounds} planned releases the mean of {m} silos adds up noise "
                           f"{rho:.3g} times the most signal the steps can add up (criterion: > 1)")
    return why


def preflight_lines(s: Any, sizes: Sequence[int] | None, dim: int, sizes_from: str) -> list[str]:
    """The pre-flight's console lines. ``sizes``: each silo's n (None: unknown to the server);
    ``sizes_from``: where they come from, in words."""
    if not s.privacy.enabled:
        return []
    head = "[silofl] pre-flight"
    if s.privacy.mode != "isrl":
        return [f"{head}: privacy.mode={s.privacy.mode}: the noise is the shuffle protocol's binomial trials "
                "(docs/privacy.md); no Gaussian noise-to-signal is shown"]
    unknown = sizes is None
    shown = list(ILLUSTRATIVE_N) if unknown else list(sizes)
    silos = [silo_noise(s, n, dim) for n in shown]
    lines = [f"{head}: planned noise per silo (ISRL-DP privacy.epsilon={s.privacy.epsilon:g} over "
             f"{s.planned_rounds()} planned round(s), clip={s.privacy.clip:g}, d={dim} parameters; n {sizes_from}; "
             "assumes no private evaluations and no standardize=dp release, each of which only adds noise)"]
    for i, (n, silo) in enumerate(zip(shown, silos, strict=True)):
        who = f"n={n}" if unknown else f"silo {i} n={n}"
        for p in silo:
            lines.append(f"{head}:   {who}: {p.phase} x{p.count} K={p.batch}: sigma {p.sigma:.4g}/coordinate vs "
                         f"clip/K {p.contribution:.4g} (x{p.ratio:.3g}); noise/signal sigma*sqrt(d)/clip "
                         f"{p.noise_to_signal:.3g}")
    if unknown:
        lines.append(f"{head}: the silos' n is not known to the server (their own records); a silo's n is 80% of "
                     "its file by default (test-fraction); set gradbant.silo-records=\"smallest,largest\" to check "
                     "those sizes")
        return lines
    why = cannot_learn(s, silos)
    for w in why:
        lines.append(f"{head}: WARNING this plan cannot learn from the silos' records (their noise drowns their "
                     f"signal): {w}; see docs/your-data.md#small-silos (full batches, fewer rounds, the mean when no "
                     "silo is suspect)")
    return lines
