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

The criteria (:func:`cannot_learn`), for each training phase of the plan:

* **cannot learn**: rho_run = sqrt(sum_i sigma_i^2) / M * sqrt(d R) / (R clip) > 1 (the M least
  noisy silos) -- over the R planned releases the noise the steps add up (norm
  sqrt(sum_i sigma_i^2)/M sqrt(d R), times lr) outweighs the most signal they can add up
  (R clip, times lr). M = silos-per-round for the mean; 1 for any other rule (it may keep one
  message: no averaging is assumed);
* **the rule weighs noise** (every aggregator but the mean: Grad-BANT's score, Krum's distances, a
  median, ...): rho > 1 for even the least noisy silo -- every message's noise outweighs the most
  signal it can carry, so the rule's weights are decided by noise (it cannot single out a
  Byzantine silo; Grad-BANT's paper score gives 0). The run may still learn, from the signal the
  weighted noisy messages add up.

Both are necessary conditions for learning, not sufficient ones (the signal is usually well below
clip). What is assumed is said: n (the partition's, ``gradbant.silo-records``, or, when the server
cannot know it, a few illustrative sizes), no private evaluations and no ``standardize = "dp"``
release (either only adds noise), the run's privacy.epsilon (a silo's lifetime cap may be less).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from app.algorithms import AlgorithmOptions
    from app.privacy.settings import PrivacySettings

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


@dataclass(frozen=True)
class NoiseRun:
    """What the noise plan reads of a run: its algorithm (a registered name) and that algorithm's
    options, the privacy settings, the aggregation rule in effect (``aggregator`` with ``auto``
    resolved) and M = ``silos-per-round``. The entrypoint builds it (app/launch.py ``noise_run``)."""

    algorithm: str
    options: AlgorithmOptions
    privacy: PrivacySettings
    rule: str
    silos_per_round: int


def silo_noise(run: NoiseRun, n: int, dim: int) -> list[PhaseNoise]:
    """The training releases a silo with ``n`` records plans for the ``run`` and their sigma,
    calibrated as clients/silo.py calibrates (no private evaluations, no pre-processing release)."""
    from app.algorithms import TRAINING_PHASES, get_algorithm
    from app.privacy.release_plan import ReleasePlan

    plan = ReleasePlan.of(get_algorithm(run.algorithm), run.options, n, run.privacy.clip, run.privacy.epsilon,
                          run.privacy.delta_for(n))
    z = plan.calibrate()
    return [PhaseNoise(n, str(r.phase), r.batch, r.count, r.sigma, run.privacy.clip, dim)
            for r in plan.calibrated(z).values() if r.phase in TRAINING_PHASES]


def cannot_learn(run: NoiseRun, silos: Sequence[Sequence[PhaseNoise]]) -> tuple[list[str], list[str]]:
    """(why the plan cannot learn, why the rule weighs noise), each empty when it does not hold,
    by the module docstring's criteria, for ``silos`` (each silo's :func:`silo_noise`)."""
    rule = run.rule
    from app.algorithms import get_algorithm

    per_message = get_algorithm(run.algorithm).weighs_each_message(rule)
    learn, weighs = [], []
    for phase in sorted({p.phase for silo in silos for p in silo}):
        rows = [p for silo in silos for p in silo if p.phase == phase]
        if per_message:
            least = min(rows, key=lambda p: p.noise_to_signal)  # even the least noisy silo
            if least.noise_to_signal > 1:
                weighs.append(f"{phase}: every silo's message carries noise sigma*sqrt(d)/clip >= "
                              f"{least.noise_to_signal:.3g} times the most signal it can hold (criterion: > 1), so "
                              f"aggregator={rule} weighs noise: its weights cannot single out a Byzantine silo"
                              + (" and the paper's score gives 0" if rule == "gradbant" else ""))
        # the rule's output averages at most M messages (the mean: M = silos-per-round; a rule that
        # may keep one message: M = 1, no averaging assumed)
        m = min(run.silos_per_round, len(rows)) if not per_message else 1
        rounds = max(p.count for p in rows)
        sigmas = sorted(p.sigma for p in rows)[:m]  # the M least noisy silos: the best case
        rho = math.sqrt(sum(x * x for x in sigmas)) / m * math.sqrt(rows[0].dim * rounds) / (rounds * rows[0].clip)
        if rho > 1:
            what = f"the mean of {m} silos" if not per_message else f"aggregator={rule} (no averaging assumed)"
            learn.append(f"{phase}: over its {rounds} planned releases {what} adds up noise {rho:.3g} times the most "
                         "signal the steps can add up (criterion: > 1)")
    return learn, weighs


def preflight_lines(run: NoiseRun, sizes: Sequence[int] | None, dim: int, sizes_from: str) -> list[str]:
    """The pre-flight's console lines. ``sizes``: each silo's n (None: unknown to the server);
    ``sizes_from``: where they come from, in words."""
    if not run.privacy.enabled:
        return []
    head = "[silofl] pre-flight"
    if run.privacy.mode == "shuffle":
        return [f"{head}: privacy.mode=shuffle: the noise is the shuffle protocol's binomial trials "
                "(docs/privacy.md); no Gaussian noise-to-signal is shown"]
    if run.privacy.mode != "isrl":
        return [f"{head}: privacy.mode={run.privacy.mode}: each silo calibrates Skellam noise with its own accountant "
                "and adds 1/count-on of it to the secure sum (docs/privacy.md#secure-aggregation); no Gaussian "
                "noise-to-signal is shown"]
    unknown = sizes is None
    shown = list(ILLUSTRATIVE_N) if unknown else list(sizes)
    silos = [silo_noise(run, n, dim) for n in shown]
    lines = [f"{head}: planned noise per silo (ISRL-DP privacy.epsilon={run.privacy.epsilon:g} over "
             f"{run.options.planned_rounds} planned round(s), clip={run.privacy.clip:g}, d={dim} parameters; n {sizes_from}; "
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
    learn, weighs = cannot_learn(run, silos)
    for w in learn:
        lines.append(f"{head}: WARNING this plan cannot learn from the silos' records (their noise drowns their "
                     f"signal): {w}; see docs/your-data.md#small-silos (full batches, fewer rounds)")
    for w in weighs:
        lines.append(f"{head}: WARNING {w}; see docs/your-data.md#small-silos")
    return lines
