"""The silo's shuffle-DP release (clients/silo.py's Silo): its message as binomial counts
sealed to the shuffler (bound to the run, round, exchange, phase and ledger sequence number),
the shuffler's silo sampling it may claim, and whom its guarantee trusts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import RecordDict

from app import wire
from app.algorithms import Phase, ReleaseSpec
from app.privacy import silo_sampling
from app.privacy.accounting import Release
from app.privacy.clipping import clip_rows
from app.privacy.contribution import Contribution
from app.privacy.envelope import parse_public_key, seal
from app.privacy.ledger import BudgetExceededError
from app.privacy.mechanism import BinomialShuffleMechanism
from app.privacy.per_sample import per_sample_grads
from app.privacy.policy import collusion_threshold
from app.privacy.shuffle import ShuffleCode, row_bound, trials_per_record


class SiloShuffle:
    """Silo's shuffle-DP methods (a mixin of :class:`clients.silo.Silo`)."""

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
