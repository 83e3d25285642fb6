"""One release plan, both sides: what a silo with n records will release in a run, and the one
Gaussian calibration of it.

    z = min { s : epsilon_spent(releases, each with noise multiplier s * weight) <= epsilon }
    sigma_kind = z * weight_kind * sensitivity_kind          (the paper's sigma^2 for each release)

The silo calibrates its noise with :meth:`ReleasePlan.calibrate` (clients/silo.py, and so
``PrivateSilo``); the server's noise-aware Grad-BANT (strategies/phase_noise.py) and the
launcher's pre-flight (app/noise_plan.py) compute an honest silo's sigma with the very same call
from public quantities (n, the plan), never from a reply. Shuffle DP calibrates the same plan's
noise trials with its own accountant (clients/silo.py, app/privacy/binomial/).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.algorithms import TRAINING_PHASES, Algorithm, AlgorithmOptions, Phase, ReleaseSpec, release_plan
from app.privacy.accounting import PlannedRelease, Release, calibrate_noise_multiplier


@dataclass(frozen=True)
class ReleasePlan:
    """Every kind of release a silo with ``n`` records plans for one run (``releases``: the
    algorithm's schedule over its planned rounds, plus its private evaluations), and its budget
    (``epsilon``, ``delta``)."""

    n: int
    releases: tuple[ReleaseSpec, ...]
    epsilon: float
    delta: float

    @classmethod
    def of(cls, algorithm: Algorithm, options: AlgorithmOptions, n: int, clip: float, epsilon: float, delta: float,
           evaluations: int = 0, evaluation_weight: float = 1.0) -> ReleasePlan:
        """The plan of ``algorithm`` (app/algorithms ``release_plan``) for n records at per-record clip C."""
        return cls(n, tuple(release_plan(algorithm, options, n, clip, evaluations, evaluation_weight)),
                   epsilon, delta)

    def planned(self) -> list[PlannedRelease]:
        """The releases as the accountant composes them (before calibration)."""
        return [PlannedRelease(r.phase, self.n, r.batch, r.count, r.weight, r.disjoint) for r in self.releases]

    def calibrate(self, before: Sequence[Release] = ()) -> float:
        """z: the smallest scale keeping the plan (after the already charged ``before``, e.g. the
        DP pre-processing release) within (epsilon, delta); rounded up, so always within budget."""
        if before:
            from app.privacy.preprocessing import calibrate_after

            return calibrate_after(list(before), self.planned(), self.epsilon, self.delta)
        return calibrate_noise_multiplier(self.planned(), self.epsilon, self.delta)

    def calibrated(self, z: float) -> dict[Phase, ReleaseSpec]:
        """Each kind's release with its noise multiplier z * weight."""
        return {r.phase: replace(r, noise_multiplier=z * r.weight) for r in self.releases}

    def training(self, phase: Phase | None = None) -> ReleaseSpec | None:
        """The plan's ``phase`` release (None: its first training release), or None."""
        return next((r for r in self.releases
                     if (r.phase == phase if phase is not None else r.phase in TRAINING_PHASES)), None)
