"""The silo half of a privacy mechanism: what :class:`clients.silo.Silo` asks instead of
branching on ``privacy.mode``. Its server half is strategies/server_mechanism.py.

A silo half calibrates (the ledger's calibration key, the noise scale, the calibrated release
specs), prices an admitted instruction (the ledger rows it costs, or why it releases nothing),
and, once the silo has recorded those rows, answers from the records' clipped rows
(clients/silo_gradients.py). Two implement it: :class:`GaussianSiloMechanism` here (privacy.mode
isrl, and the non-private run) and ``ShuffleSiloMechanism`` (clients/silo_shuffle.py).

Gaussian releases (app/privacy/accounting.py):
* ``grad`` (MB-SGD): g = (1/K) sum_{i in B} clip_L(grad f0(w, x_i)) + N(0, sigma^2 I),
  |B| = K drawn without replacement, sigma = z * 2L/K.
* ``local`` (Local SGD): Q such noisy steps w <- w - eta_local * g on the silo's copy of w;
  the message is w_Q - w_0 (post-processing of Q releases).
* ``anchor``, ``disjoint``: like ``grad`` (``disjoint``: block r of the secret permutation).
* ``diff``: (1/K2) sum_{i in B} [difference row] + N(0, sigma^2 I) (RecordGradients.difference_rows).
With ``client-momentum`` beta > 0 the silo sends m_t = beta m_{t-1} + (1 - beta) g_t of its own
releases instead (app/algorithms/momentum.py; post-processing, kept in memory for the run).
The noised update (or m_t) is then sketched with the round's broadcast seed (post-processing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch
from flwr.app import RecordDict

from app import wire
from app.admission import Rejection
from app.algorithms import TRAINING_PHASES, Phase, ReleaseSpec
from app.algorithms.momentum import ReleaseMomentum
from app.privacy.accounting import Release
from app.privacy.envelope import StaticKeys
from app.privacy.mechanism import GaussianMechanism
from app.privacy.release_plan import ReleasePlan
from app.sketch.broadcast import build_sketch
from app.sketch.powersgd import PowerSGDState
from clients.silo_gradients import RecordGradients, ReleaseDraws, unflatten

Point = Mapping[str, torch.Tensor]


class SiloMechanism(Protocol):
    """The silo half of a mechanism (module docstring)."""

    #: the reply is sealed to the shuffler the instruction names: it carries nothing else (no
    #: folded evaluation) and is not kept for a replayed request
    sealed: bool
    #: what its instructions carry for it: "shuffle" (a ShuffleTicket), "secagg" (the exchange's
    #: parameters and shares) or "" (app/admission.py)
    ticket: str
    #: the key this silo seals its contributions with (None: it seals nothing)
    sender_keys: StaticKeys | None
    #: why this mechanism releases no private evaluation (None: it does, as a Gaussian release)
    evaluation_refusal: str | None
    #: whether its calibration composes a fixed release charged before training (standardize = "dp")
    composes_fixed: bool

    def calibration_key(self, key: dict[str, Any]) -> dict[str, Any]:
        """``key`` (the plan, n, epsilon, delta) with what else this mechanism's calibration depends on."""

    def scale(self, run_plan: ReleasePlan, before: list[Release]) -> float:
        """The one noise scale of a private run's plan (after the already charged ``before``)."""

    def specs(self, run_plan: ReleasePlan, scale: float) -> dict[str, ReleaseSpec]:
        """Each phase's calibrated release at ``scale``."""

    def releases(self, ins: wire.Instruction, spec: ReleaseSpec, disjoint_kind: str) -> list[Release] | Rejection:
        """The ledger rows the admitted instruction ``ins`` costs, or why it releases nothing.
        ``disjoint_kind``: the ledger kind of the silo's secret block permutation."""

    def ledger_extra(self, spec: ReleaseSpec) -> dict[str, Any] | None:
        """What the ledger rows of a ``spec`` release carry besides the accountant's fields."""

    def answer(self, ins: wire.Instruction, spec: ReleaseSpec, w0: Point, w_prev: Point | None, seq: int,
               spent: float, gradients: RecordGradients) -> RecordDict | Rejection:
        """The reply to ``ins``, whose rows the ledger recorded as release ``seq`` (epsilon
        ``spent`` after it), computed from ``gradients``; or a refusal."""

    def report(self, plan: Mapping[str, ReleaseSpec]) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        """For summary.json: (this mechanism's fields, the planned releases, the accountant)."""


class GaussianSiloMechanism:
    """The Gaussian mechanism's silo half (privacy.mode isrl; with ``private`` False the plain
    minibatch gradient, no clipping and no noise). ``n``: the silo's records; ``lr``: the run's
    step size (a local-steps instruction may send its own); ``draws``: the noise generators;
    ``momentum``: client-momentum beta (0: each release is sent as it is)."""

    sealed = False
    ticket = ""
    sender_keys: StaticKeys | None = None
    evaluation_refusal: str | None = None
    composes_fixed = True

    def __init__(self, private: bool, n: int, lr: float, draws: ReleaseDraws, momentum: float = 0.0) -> None:
        self.private = private
        self.n = n
        self.lr = lr
        self.draws = draws
        #: the momentum buffer over this silo's releases, kept for the run (in memory); None: beta = 0
        self.momentum = ReleaseMomentum(momentum) if momentum > 0 else None
        #: PowerSGD's state, kept across this silo's rounds (in memory)
        self.powersgd_state: PowerSGDState | None = None

    def calibration_key(self, key: dict[str, Any]) -> dict[str, Any]:
        return key

    def scale(self, run_plan: ReleasePlan, before: list[Release]) -> float:
        """z from the analytic/RDP accountant, with the pre-processing release, if any, composed in before training."""
        return run_plan.calibrate(before)

    def specs(self, run_plan: ReleasePlan, scale: float) -> dict[str, ReleaseSpec]:
        return run_plan.calibrated(scale)

    def releases(self, ins: wire.Instruction, spec: ReleaseSpec, disjoint_kind: str) -> list[Release] | Rejection:
        """Algorithm 6's round r uses block r of the secret permutation, once; Q local steps are
        Q releases of the same batch size (what PrivateSilo's policy mod prices before the handler runs)."""
        if ins.phase == Phase.DISJOINT:
            blocks = self.n // spec.batch
            if not 1 <= ins.round <= blocks:
                return Rejection(wire.REFUSED_BUDGET, f"round {ins.round} has no block of K={spec.batch} records "
                                 f"left: the n={self.n} records hold {blocks} disjoint blocks (rounds 1..{blocks})")
            return [Release(disjoint_kind, self.n, spec.batch, spec.noise_multiplier, 1, disjoint=True)]
        steps = (ins.local_steps or 1) if ins.phase == Phase.LOCAL else 1
        return [Release(ins.phase, self.n, spec.batch, spec.noise_multiplier, steps)]

    def ledger_extra(self, spec: ReleaseSpec) -> dict[str, Any] | None:
        return None

    def answer(self, ins: wire.Instruction, spec: ReleaseSpec, w0: Point, w_prev: Point | None, seq: int,
               spent: float, gradients: RecordGradients) -> RecordDict | Rejection:
        """Compute, privatise and sketch one training release (clip -> mechanism -> sketch)."""
        phase = ins.phase
        if phase in (Phase.GRAD, Phase.ANCHOR):
            update, loss = self.noisy_gradient(gradients, w0, spec, seq, 0)
        elif phase == Phase.DISJOINT:
            update, loss = self.noisy_gradient(gradients, w0, spec, seq, 0, batch=gradients.block(spec.batch, ins.round))
        elif phase == Phase.DIFF:
            assert w_prev is not None
            update, loss = self.noisy_difference(gradients, w0, w_prev, spec, seq)
        else:
            steps = ins.local_steps or 1
            lr = ins.lr if ins.lr is not None else self.lr
            w = dict(w0)
            loss = 0.0
            for q in range(steps):
                g, step_loss = self.noisy_gradient(gradients, w, spec, seq, q)
                loss += step_loss / steps
                w = {k: w[k] - lr * g[k] for k in w}
            update = {k: w[k] - w0[k] for k in w}
        if self.momentum is not None:  # m_t of the releases so far, before the sketch (post-processing)
            update = self.momentum(update)
        layout = [tuple(v.shape) for v in w0.values()]
        if ins.sketch is not None and ins.sketch.kind == "powersgd" and self.powersgd_state is None:
            self.powersgd_state = PowerSGDState(layout)
        sketch = build_sketch(ins.sketch, layout, self.powersgd_state)
        reply_arrays = {k: v.detach().cpu().numpy() for k, v in update.items()}
        if sketch is not None:  # post-processing of the noised update: privacy unchanged
            flat = torch.cat([update[k].reshape(-1) for k in update]).detach().cpu()
            reply_arrays = {wire.SKETCH: sketch.compress(flat).numpy()}
        if not all(np.all(np.isfinite(a)) for a in reply_arrays.values()):
            # post-processing of the (finite) noisy release with the server's own numbers (its
            # model, its step size): saying so reveals nothing more about the records
            return Rejection(wire.REFUSED_NON_FINITE, "the update computed from the model and step size sent is not "
                             "finite (values beyond float32 range); the release was recorded")
        # a loss computed on private records is itself a release: only without privacy
        return wire.TrainReply(reply_arrays, spent, None if self.private else loss).encode()

    def noisy_gradient(self, gradients: RecordGradients, w: Point, spec: ReleaseSpec, seq: int, step: int,
                       batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], float]:
        """One release (ledger sequence number ``seq``, local step ``step``): clipped mean of K
        per-sample gradients plus N(0, sigma^2 I), on K records drawn without replacement (or on
        the given ``batch``)."""
        x, y = batch if batch is not None else gradients.batch(spec.batch, seq, step)
        if not self.private:  # no clipping, no noise: the plain minibatch gradient (no per-sample pass)
            return unflatten(gradients.mean_gradient(w, x, y), w), gradients.loss(w, x, y)
        rows = gradients.clipped_rows(w, x, y)
        noisy = GaussianMechanism(spec.sigma).release(rows, self.draws.torch_gen(seq, "noise", step))
        return unflatten(noisy, w), float("nan")

    def noisy_difference(self, gradients: RecordGradients, w: Point, w_prev: Point, spec: ReleaseSpec,
                         seq: int) -> tuple[dict[str, torch.Tensor], float]:
        """One SPIDER difference release on one batch of K2 records (module docstring)."""
        x, y = gradients.batch(spec.batch, seq, 0)
        rows = gradients.difference_rows(w, w_prev, x, y)
        if not self.private:
            return unflatten(rows.mean(dim=0), w), gradients.loss(w, x, y)
        noisy = GaussianMechanism(spec.sigma).release(rows, self.draws.torch_gen(seq, "noise", 0))
        return unflatten(noisy, w), float("nan")

    def report(self, plan: Mapping[str, ReleaseSpec]) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        return ({"sigma": next(r.sigma for r in plan.values() if r.phase in TRAINING_PHASES)},
                [{"phase": r.phase, "batch": r.batch, "count": r.count, "sensitivity": r.sensitivity,
                  "noise_multiplier": r.noise_multiplier, "sigma": r.sigma, "disjoint": r.disjoint}
                 for r in plan.values()],
                "dp-accounting (analytic Gaussian if unsampled, else RDP)")
