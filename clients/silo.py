"""The honest silo: ISRL-DP gradient releases computed and noised on the silo's own side.

A silo never trusts the server with privacy: it calibrates its noise multiplier for its own
(epsilon, delta), its own n and K and the number of releases it plans, records each release in
its own ledger before answering, and refuses a request that would exceed its budget.

Releases: what each one is, how it is noised and what it costs is the run's mechanism's
(clients/silo_mechanism.py: the Gaussian mechanism; clients/silo_shuffle.py: the binomial
shuffle); ``eval`` (node config ``evaluation="private"`` only): noisy error counts and clipped
loss sums of the current model (clients/silo_evaluation.py), one unsampled Gaussian release.

What the server sends is never trusted: rows are clipped so that any model, even one crafted to
overflow a record's gradient, gives a release of the stated sensitivity (app/privacy/clipping.py);
each release is written to the ledger before it is computed, and its noise and batch are keyed
to the ledger's sequence number for it, never to the round number the server sends, so a
release's randomness never repeats (with ``noise-seed="os"`` it comes from the OS CSPRNG).

A :class:`Silo` holds its parts: its ledger, its mechanism (``SiloMechanism``: calibration,
pricing and the release), its gradients (``RecordGradients``: clipped rows on its records) and
its evaluation (``Evaluator``); here are calibration, admission, replays and the ledger report.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict
from flwr.common import log
from logging import INFO

from app import wire
from app.refusal import PublicError
from app.admission import Rejection, check_evaluate_request, check_instruction, silo_terms
from app.algorithms import Phase, ReleaseSpec, get_algorithm, planned_evaluations
from app.config import Settings
from app.data.federated import SiloData, apply_dp_stats
from app.models import build_model
from app.privacy.accounting import Release, group_releases
from app.privacy.amplification_choice import resolve_amplification
from app.privacy.envelope import StaticKeys
from app.privacy.ledger import BudgetExceededError, PrivacyLedger
from app.privacy.preprocessing import preprocess_plan
from app.privacy.release_plan import ReleasePlan
from app.seeding import derive_seed
from clients.silo_evaluation import Evaluator
from clients.silo_gradients import RecordGradients, ReleaseDraws, as_tensors, on_device
from clients.silo_mechanism import GaussianSiloMechanism, SiloMechanism
from clients.silo_secagg import SAMPLED_BOUND, SecAggSiloMechanism
from clients.silo_shuffle import AMPLIFIED_BOUND, ShuffleSiloMechanism


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
    """One silo: its settings, model and records, and the parts it holds: ``ledger``
    (PrivacyLedger), ``mechanism`` (the run's SiloMechanism), ``plan`` (each phase's calibrated
    release), ``gradients`` (RecordGradients on ``records``, its records on ``device``) and
    ``evaluation`` (Evaluator)."""

    def __init__(self, settings: Settings, data: SiloData, num_classes: int, feature_shape: tuple[int, ...],
                 state_dir: str | Path, ledger_key: str, policy_violation: str | None = None,
                 ledger_budget: tuple[float, float] | None = None, evaluation: str = "open",
                 evaluation_noise_ratio: float = 1.0, run_id: int = 0, shuffler_pin: str | None = None,
                 ledger_mark_dir: str | Path | None = None, model: torch.nn.Module | None = None,
                 trust_silo_sampling: bool = False, ledger_key_file: str | Path | None = None,
                 ledger_witness_dir: str | Path | None = None, ledger_sync: bool = True,
                 secagg_peer_keys: frozenset[str] | None = None) -> None:
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
        ``ledger.key`` in ``state_dir``) and ledger-witness-dir (app/privacy/ledger/witness.py).
        ``ledger_sync``: fsync each ledger entry (False: a simulation's virtual silo, whose ledger
        reaches the disk once per exchange, PrivacyLedger.sync). ``secagg_peer_keys``: the other
        silos' static public keys (hex) its operator pinned (node config secagg-peer-keys; None:
        the server's, simulations only)."""
        # shuffle.amplification = auto resolved once, for this silo (app/privacy/amplification_choice.py)
        amplification, self.amplification_why = resolve_amplification(
            settings.shuffle.amplification, settings.privacy.noise_seed,
            settings.shuffle.count_on or settings.silos_per_round)
        settings = replace(settings, shuffle=replace(settings.shuffle, amplification=amplification))
        self.s = settings
        self.policy_violation = policy_violation
        self.data = data
        self.device = torch.device(_pick_device(settings.device))
        if model is None:
            model = build_model(settings.model, feature_shape, num_classes, hidden=settings.model_hidden,
                                kwargs=settings.model_kwargs)
        self.model = model.to(self.device)
        self.n = data.n
        priv = settings.privacy
        self.private = priv.enabled
        self.clip = priv.clip if self.private else math.inf
        self.run_epsilon = priv.epsilon if self.private else math.inf
        lifetime_eps, self.delta = ledger_budget or (self.run_epsilon, settings.delta_for(self.n))
        #: a node-scope ledger (one lifetime budget across runs) rather than this run's own
        self.lifetime_ledger = ledger_budget is not None
        path = Path(state_dir) / f"ledger-{ledger_key}-silo{data.index}.json"
        self.ledger = PrivacyLedger.open(path, lifetime_eps, self.delta, mark_dir=ledger_mark_dir,
                                         key_file=ledger_key_file, witness_dir=ledger_witness_dir, sync=ledger_sync)
        self.draws = ReleaseDraws(settings.seed, data.index, priv.noise_seed == "os")
        shuffle = self.private and priv.mode == "shuffle"  # the run's privacy mode picks the mechanism, here only
        self.mechanism: SiloMechanism = self._secagg_mechanism(secagg_peer_keys, state_dir, run_id) if (
            self.private and priv.mode == "secagg") else ShuffleSiloMechanism(
            settings.shuffle, self.amplification_why, settings.silos_per_round, settings.num_silos, self.clip,
            settings.diff_clip, self.n, sum(p.numel() for p in self.model.parameters()), data.index, int(run_id),
            shuffler_pin, StaticKeys.load_or_create(Path(state_dir) / f"shuffle-sender-silo{data.index}.key"),
            bool(trust_silo_sampling), self.draws) if shuffle else GaussianSiloMechanism(
            self.private, self.n, settings.lr, self.draws, settings.client_momentum)
        self.plan = self._calibrate(evaluation, evaluation_noise_ratio)
        if data.dp_stats is not None:  # standardize = "dp": charged above, computed now, on the silo's own records
            self.data = apply_dp_stats(data, self.preprocess_z, self.preprocess_seed)
        self.records = on_device(self.data, self.device)
        self.gradients = RecordGradients(self.model, self.records, self.device, self.clip, settings.diff_clip,
                                         self.private, self.block_seed, self.draws)
        self.evaluation = Evaluator(evaluation, policy_violation, self.private, self.mechanism.evaluation_refusal,
                                    self.model, self.records, self.device, self.gradients, self.ledger, self.plan,
                                    self.draws)

    def _secagg_mechanism(self, pinned: frozenset[str] | None, state_dir: str | Path, run_id: int) -> SiloMechanism:
        """Secure aggregation's silo half (clients/silo_secagg.py), its amplification resolved for this silo."""
        s = self.s
        count_on = s.secagg.count_on or s.silos_per_round
        amplification, why = resolve_amplification(s.secagg.amplification, s.privacy.noise_seed, count_on)
        return SecAggSiloMechanism(
            s.secagg, amplification, why.replace("shuffle.amplification", "secagg.amplification"), s.silos_per_round,
            self.clip, s.diff_clip, self.n, sum(p.numel() for p in self.model.parameters()), self.data.index,
            int(run_id), StaticKeys.load_or_create(Path(state_dir) / f"secagg-silo{self.data.index}.key"), pinned,
            state_dir, self.draws)

    def secagg(self, message_type: str, content: RecordDict, me: int) -> RecordDict:
        """Secure aggregation's rounds 1, 2 and 4 (keys, share, unmask: app/wire/secagg.py);
        round 3 is :meth:`train`. A malformed request is refused, never a crash."""
        if self.policy_violation:
            return self._refuse(wire.REFUSED_POLICY, self.policy_violation)
        mechanism = self.mechanism
        if not isinstance(mechanism, SecAggSiloMechanism):
            return self._refuse(wire.REFUSED_CONFIG, "this is not a secagg run (privacy.mode)")
        try:
            if message_type == wire.SECAGG_KEYS_QUERY:
                params = wire.SecAggParams.decode(content)
                answer = mechanism.advertise(params, me, self._secagg_spec(params.phase))
            elif message_type == wire.SECAGG_SHARE_QUERY:
                request = wire.ShareRequest.decode(content)
                answer = mechanism.share(request, self._secagg_spec(request.params.phase))
            else:
                answer = mechanism.unmask(wire.UnmaskRequest.decode(content))
        except wire.ReplyError as exc:
            return self._refuse(wire.REFUSED_CONFIG, str(exc))
        return self._refuse(answer.code, answer.reason) if isinstance(answer, Rejection) else answer

    def _secagg_spec(self, phase: str) -> ReleaseSpec | None:
        try:
            return self.plan.get(Phase(phase))
        except ValueError:
            return None

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
    def _calibrate(self, evaluation: str, evaluation_noise_ratio: float) -> dict[str, ReleaseSpec]:
        """One noise scale for every planned release, the smallest that keeps all planned
        releases within the run's (epsilon, delta) (the mechanism's accountant). The split rule:
        each kind's noise multiplier is scale * weight (weight 1 for differences,
        ``privacy.anchor-noise-ratio`` for full gradients), so with the default ratio 1 every kind
        has the same z and sigma proportional to its sensitivity. Proxsgd's secret block
        permutation is drawn here and stored with the calibration, so every process serving this
        silo uses the same disjoint blocks. ``evaluation``, ``evaluation_noise_ratio``: the node's
        evaluation policy, and the private evaluations' noise weight."""
        private_eval = evaluation == "private" and self.private and self.mechanism.evaluation_refusal is None
        evaluations = planned_evaluations(self.s.eval_every, self.s.num_rounds, self.s.output) if private_eval else 0
        run_plan = ReleasePlan.of(get_algorithm(self.s.algorithm), self.s.algorithm_options(), self.n, self.clip,
                                  self.run_epsilon, self.delta, evaluations, evaluation_noise_ratio)
        plan = run_plan.releases
        key = {"plan": [[r.phase, r.batch, r.count, r.weight, r.disjoint] for r in plan], "n": self.n,
               "epsilon": str(self.run_epsilon), "delta": self.delta}
        pre_fixed = self._preprocess_plan(key)
        key = self.mechanism.calibration_key(key)
        cal = self.ledger.calibration
        if cal.get("key") == key:  # a restarted silo keeps the noise (and blocks) it started with
            scale = float(cal["noise_multiplier"])
            self.block_seed = int(cal.get("block_seed", 0))
            self.preprocess_seed = int(cal.get("preprocess_seed", 0))
        else:
            scale = self.mechanism.scale(run_plan, pre_fixed) if self.private else 0.0
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
        return self.mechanism.specs(run_plan, scale)

    def _preprocess_plan(self, key: dict[str, Any]) -> list[Release]:
        """standardize = "dp": its release's rows, its multiplier in ``key`` (app/privacy/preprocessing.py)."""
        self.preprocess_z, self.preprocess_seed, rows = preprocess_plan(
            self.data.dp_stats, self.n, self.private, not self.mechanism.composes_fixed, self.run_epsilon,
            self.delta, key)
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
        spec = self.plan[ins.phase]  # admitted: a phase this silo serves, local-steps as calibrated, diff with prev
        if self.mechanism.sealed:  # a sealed contribution carries nothing else and is never replayed
            return self.release(ins, spec)
        # a request this silo already answered (a server resumed from its checkpoint replays the
        # round it lost) gets the same reply again: a copy of a release is no new release, so it
        # is not recorded or charged again, and the resumed run goes on as if never interrupted
        digest = request_digest(ins, f"{self.ledger.path}|{spec}|{self._data_digest()}")
        replayed = _REPLAYS.get(str(self.ledger.path), {}).get(digest)
        if replayed is not None:
            log(INFO, "silo %d: round %d (%s) was already answered; the same reply again, nothing new released",
                self.data.index, ins.round, ins.phase)
            return replayed
        # an evaluation folded into the instruction (the model it carries, the previous round's
        # result) is answered first, under the evaluation policy, as a separate request would be
        folded = ins.evaluation()
        evaluation = None if folded is None else self.evaluation.answer(folded)
        reply = self.release(ins, spec)
        if evaluation is not None:
            reply = wire.with_evaluation(reply, evaluation)
        if wire.refusal_of(reply) is None:  # only a release is kept for replays
            kept = _REPLAYS.setdefault(str(self.ledger.path), {})
            kept[digest] = reply
            while len(kept) > REPLAY_DEPTH:
                del kept[next(iter(kept))]
        return reply

    def release(self, ins: wire.Instruction, spec: ReleaseSpec) -> RecordDict:
        """Price, record, then compute one training release with the mechanism (or refuse): the
        rows are on the ledger before anything is read from the records."""
        w0 = as_tensors(ins.arrays, self.device)
        w_prev = as_tensors(ins.prev, self.device) if ins.phase == Phase.DIFF else None
        releases = self.mechanism.releases(ins, spec, self.disjoint_kind)
        if isinstance(releases, Rejection):
            return self._refuse(releases.code, releases.reason)
        try:
            spent, seq = self.ledger.record_release(releases, round_=ins.round, exclusive=ins.phase == Phase.DISJOINT,
                                                    extra=self.mechanism.ledger_extra(spec))
        except BudgetExceededError as exc:
            return self._refuse(wire.REFUSED_BUDGET, str(exc))
        reply = self.mechanism.answer(ins, spec, w0, w_prev, seq, spent, self.gradients)
        return self._refuse(reply.code, reply.reason) if isinstance(reply, Rejection) else reply

    def evaluate(self, content: RecordDict) -> RecordDict:
        """Answer an evaluation request as the node's policy says (Evaluator.refusal)."""
        refusal = self.evaluation.refusal()
        if refusal is not None:
            return refusal
        req = check_evaluate_request(content, silo_terms(self))
        if isinstance(req, Rejection):
            return self._refuse(req.code, req.reason)
        return self.evaluation.reply(req)

    def ledger_report(self) -> dict[str, Any]:
        """What anyone needs to recompute this silo's epsilon: n, K, delta, budget and every
        kind of release with its count, noise multiplier (or shuffle parameters) and sampling scheme."""
        releases = [
            {"kind": r.kind, "count": r.count, "noise_multiplier": r.noise_multiplier, "n": r.n, "batch": r.batch,
             "sampling": ("disjoint blocks (parallel composition)" if r.disjoint else
                          f"none claimed ({r.mechanism}: accounted as if the record were included)"
                          if (r.binomial or r.skellam) and r.sampled and r.gamma == 1.0 else
                          f"fixed-size without replacement, amplified at gamma = K/n = {r.gamma:.6g} "
                          f"({SAMPLED_BOUND if r.skellam else AMPLIFIED_BOUND})"
                          if (r.binomial or r.skellam) and r.sampled
                          else "fixed-size without replacement" if r.sampled else "none (full batch)")}
            | ({"mechanism": "binomial", "trials": r.trials, "levels": r.levels, "p": r.p, "dim": r.dim}
               | ({"amplification": r.amplification} if r.amplification != "none" else {})
               | ({"silo_sampling": r.silo_sampling} if r.silo_sampling < 1 else {})
               if r.binomial else {})
            | ({"mechanism": "skellam", "l1": r.l1, "l2": r.l2, "dim": r.dim, "mu": (r.noise_multiplier * r.l2) ** 2}
               | ({"amplification": r.amplification} if r.amplification != "none" else {}) if r.skellam else {})
            for r in group_releases(self.ledger.recorded())
        ]
        fields, planned, accountant = self.mechanism.report(self.plan)
        return {
            "silo": self.data.index, "n": self.n, "batch": self.s.batch_for(self.n), "delta": self.delta,
            "eps_budget": self.ledger.epsilon_budget, "eps_spent": self.ledger.spent(), "clip": self.clip,
            **fields, "evaluation": self.evaluation.policy,
            # the training releases, then the pre-processing release (standardize = "dp"; charged
            # before training) as "releases" shows it: z per mechanism, no sampling
            "planned": planned + [{"phase": r.kind, "batch": r.batch, "count": r.count,
                                   "noise_multiplier": r.noise_multiplier, "disjoint": r.disjoint}
                                  for r in self.preprocess_rows],
            "releases": releases,
            "adjacency": "replace-one", "accountant": accountant, "eps_covers": self.eps_covers(),
        }

    def eps_covers(self) -> str:
        """What eps_spent covers, in words, for summary.json (issue 39: a reader must not mistake a
        run's epsilon for the whole experiment's)."""
        what = ("every release this node's lifetime ledger holds (node scope: all its runs)" if self.lifetime_ledger
                else "this run's training releases"
                + (" and its DP pre-processing release (standardize = dp)" if self.preprocess_rows else ""))
        return (f"{what}; not a choice among runs (hyperparameter selection over a grid), unless each candidate "
                "run was charged to this ledger (scripts/reproduce/isrl_private_tuning.py)")

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
    ledger witnesses the request carries (the server's copies, app/privacy/ledger/witness.py):
    LedgerError, before anything is recorded, when one is ahead of the ledger (a restored or
    wiped state dir). The answer carries the ledger's own witness as it is after it."""
    ledger = getattr(silo, "ledger", None)
    if ledger is None:  # a RefusingSilo: no ledger
        return getattr(silo, method)(content)
    ledger.check_witnesses(wire.witnesses_of(content))
    reply = getattr(silo, method)(content)
    # as the handle has it after the answer (its release was recorded under the lock), not read again
    return wire.with_witnesses(reply, [ledger.witness_as_read()])


def _pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise PublicError("device = 'cuda' but no CUDA device is available on this node")
    return device
