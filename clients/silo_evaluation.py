"""The silo's evaluation (clients/silo.py's Silo): the evaluate message, the evaluation
folded into a training exchange, and the private evaluation (node config ``evaluation="private"``:
noisy error counts and clipped loss sums, one Gaussian release charged to the ledger)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import RecordDict

from app import wire
from app.admission import Rejection, check_evaluate_request, silo_terms
from app.algorithms import Phase
from app.models.losses import cross_entropy
from app.privacy.accounting import Release
from app.privacy.evaluation import clipped_loss_sum, noisy_statistics
from app.privacy.ledger import BudgetExceededError
from app.privacy.per_sample import batch_loss


class SiloEvaluation:
    """Silo's evaluation methods (a mixin of :class:`clients.silo.Silo`; they use its data, model,
    ledger and policy)."""

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
