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
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Mapping
from dataclasses import replace
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict
from flwr.common import log

from app import wire
from app.admission import Rejection, check_evaluate_request, check_instruction, silo_terms
from app.config import Settings
from app.data.federated import SiloData
from app.data.split import fixed_size_batch
from app.models import build_model
from app.privacy.accounting import (PlannedRelease, Release, calibrate_noise_multiplier, calibrate_trial_scale,
                                    group_releases, trials_for)
from app.privacy.amplification_choice import resolve_amplification
from app.privacy.contribution import Contribution
from app.privacy.envelope import StaticKeys, parse_public_key, seal
from app.privacy.shuffle import ShuffleCode, row_bound, trials_per_record
from app.privacy import silo_sampling

#: the bound a sampled binomial release is accounted with under shuffle.amplification = "sampling"
AMPLIFIED_BOUND = ("Theorem 9 form of Wang, Balle & Kasiviswanathan 2019 for the truncated ideal-vs-real pair, "
                   "eps(inf) = inf branch (app/privacy/amplification.py)")
from app.algorithms import TRAINING_PHASES, Phase, ReleaseSpec, get_algorithm, planned_evaluations, release_plan
from app.privacy.clipping import clip_rows
from app.privacy.evaluation import clipped_loss_sum, noisy_statistics
from app.privacy.ledger import BudgetExceededError, PrivacyLedger
from app.privacy.policy import collusion_threshold
from app.data.federated import apply_dp_stats
from app.privacy.preprocessing import calibrate_after, preprocess_plan
from app.privacy.mechanism import BinomialShuffleMechanism, make_mechanism
from app.models.losses import cross_entropy
from app.privacy.per_sample import batch_loss, per_sample_grads
from app.seeding import derive_seed, np_rng, torch_gen
from app.sketch.broadcast import build_sketch
from app.sketch.powersgd import PowerSGDState

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


class Silo:
    """One silo's state: data, model template, ledger and noise calibration."""

    def __init__(self, settings: Settings, data: SiloData, num_classes: int, feature_shape: tuple[int, ...],
                 state_dir: str | Path, ledger_key: str, policy_violation: str | None = None,
                 ledger_budget: tuple[float, float] | None = None, evaluation: str = "open",
                 evaluation_noise_ratio: float = 1.0, run_id: int = 0, shuffler_pin: str | None = None,
                 ledger_mark_dir: str | Path | None = None, model: torch.nn.Module | None = None,
                 trust_silo_sampling: bool = False) -> None:
        """``ledger_budget`` (epsilon, delta): the ledger's lifetime budget when it spans several
        runs (node scope); each run still calibrates its noise for the run's own epsilon, and the
        ledger refuses whatever would take the total past the lifetime budget. ``evaluation``:
        the node's evaluation policy (open | private | off, app/privacy/policy.py). ``run_id`` and
        ``shuffler_pin`` (shuffle mode): the run the contributions are bound to, and the shuffler
        public key (hex) the node's operator pinned; a silo with a pin seals to no other key.
        ``ledger_mark_dir``: where the ledger's high-water mark lives (node config
        ``ledger-mark-dir``; None: ``ledger-marks`` in ``state_dir``). ``model``: the silo's own
        torch module (clients/private_silo.py); None: the run config's model from the zoo.
        ``trust_silo_sampling``: node config shuffle-trust-silo-sampling (app/privacy/silo_sampling.py)."""
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
        self.ledger = PrivacyLedger.open(path, lifetime_eps, self.delta, mark_dir=ledger_mark_dir)
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
        evaluations = planned_evaluations(self.s) if private_eval else 0
        plan = release_plan(get_algorithm(self.s.algorithm), self.s, self.n, self.clip, evaluations,
                            self.evaluation_noise_ratio)
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
            planned = [PlannedRelease(r.phase, self.n, r.batch, r.count, r.weight, r.disjoint) for r in plan]
            if not self.private:
                scale = 0.0
            elif self.shuffle:  # the exchange's noise trials, from the exact binomial accountant
                log(INFO, "silo %d: calibrating shuffle-DP noise (g=%d levels, d=%d, p=%g) with the exact binomial "
                    "accountant (seconds for small models; it grows with g * sqrt(trials)); record-level "
                    "amplification: %s", self.data.index, self.levels, self.dim, self.s.shuffle.p,
                    self.amplification_why)
                scale = calibrate_trial_scale(planned, self.run_epsilon, self.delta, p=self.s.shuffle.p,
                                         levels=self.levels, dim=self.dim, amplification=self.s.shuffle.amplification)
            elif pre_fixed:  # training calibrated with the pre-processing release composed in
                scale = calibrate_after(pre_fixed, planned, self.run_epsilon, self.delta)
            else:
                scale = calibrate_noise_multiplier(
                    [PlannedRelease(r.phase, self.n, r.batch, r.count, r.weight, r.disjoint) for r in plan],
                    self.run_epsilon, self.delta)
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
                        raise ValueError(f"the pre-processing release (standardize = 'dp') was refused: {exc}") from None
                calibration["preprocess_seed"] = self.preprocess_seed
            self.ledger.set_calibration(calibration)
        self.disjoint_kind = f"disjoint:{hashlib.sha256(str(self.block_seed).encode()).hexdigest()[:12]}"
        if self.shuffle:
            return {r.phase: replace(r, trials=trials_for(int(scale), r.weight)) for r in plan}
        return {r.phase: replace(r, noise_multiplier=scale * r.weight) for r in plan}

    def _preprocess_plan(self, key: dict[str, Any]) -> list[Release]:
        """standardize = "dp": its release's rows, its multiplier in ``key`` (app/privacy/preprocessing.py)."""
        self.preprocess_z, self.preprocess_seed, rows = preprocess_plan(
            self.data.dp_stats, self.n, self.private, self.shuffle, self.run_epsilon, self.delta, key)
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

    def _release(self, ins: wire.Instruction, spec: ReleaseSpec, w0: dict[str, torch.Tensor],
                 w_prev: dict[str, torch.Tensor] | None, steps: int, lr: float) -> RecordDict:
        """Record, compute, privatise and sketch one training release (or refuse)."""
        phase, rnd = ins.phase, ins.round
        if phase == Phase.DISJOINT:  # Algorithm 6: round r uses block r of the secret permutation, once
            releases = [Release(self.disjoint_kind, self.n, spec.batch, spec.noise_multiplier, 1, disjoint=True)]
            blocks = self.n // spec.batch
            if not 1 <= rnd <= blocks:
                return self._refuse(wire.REFUSED_BUDGET, f"round {rnd} has no block of K={spec.batch} records left: "
                                    f"the n={self.n} records hold {blocks} disjoint blocks (rounds 1..{blocks})")
        else:
            releases = [Release(phase, self.n, spec.batch, spec.noise_multiplier, steps)]
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

    def evaluate(self, content: RecordDict) -> RecordDict:
        """Answer an evaluation request as the node's policy says (app/privacy/policy.py):

        * ``open``: exact test errors on the silo's held-out split, the mean loss on its training
          split and, when the server asks (``train-gradient``), the full gradient of that mean
          loss, from which the server computes ||G_eta|| (NOT covered by the DP guarantee);
        * ``private``: noisy counts and clipped loss sums, one Gaussian release charged to the
          ledger (app/privacy/evaluation.py); no gradient;
        * ``off``: a refusal. A silo whose policy refuses the run refuses its evaluation too."""
        refusal = self._evaluation_refusal()
        if refusal is not None:
            return refusal
        req = check_evaluate_request(content, silo_terms(self))
        if isinstance(req, Rejection):
            return self._refuse(req.code, req.reason)
        return self._evaluation_reply(req)

    def _evaluation_refusal(self) -> RecordDict | None:
        """The refusal this silo's evaluation policy gives every evaluation request (None: it answers)."""
        if self.policy_violation:
            return self._refuse(wire.REFUSED_POLICY, self.policy_violation)
        if self.evaluation == "off":
            return self._refuse(wire.REFUSED_POLICY, "this silo's policy answers no evaluation requests "
                                "(node config evaluation = 'off')")
        if self.evaluation == "private" and self.shuffle:
            return self._refuse(wire.REFUSED_POLICY, "this silo evaluates privately (node config evaluation = "
                                "'private'), which is not available in shuffle mode; its operator may choose open or off")
        if self.evaluation == "private" and not self.private:
            return self._refuse(wire.REFUSED_POLICY, "this silo evaluates privately (node config evaluation = "
                                "'private'), which needs a private run")
        return None

    def _answer_evaluation(self, req: wire.EvaluateRequest) -> RecordDict:
        """The answer to ``req`` as the policy says (:meth:`evaluate`): its refusal, or the reply."""
        refusal = self._evaluation_refusal()
        return refusal if refusal is not None else self._evaluation_reply(req)

    def _evaluation_reply(self, req: wire.EvaluateRequest) -> RecordDict:
        """The evaluation reply to ``req`` of a silo whose policy answers (open or private)."""
        w = self._tensors(req.arrays)
        if self.evaluation == "private":
            return self._private_evaluation(w, req.round)
        with torch.no_grad():
            logits = torch.func.functional_call(self.model, w, (self.test_x,))
            test_loss = cross_entropy(logits, self.test_y).item() * len(self.test_y)
            errors = (logits.argmax(1) != self.test_y).sum().item()
        train_loss = batch_loss(self.model, w, self.train_x, self.train_y) * self.n
        val_errors = val_count = None
        if self.val_y is not None and len(self.val_y):
            with torch.no_grad():
                val_logits = torch.func.functional_call(self.model, w, (self.val_x,))
            val_errors, val_count = float((val_logits.argmax(1) != self.val_y).sum().item()), float(len(self.val_y))
        return wire.EvaluateReply(
            test_errors=float(errors), test_count=float(len(self.test_y)), test_loss_sum=test_loss,
            train_loss_sum=train_loss, train_count=float(self.n), val_errors=val_errors, val_count=val_count,
            eps_spent=self.ledger.spent(), gradient=self._full_gradient(w) if req.train_gradient else None).encode()

    def _private_evaluation(self, w: Mapping[str, torch.Tensor], rnd: int) -> RecordDict:
        """Noisy error counts and clipped loss sums (one ``eval`` release, recorded first)."""
        spec = self.plan[Phase.EVAL]
        try:
            spent, seq = self.ledger.record_release([Release(Phase.EVAL, self.n, self.n, spec.noise_multiplier, 1)],
                                                    round_=rnd)
        except BudgetExceededError as exc:
            return self._refuse(wire.REFUSED_BUDGET, str(exc))
        stats: dict[str, float] = {}
        counts: dict[str, float] = {}
        with torch.no_grad():
            splits = [("test", self.test_x, self.test_y), ("train", self.train_x, self.train_y)]
            if self.val_y is not None and len(self.val_y):
                splits.append(("val", self.val_x, self.val_y))
            for name, x, y in splits:
                logits = torch.func.functional_call(self.model, dict(w), (x,))
                if name != "train":
                    stats[f"{name}_errors"] = float((logits.argmax(1) != y).sum().item())
                    counts[f"{name}_errors"] = float(len(y))
                if name != "val":
                    per_record = torch.nn.functional.cross_entropy(logits, y, reduction="none")
                    stats[f"{name}_loss_sum"] = clipped_loss_sum(per_record)
                    counts[f"{name}_loss_sum"] = float(len(y))
        noisy = noisy_statistics(stats, counts, spec.noise_multiplier, self._torch_gen(seq, "eval-noise", 0))
        return wire.EvaluateReply(
            test_errors=noisy["test_errors"], test_count=counts["test_errors"], test_loss_sum=noisy["test_loss_sum"],
            train_loss_sum=noisy["train_loss_sum"], train_count=float(self.n), val_errors=noisy.get("val_errors"),
            val_count=counts.get("val_errors"), eps_spent=spent).encode()

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
            "planned": [{"phase": r.phase, "batch": r.batch, "count": r.count, "sensitivity": r.sensitivity,
                         "noise_multiplier": r.noise_multiplier, "sigma": r.sigma, "disjoint": r.disjoint}
                        for r in self.plan.values()],
            "releases": releases,
            "adjacency": "replace-one", "accountant": "dp-accounting (analytic Gaussian if unsampled, else RDP)",
        }

    def _shuffle_release(self, ins: wire.Instruction, spec: ReleaseSpec, w0: Mapping[str, torch.Tensor],
                         w_prev: Mapping[str, torch.Tensor] | None) -> RecordDict:
        """Shuffle DP (the paper's Algorithms 7-10): the release's clipped rows, encoded as
        per-coordinate counts of rounded levels plus Bin(K b, p) noise (app/privacy/shuffle.py),
        sealed to the shuffler's public key so that the server relays what it cannot read. The
        release is recorded (a binomial release of the exchange's ``spec.trials`` trials) before
        anything is computed from the records."""
        phase, rnd = ins.phase, ins.round
        shuffler_key = parse_public_key(ins.shuffle.shuffler_key)  # admitted: present and a key
        if self.shuffler_pin is not None and shuffler_key != parse_public_key(self.shuffler_pin):
            return self._refuse(wire.REFUSED_POLICY, "the shuffler key sent is not the one this node pinned "
                                "(node config shuffler-public-key); nothing was released")
        count_on = self.s.shuffle.count_on or self.s.silos_per_round
        b = trials_per_record(spec.trials, count_on, spec.batch, self.s.shuffle.headroom)
        kind = self.disjoint_kind if phase == Phase.DISJOINT else str(phase)
        if phase == Phase.DISJOINT and not 1 <= rnd <= self.n // spec.batch:
            return self._refuse(wire.REFUSED_BUDGET, f"round {rnd} has no block of K={spec.batch} records left: "
                                f"the n={self.n} records hold {self.n // spec.batch} disjoint blocks")
        q, sampling_tag, _ = self._silo_sampling(count_on)
        release = Release(kind, self.n, spec.batch, 0.0, 1, phase == Phase.DISJOINT, "binomial", spec.trials,
                          self.levels, self.s.shuffle.p, self.dim, self.s.shuffle.amplification, q)
        try:
            spent, seq = self.ledger.record_release([release], round_=rnd, exclusive=phase == Phase.DISJOINT,
                                                    extra={"trials_per_record": b, "count_on": count_on})
        except BudgetExceededError as exc:
            return self._refuse(wire.REFUSED_BUDGET, str(exc))
        if phase == Phase.DIFF:
            assert w_prev is not None
            x, y = self._batch(spec.batch, seq, 0)
            rows = self._difference_rows(w0, w_prev, x, y)
        else:
            x, y = self._block(spec.batch, rnd) if phase == Phase.DISJOINT else self._batch(spec.batch, seq, 0)
            rows = clip_rows(per_sample_grads(self.model, dict(w0), x, y), self.clip)
        code = ShuffleCode(row_bound(phase == Phase.DIFF, self.clip, self.s.diff_clip), self.levels, self.s.shuffle.p)
        counts = BinomialShuffleMechanism(code, b, self._np_rng(seq, "shuffle-encoding", 0)).release(rows).numpy()
        # bound to its exchange (run, round, exchange, phase: the AEAD's associated data) and, inside
        # the sealed payload, to that context's hash and this release's ledger sequence number
        context = wire.shuffle_context(self.run_id, rnd, ins.shuffle.exchange, str(phase))
        contribution = Contribution(records=spec.batch, trials=spec.batch * b, required_trials=spec.trials,
                                    levels=self.levels, counts=counts,
                                    binding=Contribution.bind(context, seq) + sampling_tag)
        assert self.sender_keys is not None
        return wire.SealedReply(seal(shuffler_key, self.sender_keys, contribution.encode(), context), spent).encode()

    def _silo_sampling(self, count_on: int) -> tuple[float, bytes, str]:
        """(q, seal tag, why) of app/privacy/silo_sampling.claim for this run and node."""
        return silo_sampling.claim(self.s.shuffle.silo_sample, self.s.num_silos, self.trust_silo_sampling, count_on,
                                   pinned=self.shuffler_pin is not None)

    def _silo_sampling_report(self, count_on: int) -> dict[str, Any]:
        q, _, why = self._silo_sampling(count_on)
        return {"claimed": q < 1, "q": q, "why": why}

    # -- internals ------------------------------------------------------------------------
    def _noisy_gradient(self, w: Mapping[str, torch.Tensor], spec: ReleaseSpec, seq: int, step: int,
                        batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], float]:
        """One release (ledger sequence number ``seq``, local step ``step``): clipped mean of K
        per-sample gradients plus N(0, sigma^2 I), on K records drawn without replacement (or on
        the given ``batch``)."""
        x, y = batch if batch is not None else self._batch(spec.batch, seq, step)
        if not self.private:  # no clipping, no noise: the plain minibatch gradient (no per-sample pass)
            return _unflatten(self._mean_gradient(w, x, y), w), batch_loss(self.model, dict(w), x, y)
        rows = clip_rows(per_sample_grads(self.model, dict(w), x, y), self.clip)
        noisy = make_mechanism(self.s.privacy.mode, spec.sigma).release(rows, self._torch_gen(seq, "noise", step))
        return _unflatten(noisy, w), float("nan")

    def _noisy_difference(self, w: Mapping[str, torch.Tensor], w_prev: Mapping[str, torch.Tensor], spec: ReleaseSpec,
                          seq: int) -> tuple[dict[str, torch.Tensor], float]:
        """One SPIDER difference release on one batch of K2 records (see the module docstring)."""
        x, y = self._batch(spec.batch, seq, 0)
        rows = self._difference_rows(w, w_prev, x, y)
        if not self.private:
            return _unflatten(rows.mean(dim=0), w), batch_loss(self.model, dict(w), x, y)
        noisy = make_mechanism(self.s.privacy.mode, spec.sigma).release(rows, self._torch_gen(seq, "noise", 0))
        return _unflatten(noisy, w), float("nan")

    def _difference_rows(self, w: Mapping[str, torch.Tensor], w_prev: Mapping[str, torch.Tensor], x: torch.Tensor,
                         y: torch.Tensor) -> torch.Tensor:
        """Per-record differences on (x, y): clip_C(g(w) - g(w')) with ``diff-clip`` C > 0 (norm <= C),
        else clip_L g(w) - clip_L g(w') (norm <= 2L)."""
        g_now = per_sample_grads(self.model, dict(w), x, y)
        g_prev = per_sample_grads(self.model, dict(w_prev), x, y)
        if self.s.diff_clip > 0 and self.private:
            return clip_rows(g_now - g_prev, self.s.diff_clip)
        return clip_rows(g_now, self.clip) - clip_rows(g_prev, self.clip)

    def _mean_gradient(self, w: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Flat gradient of the mean loss on (x, y) (what the per-sample route averages to)."""
        params = {k: v.detach().requires_grad_(True) for k, v in w.items()}
        loss = cross_entropy(torch.func.functional_call(self.model, params, (x,)), y)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(params.values()))])

    def _full_gradient(self, w: Mapping[str, torch.Tensor], chunk: int = 4096) -> dict[str, np.ndarray]:
        """Gradient of the mean training loss (1/n) sum_x f0(w, x), accumulated in chunks."""
        params = {k: v.detach().clone().requires_grad_(True) for k, v in w.items()}
        total = {k: torch.zeros_like(v) for k, v in params.items()}
        for start in range(0, self.n, chunk):
            x, y = self.train_x[start:start + chunk], self.train_y[start:start + chunk]
            loss = cross_entropy(torch.func.functional_call(self.model, params, (x,)), y) * (len(y) / self.n)
            for k, g in zip(params, torch.autograd.grad(loss, list(params.values())), strict=True):
                total[k] += g
        return {k: v.detach().cpu().numpy() for k, v in total.items()}

    def _batch(self, k: int, seq: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K of the n records, uniformly without replacement."""
        idx = torch.as_tensor(fixed_size_batch(self.n, k, self._np_rng(seq, "batch", step)), device=self.device)
        return self.train_x[idx], self.train_y[idx]

    def _block(self, k: int, rnd: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``rnd`` (1-based) of K records of the silo's secret permutation (Algorithm 6)."""
        perm = np.random.default_rng(self.block_seed).permutation(self.n)
        idx = torch.as_tensor(perm[(rnd - 1) * k: rnd * k], device=self.device)
        return self.train_x[idx], self.train_y[idx]

    def _tensors(self, params: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """``params`` (admitted: this silo's layout, finite) as tensors on the silo's device."""
        return {k: torch.as_tensor(v, device=self.device) for k, v in params.items()}

    def _np_rng(self, seq: int, *parts: Any) -> np.random.Generator:
        """The generator of release ``seq`` (its ledger sequence number) for ``parts``: the OS
        CSPRNG with ``noise-seed="os"``; else derived from (run seed, silo, seq, parts), which
        makes simulations reproducible and lets whoever knows the seed recompute it."""
        if self.s.privacy.noise_seed == "os":
            return np.random.default_rng(secrets.randbits(128))
        return np_rng(self.s.seed, "silo", self.data.index, "release", seq, *parts)

    def _torch_gen(self, seq: int, *parts: Any) -> torch.Generator:
        """Like :meth:`_np_rng`, for torch draws (on the CPU)."""
        if self.s.privacy.noise_seed == "os":
            return torch.Generator().manual_seed(secrets.randbits(63))
        return torch_gen(self.s.seed, "silo", self.data.index, "release", seq, *parts)

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


def shuffle_trust(count_on: int, silos: int) -> dict[str, Any]:
    """Whom a shuffle-DP silo's epsilon relies on, for summary.json (app/privacy/policy.py's
    collusion_threshold): 'holds unless more than k of the other silos are dishonest or collude
    with the server' (the shuffler is trusted in every case)."""
    k = collusion_threshold(count_on, silos)
    return {"count_on": int(count_on), "collusion_threshold": k,
            "holds": f"unless more than {k} of the other {max(silos - 1, 0)} silos are dishonest or collude with the "
                     "server (and unless the shuffler colludes with the server)",
            "why": ("count-on 1: the silo adds all the noise its epsilon needs" if count_on <= 1 else
                    f"count-on {count_on}: the silo adds (1 + headroom)/{count_on} of the noise its epsilon needs and "
                    "counts on the other silos in its sums for the rest; one that claims noise it did not add, or "
                    "whose counts reach the server, shrinks it")}


def _unflatten(vec: torch.Tensor, like: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out, offset = {}, 0
    for k, v in like.items():
        out[k] = vec[offset: offset + v.numel()].reshape(v.shape)
        offset += v.numel()
    return out


def _pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = 'cuda' but no CUDA device is available on this node")
    return device
