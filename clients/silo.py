"""The honest silo: ISRL-DP gradient releases computed and noised on the silo's own side.

A silo never trusts the server with privacy: it calibrates its noise multiplier for its own
(epsilon, delta), its own n and K and the number of releases it plans, records each release in
its own ledger before answering, and refuses a request that would exceed its budget.

Releases (one Gaussian mechanism each, see app/privacy/accounting.py):
* ``grad`` (MB-SGD): g = (1/K) sum_{i in B} clip_L(grad f0(w, x_i)) + N(0, sigma^2 I),
  |B| = K drawn without replacement, sigma = z * 2L/K.
* ``local`` (Local SGD): Q such noisy steps w <- w - eta_local * g on the silo's copy of w;
  the message is w_Q - w_0 (post-processing of Q releases).
* ``anchor`` (FedProx-SPIDER every q-th round, K1 records; FedProx-SVRG's snapshot gradient,
  K1 = n, every Q + 1 rounds): like ``grad``.
* ``diff`` (the other rounds): (1/K2) sum_{i in B} [clip_L grad f0(w, x_i) - clip_L grad f0(w', x_i)]
  + N(0, sigma^2 I) on one batch of K2 records, w' = w_{r-1} (SPIDER) or the snapshot (SVRG); replace-one
  sensitivity 4L/K2 (the paper's branch for unknown smoothness beta), or, with
  ``diff-clip`` C > 0, each per-record difference clipped to C: sensitivity 2C/K2.
* ``eval`` (node config ``evaluation="private"`` only): noisy error counts and clipped loss
  sums of the current model (app/privacy/evaluation.py), one unsampled Gaussian release.

What the server sends is never trusted: rows are clipped so that any model, even one crafted to
overflow a record's gradient, gives a release of the stated sensitivity (app/privacy/clipping.py);
each release is written to the ledger before it is computed, and its noise and batch are keyed
to the ledger's sequence number for it, never to the round number the server sends, so a
release's randomness never repeats (with ``noise-seed="os"`` it comes from the OS CSPRNG).

The Silo's methods by job: its gradients (clients/silo_gradients.py), its shuffle-DP release
(clients/silo_shuffle.py) and its evaluation (clients/silo_evaluation.py) are mixins of
:class:`Silo`; calibration, admission, the ledger and the training release are here.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import replace
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict
from flwr.common import log

from app import wire
from app.refusal import PublicError
from app.admission import Rejection, check_instruction, silo_terms
from app.algorithms import TRAINING_PHASES, Phase, ReleaseSpec, get_algorithm, planned_evaluations
from app.config import Settings
from app.data.federated import SiloData, apply_dp_stats
from app.models import build_model
from app.privacy import silo_sampling
from app.privacy.accounting import Release, calibrate_trial_scale, group_releases, trials_for
from app.privacy.amplification_choice import resolve_amplification
from app.privacy.envelope import StaticKeys
from app.privacy.ledger import BudgetExceededError, PrivacyLedger
from app.privacy.preprocessing import preprocess_plan
from app.privacy.release_plan import ReleasePlan
from app.privacy.shuffle import trials_per_record
from app.seeding import derive_seed
from app.sketch.broadcast import build_sketch
from app.sketch.powersgd import PowerSGDState
from clients.silo_evaluation import SiloEvaluation
from clients.silo_gradients import SiloGradients
from clients.silo_shuffle import SiloShuffle, shuffle_trust

#: the bound a sampled binomial release is accounted with under shuffle.amplification = "sampling"
AMPLIFIED_BOUND = ("Theorem 9 form of Wang, Balle & Kasiviswanathan 2019 for the truncated ideal-vs-real pair, "
                   "eps(inf) = inf branch (app/privacy/amplification.py)")


#: how many released replies each silo keeps (in memory, per ledger) to answer a replayed request
REPLAY_DEPTH = 2
#: ledger path -> {request digest: the reply released for it}, most recent last. Module level, so
#: a resumed run (a new Flower run id, the same ledger-run-key) still finds them in a warm
#: process (the silo service, a simulation's actors).
_REPLAYS: dict[str, dict[str, RecordDict]] = {}


def request_digest(ins: wire.Instruction, context: str) -> str:
    """SHA-256 of everything an instruction asks (round, phase, points, sketch, local steps, step
    size) and of ``context`` (the ledger and the calibration it is answered under)."""
    h = hashlib.sha256(context.encode())
    h.update(repr((ins.round, str(ins.phase), ins.sketch, ins.local_steps, ins.lr, ins.evaluate_round,
                   ins.train_gradient)).encode())
    for point in (ins.arrays, ins.prev):
        for key in sorted(point or {}):
            arr = np.ascontiguousarray(point[key])
            h.update(f"{key}:{arr.dtype.str}:{arr.shape}".encode())
            h.update(memoryview(arr).cast("B"))
        h.update(b"|")
    return h.hexdigest()


class Silo(SiloEvaluation, SiloShuffle, SiloGradients):
    """One silo's state: data, model template, ledger and noise calibration."""

    def __init__(self, settings: Settings, data: SiloData, num_classes: int, feature_shape: tuple[int, ...],
                 state_dir: str | Path, ledger_key: str, policy_violation: str | None = None,
                 ledger_budget: tuple[float, float] | None = None, evaluation: str = "open",
                 evaluation_noise_ratio: float = 1.0, run_id: int = 0, shuffler_pin: str | None = None,
                 ledger_mark_dir: str | Path | None = None, model: torch.nn.Module | None = None,
                 trust_silo_sampling: bool = False, ledger_key_file: str | Path | None = None,
                 ledger_witness_dir: str | Path | None = None) -> None:
        """``ledger_budget`` (epsilon, delta): the ledger's lifetime budget when it spans several
        runs (node scope); each run still calibrates its noise for the run's own epsilon, and the
        ledger refuses whatever would take the total past the lifetime budget. ``evaluation``:
        the node's evaluation policy (open | private | off, app/privacy/policy.py). ``run_id`` and
        ``shuffler_pin`` (shuffle mode): the run the contributions are bound to, and the shuffler
        public key (hex) the node's operator pinned; a silo with a pin seals to no other key.
        ``ledger_mark_dir``: where the ledger's high-water mark lives (node config
        ``ledger-mark-dir``; None: ``ledger-marks`` in ``state_dir``). ``model``: the silo's own
        torch module (clients/private_silo.py); None: the run config's model from the zoo.
        ``trust_silo_sampling``: node config shuffle-trust-silo-sampling (app/privacy/silo_sampling.py).
        ``ledger_key_file``, ``ledger_witness_dir``: node config ledger-key-file (None:
        ``ledger.key`` in ``state_dir``) and ledger-witness-dir (app/privacy/ledger_witness.py)."""
        # shuffle.amplification = auto resolved once, for this silo (app/privacy/amplification_choice.py)
        amplification, self.amplification_why = resolve_amplification(
            settings.shuffle.amplification, settings.privacy.noise_seed,
            settings.shuffle.count_on or settings.silos_per_round)
        settings = replace(settings, shuffle=replace(settings.shuffle, amplification=amplification))
        self.s = settings
        self.trust_silo_sampling = bool(trust_silo_sampling)
        self.run_id = int(run_id)
        self.shuffler_pin = shuffler_pin
        self.policy_violation = policy_violation
        self.evaluation = evaluation
        self.evaluation_noise_ratio = evaluation_noise_ratio
        self.data = data
        self.device = torch.device(_pick_device(settings.device))
        if model is None:
            model = build_model(settings.model, feature_shape, num_classes, hidden=settings.model_hidden,
                                kwargs=settings.model_kwargs)
        self.model = model.to(self.device)
        self.train_x = data.train_x.to(self.device)
        self.train_y = data.train_y.to(self.device)
        self.test_x = data.test_x.to(self.device)
        self.test_y = data.test_y.to(self.device)
        self.val_x = None if data.val_x is None else data.val_x.to(self.device)
        self.val_y = None if data.val_y is None else data.val_y.to(self.device)
        self.n = data.n
        priv = settings.privacy
        self.private = priv.enabled
        self.clip = priv.clip if self.private else math.inf
        self.run_epsilon = priv.epsilon if self.private else math.inf
        lifetime_eps, self.delta = ledger_budget or (self.run_epsilon, settings.delta_for(self.n))
        path = Path(state_dir) / f"ledger-{ledger_key}-silo{data.index}.json"
        self.ledger = PrivacyLedger.open(path, lifetime_eps, self.delta, mark_dir=ledger_mark_dir,
                                         key_file=ledger_key_file, witness_dir=ledger_witness_dir)
        self.shuffle = self.private and priv.mode == "shuffle"
        self.dim = sum(p.numel() for p in self.model.parameters())
        self.levels = settings.shuffle.levels_for(self.dim) if self.shuffle else 0
        self.sender_keys = (StaticKeys.load_or_create(Path(state_dir) / f"shuffle-sender-silo{data.index}.key")
                            if self.shuffle else None)
        self.plan = self._calibrate()
        if data.dp_stats is not None:  # standardize = "dp": charged above, computed now, on the silo's own records
            self.data = apply_dp_stats(data, self.preprocess_z, self.preprocess_seed)
            self.train_x, self.test_x = self.data.train_x.to(self.device), self.data.test_x.to(self.device)
            self.val_x = None if self.data.val_x is None else self.data.val_x.to(self.device)
        self.powersgd_state: PowerSGDState | None = None

    def _data_digest(self) -> str:
        """SHA-256 of the training records (once): a replayed reply is only ever one computed
        from these very records."""
        if getattr(self, "_data_sha", None) is None:
            h = hashlib.sha256()
            for t in (self.data.train_x, self.data.train_y):
                arr = np.ascontiguousarray(t.detach().cpu().numpy())
                h.update(f"{arr.dtype.str}:{arr.shape}".encode())
                h.update(memoryview(arr).cast("B"))
            self._data_sha = h.hexdigest()
        return self._data_sha

    # -- calibration ----------------------------------------------------------------------
    def _calibrate(self) -> dict[str, ReleaseSpec]:
        """One noise scale for every planned release, the smallest that keeps all planned
        releases within the run's (epsilon, delta). The split rule: each kind's noise multiplier
        is scale * weight (weight 1 for differences, ``privacy.anchor-noise-ratio`` for full
        gradients), so with the default ratio 1 every kind has the same z and sigma proportional
        to its sensitivity. Proxsgd's secret block permutation is drawn here and stored with the
        calibration, so every process serving this silo uses the same disjoint blocks."""
        private_eval = self.evaluation == "private" and self.private and not self.shuffle
        evaluations = planned_evaluations(self.s.eval_every, self.s.num_rounds, self.s.output) if private_eval else 0
        run_plan = ReleasePlan.of(get_algorithm(self.s.algorithm), self.s.algorithm_options(), self.n, self.clip,
                                  self.run_epsilon, self.delta, evaluations, self.evaluation_noise_ratio)
        plan = run_plan.releases
        key = {"plan": [[r.phase, r.batch, r.count, r.weight, r.disjoint] for r in plan], "n": self.n,
               "epsilon": str(self.run_epsilon), "delta": self.delta}
        pre_fixed = self._preprocess_plan(key)
        if self.shuffle:
            key |= {"mode": "shuffle", "levels": self.levels, "p": self.s.shuffle.p, "dim": self.dim}
            if self.s.shuffle.amplification != "none":
                key["amplification"] = self.s.shuffle.amplification
        cal = self.ledger.calibration
        if cal.get("key") == key:  # a restarted silo keeps the noise (and blocks) it started with
            scale = float(cal["noise_multiplier"])
            self.block_seed = int(cal.get("block_seed", 0))
            self.preprocess_seed = int(cal.get("preprocess_seed", 0))
        else:
            if not self.private:
                scale = 0.0
            elif self.shuffle:  # the exchange's noise trials, from the exact binomial accountant
                log(INFO, "silo %d: calibrating shuffle-DP noise (g=%d levels, d=%d, p=%g) with the exact binomial "
                    "accountant (seconds for small models; it grows with g * sqrt(trials)); record-level "
                    "amplification: %s", self.data.index, self.levels, self.dim, self.s.shuffle.p,
                    self.amplification_why)
                scale = calibrate_trial_scale(run_plan.planned(), self.run_epsilon, self.delta, p=self.s.shuffle.p,
                                         levels=self.levels, dim=self.dim, amplification=self.s.shuffle.amplification)
            else:  # with the pre-processing release, if any, composed in before training
                scale = run_plan.calibrate(pre_fixed)
            self.block_seed = (secrets.randbits(63) if self.s.privacy.noise_seed == "os"
                               else derive_seed(self.s.seed, "silo", self.data.index, "disjoint-blocks"))
            calibration = {"key": key, "noise_multiplier": scale, "block_seed": self.block_seed}
            if "preprocess" in key:  # charged before anything is computed from the records
                self.preprocess_seed = (secrets.randbits(63) if self.s.privacy.noise_seed == "os"
                                        else derive_seed(self.s.seed, "silo", self.data.index, "preprocess"))
                if pre_fixed:
                    try:
                        self.ledger.record(pre_fixed, round_=0)
                    except BudgetExceededError as exc:
                        raise BudgetExceededError(f"the pre-processing release (standardize = 'dp') was refused: "
                                                  f"{exc}") from None
                calibration["preprocess_seed"] = self.preprocess_seed
            self.ledger.set_calibration(calibration)
        self.disjoint_kind = f"disjoint:{hashlib.sha256(str(self.block_seed).encode()).hexdigest()[:12]}"
        if self.shuffle:
            return {r.phase: replace(r, trials=trials_for(int(scale), r.weight)) for r in plan}
        return run_plan.calibrated(scale)

    def _preprocess_plan(self, key: dict[str, Any]) -> list[Release]:
        """standardize = "dp": its release's rows, its multiplier in ``key`` (app/privacy/preprocessing.py)."""
        self.preprocess_z, self.preprocess_seed, rows = preprocess_plan(
            self.data.dp_stats, self.n, self.private, self.shuffle, self.run_epsilon, self.delta, key)
        self.preprocess_rows = rows  # planned too (ledger_report), not only released
        return rows

    # -- messages -------------------------------------------------------------------------
    def train(self, content: RecordDict) -> RecordDict:
        """Answer a training instruction with an update, or a refusal. Everything in the
        instruction is checked before the release is recorded; the release is recorded (and its
        sequence number reserved) before anything is computed from the silo's records. The
        pipeline is clip -> mechanism -> sketch."""
        if self.policy_violation:
            return self._refuse(wire.REFUSED_POLICY, self.policy_violation)
        ins = check_instruction(content, silo_terms(self))  # every field, before anything is recorded
        if isinstance(ins, Rejection):
            return self._refuse(ins.code, ins.reason)
        phase, rnd = ins.phase, ins.round
        spec = self.plan[phase]  # admitted: a phase this silo serves, local-steps as calibrated, diff with prev
        steps = (ins.local_steps or 1) if phase == Phase.LOCAL else 1
        lr = ins.lr if phase == Phase.LOCAL and ins.lr is not None else self.s.lr
        w0 = self._tensors(ins.arrays)
        w_prev = self._tensors(ins.prev) if phase == Phase.DIFF else None
        if self.shuffle:
            return self._shuffle_release(ins, spec, w0, w_prev)
        # a request this silo already answered (a server resumed from its checkpoint replays the
        # round it lost) gets the same reply again: a copy of a release is no new release, so it
        # is not recorded or charged again, and the resumed run goes on as if never interrupted
        digest = request_digest(ins, f"{self.ledger.path}|{spec}|{self._data_digest()}")
        replayed = _REPLAYS.get(str(self.ledger.path), {}).get(digest)
        if replayed is not None:
            log(INFO, "silo %d: round %d (%s) was already answered; the same reply again, nothing new released",
                self.data.index, rnd, phase)
            return replayed
        # an evaluation folded into the instruction (the model it carries, the previous round's
        # result) is answered first, under the evaluation policy, as a separate request would be
        folded = ins.evaluation()
        evaluation = None if folded is None else self._answer_evaluation(folded)
        reply = self._release(ins, spec, w0, w_prev, steps, lr)
        if evaluation is not None:
            reply = wire.with_evaluation(reply, evaluation)
        if wire.refusal_of(reply) is None:  # only a release is kept for replays
            kept = _REPLAYS.setdefault(str(self.ledger.path), {})
            kept[digest] = reply
            while len(kept) > REPLAY_DEPTH:
                del kept[next(iter(kept))]
        return reply

    def gaussian_releases(self, ins: wire.Instruction) -> list[Release] | str:
        """The ledger rows the admitted instruction ``ins`` costs under the Gaussian mechanism
        (what :meth:`_release` records, and what PrivateSilo's policy mod prices before the
        handler runs), or why the plan holds none: Algorithm 6's round r uses block r of the
        secret permutation, once; Q local steps are Q releases of the same batch size."""
        spec = self.plan[ins.phase]
        if ins.phase == Phase.DISJOINT:
            blocks = self.n // spec.batch
            if not 1 <= ins.round <= blocks:
                return (f"round {ins.round} has no block of K={spec.batch} records left: the n={self.n} records hold "
                        f"{blocks} disjoint blocks (rounds 1..{blocks})")
            return [Release(self.disjoint_kind, self.n, spec.batch, spec.noise_multiplier, 1, disjoint=True)]
        steps = (ins.local_steps or 1) if ins.phase == Phase.LOCAL else 1
        return [Release(ins.phase, self.n, spec.batch, spec.noise_multiplier, steps)]

    def _release(self, ins: wire.Instruction, spec: ReleaseSpec, w0: dict[str, torch.Tensor],
                 w_prev: dict[str, torch.Tensor] | None, steps: int, lr: float) -> RecordDict:
        """Record, compute, privatise and sketch one training release (or refuse)."""
        phase, rnd = ins.phase, ins.round
        releases = self.gaussian_releases(ins)
        if isinstance(releases, str):
            return self._refuse(wire.REFUSED_BUDGET, releases)
        try:
            spent, seq = self.ledger.record_release(releases, round_=rnd, exclusive=phase == Phase.DISJOINT)
        except BudgetExceededError as exc:
            return self._refuse(wire.REFUSED_BUDGET, str(exc))

        if phase in (Phase.GRAD, Phase.ANCHOR):
            update, loss = self._noisy_gradient(w0, spec, seq, 0)
        elif phase == Phase.DISJOINT:
            update, loss = self._noisy_gradient(w0, spec, seq, 0, batch=self._block(spec.batch, rnd))
        elif phase == Phase.DIFF:
            assert w_prev is not None
            update, loss = self._noisy_difference(w0, w_prev, spec, seq)
        else:
            w = dict(w0)
            loss = 0.0
            for q in range(steps):
                g, step_loss = self._noisy_gradient(w, spec, seq, q)
                loss += step_loss / steps
                w = {k: w[k] - lr * g[k] for k in w}
            update = {k: w[k] - w0[k] for k in w}
        layout = [tuple(v.shape) for v in w0.values()]
        if ins.sketch is not None and ins.sketch.kind == "powersgd" and self.powersgd_state is None:
            self.powersgd_state = PowerSGDState(layout)  # kept across this silo's rounds (in memory)
        sketch = build_sketch(ins.sketch, layout, self.powersgd_state)
        reply_arrays = {k: v.detach().cpu().numpy() for k, v in update.items()}
        if sketch is not None:  # post-processing of the noised update: privacy unchanged
            flat = torch.cat([update[k].reshape(-1) for k in update]).detach().cpu()
            reply_arrays = {wire.SKETCH: sketch.compress(flat).numpy()}
        if not all(np.all(np.isfinite(a)) for a in reply_arrays.values()):
            # post-processing of the (finite) noisy release with the server's own numbers (its
            # model, its step size): saying so reveals nothing more about the records
            return self._refuse(wire.REFUSED_NON_FINITE, "the update computed from the model and step size sent is not "
                                "finite (values beyond float32 range); the release was recorded")
        # a loss computed on private records is itself a release: only without privacy
        return wire.TrainReply(reply_arrays, spent, None if self.private else loss).encode()

    def ledger_report(self) -> dict[str, Any]:
        """What anyone needs to recompute this silo's epsilon: n, K, delta, budget and every
        kind of release with its count, noise multiplier and sampling scheme."""
        releases = [
            {"kind": r.kind, "count": r.count, "noise_multiplier": r.noise_multiplier, "n": r.n, "batch": r.batch,
             "sampling": ("disjoint blocks (parallel composition)" if r.disjoint else
                          "none claimed (binomial: accounted as if the record were included)"
                          if r.binomial and r.sampled and r.gamma == 1.0 else
                          f"fixed-size without replacement, amplified at gamma = K/n = {r.gamma:.6g} ({AMPLIFIED_BOUND})"
                          if r.binomial and r.sampled
                          else "fixed-size without replacement" if r.sampled else "none (full batch)")}
            | ({"mechanism": "binomial", "trials": r.trials, "levels": r.levels, "p": r.p, "dim": r.dim}
               | ({"amplification": r.amplification} if r.amplification != "none" else {})
               | ({"silo_sampling": r.silo_sampling} if r.silo_sampling < 1 else {})
               if r.binomial else {})
            for r in group_releases(self.ledger.recorded())
        ]
        if self.shuffle:
            count_on = self.s.shuffle.count_on or self.s.silos_per_round
            return {
                "silo": self.data.index, "n": self.n, "batch": self.s.batch_for(self.n), "delta": self.delta,
                "eps_budget": self.ledger.epsilon_budget, "eps_spent": self.ledger.spent(), "clip": self.clip,
                "mechanism": "binomial (shuffle DP)", "evaluation": self.evaluation,
                "shuffle": {"levels": self.levels, "p": self.s.shuffle.p, "dim": self.dim, "count_on": count_on,
                            "headroom": self.s.shuffle.headroom,
                            "record_amplification": (f"sampling: {AMPLIFIED_BOUND}"
                                                     if self.s.shuffle.amplification == "sampling" else "none"),
                            "record_amplification_why": self.amplification_why,
                            "amplification": "none: the server knows which silos it sampled, so no amplification by "
                                             "the server's silo sampling is claimed (the shuffler's: silo_sampling)",
                            "silo_sampling": self._silo_sampling_report(count_on),
                            "trust": shuffle_trust(count_on, self.s.num_silos)},
                "planned": [{"phase": r.phase, "batch": r.batch, "count": r.count, "disjoint": r.disjoint,
                             "trials": r.trials,
                             "trials_per_record": trials_per_record(r.trials, count_on, r.batch, self.s.shuffle.headroom),
                             "messages": count_on * r.batch} for r in self.plan.values()],
                "releases": releases,
                "adjacency": "replace-one",
                "accountant": "exact binomial RDP with truncated tails (app/privacy/binomial.py), composed in RDP",
            }
        return {
            "silo": self.data.index, "n": self.n, "batch": self.s.batch_for(self.n), "delta": self.delta,
            "eps_budget": self.ledger.epsilon_budget, "eps_spent": self.ledger.spent(), "clip": self.clip,
            "sigma": next(r.sigma for r in self.plan.values() if r.phase in TRAINING_PHASES),
            "evaluation": self.evaluation,
            # the training releases, then the pre-processing release (standardize = "dp"; charged
            # before training) as "releases" shows it: z per mechanism, no sampling
            "planned": [{"phase": r.phase, "batch": r.batch, "count": r.count, "sensitivity": r.sensitivity,
                         "noise_multiplier": r.noise_multiplier, "sigma": r.sigma, "disjoint": r.disjoint}
                        for r in self.plan.values()]
                       + [{"phase": r.kind, "batch": r.batch, "count": r.count, "noise_multiplier": r.noise_multiplier,
                           "disjoint": r.disjoint} for r in getattr(self, "preprocess_rows", [])],
            "releases": releases,
            "adjacency": "replace-one", "accountant": "dp-accounting (analytic Gaussian if unsampled, else RDP)",
        }

    def _refuse(self, code: str, reason: str) -> RecordDict:
        return wire.Refusal(code, reason, self.ledger.spent()).encode()


class RefusingSilo:
    """A silo whose ledger cannot be used (unreadable, or written for another budget): without a
    trustworthy record of what it has spent it releases nothing and says why, to every request."""

    def __init__(self, index: int, reason: str, code: str = wire.REFUSED_LEDGER) -> None:
        self.index = index
        self.reason = reason
        self.code = code  # REFUSED_CONFIG: its records do not fit the run (it holds no ledger either)

    def train(self, content: RecordDict) -> RecordDict:
        return wire.Refusal(self.code, self.reason, math.nan).encode()

    evaluate = train

    def ledger_report(self) -> dict[str, Any]:
        return {"silo": self.index, "error": self.reason}


def witnessed_answer(silo: Silo | RefusingSilo, method: str, content: RecordDict) -> RecordDict:
    """``silo``'s ``method`` (train or evaluate) answer to ``content``, checked first against the
    ledger witnesses the request carries (the server's copies, app/privacy/ledger_witness.py):
    LedgerError, before anything is recorded, when one is ahead of the ledger (a restored or
    wiped state dir). The answer carries the ledger's own witness as it is after it."""
    ledger = getattr(silo, "ledger", None)
    if ledger is None:  # a RefusingSilo: no ledger
        return getattr(silo, method)(content)
    ledger.check_witnesses(wire.witnesses_of(content))
    reply = getattr(silo, method)(content)
    return wire.with_witnesses(reply, [ledger.check_witnesses([])])


def _pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PublicError("device = 'cuda' but no CUDA device is available on this node")
    return device
