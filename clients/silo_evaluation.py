"""The silo's evaluation: the evaluate message, the evaluation folded into a training exchange,
and the private evaluation (node config ``evaluation="private"``: noisy error counts and clipped
loss sums, one Gaussian release charged to the ledger)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import RecordDict

from app import wire
from app.algorithms import Phase, ReleaseSpec
from app.data.federated import SiloData
from app.models.losses import cross_entropy
from app.privacy.accounting import Release
from app.privacy.evaluation import clipped_loss_sum, noisy_statistics
from app.privacy.ledger import BudgetExceededError, PrivacyLedger
from app.privacy.row_batcher import forward_logits
from clients.silo_gradients import RecordGradients, ReleaseDraws, as_tensors


class Evaluator:
    """A silo's answers to evaluation requests, as its node's ``policy`` says (open | private |
    off, app/privacy/policy.py). ``model``, ``records`` (on ``device``), ``gradients`` (the open
    answer's training gradient): what is evaluated; ``ledger``: where a private evaluation is
    charged, at its calibrated ``plan``'s ``eval`` release, with ``draws``' noise;
    ``policy_violation``: why the node refuses the run (then every evaluation too); ``private``:
    a private run; ``mechanism_refusal``: why the run's mechanism releases no private evaluation
    (SiloMechanism.evaluation_refusal)."""

    def __init__(self, policy: str, policy_violation: str | None, private: bool, mechanism_refusal: str | None,
                 model: torch.nn.Module, records: SiloData, device: torch.device, gradients: RecordGradients,
                 ledger: PrivacyLedger, plan: Mapping[str, ReleaseSpec], draws: ReleaseDraws) -> None:
        self.policy = policy
        self.policy_violation = policy_violation
        self.private = private
        self.mechanism_refusal = mechanism_refusal
        self.model = model
        self.records = records
        self.device = device
        self.gradients = gradients
        self.ledger = ledger
        self.plan = plan
        self.draws = draws

    def refuse(self, code: str, reason: str) -> RecordDict:
        """A refusal stating the ledger's epsilon spent."""
        return wire.Refusal(code, reason, self.ledger.spent()).encode()

    def refusal(self) -> RecordDict | None:
        """The refusal this silo's evaluation policy gives every evaluation request (None: it answers):

        * ``open``: exact test errors on the silo's held-out split, the mean loss on its training
          split and, when the server asks (``train-gradient``), the full gradient of that mean
          loss, from which the server computes ||G_eta|| (NOT covered by the DP guarantee);
        * ``private``: noisy counts and clipped loss sums, one Gaussian release charged to the
          ledger (app/privacy/evaluation.py); no gradient;
        * ``off``: a refusal. A silo whose policy refuses the run refuses its evaluation too."""
        if self.policy_violation:
            return self.refuse(wire.REFUSED_POLICY, self.policy_violation)
        if self.policy == "off":
            return self.refuse(wire.REFUSED_POLICY, "this silo's policy answers no evaluation requests "
                               "(node config evaluation = 'off')")
        if self.policy == "private" and self.mechanism_refusal is not None:
            return self.refuse(wire.REFUSED_POLICY, self.mechanism_refusal)
        if self.policy == "private" and not self.private:
            return self.refuse(wire.REFUSED_POLICY, "this silo evaluates privately (node config evaluation = "
                               "'private'), which needs a private run")
        return None

    def answer(self, req: wire.EvaluateRequest) -> RecordDict:
        """The answer to the admitted ``req`` as the policy says (:meth:`refusal`): its refusal, or the reply."""
        refusal = self.refusal()
        return refusal if refusal is not None else self.reply(req)

    def reply(self, req: wire.EvaluateRequest) -> RecordDict:
        """The evaluation reply to ``req`` of a silo whose policy answers (open or private)."""
        w = as_tensors(req.arrays, self.device)
        if self.policy == "private":
            return self.private_evaluation(w, req.round)
        r = self.records
        # the model's outputs on each split (with the other silos' in one pass on the batched path)
        logits = forward_logits(self.model, dict(w), r.test_x)
        with torch.no_grad():
            # the sum of the test records' losses: 0 over none (the mean of none is NaN, which the
            # server would drop as a non-finite reply, and a run of tiny silos would read as diverged)
            test_loss = cross_entropy(logits, r.test_y).item() * len(r.test_y) if len(r.test_y) else 0.0
            errors = (logits.argmax(1) != r.test_y).sum().item()
            train_loss = float(cross_entropy(forward_logits(self.model, dict(w), r.train_x), r.train_y)) * r.n
        val_errors = val_count = None
        if r.val_y is not None and len(r.val_y):
            val_logits = forward_logits(self.model, dict(w), r.val_x)
            val_errors, val_count = float((val_logits.argmax(1) != r.val_y).sum().item()), float(len(r.val_y))
        return wire.EvaluateReply(
            test_errors=float(errors), test_count=float(len(r.test_y)), test_loss_sum=test_loss,
            train_loss_sum=train_loss, train_count=float(r.n), val_errors=val_errors, val_count=val_count,
            eps_spent=self.ledger.spent_as_read(),  # read just before, by witnessed_answer's check
            gradient=self.gradients.full_gradient(w) if req.train_gradient else None).encode()

    def private_evaluation(self, w: Mapping[str, torch.Tensor], rnd: int) -> RecordDict:
        """Noisy error counts and clipped loss sums (one ``eval`` release, recorded first)."""
        spec = self.plan[Phase.EVAL]
        r = self.records
        try:
            spent, seq = self.ledger.record_release([Release(Phase.EVAL, r.n, r.n, spec.noise_multiplier, 1)],
                                                    round_=rnd)
        except BudgetExceededError as exc:
            return self.refuse(wire.REFUSED_BUDGET, str(exc))
        stats: dict[str, float] = {}
        counts: dict[str, float] = {}
        with torch.no_grad():
            splits = [("test", r.test_x, r.test_y), ("train", r.train_x, r.train_y)]
            if r.val_y is not None and len(r.val_y):
                splits.append(("val", r.val_x, r.val_y))
            for name, x, y in splits:
                logits = torch.func.functional_call(self.model, dict(w), (x,))
                if name != "train":
                    stats[f"{name}_errors"] = float((logits.argmax(1) != y).sum().item())
                    counts[f"{name}_errors"] = float(len(y))
                if name != "val":
                    per_record = torch.nn.functional.cross_entropy(logits, y, reduction="none")
                    stats[f"{name}_loss_sum"] = clipped_loss_sum(per_record)
                    counts[f"{name}_loss_sum"] = float(len(y))
        noisy = noisy_statistics(stats, counts, spec.noise_multiplier, self.draws.torch_gen(seq, "eval-noise", 0))
        return wire.EvaluateReply(
            test_errors=noisy["test_errors"], test_count=counts["test_errors"], test_loss_sum=noisy["test_loss_sum"],
            train_loss_sum=noisy["train_loss_sum"], train_count=float(r.n), val_errors=noisy.get("val_errors"),
            val_count=counts.get("val_errors"), eps_spent=spent).encode()
