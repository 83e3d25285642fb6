"""The evaluation harness for model-level attacks (threat model: colluding, omniscient adversary).

In a simulation the Byzantine silos answer honestly; after all replies of the round have arrived
the harness replaces each Byzantine silo's message, in the space in which it was sent (the flat
update, or the sketch payload y when the round is sketched: a Byzantine silo can only send some
y, and the server lifts S^T y), by the attack's output:

* ``sign-flip``: the negation of the silo's own honest message;
* ``ipm``: -epsilon * mean of the honest messages (Xie et al. 2020);
* ``alie``: coordinate-wise mu + z sigma over the honest messages (Baruch et al. 2019; z from their
  formula when f < n/2, ``attack.alie-z`` otherwise, where the formula is undefined);
* ``gaussian``: N(0, attack.noise-std^2) in every coordinate;
* ``alie-adaptive``, ``ipm-adaptive``, ``mimic`` (app/adaptive_attacks.py): the scale searched
  each round against the rule in use, with its pre-aggregators (strategies/composition.py
  ``rule_simulator``); Mimic repeats the honest silo it learned to copy (``mimic_learning``: the
  largest projection on the honest messages' top variance direction, tracked over
  ``attack.mimic-warmup`` exchanges in the model space, the lifted messages);
* ``edge-of-score`` (app/edge_attack.py, :func:`edge_message`): aimed at Grad-BANT's score. White
  box: the attacker reads the exchange's (g0, L, c) as Grad-BANT's server computes them (the rule's
  own when it is Grad-BANT; otherwise a Grad-BANT reference at the run's settings, noise-aware
  where that score is defined), and sends the message of largest damage -<h, u> along
  ``attack.edge-target`` whose score stays >= m > 0, in the plane of two messages it can make the
  server read (S^T S g0 and the honest mean S^T ybar, or S^T S h), m searched on
  ``EDGE_FRACTIONS`` of the plane's largest score against the rule in use.

Data-level attacks (label flipping, random labels) run on the Byzantine silos themselves
(clients/byzantine.py) and need nothing here. :class:`Attacked` wraps any aggregator with the
harness (strategies/aggregators.py does when attack.kind is set).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from logging import DEBUG, WARNING
from typing import Any, NamedTuple

import numpy as np
from flwr.common import log

from app.seeding import np_rng
from app.edge_attack import EDGE_FRACTIONS, edge_in_span, span_max_score
from app.adaptive_attacks import ADAPTIVE_ATTACKS, MimicState, adaptive_alie, adaptive_ipm, mimic_learning
from app.attacks import (MODEL_ATTACKS, AttackSettings, alie, alie_z, byzantine_count, byzantine_indices,
                         gaussian_noise, ipm, sign_flip)


class RunFacts(NamedTuple):
    """What the attack harness reads of the run besides its attack: the seed of the attacks' own
    draws, the number of silos N and the rule's stated byzantine.f (-1: not stated)."""

    seed: int
    num_silos: int
    byzantine_f: int


def alie_z_for(attack: AttackSettings, num_silos: int, n: int, f: int) -> float:
    """``attack.alie-z`` when set; else Baruch et al.'s z for this round's n and f, or, in a round
    where the sampled Byzantine silos happen to be a majority, for the whole federation's N and f."""
    if attack.alie_z:
        return attack.alie_z
    if f < n / 2:
        return alie_z(n, f)
    return alie_z(num_silos, byzantine_count(num_silos, attack.fraction))


def attack_messages(attack: AttackSettings, run: RunFacts, server_round: int, messages: Mapping[int, np.ndarray],
                    byzantine: set[int], rule: Callable[[int, np.ndarray], Callable[[np.ndarray], np.ndarray]] | None = None,
                    report: dict[str, float] | None = None, mimic_target: int | None = None,
                    lift: Callable[[np.ndarray], np.ndarray] | None = None,
                    partition_of: Mapping[int, int] | None = None) -> dict[int, np.ndarray]:
    """Messages (node -> vector) after the Byzantine nodes' ones are replaced; honest ones unchanged.
    ``run``: the run's seed, number of silos and stated byzantine.f.
    The omniscient attacks need at least one honest message; without one they send their own.
    ``rule(f, honest_mean)``: the rule in use as the adaptive attacks evaluate it (rows -> vector);
    ``mimic_target``: the honest node Mimic copies (None: the first honest message); ``lift``: how
    the server reads a message when it aggregates lifts of sketches (:func:`adaptive_message`);
    ``partition_of``: node -> its silo's partition id, which keys the Gaussian attack's draws (a
    simulation's node ids are random on Flower's engine; the node id where it is unknown)."""
    out = {node: np.asarray(m, dtype=np.float32) for node, m in messages.items()}
    if attack.kind not in MODEL_ATTACKS or not byzantine:
        return out
    honest = [m for node, m in out.items() if node not in byzantine]
    stack = np.stack(honest).astype(np.float64) if honest else None
    n, f = len(out), len([node for node in out if node in byzantine])
    if attack.kind in ADAPTIVE_ATTACKS:
        if stack is None:
            return out
        if attack.kind == "mimic":
            new = out[mimic_target] if mimic_target in out and mimic_target not in byzantine else stack[0]
            return out | {node: np.asarray(new, dtype=np.float32) for node in sorted(byzantine & set(out))}
        new = adaptive_message(attack.kind, run.byzantine_f, stack, f, rule, report, lift)
        return out | {node: new for node in sorted(byzantine & set(out))}
    for node in sorted(byzantine & set(out)):
        own = out[node]
        if attack.kind == "sign-flip":
            new = sign_flip(own)
        elif attack.kind == "gaussian":
            who = (partition_of or {}).get(node, node)
            new = gaussian_noise(own.shape, attack.noise_std, np_rng(run.seed, "attack-noise", server_round, who))
        elif stack is None:
            new = own
        elif attack.kind == "ipm":
            new = ipm(stack, attack.ipm_epsilon)
        else:
            new = alie(stack, n, f, z=alie_z_for(attack, run.num_silos, n, f))
        out[node] = np.asarray(new, dtype=np.float32)
    return out


def adaptive_message(kind: str, byzantine_f: int, honest: np.ndarray, f: int,
                     rule: Callable[[int, np.ndarray], Callable[[np.ndarray], np.ndarray]] | None,
                     report: dict[str, float] | None = None,
                     lift: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """The one message every Byzantine silo sends under ALIE or IPM adaptive (app/adaptive_attacks.py):
    the scale searched against ``rule`` (the mean when None); ``report`` gets tau* as ``attack_scale``.
    ``lift`` (a sketched round aggregated in the model space): the rule reads S^T y, so the search
    compares its output with the lifted honest mean S^T mean(y) (``rule`` is built with ``lift``).
    ``kind``: alie-adaptive or ipm-adaptive; ``byzantine_f``: the rule's stated f (-1: the round's ``f``)."""
    f_rule = byzantine_f if byzantine_f >= 0 else f
    reference = None if lift is None else lift(honest.mean(axis=0))  # S^T mean(y): what the rule's output is near
    agg = rule(f_rule, honest.mean(axis=0) if reference is None else reference) if rule is not None \
        else (lambda rows: rows.mean(axis=0))
    attack = adaptive_alie if kind == "alie-adaptive" else adaptive_ipm
    vector, tau = attack(honest, f, agg, reference)
    log(DEBUG, "%s: tau* = %.4g against the rule in use", kind, tau)
    if report is not None:
        report["attack_scale"] = float(tau)
    return np.asarray(vector, dtype=np.float32)


def edge_message(honest: np.ndarray, f: int, payloads: np.ndarray, basis: np.ndarray, g0: np.ndarray,
                 harm: np.ndarray, score_terms: tuple[float, float, float],
                 aggregate: Callable[[np.ndarray], np.ndarray], to_rule: Callable[[np.ndarray], np.ndarray],
                 report: dict[str, float] | None = None,
                 fractions: tuple[float, ...] = EDGE_FRACTIONS) -> np.ndarray:
    """The one message every Byzantine silo sends under ``edge-of-score`` (app/edge_attack.py).

    ``honest`` [h, k]: the honest messages as sent; ``payloads`` [k, j]: messages the attacker can
    send, whose reading by the server (in the rule's space) is ``basis`` [d, j] (linear: payloads @ w
    is read as basis @ w); ``g0``, ``harm`` in the rule's space; ``score_terms`` = (L, gamma, c).
    For each fraction tau, u(tau) = edge_in_span(basis, g0, harm, L, gamma, c, m = tau * s_top)
    (s_top: :func:`span_max_score`), and the kept tau maximises the aggregate's damage
    -<harm, to_rule(aggregate([honest; f copies]))> (the rule in use, state copied). ``report`` gets
    tau as ``attack_scale``, and the crafted score and per-message damage -<harm, u>."""
    smooth, gamma, c = score_terms
    top = span_max_score(basis, g0, smooth, gamma, c)
    best: tuple[float, np.ndarray, Any] | None = None
    for tau in fractions:
        w, craft = edge_in_span(basis, g0, harm, smooth, gamma, c, tau * top)
        message = (payloads @ w).astype(np.float32)
        rows = np.concatenate([honest, np.repeat(message[None, :].astype(np.float64), f, axis=0)])
        try:
            damage = -float(np.asarray(harm, dtype=np.float64) @ to_rule(aggregate(rows)))
        except ValueError:  # the rule keeps nothing for these rows: no damage
            damage = 0.0
        if not np.isfinite(damage):
            damage = 0.0
        if best is None or damage > best[0]:
            best = (damage, message, (tau, craft))
    assert best is not None
    tau, craft = best[2]
    log(DEBUG, "edge-of-score: tau = %.3g, score %.4g (top %.4g), damage %.4g", tau, craft.score, top, craft.damage)
    if report is not None:
        report |= {"attack_scale": float(tau), "attack_score": float(craft.score),
                   "attack_damage": float(craft.damage), "attack_aggregate_damage": float(best[0])}
    return best[1]


class Attacked:
    """The attack harness as a wrapper around any aggregator (simulation only; attack.kind set):
    it learns which nodes are Byzantine once (the experiment's ground truth, :meth:`prepare`),
    replaces their messages each exchange (a model attack) before ``inner`` combines them, and
    tells ``inner`` who they were (the reported Byzantine weight; f when byzantine.f is unset)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.byzantine_nodes: set[int] = set()
        self.partition_of: dict[int, int] = {}  # node -> its unique partition id claim (prepare)
        #: this exchange's adaptive-attack scale tau* (the row's attack_scale)
        self.report: dict[str, float] = {}
        #: the learning Mimic's state (app/adaptive_attacks.py mimic_learning)
        self.mimic = MimicState()
        #: edge-of-score's Grad-BANT reference when the rule in use is not Grad-BANT (built once)
        self._edge_reference: Any = None

    def bind(self, owner: Any) -> None:
        self.s = owner.s  # the run's settings, read for the attack, seed and silos
        self.byzantine = byzantine_indices(owner.s.attack, owner.s.num_silos, owner.s.seed)
        self.inner.bind(owner)
        if self.s.attack.kind == "edge-of-score":  # what its Grad-BANT reference needs of the strategy
            self.layout, self.roster = owner.layout, owner.roster
            self.phase = owner.scheduled_phase(1) if owner.algorithm.rule_step else None
            last = int(np.prod(list(self.layout.values())[-1]))
            if self.s.attack.edge_target == "class-bias" and self.s.attack.edge_class >= last:
                from app.options import ConfigError

                raise ConfigError(f"attack.edge-class = {self.s.attack.edge_class} is out of range for this model; "
                                  f"allowed: [0, {last - 1}] (the entries of its last parameter, the output bias)")

    def prepare(self, grid: Any, timeout: float) -> None:
        """Learn which nodes are Byzantine: every node is asked once for its partition id; an
        answer that is not a valid, unique partition id marks nobody. The server never weights a
        silo by it."""
        self.inner.prepare(grid, timeout)
        if self.s.attack.kind == "none" or not self.byzantine:
            return
        from flwr.app import Message, RecordDict

        from app import wire

        msgs = [Message(RecordDict(), dst_node_id=n, message_type=wire.IDENTITY_QUERY) for n in sorted(grid.get_node_ids())]
        claims: dict[int, int] = {}
        for reply in grid.send_and_receive(msgs, timeout=timeout):
            try:
                claims[reply.metadata.src_node_id] = wire.read_identity(reply.content, self.s.num_silos)
            except wire.ReplyError as exc:
                log(WARNING, "identity of node %d not used: %s", reply.metadata.src_node_id, exc)
        counts = np.bincount(list(claims.values()), minlength=self.s.num_silos)
        self.partition_of = {node: part for node, part in claims.items() if counts[part] == 1}
        self.byzantine_nodes = {node for node, part in self.partition_of.items() if part in self.byzantine}

    def attacked(self, rnd: int, updates: Any, ex: Any = None) -> Any:
        """``updates`` with the Byzantine nodes' messages replaced (lifted once more: only those)."""
        byz = self.byzantine_nodes & set(updates.nodes)
        if hasattr(self.inner, "impl"):
            self.inner.impl.oracle = byz
        if self.s.attack.kind not in MODEL_ATTACKS or not byz:
            return updates
        lift = self.model_space_lift(updates)
        run = RunFacts(self.s.seed, self.s.num_silos, self.s.robust.byzantine_f)
        if self.s.attack.kind == "edge-of-score":
            messages = self.edge_messages(rnd, updates, ex, byz, lift)
        else:
            messages = attack_messages(self.s.attack, run, rnd, updates.messages, byz,
                                       self.simulated_rule(rnd, ex, lift), self.report,
                                       self.mimic_target(rnd, updates, byz), lift, self.partition_of)
        from app.wire import ReplyError
        from strategies.replies import check_bounded

        keep: list[int] = []
        lifted: list[Any] = []
        malformed = dict(updates.malformed)
        for i, (node, u) in enumerate(zip(updates.nodes, updates.updates, strict=True)):
            if node in byz:
                try:  # the server's own bounds on what a silo sends (strategies/replies.py)
                    check_bounded("update", messages[node])
                    u = updates.lift(messages[node])
                except ReplyError as exc:  # refused as the server refuses such a reply: a dropped silo
                    malformed[node] = str(exc)
                    continue
            keep.append(i)
            lifted.append(u)
        if len(keep) == len(updates.nodes):
            return replace(updates, updates=lifted, messages=messages)
        self.report["attack_dropped"] = len(updates.nodes) - len(keep)
        log(WARNING, "round %d: %d attacked message(s) out of the server's bounds, dropped as malformed", rnd,
            len(updates.nodes) - len(keep))
        nodes = [updates.nodes[i] for i in keep]
        return replace(updates, nodes=nodes, updates=lifted, metrics=[updates.metrics[i] for i in keep],
                       messages={n: messages[n] for n in nodes}, malformed=malformed)

    def mimic_target(self, rnd: int, updates: Any, byz: set[int]) -> int | None:
        """Mimic's silo this exchange, learned on the honest lifted messages (model space: a sketched
        round's payloads live in a new space each round); None for the other attacks."""
        if self.s.attack.kind != "mimic":
            return None
        from strategies.replies import flatten

        pairs = [(node, u) for node, u in zip(updates.nodes, updates.updates, strict=True) if node not in byz]
        if not pairs:
            return None
        honest = np.stack([flatten(u) for _, u in pairs]).astype(np.float64)
        target, self.mimic = mimic_learning(self.mimic, honest, [node for node, _ in pairs],
                                            self.s.attack.mimic_warmup, np_rng(self.s.seed, "mimic-z", rnd))
        return target

    def model_space_lift(self, updates: Any) -> Callable[[np.ndarray], np.ndarray] | None:
        """y -> S_t^T y flattened, when the round is sketched and the rule runs on the lifts
        (``aggregation-space = lifted``): what the adaptive attacks must aim at; else None."""
        if (self.s.attack.kind not in ("alie-adaptive", "ipm-adaptive", "edge-of-score") or self.s.sketch.kind == "none"
                or self.s.robust.space != "lifted" or updates.lift is None
                or getattr(self.inner, "impl", None) is None):  # the mean: no rule to simulate
            return None
        from strategies.gradbant import lift_flat

        return lambda y: lift_flat(updates, y)

    def edge_reference(self) -> Any:
        """Whose score edge-of-score aims at: the rule's own Grad-BANT, or (another rule) a Grad-BANT
        reference at the run's settings (strategies/gradbant.py RobustAggregator; noise-aware where
        that score is defined: privacy isrl or off and a sketch kind with an exact noise energy)."""
        impl = getattr(self.inner, "impl", None)
        if impl is not None and impl.s.robust.aggregator == "gradbant":
            return impl
        if self._edge_reference is None:
            from app.sketch_settings import NOISE_AWARE_SKETCH_KINDS
            from strategies.gradbant import RobustAggregator

            s = self.s
            aware = s.privacy.mode in ("isrl", "off") and s.sketch.kind in NOISE_AWARE_SKETCH_KINDS
            robust = replace(s.robust, aggregator="gradbant", pre=(), space="lifted", gradbant_noise_aware=aware)
            self._edge_reference = RobustAggregator(replace(s, robust=robust), self.layout, self.roster, self.phase,
                                                    trust=getattr(self.inner, "trust", None),
                                                    model=getattr(self.inner, "model", None))
        return self._edge_reference

    def edge_messages(self, rnd: int, updates: Any, ex: Any, byz: set[int],
                      lift: Callable[[np.ndarray], np.ndarray] | None) -> dict[int, np.ndarray]:
        """The round's messages with the Byzantine nodes' replaced by :func:`edge_message`: g0, L
        and c of :meth:`edge_reference` at the exchange's point; the plane of two payloads, S g0/scale
        and the honest mean ybar (target honest-mean) or S h/scale (class-bias), read as the server
        reads them (lifted, times scale: -1/lr for a local phase's model changes)."""
        import torch

        from app.algorithms import Phase
        from app.sketch.broadcast import build_sketch, round_sketch
        from strategies.composition import rule_simulator
        from strategies.replies import flatten

        out = {node: np.asarray(m, dtype=np.float32) for node, m in updates.messages.items()}
        honest_nodes = [node for node in updates.nodes if node not in byz]
        if not honest_nodes or ex is None:
            return out
        s = self.s
        scale = -1.0 / s.lr if ex.phase == Phase.LOCAL else 1.0
        g0, smooth, c = self.edge_reference().score_inputs(ex.at, rnd, ex)
        sk = s.sketch
        sketch = build_sketch(round_sketch(sk.kind, sk.ratio, sk.epsilon, sk.layerwise, s.seed, rnd,
                                           sk.error_feedback), list(self.layout.values()))

        def send(x: np.ndarray) -> np.ndarray:  # the payload of a model-space vector
            if sketch is None:
                return np.asarray(x, dtype=np.float64)
            return sketch.compress(torch.from_numpy(np.asarray(x, dtype=np.float32))).numpy().astype(np.float64)

        def read(y: np.ndarray) -> np.ndarray:  # as the server reads a payload: S^T y (decoded), flat
            return flatten(updates.lift(np.asarray(y, dtype=np.float32))).astype(np.float64) \
                if updates.lift is not None else np.asarray(y, dtype=np.float64)

        honest = np.stack([out[node] for node in honest_nodes]).astype(np.float64)
        ybar = honest.mean(axis=0)
        if s.attack.edge_target == "class-bias":
            harm = np.zeros(sum(int(np.prod(v)) for v in self.layout.values()))
            harm[-int(np.prod(list(self.layout.values())[-1])) + s.attack.edge_class] = 1.0
            p_h = send(harm / scale)
        else:
            p_h = ybar
        payloads = np.stack([send(g0 / scale), p_h], axis=1)
        basis = scale * np.stack([read(payloads[:, 0]), read(payloads[:, 1])], axis=1)
        if s.attack.edge_target != "class-bias":
            harm = basis[:, 1]  # the honest mean as the server reads it, in the rule's space
        f_rule = s.robust.byzantine_f if s.robust.byzantine_f >= 0 else len(byz)
        impl = getattr(self.inner, "impl", None)
        aggregate = rule_simulator(impl, rnd, f_rule, g0 / scale, scale, lift) if impl is not None \
            else (lambda rows: rows.mean(axis=0))
        space_lift = lift is None and updates.lift is not None and sketch is not None  # the rule ran on payloads

        def to_rule(vector: np.ndarray) -> np.ndarray:
            return scale * (read(vector) if space_lift else np.asarray(vector, dtype=np.float64))

        try:
            new = edge_message(honest, len(byz), payloads, basis, g0, harm, (smooth, s.lr, c), aggregate, to_rule,
                               self.report)
        except ValueError as exc:  # no edge this exchange (g0 = 0, or no penalty): send the honest mean
            log(WARNING, "round %d: edge-of-score: %s; the Byzantine silos send the honest mean", rnd, exc)
            new = ybar.astype(np.float32)
        return out | {node: new for node in sorted(byz & set(out))}

    def simulated_rule(self, rnd: int, ex: Any,
                       lift: Callable[[np.ndarray], np.ndarray] | None = None) -> Callable[[int, np.ndarray], Any] | None:
        """The inner rule as the adaptive attacker evaluates it (strategies/composition.py), on the
        messages as the server reads them (``lift``; a local phase's model changes read as
        -d / gamma); None for the mean."""
        impl = getattr(self.inner, "impl", None)
        if impl is None or self.s.attack.kind not in ADAPTIVE_ATTACKS:
            return None
        from app.algorithms import Phase
        from strategies.composition import rule_simulator

        scale = -1.0 / self.s.lr if getattr(ex, "phase", None) == Phase.LOCAL else 1.0
        return lambda f, mean: rule_simulator(impl, rnd, f, mean, scale, lift)

    def combine(self, rnd: int, ex: Any, updates: Any) -> tuple[Any, dict[str, Any]]:
        self.report = {}
        out, row = self.inner.combine(rnd, ex, self.attacked(rnd, updates, ex))
        return out, {"byzantine_answered": len(self.byzantine_nodes & set(updates.nodes))} | self.report | row

    def state(self) -> dict[str, Any]:
        inner = self.inner.state()
        m = self.mimic
        mimic = {"t": m.t, "target": -1 if m.target is None else m.target} | (
            {"mu": m.mu, "z": m.z} if m.mu is not None and m.z is not None else {})
        return {"byzantine_nodes": self.byzantine_nodes, "mimic": mimic} | ({"inner": inner} if inner else {})

    def restore(self, state: dict[str, Any]) -> None:
        self.byzantine_nodes = set(state["byzantine_nodes"])
        m = state.get("mimic", {})
        self.mimic = MimicState(int(m.get("t", 0)), m.get("mu"), m.get("z"),
                                None if int(m.get("target", -1)) < 0 else int(m["target"]))
        if "inner" in state:
            self.inner.restore(state["inner"])
