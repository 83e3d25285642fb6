"""Byzantine-robust training: Grad-BANT (trust scores on a server-side trust set) and the
baseline aggregation rules, with JL-sketched uplinks and the attack harness.

Round t (Grad-BANT, the JL + Grad-BANT paper), with S_t the round's sketch (identity without one):

    silo i sends y_i = S_t g_i (honest) or anything (Byzantine); u_i = S_t^T y_i
    theta_i = [ <S_t grad f0(x_t), y_i> - (L gamma / 2) ||u_i||^2 ]_+        (<S g0, y> = <g0, S^T y>)
    p <- (1 - beta) p + beta theta / sum(theta);   a_i = p_i 1[theta_i > 0], renormalised
    x_{t+1} = x_t - gamma S_t^T (sum_i a_i y_i) = x_t - gamma sum_i a_i u_i
    if every theta_i = 0:  p <- (1 - beta) p + beta / n  and  x_{t+1} = x_t

f0 is the cross-entropy on the server's trust set (``trust.size`` records drawn before the silos'
partition, so disjoint from every silo), gamma = ``lr``, L = ``gradbant.smoothness``, beta =
``gradbant.beta``; p has one entry per silo (all N, uniform at the start; a silo not sampled in a
round gets theta = 0 in the momentum update).

Messages: with ``local-steps`` = 1 a silo sends its (clipped, noised if private) minibatch
gradient g; with Q > 1 local SGD steps of size gamma it sends its model change d = w_Q - w_0 and
the server uses the pseudo-gradient g = -d / gamma, computing its reference g0 the same way: Q
SGD steps of size gamma on batches of the trust set (as FLTrust does). The baselines
(``aggregator``: mean, fltrust, krum, multi-krum, trimmed-mean, median, geometric-median,
centered-clipping, smea; strategies/aggregation.py) get the same lifted pseudo-gradients and step
x_{t+1} = x_t - gamma * rule(u_1..u_m), or with ``aggregation-space = sketch`` (RobAJoL; a linear
JL sketch) x_{t+1} = x_t - gamma S_t^T rule(y_1..y_m): the rule and its pre-aggregators on the
payloads in R^k, the aggregate lifted once (strategies/composition.py refuse_space). Krum & co.
are told f = ``byzantine.f``, the number of Byzantine silos the operator states the rule must
tolerate; when it is not stated (-1), only a simulation with an attack can run them: its harness
tells them the number of Byzantine silos among the round's replies (an oracle, as in the papers'
experiments) and the log says so. A rule that needs f refuses to start with neither
(app/config.py): with f = 0 the trimmed mean, Multi-Krum and SMEA are the plain mean, which one
hostile silo ruins.

Identity: p is indexed by the server's own slot for each Flower node (strategies/replies.py
NodeRoster), never by anything a reply says. Which nodes are Byzantine is the experiment's
ground truth, used only by the attack harness and the reported Byzantine weight: when an attack
is configured the server asks each node once, at the start, for its partition id.
"""

from __future__ import annotations

from dataclasses import replace
from logging import INFO, WARNING
from typing import Any, TypedDict

import numpy as np
import torch
from flwr.common import log

from app import wire
from app.algorithms import Phase
from app.config import Settings
from app.data.federated import TrustSet, build_trust_set, dataset_meta
from app.models import build_model
from app.models.losses import cross_entropy
from app.seeding import np_rng
from app.server_device import server_device
from strategies.aggregation import RULES, HonestMajorityRequired
from strategies.exchange import Exchange
from strategies.options import TRUST_AGGREGATORS
from strategies.phase_noise import (ROW_PHASES, HonestNoise, block_shaped_sketch, difference_rows,
                                   minibatch_noise_energy, noise_aware_scores, silo_record_bounds)
from strategies.replies import NodeRoster, Params, Updates, flatten


def gradbant_step(g0: np.ndarray, updates: np.ndarray, p: np.ndarray, idx: np.ndarray, beta: float,
                  smoothness: float, gamma: float,
                  noise_energy: float = 0.0) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray]:
    """One Grad-BANT aggregation (see the module docstring). ``updates`` [m, d] are the lifted
    messages of the silos ``idx`` [m] (indices into ``p``, the momentum over all N silos).
    ``noise_energy`` c > 0 (noise-aware): the penalty is (L gamma / 2) max(||u||^2 - c, 0).
    Returns (direction sum_i a_i u_i, or None when every score is 0; the new p; the active
    weights a [m]; the scores theta [m])."""
    u = np.asarray(updates, dtype=np.float64)
    theta = np.maximum(0.0, noise_aware_scores(g0, u, smoothness, gamma, noise_energy))
    n = len(p)
    if theta.sum() <= 0:
        return None, (1 - beta) * p + beta / n, np.zeros(len(u)), theta
    share = np.zeros(n)
    np.add.at(share, idx, theta / theta.sum())
    p_new = (1 - beta) * p + beta * share
    active = p_new[idx] * (theta > 0)
    a = active / active.sum()
    return a @ u, p_new, a, theta


def secant_smoothness(grad_at: Any, w: dict[str, np.ndarray], g0: np.ndarray, gamma: float,
                      layout: dict[str, tuple[int, ...]]) -> float:
    """L-hat = ||grad f0(x - gamma g0) - grad f0(x)|| / (gamma ||g0||): the trust loss's curvature
    along the step the round is about to take (the descent lemma's L for that step), from the
    server's own data and model only. ``grad_at(params) -> flat gradient``. 0 when g0 = 0;
    the largest float when it is not finite (every penalised score is then 0)."""
    norm = float(np.linalg.norm(g0))
    if norm == 0 or not np.isfinite(norm):
        return 0.0 if norm == 0 else float(np.finfo(np.float64).max)
    x = flatten(w).astype(np.float64)
    moved = wire.unflatten(x - gamma * np.asarray(g0, dtype=np.float64), layout, dtype=np.float32)
    est = float(np.linalg.norm(grad_at(moved) - grad_at(w))) / (gamma * norm)
    return est if np.isfinite(est) else float(np.finfo(np.float64).max)


def message_rows(updates: Updates) -> np.ndarray:
    """The messages as sent [m, k] (float64), in reply order: with a sketch the payloads y_i = S_t x_i
    (``aggregation-space = sketch``: the rule's input, RobAJoL)."""
    return np.stack([np.asarray(updates.messages[node], dtype=np.float64) for node in updates.nodes])


def lift_flat(updates: Updates, vector: np.ndarray) -> np.ndarray:
    """S_t^T ``vector`` (then the mechanism's decode, as for every message) as a flat float64
    vector: the lift of an aggregate computed in the sketch space."""
    if updates.lift is None:
        raise ValueError("aggregation-space = 'sketch' needs the round's lift S_t^T (Updates.lift), got none")
    return flatten(updates.lift(np.asarray(vector, dtype=np.float32))).astype(np.float64)


def check_reference(model: torch.nn.Module, layout: dict[str, tuple[int, ...]]) -> None:
    """ValueError (one line) unless the trust set's reference ``model`` has the federation's
    parameter names and shapes: its gradient g0 is compared with the silos' messages, coordinate
    by coordinate."""
    own = {k: tuple(v.shape) for k, v in model.named_parameters()}
    want = {k: tuple(v) for k, v in layout.items()}
    if own != want:
        diff = next((k for k in {**own, **want} if own.get(k) != want.get(k)), "?")
        raise ValueError(f"the trust set's reference model does not have the federation's parameters: {diff!r} is "
                         f"{own.get(diff)} in the model and {want.get(diff)} in the federation's layout")


def public_noise(s: Settings) -> HonestNoise:
    """What the server can know of an honest silo's noise in the run ``s`` (strategies/phase_noise.py
    ``HonestNoise``): its plan, and the silos' record bounds, read here (``gradbant.silo-records``,
    else the run's partition; ConfigError when neither can be read)."""
    from app.algorithms import get_algorithm
    from app.data import federated

    def partition() -> list[int]:
        return [len(train) for train, _ in federated.silo_splits(s, s.seed, s.robust.trust_size)[1]]

    bounds = silo_record_bounds(s.robust.gradbant_silo_records, partition, s.dataset)
    return HonestNoise(get_algorithm(s.algorithm), s.algorithm_options(), s.privacy, bounds, s.sketch)


class RobustState(TypedDict):
    """What a robust rule carries across rounds: Grad-BANT's trust weights p and centered
    clipping's last aggregate."""

    p: np.ndarray
    center: np.ndarray | None


class RobustAggregator:
    """Grad-BANT or a baseline rule over (possibly sketched, possibly attacked) silo messages: the
    aggregation component (strategies/aggregators.py) of any optimiser. ``phase``: the phase of
    the run's messages when it is one for the whole run (algorithm robust: grad, or local with
    Q > 1); otherwise each exchange's own phase sets noise-aware Grad-BANT's reference and
    allowance (strategies/phase_noise.py)."""

    state_attrs = tuple(RobustState.__annotations__)

    def __init__(self, s: Settings, layout: dict[str, tuple[int, ...]], roster: NodeRoster,
                 phase: Phase | None = None, *, trust: TrustSet | None = None, model: torch.nn.Module | None = None) -> None:
        self.s, self.layout, self.roster = s, layout, roster
        self.phase = phase
        self.p = np.full(s.num_silos, 1.0 / s.num_silos)
        #: the Byzantine nodes the simulation's attack harness names (strategies/byzantine_harness.py
        #: sets it): the reported Byzantine weight, and f when byzantine.f is not stated
        self.oracle: set[int] = set()
        self.center: np.ndarray | None = None  # centered clipping: the previous aggregate
        #: where the trust-set gradients are computed (server-device; app/server_device.py)
        self.device = server_device(s)
        if trust is None and s.robust.aggregator in TRUST_AGGREGATORS:
            trust = build_trust_set(s, s.seed, s.robust.trust_size, s.robust.trust_classes, s.robust.trust_shift)
        self.trust = trust if s.robust.aggregator in TRUST_AGGREGATORS else None
        if self.trust is not None and self.device.type != "cpu":
            self.trust = replace(self.trust, x=self.trust.x.to(self.device), y=self.trust.y.to(self.device))
        if model is None:
            shape, classes = dataset_meta(s)
            model = build_model(s.model, shape, classes, hidden=s.model_hidden, kwargs=s.model_kwargs)
        else:  # the user's own: it must be the federation's model
            check_reference(model, layout)
        self.model = model.to(self.device)
        #: noise-aware Grad-BANT (strategies/phase_noise.py): c of an honest lifted message, per phase
        self.aware = s.robust.aggregator == "gradbant" and s.robust.gradbant_noise_aware
        self._dp_energy: dict[Phase | None, float] = {}
        self._honest: HonestNoise | None = None
        #: ... and with batch-mean messages (grad, anchor, diff) also its batch's sampling noise,
        #: estimated each round on the trust set: kappa (the lift's weights), the smallest silo's n
        self.sampling_aware = self.aware and self.phase != Phase.LOCAL
        self.lift_kappa = self._lift_kappa() if self.sampling_aware else None
        self.fewest_records = self.honest_noise().records[0] if self.sampling_aware else 0
        if self.aware and s.privacy.enabled:
            self.dp_energy(self.phase)  # the silos' record counts, read once, now (ConfigError if unreadable)
        #: the last round's score terms (L used, noise energy c), reported in its row
        self.score_terms: dict[str, float] = {}
        #: an honest-majority rule that kept the model this exchange (the replies cannot outvote
        #: f): its name, f, the rows it saw and why, for the row's ``model_kept`` (app/run_health.py)
        self.kept: dict[str, Any] = {}
        rule = RULES.get(s.robust.aggregator)
        if rule is not None and "f" in rule.inputs and s.robust.byzantine_f < 0 and s.attack.kind != "none":
            log(INFO, "byzantine.f is not set: the attack harness tells %s f = the number of Byzantine silos among "
                "each round's replies (attack.kind = %s, the simulation's ground truth)", s.robust.aggregator,
                s.attack.kind)

    # -- the server's reference on the trust set -------------------------------------------
    def reference(self, w: dict[str, np.ndarray], server_round: int, phase: Phase | None = None) -> np.ndarray:
        """g0: the trust-set gradient at w (one message), or the pseudo-gradient of Q local SGD
        steps of size gamma on trust-set batches of the silos' batch size."""
        assert self.trust is not None
        phase = self.phase if phase is None else phase
        params = self._on_device(w)
        x_all, y_all = self.trust.x, self.trust.y
        rng = np_rng(self.s.seed, "trust-batches", server_round)
        steps = self.s.local_steps if phase == Phase.LOCAL else 1
        k = self.s.batch_size or len(y_all)
        start = {key: v.clone() for key, v in params.items()}
        grad = None
        for _ in range(steps):
            idx = torch.as_tensor(rng.choice(len(y_all), size=min(k, len(y_all)), replace=False), device=self.device) \
                if k < len(y_all) else torch.arange(len(y_all), device=self.device)
            live = {key: v.clone().requires_grad_(True) for key, v in params.items()}
            loss = cross_entropy(torch.func.functional_call(self.model, live, (x_all[idx],)), y_all[idx])
            grad = dict(zip(live, torch.autograd.grad(loss, list(live.values())), strict=True))
            params = {key: (params[key] - self.s.lr * grad[key]).detach() for key in params}
        if phase != Phase.LOCAL:
            assert grad is not None
            return flatten({key: g.cpu().numpy() for key, g in grad.items()})
        return flatten({key: ((start[key] - params[key]) / self.s.lr).cpu().numpy() for key in params})

    def _on_device(self, w: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """The model ``w`` as float32 tensors on the server's device."""
        return {k: torch.tensor(v, dtype=torch.float32, device=self.device) for k, v in w.items()}

    def _lift_kappa(self) -> np.ndarray:
        from app.sketch.noise import lift_noise_weights

        layout = [tuple(v) for v in self.layout.values()]
        n = sum(int(np.prod(shape)) for shape in layout)
        return lift_noise_weights(block_shaped_sketch(self.s.sketch, layout), n)

    def trust_gradient(self, w: dict[str, np.ndarray]) -> np.ndarray:
        """grad f0(w): the mean cross-entropy gradient over the whole trust set (float64, flat)."""
        assert self.trust is not None
        live = {k: v.requires_grad_(True) for k, v in self._on_device(w).items()}
        loss = cross_entropy(torch.func.functional_call(self.model, live, (self.trust.x,)), self.trust.y)
        grads = torch.autograd.grad(loss, list(live.values()))
        return np.concatenate([g.detach().cpu().numpy().reshape(-1) for g in grads]).astype(np.float64)

    def trust_rows(self, w: dict[str, np.ndarray]) -> np.ndarray:
        """The trust set's per-record gradients at w [T, d], clipped as an honest silo clips them
        (``privacy.clip`` under ISRL-DP; unclipped without privacy)."""
        from app.privacy.clipping import clip_rows
        from app.privacy.per_sample import per_sample_grads

        assert self.trust is not None
        rows = per_sample_grads(self.model, self._on_device(w), self.trust.x, self.trust.y)
        if self.s.privacy.enabled:
            rows = clip_rows(rows, self.s.privacy.clip)
        return rows.double().cpu().numpy()

    def dp_energy(self, phase: Phase | None) -> float:
        """c_dp of an honest ``phase`` message (``HonestNoise.energy``), once per phase; 0 unless
        noise-aware under privacy."""
        if not self.aware or not self.s.privacy.enabled:
            return 0.0
        if phase not in self._dp_energy:
            self._dp_energy[phase] = self.honest_noise().energy([tuple(v) for v in self.layout.values()], phase)
        return self._dp_energy[phase]

    def honest_noise(self) -> HonestNoise:
        """The server's public view of an honest silo's noise (:func:`public_noise`), built once."""
        if self._honest is None:
            self._honest = public_noise(self.s)
        return self._honest

    def difference_trust_rows(self, at: dict[str, np.ndarray], prev: dict[str, np.ndarray]) -> np.ndarray:
        """The trust set's per-record differences between ``at`` and ``prev`` [T, d], formed as an
        honest silo forms its difference release's rows (:func:`difference_rows`)."""
        from app.privacy.per_sample import per_sample_grads

        assert self.trust is not None
        now, before = (per_sample_grads(self.model, self._on_device(p), self.trust.x, self.trust.y) for p in (at, prev))
        private = self.s.privacy.enabled
        rows = difference_rows(now, before, self.s.privacy.clip, self.s.diff_clip, private)
        return rows.double().cpu().numpy()

    def score_inputs(self, w: dict[str, np.ndarray], server_round: int,
                     ex: Exchange | None = None) -> tuple[np.ndarray, float, float]:
        """(g0, L, c) of this round's Grad-BANT scores. Noise-aware with batch-mean messages (grad,
        anchor, SPIDER's and SVRG's differences): g0 is the mean of the trust set's own per-record
        rows for the exchange (clipped as the silos clip: gradients at w, or differences between
        the exchange's two points) and c = the phase's DP-noise energy plus the batch's sampling
        noise (strategies/phase_noise.py); otherwise g0 is :meth:`reference` (a difference: the
        trust set's own) and c the DP-noise energy (0 unless noise-aware).
        ``gradbant.smoothness = auto``: L = :func:`secant_smoothness`."""
        phase = self.phase if ex is None else ex.phase
        if self.sampling_aware and phase in ROW_PHASES and (phase != Phase.DIFF or ex is not None):
            assert self.lift_kappa is not None
            if phase == Phase.DIFF:
                assert ex is not None and ex.prev is not None
                rows = self.difference_trust_rows(ex.at, ex.prev)
            else:
                rows = self.trust_rows(w)
            g0 = rows.mean(axis=0)
            n = self.fewest_records
            c = self.dp_energy(phase) + minibatch_noise_energy(rows, self.honest_noise().batch(phase, n), n, self.lift_kappa)
        else:
            g0, c = self._reference_for(ex, w, server_round).astype(np.float64), self.dp_energy(phase)
        smooth = self.s.robust.gradbant_smoothness
        if smooth == "auto":
            smooth = secant_smoothness(self.trust_gradient, w, g0, self.s.lr, self.layout)
        return g0, float(smooth), c

    # -- one round -------------------------------------------------------------------------
    def combine_flat(self, rnd: int, ex: Exchange, updates: Updates) -> tuple[np.ndarray | None, dict[str, Any]]:
        """The rule's direction over one exchange's (lifted; in a simulation, attacked) messages as a flat float64
        gradient (a local phase's model changes d as pseudo-gradients -d / gamma), or None (the
        rule kept nothing), and the row's entries (each silo's weight, the Byzantine weight)."""
        nodes = updates.nodes
        byz_nodes = self.oracle & set(nodes)
        sketched = self.s.robust.space == "sketch"
        rows = message_rows(updates) if sketched else \
            np.stack([flatten(u) for u in updates.updates]).astype(np.float64)
        if ex.phase == Phase.LOCAL:
            rows = -rows / self.s.lr  # model change d -> pseudo-gradient -d / gamma (S d -> S(-d / gamma))
        idx = np.array([self.roster.slot(node) for node in nodes])
        if idx.max() >= len(self.p):  # a node that joined after the start: it starts with no trust
            self.p = np.concatenate([self.p, np.zeros(idx.max() + 1 - len(self.p))])
        f = self.s.robust.byzantine_f if self.s.robust.byzantine_f >= 0 else len(byz_nodes)
        self.kept = {}
        direction, weights = self.aggregate(rows, idx, ex.at, rnd, f, ex)
        if sketched and direction is not None:
            direction = lift_flat(updates, direction)  # S_t^T rule(y_1..y_m), once
        row = {"silo_weights": {int(i): float(a) for i, a in zip(idx, weights)},
               "byzantine_weight": float(sum(a for node, a in zip(nodes, weights) if node in byz_nodes)),
               "byzantine_answered": len(byz_nodes)} | self.score_terms
        if self.kept:  # only when it happened: the rule could not act on these replies
            row["model_kept"] = self.kept | {"replies": len(nodes)}
        return direction, row

    def combine(self, rnd: int, ex: Exchange, updates: Updates) -> tuple[Params | None, dict[str, Any]]:
        """:meth:`combine_flat` in the messages' own space (a local phase: a model change)."""
        direction, row = self.combine_flat(rnd, ex, updates)
        if direction is None:
            return None, row
        if ex.phase == Phase.LOCAL:
            direction = -self.s.lr * direction
        return wire.unflatten(direction, self.layout, dtype=np.float64), row

    def state(self) -> RobustState:
        return RobustState(p=self.p, center=self.center)

    def restore(self, state: dict[str, Any]) -> None:
        for name in self.state_attrs:
            setattr(self, name, state[name])

    def _reference_for(self, ex: Exchange | None, w: dict[str, np.ndarray], server_round: int) -> np.ndarray:
        """The trust set's own version of the exchange's message: g0 at w, the local
        pseudo-gradient, or for a difference grad f0(at) - grad f0(prev) on the whole trust set."""
        if ex is not None and ex.phase == Phase.DIFF and ex.prev is not None:
            return self.trust_gradient(ex.at) - self.trust_gradient(ex.prev)
        return self.reference(w, server_round, None if ex is None else ex.phase)

    def aggregate(self, lifted: np.ndarray, idx: np.ndarray, w: dict[str, np.ndarray], server_round: int,
                  f: int, ex: Exchange | None = None) -> tuple[np.ndarray | None, np.ndarray]:
        """The round's direction (None: the model stays) and the weight each message got, after
        the pre-aggregators ``pre-aggregators`` when set (strategies/composition.py)."""
        if self.s.robust.pre:
            from strategies.composition import pre_aggregate

            return pre_aggregate(self, lifted, idx, w, server_round, f, ex)
        return self.rule_aggregate(lifted, idx, w, server_round, f, ex)

    def rule_aggregate(self, lifted: np.ndarray, idx: np.ndarray, w: dict[str, np.ndarray], server_round: int,
                       f: int, ex: Exchange | None = None) -> tuple[np.ndarray | None, np.ndarray]:
        """The rule alone on ``lifted`` rows (``idx``: their silos' slots in p)."""
        rule = self.s.robust.aggregator
        if rule == "gradbant":
            g0, smooth, c = self.score_inputs(w, server_round, ex)
            if self.s.robust.gradbant_smoothness == "auto" or self.s.robust.gradbant_noise_aware:
                self.score_terms = {"gradbant_smoothness": smooth, "gradbant_noise_energy": c}
            direction, self.p, a, _ = gradbant_step(g0, lifted, self.p, idx, self.s.robust.gradbant_beta,
                                                    smooth, self.s.lr, c)
            if direction is None:
                log(WARNING, "round %d: every Grad-BANT score is 0; the model is unchanged", server_round)
            return direction, a
        spec = RULES[rule]
        kwargs: dict[str, Any] = {}
        if "trust_update" in spec.inputs:
            kwargs["trust_update"] = self._reference_for(ex, w, server_round)
        if "f" in spec.inputs:
            kwargs["f"] = f
        if "center" in spec.inputs:
            kwargs["center"] = self.center if self.center is not None else np.zeros(lifted.shape[1])
        if "tau" in spec.inputs:
            kwargs["tau"] = self.s.robust.cc_tau
        try:
            agg = spec.fn(lifted, **kwargs)
        except (HonestMajorityRequired, ValueError) as exc:  # e.g. Krum with n - f - 2 < 1 this round
            log(WARNING, "round %d: %s; the model is unchanged this round", server_round, exc)
            self.kept = {"rule": rule, "f": int(f), "rows": int(len(lifted)), "reason": str(exc)}
            return None, np.zeros(len(lifted))
        self.center = agg.vector
        if not np.any(agg.vector) and rule == "fltrust":
            return None, agg.weights
        return agg.vector, agg.weights
