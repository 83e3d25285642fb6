"""The noise an honest silo's release carries, phase by phase, as the server can know it (public
settings and its own trust set, never a reply): noise-aware Grad-BANT's allowance c for any
optimiser's messages (docs/byzantine.md#noise-aware-grad-bant).

A release of phase P by a silo with n records is the mean of K per-record rows over a batch B drawn
without replacement, noised and (optionally) sketched and lifted:

    u = S^T S (rbar_B + xi),  xi ~ N(0, sigma_P^2 I_d)
    rows r(x): grad / anchor / disjoint   clip_L grad f(w, x)
               diff (SPIDER, SVRG)        clip_L grad f(w, x) - clip_L grad f(w', x)
                                          (clip_C(grad f(w, x) - grad f(w', x)) with diff-clip C > 0)

sigma_P = z * weight_P * sensitivity_P from the algorithm's release plan (a difference: 4L/K2, or
2C/K2), K the phase's batch (:meth:`HonestNoise.batch`). With rbar the mean over the silo's n rows and
s_j^2 their per-coordinate variance (Cochran, without replacement),

    E||u||^2 = E||S^T S rbar||^2 + c_P,   c_P = (1 - K/n)/K * sum_j kappa_j s_j^2 + sigma_P^2 E||S^T S||_F^2,

so the noise-aware score s = <g0, u> - (L gamma / 2)(||u||^2 - c_P) of an honest message has

    E s = <g0, rbar> - (L gamma / 2) E||S^T S rbar||^2          (:func:`expected_honest_score`)

(E S^T S = I), which is > 0 when g0 = rbar and L gamma kappa_max < 2, whereas the paper's score
(c = 0) subtracts (L gamma / 2) c_P more: d sigma_P^2 of a difference release dwarfs ||rbar||^2, so
every honest difference scores 0. The server takes s_j^2 from its trust set's rows (the same rows
at the same points) and n, K of the smallest silo; sigma_P of the largest (the smallest noise any
honest silo has): both the conservative side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.algorithms import Algorithm, AlgorithmOptions, Phase
from app.options import ConfigError
from app.privacy.release_plan import ReleasePlan
from app.privacy.settings import PrivacySettings
from app.sketch_settings import SketchSettings

#: phases whose message is one batch mean of per-record rows (the sampling term applies)
ROW_PHASES = (Phase.GRAD, Phase.ANCHOR, Phase.DIFF, Phase.DISJOINT)


def silo_record_bounds(stated: tuple[int, ...], partition: Callable[[], Sequence[int]],
                       dataset: str) -> tuple[int, int]:
    """(smallest, largest) number of training records of any silo: ``stated``
    (``gradbant.silo-records``: a deployment's public bounds, which the operators state) when set,
    else the sizes ``partition()`` reads from the run's partition (a simulation). ConfigError
    naming the key when neither is available."""
    if stated:
        lo, hi = stated
        return lo, hi
    from app.data.sources import DataUnavailableError

    try:
        sizes = list(partition())
    except (OSError, DataUnavailableError) as exc:
        raise ConfigError(f"gradbant.noise-aware = true needs the silos' record counts, but the server cannot read "
                          f"{dataset} ({exc}); set gradbant.silo-records = \"smallest,largest\" (public bounds)") from None
    return min(sizes), max(sizes)


def minibatch_noise_energy(rows: np.ndarray, batch: int, n: int, kappa: np.ndarray) -> float:
    """E||S^T S (mean_B - mean)||^2 for a batch B of K = ``batch`` of a silo's n records drawn
    without replacement (clients/silo.py), whose per-record rows have per-coordinate
    variance s_j^2, estimated by the sample variance of ``rows`` [T, d] (the trust set's
    per-record rows, clipped as the silos clip): Var(mean_B)_j = (1 - K/n) s_j^2 / K
    (Cochran, sampling without replacement), lifted with kappa (app/sketch/noise.py):

        c_sampling = (1 - K/n) / K * sum_j kappa_j s_j^2.   K >= n (full batch): 0."""
    if batch >= n or len(rows) < 2:
        return 0.0
    var = np.var(np.asarray(rows, dtype=np.float64), axis=0, ddof=1)
    return float((1.0 - batch / n) / batch * (kappa @ var))


def block_shaped_sketch(sketch: SketchSettings, layout: list[tuple[int, ...]]) -> Any:
    """A sketch of the run's kind and blocks (None without one), for the lift's noise factors,
    which depend on the block sizes only, not on the seed or the round."""
    from app.sketch.base import make_sketch

    return None if sketch.kind == "none" else make_sketch(
        sketch.kind, layout, seed=0, round=1, layerwise=sketch.layerwise, ratio=sketch.ratio)


@dataclass(frozen=True)
class HonestNoise:
    """What the server can know of an honest silo's release noise, from public quantities only
    (the run's plan, never a reply): its ``algorithm`` and ``options``, the ``privacy`` settings,
    the bounds (smallest, largest) on a silo's record count (:func:`silo_record_bounds`) and the
    run's ``sketch``."""

    algorithm: Algorithm
    options: AlgorithmOptions
    privacy: PrivacySettings
    records: tuple[int, int]
    sketch: SketchSettings

    def batch(self, phase: Phase, n: int) -> int:
        """K of a ``phase`` release by a silo with n records, from the algorithm's release plan
        (SPIDER's anchor: K1 = ``spider.anchor-batch`` or n; SVRG's snapshot: n; else ``batch-size``)."""
        return self.algorithm.release(phase, self.options, n, self.privacy.clip, 1).batch

    def variance(self, phase: Phase | None = None) -> float:
        """The per-coordinate noise variance of an honest silo's ``phase`` message (default: the
        plan's first training phase) under ISRL-DP: sigma^2 with sigma = z * weight *
        sensitivity (Q sigma^2 for Q local steps' pseudo-gradient), z from the silo's own
        calibration (``ReleasePlan.calibrate``) for the silo with the most records (the smallest
        sigma of any honest silo: z and the sensitivity both shrink as n grows) and no private
        evaluations (they would only raise an honest silo's noise). 0 without privacy, or for a
        phase the plan does not hold (the conservative side: no allowance)."""
        if not self.privacy.enabled:
            return 0.0
        n = self.records[1]
        plan = ReleasePlan.of(self.algorithm, self.options, n, self.privacy.clip, self.privacy.epsilon,
                              self.privacy.delta_for(n))
        spec = plan.training(phase)
        if spec is None:
            return 0.0
        sigma = plan.calibrated(plan.calibrate())[spec.phase].sigma
        steps = self.options.local_steps if spec.phase == Phase.LOCAL else 1
        return steps * sigma**2

    def energy(self, layout: list[tuple[int, ...]], phase: Phase | None = None) -> float:
        """c_dp = E||S^T S xi||^2 of an honest ``phase`` message's noise xi (variance
        :meth:`variance` per coordinate) after the run's sketch and its lift (app/sketch/noise.py)."""
        var = self.variance(phase)
        if var == 0:
            return 0.0
        from app.sketch.noise import lift_noise_factor

        n = sum(int(np.prod(shape)) for shape in layout)
        return var * lift_noise_factor(block_shaped_sketch(self.sketch, layout), n)


def difference_rows(now: Any, prev: Any, clip: float, diff_clip: float, private: bool) -> Any:
    """Per-record difference rows [B, d] (torch) as an honest silo forms them (clients/silo.py
    ``RecordGradients.difference_rows``): clip_C(now - prev) with ``diff-clip`` C > 0 under privacy, else
    clip_L(now) - clip_L(prev) (unclipped without privacy)."""
    from app.privacy.clipping import clip_rows

    if private and diff_clip > 0:
        return clip_rows(now - prev, diff_clip)
    if not private:
        return now - prev
    return clip_rows(now, clip) - clip_rows(prev, clip)


def noise_aware_scores(g0: np.ndarray, updates: np.ndarray, smoothness: float, gamma: float,
                       noise_energy: float = 0.0) -> np.ndarray:
    """The scores before the clamp: s_i = <g0, u_i> - (L gamma / 2) max(||u_i||^2 - c, 0) (c = 0:
    the paper's); Grad-BANT's theta_i = [s_i]_+."""
    u = np.asarray(updates, dtype=np.float64)
    energy = (u * u).sum(axis=1)
    if noise_energy > 0:
        energy = np.maximum(energy - noise_energy, 0.0)
    return u @ np.asarray(g0, dtype=np.float64) - 0.5 * smoothness * gamma * energy


def expected_honest_score(g0: np.ndarray, rbar: np.ndarray, smoothness: float, gamma: float,
                          kappa: np.ndarray | None = None) -> float:
    """E[<g0, u> - (L gamma / 2)(||u||^2 - c)] of an honest message whose rows' mean is ``rbar``
    (see the module docstring): <g0, rbar> - (L gamma / 2) sum_j kappa_j rbar_j^2 (kappa = 1
    without a sketch; kappa the diagonal of E[(S^T S)^2], app/sketch/noise.py)."""
    r = np.asarray(rbar, dtype=np.float64)
    k = np.ones_like(r) if kappa is None else np.asarray(kappa, dtype=np.float64)
    return float(np.asarray(g0, dtype=np.float64) @ r - 0.5 * smoothness * gamma * (k @ (r * r)))
