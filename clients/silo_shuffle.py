"""The binomial shuffle mechanism's silo half (clients/silo_mechanism.py's SiloMechanism): the
release's clipped rows as binomial counts sealed to the shuffler (bound to the run, round,
exchange, phase and ledger sequence number), its calibration by the exact binomial accountant,
the shuffler's silo sampling it may claim, and whom its guarantee trusts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from logging import INFO
from typing import Any

import torch
from flwr.app import RecordDict
from flwr.common import log

from app import wire
from app.admission import Rejection
from app.algorithms import Phase, ReleaseSpec
from app.privacy import silo_sampling
from app.privacy.accounting import Release, calibrate_trial_scale, trials_for
from app.privacy.contribution import Contribution
from app.privacy.envelope import StaticKeys, parse_public_key, seal
from app.privacy.mechanism import BinomialShuffleMechanism
from app.privacy.policy import collusion_threshold
from app.privacy.release_plan import ReleasePlan
from app.privacy.settings import ShuffleSettings
from app.privacy.shuffle import ShuffleCode, row_bound, trials_per_record
from clients.silo_gradients import RecordGradients, ReleaseDraws

#: the bound a sampled binomial release is accounted with under shuffle.amplification = "sampling"
AMPLIFIED_BOUND = ("Theorem 9 form of Wang, Balle & Kasiviswanathan 2019 for the truncated ideal-vs-real pair, "
                   "eps(inf) = inf branch (app/privacy/amplification.py)")


class ShuffleSiloMechanism:
    """The binomial shuffle mechanism's silo half (privacy.mode shuffle; the paper's Algorithms
    7-10). ``options``: the run's shuffle settings (amplification already resolved for this
    silo, ``amplification_why`` saying how); ``silos_per_round``, ``num_silos``: the run's;
    ``clip``, ``diff_clip``: L and C (a row's bound, app/privacy/shuffle.py); ``n``, ``dim``,
    ``index``: the silo's records, model size and number; ``run_id``: the run its contributions
    are bound to; ``shuffler_pin``: the shuffler public key (hex) the node's operator pinned (a
    silo with a pin seals to no other key); ``sender_keys``: this silo's sealing key;
    ``trust_silo_sampling``: node config shuffle-trust-silo-sampling; ``draws``: the encoding's
    generators."""

    sealed = True
    #: what the instruction carries for it (app/admission.py)
    ticket = "shuffle"
    evaluation_refusal = ("this silo evaluates privately (node config evaluation = 'private'), which is not "
                          "available in shuffle mode; its operator may choose open or off")
    composes_fixed = False  # the exact binomial accountant calibrates the plan alone

    def __init__(self, options: ShuffleSettings, amplification_why: str, silos_per_round: int, num_silos: int,
                 clip: float, diff_clip: float, n: int, dim: int, index: int, run_id: int, shuffler_pin: str | None,
                 sender_keys: StaticKeys, trust_silo_sampling: bool, draws: ReleaseDraws) -> None:
        self.options = options
        self.amplification_why = amplification_why
        self.count_on = options.count_on or silos_per_round
        self.num_silos = num_silos
        self.clip, self.diff_clip = clip, diff_clip
        self.n, self.dim, self.index = n, dim, index
        self.levels = options.levels_for(dim)
        self.run_id = run_id
        self.shuffler_pin = shuffler_pin
        self.sender_keys: StaticKeys | None = sender_keys
        self.trust_silo_sampling = trust_silo_sampling
        self.draws = draws

    def calibration_key(self, key: dict[str, Any]) -> dict[str, Any]:
        key = key | {"mode": "shuffle", "levels": self.levels, "p": self.options.p, "dim": self.dim}
        if self.options.amplification != "none":
            key["amplification"] = self.options.amplification
        return key

    def scale(self, run_plan: ReleasePlan, before: list[Release]) -> float:
        """The exchange's noise trials, from the exact binomial accountant (no pre-processing
        release in shuffle mode: app/privacy/preprocessing.py refuses it)."""
        log(INFO, "silo %d: calibrating shuffle-DP noise (g=%d levels, d=%d, p=%g) with the exact binomial "
            "accountant (seconds for small models; it grows with g * sqrt(trials)); record-level "
            "amplification: %s", self.index, self.levels, self.dim, self.options.p, self.amplification_why)
        return calibrate_trial_scale(run_plan.planned(), run_plan.epsilon, run_plan.delta, p=self.options.p,
                                     levels=self.levels, dim=self.dim, amplification=self.options.amplification)

    def specs(self, run_plan: ReleasePlan, scale: float) -> dict[str, ReleaseSpec]:
        return {r.phase: replace(r, trials=trials_for(int(scale), r.weight)) for r in run_plan.releases}

    def trials_per_record(self, spec: ReleaseSpec) -> int:
        """b: the noise trials each of the release's records carries (app/privacy/shuffle.py)."""
        return trials_per_record(spec.trials, self.count_on, spec.batch, self.options.headroom)

    def releases(self, ins: wire.Instruction, spec: ReleaseSpec, disjoint_kind: str) -> list[Release] | Rejection:
        """One binomial release of the exchange's ``spec.trials`` trials; refused when the
        shuffler key sent is not the pinned one, or the round has no disjoint block left."""
        phase, rnd = ins.phase, ins.round
        shuffler_key = parse_public_key(ins.shuffle.shuffler_key)  # admitted: present and a key
        if self.shuffler_pin is not None and shuffler_key != parse_public_key(self.shuffler_pin):
            return Rejection(wire.REFUSED_POLICY, "the shuffler key sent is not the one this node pinned "
                             "(node config shuffler-public-key); nothing was released")
        kind = disjoint_kind if phase == Phase.DISJOINT else str(phase)
        if phase == Phase.DISJOINT and not 1 <= rnd <= self.n // spec.batch:
            return Rejection(wire.REFUSED_BUDGET, f"round {rnd} has no block of K={spec.batch} records left: "
                             f"the n={self.n} records hold {self.n // spec.batch} disjoint blocks")
        q, _, _ = self.silo_sampling()
        return [Release(kind, self.n, spec.batch, 0.0, 1, phase == Phase.DISJOINT, "binomial", spec.trials,
                        self.levels, self.options.p, self.dim, self.options.amplification, q)]

    def ledger_extra(self, spec: ReleaseSpec) -> dict[str, Any] | None:
        return {"trials_per_record": self.trials_per_record(spec), "count_on": self.count_on}

    def answer(self, ins: wire.Instruction, spec: ReleaseSpec, w0: Mapping[str, torch.Tensor],
               w_prev: Mapping[str, torch.Tensor] | None, seq: int, spent: float,
               gradients: RecordGradients) -> RecordDict | Rejection:
        """The release's clipped rows, encoded as per-coordinate counts of rounded levels plus
        Bin(K b, p) noise (app/privacy/shuffle.py), sealed to the shuffler's public key so that
        the server relays what it cannot read."""
        phase, rnd = ins.phase, ins.round
        shuffler_key = parse_public_key(ins.shuffle.shuffler_key)
        b = self.trials_per_record(spec)
        _, sampling_tag, _ = self.silo_sampling()
        if phase == Phase.DIFF:
            assert w_prev is not None
            x, y = gradients.batch(spec.batch, seq, 0)
            rows = gradients.difference_rows(w0, w_prev, x, y)
        else:
            x, y = gradients.block(spec.batch, rnd) if phase == Phase.DISJOINT else gradients.batch(spec.batch, seq, 0)
            rows = gradients.clipped_rows(w0, x, y)
        code = ShuffleCode(row_bound(phase == Phase.DIFF, self.clip, self.diff_clip), self.levels, self.options.p)
        counts = BinomialShuffleMechanism(code, b, self.draws.np_rng(seq, "shuffle-encoding", 0)).release(rows).numpy()
        # bound to its exchange (run, round, exchange, phase: the AEAD's associated data) and, inside
        # the sealed payload, to that context's hash and this release's ledger sequence number
        context = wire.shuffle_context(self.run_id, rnd, ins.shuffle.exchange, str(phase))
        contribution = Contribution(records=spec.batch, trials=spec.batch * b, required_trials=spec.trials,
                                    levels=self.levels, counts=counts,
                                    binding=Contribution.bind(context, seq) + sampling_tag)
        assert self.sender_keys is not None
        return wire.SealedReply(seal(shuffler_key, self.sender_keys, contribution.encode(), context), spent).encode()

    def silo_sampling(self) -> tuple[float, bytes, str]:
        """(q, seal tag, why) of app/privacy/silo_sampling.claim for this run and node."""
        return silo_sampling.claim(self.options.silo_sample, self.num_silos, self.trust_silo_sampling, self.count_on,
                                   pinned=self.shuffler_pin is not None)

    def report(self, plan: Mapping[str, ReleaseSpec]) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        q, _, why = self.silo_sampling()
        shuffle = {"levels": self.levels, "p": self.options.p, "dim": self.dim, "count_on": self.count_on,
                   "headroom": self.options.headroom,
                   "record_amplification": (f"sampling: {AMPLIFIED_BOUND}"
                                            if self.options.amplification == "sampling" else "none"),
                   "record_amplification_why": self.amplification_why,
                   "amplification": "none: the server knows which silos it sampled, so no amplification by "
                                    "the server's silo sampling is claimed (the shuffler's: silo_sampling)",
                   "silo_sampling": {"claimed": q < 1, "q": q, "why": why},
                   "trust": shuffle_trust(self.count_on, self.num_silos)}
        planned = [{"phase": r.phase, "batch": r.batch, "count": r.count, "disjoint": r.disjoint, "trials": r.trials,
                    "trials_per_record": self.trials_per_record(r), "messages": self.count_on * r.batch}
                   for r in plan.values()]
        return ({"mechanism": "binomial (shuffle DP)", "shuffle": shuffle}, planned,
                "exact binomial RDP with truncated tails (app/privacy/binomial/), composed in RDP")


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
