"""PrivateSilo: silofl's record-level ISRL-DP for a Flower user's own ClientApp (docs/private-clientapp.md).

A Flower user brings their own torch model and their own records; :class:`PrivateSilo` gives
their ``@app.train()`` handler what silofl's built-in silo node does, by running that very silo
(clients/silo.py) on them: per-record clipping of ``torch.func`` per-sample gradients, the
Gaussian mechanism calibrated from the silo's OWN (epsilon, delta) and plan (dp-accounting, for
the fixed-size sampling used), the release written to the silo's ledger BEFORE anything is
computed from the records (noise and batch keyed to the ledger's sequence number; from the OS
CSPRNG on a deployed node), and the server's broadcast-seed sketch (post-processing). Refusals are
Flower reply messages (``wire.Refusal``), never exceptions.

Two Flower mods (``Mod = (msg, context, call_next) -> Message``, flwr.clientapp.typing):

* :meth:`PrivateSilo.policy_mod` refuses BEFORE the handler runs (so before any record is read):
  the node policy (app/privacy/policy.py: caps, ledger scope, noise seed; plus ``algorithms``, a
  comma-separated allow-list), the request's every field (app/admission.py) and the budget left
  (the release the request asks for, checked against the ledger without recording it);
* :class:`SketchMod` sketches a finished, already-private update with the round's broadcast
  seed (post-processing, so valid as a mod); the handler then releases the full update.

Why the clipping is not a mod: a mod sees only the finished update (Flower's ``LocalDpMod``
clips and noises that: update-level DP), while record-level DP needs each record's gradient
clipped inside the release, and the ledger write before it. So the release is a method and the
mods are what is policy or post-processing.

Placed in clients/ (the node side): it composes clients/silo.py and the base layer, and neither
strategies/ nor the base layer imports it (DESIGN.md section 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from app import refusal, wire
from app.admission import Rejection, check_evaluate_request, check_instruction, silo_terms, sketch_error
from app.config import SCHEMA, ConfigError, Settings, parse_settings
from app.data.federated import SiloData
from app.privacy.accounting import epsilon_spent
from app.privacy.ledger import BUDGET_RTOL, LedgerError
from app.privacy.policy import NodePolicy, PolicyError, node_policy, policy_violation
from app.sketch.broadcast import build_sketch
from app.sketch.powersgd import PowerSGDState
from clients.silo import RefusingSilo, Silo, witnessed_answer

#: node-config key (PrivateSilo's policy): the algorithms this silo releases for, comma-separated
ALGORITHMS_KEY = "algorithms"
#: the one reason a PrivateSilo gives when its plan cannot be built on its records (detail: its log)
PLAN_REASON = ("this silo's plan (batch size, rounds, clip, algorithm) cannot be applied to its records; the detail "
               "is in the node's log")

Records = tuple  # (x, y) or (x, y, test_x, test_y): float features, int64 labels
RecordSource = Records | Callable[[Context], Records]


class PrivateSilo:
    """One silo's own model, records, budget, plan, ledger and node policy.

    ``model``: a torch module (or a zero-argument factory; one model per node) mapping a batch
    to logits, no BatchNorm; its parameter names and shapes must be those of the server's model.
    ``records``: (x, y) or (x, y, test_x, test_y), or a function of the node's Context returning
    one (the held-out pair answers evaluations; without it evaluation is refused).
    ``epsilon``, ``delta``: this silo's budget for the run (delta None: 1/n^2). The plan:
    ``rounds`` releases of ``batch_size`` records each (fixed-size, without replacement),
    per-record clip ``clip``, for ``algorithm``; ``options``: further run-config keys of the plan
    (``local-steps``, ``spider.q``, ...). The server's run config fills in the rest (its seed,
    sketch, step size); the silo's own values above always win, and its ledger holds every
    release to (epsilon, delta) whatever the run config says.
    ``state_dir``: where the ledger lives (None: node config ``state-dir``, else
    ``$FLWR_HOME/silofl-state``). ``policy``: node-config policy keys (app/privacy/policy.py and
    ``algorithms``) over the node's own config. ``deployed``: None: a ``flwr-clientapp`` process is
    deployed (OS-CSPRNG noise by default); a simulation is not."""

    def __init__(self, model: torch.nn.Module | Callable[[], torch.nn.Module], records: RecordSource, *,
                 epsilon: float, clip: float, batch_size: int, rounds: int, delta: float | None = None,
                 algorithm: str = "mbsgd", options: Mapping[str, Any] | None = None,
                 state_dir: str | Path | None = None, policy: Mapping[str, Any] | None = None,
                 deployed: bool | None = None, device: str = "cpu") -> None:
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise ValueError(f"epsilon = {epsilon!r}; a PrivateSilo needs a finite budget > 0")
        self.model, self.records = model, records
        self.plan: dict[str, Any] = dict(options or {}) | {
            "algorithm": algorithm, "num-rounds": int(rounds), "batch-size": int(batch_size),
            "privacy.mode": "isrl", "privacy.epsilon": float(epsilon), "privacy.clip": float(clip),
            "privacy.planned-rounds": 0,
            "privacy.delta": "auto" if delta is None else float(delta), "device": device}
        self.state_dir = None if state_dir is None else Path(state_dir)
        self.policy_keys = dict(policy or {})
        self.deployed = deployed
        self._silos: dict[tuple, Silo | RefusingSilo] = {}

    # -- the run's silo ---------------------------------------------------------------------
    def node_policy(self, context: Context) -> NodePolicy:
        """The node's policy: its config with ``policy`` over it (PolicyError when malformed),
        on the safe side wherever the constructor's ``policy`` does not say otherwise: noise and
        batches from the OS CSPRNG (``noise-seed = "run"`` only when ``policy`` says so), and no
        open evaluation (exact statistics and the training gradient, outside the guarantee)
        unless ``policy`` says ``evaluation = "open"``: a node config alone, or a simulation's
        defaults, never opens it."""
        node = dict(context.node_config) | self.policy_keys
        policy = node_policy({k: v for k, v in node.items() if k != ALGORITHMS_KEY}, deployed=self._deployed())
        if policy.noise_seed is None:  # a simulation without caps: the run config would decide
            policy = replace(policy, noise_seed="os")
        if policy.evaluation == "open" and str(self.policy_keys.get("evaluation", "")) != "open":
            policy = replace(policy, evaluation="off")
        return policy

    def settings(self, context: Context, policy: NodePolicy) -> Settings:
        """The run's config with this silo's plan over it, as the silo applies it."""
        run = {k: v for k, v in context.run_config.items() if k in SCHEMA}  # a user's own keys: not silofl's
        s = parse_settings(run | self.plan)
        if policy.noise_seed is not None:  # the node's choice (or its safe default, os) wins
            s = replace(s, privacy=replace(s.privacy, noise_seed=policy.noise_seed))
        return s

    def silo(self, context: Context) -> Silo | RefusingSilo:
        """The silo of this node and run: built on the first message (its calibration, its ledger)
        and kept. Nothing is computed from the records here."""
        key = (context.run_id, context.node_id)
        if key in self._silos:
            return self._silos[key]
        index = int(context.node_config.get("partition-id", 0))
        try:
            policy = self.node_policy(context)
            s = self.settings(context, policy)
        except (PolicyError, ConfigError) as exc:
            self._silos[key] = _Refusing(index, f"this silo cannot serve the run: {exc}", wire.REFUSED_POLICY)
            return self._silos[key]
        try:
            data = self._data(context, index)
        except Exception as exc:  # noqa: BLE001 - the user's records: the server learns only that they failed
            self._silos[key] = _Refusing(index, refusal.data_reason(index, exc), wire.REFUSED_DATA)
            return self._silos[key]
        where = self.state_dir or Path(str(context.node_config.get("state-dir") or _default_state_dir()))
        ledger_key = "node" if policy.ledger_scope == "node" else (s.ledger_run_key or f"run{context.run_id}")
        budget = None
        if policy.ledger_scope == "node":  # one lifetime budget across runs: the node's caps
            budget = (float(policy.epsilon_cap),
                      policy.delta_cap if policy.delta_cap is not None else 1.0 / (data.n * data.n))
        delta_asked = "1/n^2" if s.privacy.delta is None else f"{s.privacy.delta:g}"
        violation = policy_violation(policy, True, s.privacy.epsilon, s.delta_for(data.n), delta_asked)
        violation = violation or self._run_violation(context)
        model = self.model() if callable(self.model) and not isinstance(self.model, torch.nn.Module) else self.model
        evaluation = policy.evaluation if len(data.test_y) else "off"
        try:
            silo = Silo(s, data, 0, tuple(data.train_x.shape[1:]), where, ledger_key, policy_violation=violation,
                        ledger_budget=budget, evaluation=evaluation,
                        evaluation_noise_ratio=policy.evaluation_noise_ratio, run_id=context.run_id,
                        ledger_mark_dir=context.node_config.get("ledger-mark-dir") or None, model=model,
                        ledger_key_file=context.node_config.get("ledger-key-file") or None,
                        ledger_witness_dir=context.node_config.get("ledger-witness-dir") or None)
        except LedgerError as exc:  # no trustworthy record of what was spent: release nothing
            self._silos[key] = RefusingSilo(index, refusal.ledger_reason(index, exc))
            return self._silos[key]
        except Exception as exc:  # noqa: BLE001 - e.g. a plan that does not fit the records (K > n): a fixed
            # reason to the server, the detail in this node's log (app/refusal.py)
            refusal.logged(index, f"{type(exc).__name__}: {exc}")
            self._silos[key] = _Refusing(index, PLAN_REASON, wire.REFUSED_CONFIG)
            return self._silos[key]
        self._silos = {k: v for k, v in self._silos.items() if k[0] == context.run_id}  # old runs: drop
        self._silos[key] = silo
        return silo

    def _deployed(self) -> bool:
        if self.deployed is not None:
            return self.deployed
        from app.node_context import deployed_process

        return deployed_process()

    def _data(self, context: Context, index: int) -> SiloData:
        got = self.records(context) if callable(self.records) else self.records
        if len(got) not in (2, 4):
            raise ValueError("records must be (x, y) or (x, y, test_x, test_y)")
        x, y = torch.as_tensor(got[0], dtype=torch.float32), torch.as_tensor(got[1], dtype=torch.int64)
        tx, ty = ((torch.as_tensor(got[2], dtype=torch.float32), torch.as_tensor(got[3], dtype=torch.int64))
                  if len(got) == 4 else (x[:0], y[:0]))
        return SiloData(index, x, y, tx, ty)

    def _run_violation(self, context: Context) -> str | None:
        """What this silo's plan and policy refuse about the run itself (its mode, its algorithm)."""
        run = context.run_config
        mode = str(run.get("privacy.mode", "isrl"))
        if mode in ("shuffle", "secagg"):
            return (f"this silo releases Gaussian ISRL-DP (PrivateSilo); the run asks for privacy.mode = {mode!r}, "
                    "which needs silofl's own silo node")
        algorithm = str(run.get("algorithm", self.plan["algorithm"]))
        if algorithm != self.plan["algorithm"]:
            return f"this silo planned its releases for algorithm {self.plan['algorithm']!r}; the run is {algorithm!r}"
        node = dict(context.node_config) | self.policy_keys
        allowed = [a.strip() for a in str(node.get(ALGORITHMS_KEY, "")).split(",") if a.strip()]
        if allowed and algorithm not in allowed:
            return f"this silo's policy allows algorithms {allowed} (node config {ALGORITHMS_KEY}); the run is {algorithm!r}"
        return None

    # -- what a ClientApp's handlers call ---------------------------------------------------
    def release(self, msg: Message, context: Context) -> Message:
        """Answer a training instruction: clip -> Gaussian mechanism -> ledger -> sketch, or a
        refusal (the built-in silo's ``train``, clients/silo.py)."""
        return Message(self._answer("train", msg.content, context), reply_to=msg)

    def evaluate(self, msg: Message, context: Context) -> Message:
        """Answer an evaluation request as the node's evaluation policy says."""
        return Message(self._answer("evaluate", msg.content, context), reply_to=msg)

    def ledger(self, msg: Message, context: Context) -> Message:
        """The silo's public privacy record (the ``query.ledger`` silofl's ServerApp asks for)."""
        silo = self.silo(context)
        try:
            if getattr(silo, "ledger", None) is not None:  # the server's witnesses: a restored state dir
                silo.ledger.check_witnesses(wire.witnesses_of(msg.content))
            return Message(wire.ledger_reply(silo.ledger_report()), reply_to=msg)
        except LedgerError as exc:
            index = getattr(silo, "index", 0)
            return Message(wire.ledger_reply({"silo": index, "error": refusal.ledger_reason(index, exc)}), reply_to=msg)

    def eps_spent(self, context: Context) -> float:
        silo = self.silo(context)
        return math.nan if isinstance(silo, RefusingSilo) else silo.ledger.spent()

    def _answer(self, method: str, content: RecordDict, context: Context) -> RecordDict:
        silo = self.silo(context)
        index = getattr(silo, "index", "?")
        try:
            return witnessed_answer(silo, method, content)
        except wire.ReplyError as exc:
            return wire.Refusal(wire.REFUSED_CONFIG, str(exc), silo.ledger.spent()).encode()
        except LedgerError as exc:
            return wire.Refusal(wire.REFUSED_LEDGER, refusal.ledger_reason(index, exc), math.nan).encode()
        except Exception as exc:  # noqa: BLE001 - never a crash whose text reaches the server
            return wire.Refusal(wire.REFUSED_INTERNAL, refusal.internal_reason(index, exc), math.nan).encode()

    # -- the policy mod ---------------------------------------------------------------------
    def policy_mod(self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        """Flower Mod: a training (or evaluation) request this silo would refuse never reaches
        the handler."""
        kind = msg.metadata.message_type.split(".")[0]
        if kind == MessageType.TRAIN:
            refusal = self.admission(msg.content, context)
        elif kind == MessageType.EVALUATE:
            refusal = self.evaluation_admission(msg.content, context)
        else:
            return call_next(msg, context)
        return call_next(msg, context) if refusal is None else Message(refusal.encode(), reply_to=msg)

    def evaluation_admission(self, content: RecordDict, context: Context) -> wire.Refusal | None:
        """Why this silo refuses the evaluation request ``content`` (its evaluation policy, a
        malformed request), or None."""
        silo = self.silo(context)
        if isinstance(silo, RefusingSilo):
            return wire.Refusal(getattr(silo, "code", wire.REFUSED_LEDGER), silo.reason, math.nan)
        refused = silo.evaluation.refusal()
        if refused is not None:
            return wire.Refusal.decode(refused)
        req = check_evaluate_request(content, silo_terms(silo))
        return wire.Refusal(req.code, req.reason, silo.ledger.spent()) if isinstance(req, Rejection) else None

    def admission(self, content: RecordDict, context: Context) -> wire.Refusal | None:
        """Why this silo refuses the training request ``content`` (or None): a ledger it cannot
        trust, its policy, a malformed or unplanned request, or a release its budget cannot pay.
        Reads the ledger; records nothing; touches no record."""
        silo = self.silo(context)
        if isinstance(silo, RefusingSilo):
            return wire.Refusal(getattr(silo, "code", wire.REFUSED_LEDGER), silo.reason, math.nan)
        try:
            spent = silo.ledger.spent()
        except LedgerError as exc:
            return wire.Refusal(wire.REFUSED_LEDGER, refusal.ledger_reason(silo.data.index, exc), math.nan)
        if silo.policy_violation:
            return wire.Refusal(wire.REFUSED_POLICY, silo.policy_violation, spent)
        ins = check_instruction(content, silo_terms(silo))
        if isinstance(ins, Rejection):
            return wire.Refusal(ins.code, ins.reason, spent)
        new = silo.mechanism.releases(ins, silo.plan[ins.phase], silo.disjoint_kind)
        if isinstance(new, Rejection):
            return wire.Refusal(new.code, new.reason, spent)
        ledger = silo.ledger
        try:
            after = epsilon_spent(ledger.recorded() + new, ledger.delta)
        except ValueError as exc:
            return wire.Refusal(wire.REFUSED_BUDGET, f"release refused: {exc}", spent)
        if not math.isinf(ledger.epsilon_budget) and after > ledger.epsilon_budget * (1 + BUDGET_RTOL):
            return wire.Refusal(wire.REFUSED_BUDGET, f"privacy budget exceeded: budget epsilon={ledger.epsilon_budget:g} "
                                f"at delta={ledger.delta:.3g}, spent {spent:.4f}, this request would bring it to "
                                f"{after:.4f}; nothing was read or released", spent)
        return None


class _Refusing(RefusingSilo):
    """A silo that refuses everything with ``code`` (a node policy or a plan it cannot apply)."""

    def __init__(self, index: int, reason: str, code: str) -> None:
        super().__init__(index, reason)
        self.code = code

    def train(self, content: RecordDict) -> RecordDict:
        return wire.Refusal(self.code, self.reason, math.nan).encode()

    evaluate = train


class SketchMod:
    """Flower Mod: sketch a finished, already-private training update with the round's broadcast
    seed (the server's ``sketch-*`` config; post-processing, so privacy is unchanged).

    The handler is called with the sketch taken out of the instruction, so it releases the full
    update (and records it first); this mod then compresses that reply's ``update`` exactly as the
    built-in silo does and keeps one PowerSGD state per node. A malformed sketch is refused before
    the handler runs. Put it outside the policy mod: ``ClientApp(mods=[SketchMod(), silo.policy_mod])``."""

    def __init__(self) -> None:
        self._powersgd: dict[int, PowerSGDState] = {}

    def __call__(self, msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        try:
            ins = wire.Instruction.decode(msg.content)
        except wire.ReplyError:  # the handler (or the policy mod) refuses it with the reason
            return call_next(msg, context)
        if ins.sketch is None:
            return call_next(msg, context)
        layout = [tuple(np.shape(a)) for a in ins.arrays.values()]
        error = sketch_error(ins.sketch, {k: tuple(np.shape(a)) for k, a in ins.arrays.items()})
        if error:
            return Message(wire.Refusal(wire.REFUSED_CONFIG, error, math.nan).encode(), reply_to=msg)
        original = msg.content
        msg.content = without_sketch(original)  # the handler releases the full update
        try:
            reply = call_next(msg, context)
        finally:
            msg.content = original
        if reply.has_error() or wire.UPDATE not in reply.content.array_records:
            return reply  # a refusal (or a failure) goes back as it is
        try:
            update = wire.record_to_params(reply.content.array_records[wire.UPDATE], dict(zip(ins.arrays, layout)))
        except wire.ReplyError as exc:
            reply.content = wire.Refusal(wire.REFUSED_CONFIG, f"the handler's update cannot be sketched: {exc}",
                                         math.nan).encode()
            return reply
        if ins.sketch.kind == "powersgd" and context.node_id not in self._powersgd:
            self._powersgd[context.node_id] = PowerSGDState(layout)
        sketch = build_sketch(ins.sketch, layout, self._powersgd.get(context.node_id))
        flat = torch.cat([torch.from_numpy(update[k]).reshape(-1) for k in update])
        payload = sketch.compress(flat).numpy()
        spent = float(reply.content.metric_records[wire.METRICS].get(wire.EPS_SPENT, math.nan))
        if not np.all(np.isfinite(payload)):
            content = wire.Refusal(wire.REFUSED_NON_FINITE, "the sketched update is not finite; the release was "
                                   "recorded", spent).encode()
        else:
            content = RecordDict(dict(reply.content.items()))
            content[wire.UPDATE] = wire.params_to_record({wire.SKETCH: payload})
        reply.content = content
        return reply


def without_sketch(content: RecordDict) -> RecordDict:
    """``content`` with the round's sketch fields taken out of its config (the full update asked)."""
    out = RecordDict(dict(content.items()))
    config = dict(content.config_records[wire.CONFIG])
    for field in wire.SKETCH_FIELDS.values():
        config.pop(field, None)
    out[wire.CONFIG] = ConfigRecord(config)
    return out


def _default_state_dir() -> Path:
    from app.node_context import state_dir

    return state_dir({})
