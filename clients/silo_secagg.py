"""The secure-aggregation mechanism's silo half (clients/silo_mechanism.py's SiloMechanism):
each release is the integer sum of the batch's rotated, scaled, conditionally rounded rows plus
Skellam noise (app/privacy/skellam/), masked for SecAgg+ (app/secagg/protocol.py), so the server
learns only the sum over the exchange's silos. Its server half is strategies/secagg_relay.py.

What the silo decides itself, whatever the server writes:

* **its noise**: z_req, the total noise multiplier its plan needs at its (epsilon, delta), from
  the Skellam accountant (Agarwal, Kairouz & Liu 2021) at the smallest scale it accepts,
  gamma_min = sqrt(D) / R (its accounting only gets better for a larger gamma:
  app/privacy/skellam/accounting.py); it adds z_add = z_req sqrt((1 + headroom) / count-on), so
  ``count-on`` silos that add theirs reach z_req (variances add: a sum of Skellams is Skellam);
* **whom it counts on**: at most its node config ``secagg-count-on-max`` silos (the run's
  ``secagg.count-on``, or silos-per-round); their noise claims reach it sealed under their static
  keys (in a deployment the keys its operator pinned, ``secagg-peer-keys``). It masks only if
  its own and the smallest count-on - 1 verified claims reach z_req, and it gives its unmask
  shares only if the survivors' claims reach every survivor's requirement;
* **what it records**: the release, as a Skellam release with the integer sensitivities at the
  scale actually used (l2 = 2 B(gamma R, D), l1 = min(l2^2, sqrt(D) l2)) and noise z_req, before
  anything is computed from its records (the ledger's order, clients/silo.py).

The per-exchange protocol state (its fresh mask key, self-mask seed, the shares it holds) lives
in ``state_dir/secagg-silo<i>/`` with mode 0600, so any process serving the silo (a simulation's
actors, a restarted node) continues the exchange; it is removed once the silo has unmasked.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import struct
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import RecordDict

from app import wire
from app.admission import Rejection
from app.algorithms import Phase, ReleaseSpec
from app.privacy.accounting import Release
from app.privacy.envelope import StaticKeys
from app.privacy.mechanism import SkellamSecAggMechanism
from app.privacy.release_plan import ReleasePlan
from app.privacy.settings import SecAggSettings
from app.privacy.shuffle import row_bound
from app.privacy.skellam import encoding as skellam
from app.secagg.protocol import SecAggError, SecAggSilo
from clients.silo_gradients import RecordGradients, ReleaseDraws

#: the bound a release is accounted with
SKELLAM_BOUND = ("multi-dimensional Skellam RDP of Agarwal, Kairouz & Liu 2021 (app/privacy/skellam/accounting.py)"
                 ", composed in RDP and converted by dp-accounting")
SAMPLED_BOUND = ("Theorem 9 of Wang, Balle & Kasiviswanathan 2019 as published, eps(inf) = inf "
                 "(app/privacy/skellam/accounting.py wbk_theorem9)")
_CLAIM = struct.Struct(">dd")  # (z_add, z_req), sealed to each neighbour with its share payload


def encode_claim(z_add: float, z_req: float) -> bytes:
    return _CLAIM.pack(float(z_add), float(z_req))


def decode_claim(blob: bytes) -> tuple[float, float] | None:
    """(z_add, z_req) of a peer's claim, or None when malformed or impossible."""
    if len(blob) != _CLAIM.size:
        return None
    z_add, z_req = _CLAIM.unpack(blob)
    if not (0.0 < z_add < 1e6 and 0.0 < z_req < 1e6):
        return None
    return z_add, z_req


def counted_noise(own: float, peers: list[float], count_on: int) -> float:
    """sqrt(own^2 + the smallest count-on - 1 of the peers' z_add^2): the total noise multiplier a
    silo counts on (inf-free: fewer peers than needed count as 0)."""
    needed = max(count_on - 1, 0)
    smallest = sorted(z * z for z in peers)[:needed]
    if len(smallest) < needed:
        return 0.0
    return math.sqrt(own * own + sum(smallest))


class SecAggSiloMechanism:
    """The silo half of secure aggregation (module docstring). ``options``: the run's secagg
    settings, ``amplification`` resolved for this silo (``amplification_why``: how);
    ``silos_per_round``: the run's; ``clip``, ``diff_clip``: L and C; ``n``, ``dim``, ``index``:
    the silo's records, model size and number; ``run_id``: the run (Flower's, the silo's own
    view); ``keys``: its static key pair; ``pinned``: its operator's peer keys (None: the
    server's, simulations only); ``state_dir``: where the exchange state lives; ``draws``: its
    generators."""

    sealed = True
    #: what the instruction carries for it (app/admission.py)
    ticket = "secagg"
    evaluation_refusal = ("this silo evaluates privately (node config evaluation = 'private'), which is not "
                          "available in secagg mode; its operator may choose open or off")
    composes_fixed = False

    def __init__(self, options: SecAggSettings, amplification: str, amplification_why: str, silos_per_round: int,
                 clip: float, diff_clip: float, n: int, dim: int, index: int, run_id: int, keys: StaticKeys,
                 pinned: frozenset[str] | None, state_dir: str | Path, draws: ReleaseDraws) -> None:
        self.options = replace(options, amplification=amplification)
        self.amplification_why = amplification_why
        self.count_on = options.count_on or silos_per_round
        self.clip, self.diff_clip = clip, diff_clip
        self.n, self.dim, self.index = n, dim, index
        self.padded = skellam.padded_dim(dim)
        self.run_id = int(run_id)
        self.sender_keys: StaticKeys | None = keys
        self.pinned = pinned
        self.state_dir = Path(state_dir) / f"secagg-silo{index}"
        self.draws = draws

    # -- calibration ------------------------------------------------------------------------------
    def gamma_min(self, phase: Phase) -> float:
        """The smallest scale this silo accepts for a ``phase`` release: gamma R >= sqrt(D), so a
        row's rounding moves it by at most half its bound (the calibration's scale)."""
        return skellam.gamma_floor(self.padded, self.bound(phase))

    def bound(self, phase: Phase) -> float:
        """R: the L2 bound of a ``phase`` release's rows (app/privacy/shuffle.py ``row_bound``)."""
        return row_bound(phase == Phase.DIFF, self.clip, self.diff_clip)

    def sensitivities(self, phase: Phase, gamma: float) -> tuple[float, float]:
        """(l1, l2): the replace-one sensitivities of the integer sum of a batch's rounded rows
        at scale ``gamma`` (app/privacy/skellam/encoding.py ``sensitivity``)."""
        return skellam.sensitivity(gamma, self.bound(phase), self.dim)

    def skellam_release(self, kind: str, batch: int, z: float, count: int, disjoint: bool, phase: Phase,
                        gamma: float) -> Release:
        l1, l2 = self.sensitivities(phase, gamma)
        return Release(kind, self.n, batch, z, count, disjoint, "skellam", dim=self.padded,
                       amplification=self.options.amplification, l1=l1, l2=l2)

    def calibration_key(self, key: dict[str, Any]) -> dict[str, Any]:
        return key | {"mode": "secagg", "dim": self.padded, "amplification": self.options.amplification,
                      "gamma_min": "sqrt(D)/R", "clip": self.clip, "diff_clip": self.diff_clip}

    def scale(self, run_plan: ReleasePlan, before: list[Release]) -> float:
        """z_req: the smallest noise multiplier keeping the plan's Skellam releases, each at this
        silo's smallest accepted scale, within (epsilon, delta)."""
        from app.privacy.accounting import bisect_scale, epsilon_spent

        kinds = [(r, Phase(r.phase)) for r in run_plan.releases]

        def eps_at(z: float) -> float:
            return epsilon_spent([self.skellam_release(str(r.phase), r.batch, z * r.weight, r.count, r.disjoint, phase,
                                                       self.gamma_min(phase)) for r, phase in kinds],
                                 run_plan.delta)

        return bisect_scale(eps_at, run_plan.epsilon, run_plan.delta, 1e-3)

    def specs(self, run_plan: ReleasePlan, scale: float) -> dict[str, ReleaseSpec]:
        return run_plan.calibrated(scale)

    def added(self, spec: ReleaseSpec) -> float:
        """z_add: the share of the noise this silo adds to a ``spec`` release."""
        return spec.noise_multiplier * math.sqrt((1.0 + self.options.headroom) / self.count_on)

    def ledger_extra(self, spec: ReleaseSpec) -> dict[str, Any] | None:
        return {"count_on": self.count_on, "z_add": self.added(spec)}

    # -- the exchange's state on disk ---------------------------------------------------------------
    def _path(self, exchange: int) -> Path:
        return self.state_dir / f"run{self.run_id}-exchange{int(exchange)}.json"

    def _save(self, params: wire.SecAggParams, proto: SecAggSilo, extra: Mapping[str, Any]) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self._path(params.exchange)
        tmp = path.with_suffix(".tmp")
        data = {"params": params.config(), "protocol": proto.state_dict(), **extra}
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)

    def _load(self, params: wire.SecAggParams) -> tuple[SecAggSilo, dict[str, Any]] | Rejection:
        try:
            data = json.loads(self._path(params.exchange).read_text())
            stored = wire.SecAggParams.read(data["params"])
        except (OSError, ValueError, KeyError, wire.ReplyError):
            return Rejection(wire.REFUSED_CONFIG, f"secagg: this silo holds no state for exchange {params.exchange} "
                             "(it was not sent the exchange's keys query, or has finished it)")
        if not stored.same_exchange(params):
            return Rejection(wire.REFUSED_CONFIG, "secagg: the request's parameters differ from those of the "
                             "exchange's keys query")
        return SecAggSilo.from_state(data["protocol"], self.sender_keys, randbelow=secrets.randbelow), data

    def _peers_static(self, static_keys: Mapping[int, str]) -> dict[int, bytes]:
        """The roster's static keys this silo seals to: the server's (a simulation), or only those
        its operator pinned (a silo whose key the server swapped is left out)."""
        return {n: bytes.fromhex(k) for n, k in static_keys.items() if self.pinned is None or k in self.pinned}

    # -- rounds 1, 2 and 4 (the handlers of app/node_runtime.py) -----------------------------------
    def advertise(self, params: wire.SecAggParams, me: int, spec: ReleaseSpec | None) -> RecordDict | Rejection:
        """Round 1: a fresh mask key for the exchange, with the batch K and the noise z_add it adds."""
        if spec is None:
            return Rejection(wire.REFUSED_CONFIG, f"secagg: phase {params.phase!r} is not one this silo releases")
        proto = SecAggSilo(int(me), self.sender_keys, params.context(self.run_id), params.threshold, params.bits,
                           self.padded, secrets.randbelow)
        advert = proto.advertise()
        self._save(params, proto, {"me": int(me)})
        return wire.advert_reply(advert.encode(), spec.batch, self.added(spec))

    def share(self, request: wire.ShareRequest, spec: ReleaseSpec | None) -> RecordDict | Rejection:
        """Round 2: Shamir shares of the self-mask seed and mask key, sealed to each neighbour with
        this silo's noise claim (z_add, z_req)."""
        loaded = self._load(request.params)
        if isinstance(loaded, Rejection):
            return loaded
        if spec is None:
            return Rejection(wire.REFUSED_CONFIG, f"secagg: phase {request.params.phase!r} is not one this silo releases")
        proto, data = loaded
        roster = len(request.adverts)
        if not roster // 2 < request.params.threshold <= roster:
            return Rejection(wire.REFUSED_POLICY, f"secagg: threshold t = {request.params.threshold} for a "
                             f"neighbourhood of {roster} silos; this silo requires a majority (t in "
                             f"[{roster // 2 + 1}, {roster}]) so that no two disjoint sets of silos open its secrets")
        from app.secagg.protocol import Advert

        try:
            adverts = {n: Advert.decode(b) for n, b in request.adverts.items()}
            peers = self._peers_static(request.static_keys)
            assert self.sender_keys is not None
            peers[int(data["me"])] = self.sender_keys.public  # its own key is its own, whatever the server says
            roster_nodes = {n: a for n, a in adverts.items() if n in peers}
            blobs = proto.share(roster_nodes, peers, encode_claim(self.added(spec), spec.noise_multiplier))
        except SecAggError as exc:
            return Rejection(wire.REFUSED_POLICY, f"secagg: {exc}")
        self._save(request.params, proto, {k: v for k, v in data.items() if k not in ("params", "protocol")})
        return wire.ShareReply(blobs).encode()

    def unmask(self, request: wire.UnmaskRequest) -> RecordDict | Rejection:
        """Round 4: the shares the server may have, if the survivors' claimed noise reaches every
        survivor's requirement (else nothing: the sum stays closed)."""
        loaded = self._load(request.params)
        if isinstance(loaded, Rejection):
            return loaded
        proto, data = loaded
        claims = {int(k): tuple(v) for k, v in data.get("claims", {}).items()}
        me = int(data["me"])
        own = data.get("own")
        if own is None:
            return Rejection(wire.REFUSED_CONFIG, "secagg: this silo sent no masked vector in this exchange")
        claims[me] = (float(own[0]), float(own[1]))
        survivors = [int(n) for n in request.survivors]
        known = [claims[n] for n in survivors if n in claims]
        total = math.sqrt(sum(z_add * z_add for z_add, _ in known))
        need = max(z_req for _, z_req in known)
        if total < need * (1.0 - 1e-9):
            return Rejection(wire.REFUSED_POLICY, f"secagg: the {len(survivors)} survivors' claimed noise (z = "
                             f"{total:.4g}) is below a survivor's requirement (z = {need:.4g}); too many silos dropped "
                             "out for this sum to be private, so this silo opens nothing")
        try:
            reply = proto.unmask(survivors, [int(n) for n in request.dropped])
        except SecAggError as exc:
            return Rejection(wire.REFUSED_POLICY, f"secagg: {exc}")
        self._save(request.params, proto, {k: v for k, v in data.items() if k not in ("params", "protocol")})
        return wire.BlobReply(reply.encode()).encode()

    # -- round 3: the release (clients/silo.py's order: price, record, compute) --------------------
    def releases(self, ins: wire.Instruction, spec: ReleaseSpec, disjoint_kind: str) -> list[Release] | Rejection:
        """The release's ledger row, once the exchange's shares are verified and the claimed noise
        of the silos it counts on reaches its requirement; else why it releases nothing."""
        params = ins.secagg
        if params is None:
            return Rejection(wire.REFUSED_CONFIG, "this is a secagg run: the instruction must carry the exchange's "
                             "secagg parameters and shares")
        phase, rnd = ins.phase, ins.round
        if params.phase != str(phase) or params.round != rnd:
            return Rejection(wire.REFUSED_CONFIG, "secagg: the instruction's round and phase differ from the exchange's")
        if params.gamma < self.gamma_min(phase) * (1.0 - 1e-12):
            return Rejection(wire.REFUSED_POLICY, f"secagg: scale gamma = {params.gamma:.6g} is below this silo's "
                             f"smallest, sqrt(D)/R = {self.gamma_min(phase):.6g} (its noise is calibrated there)")
        if phase == Phase.DISJOINT and not 1 <= rnd <= self.n // spec.batch:
            return Rejection(wire.REFUSED_BUDGET, f"round {rnd} has no block of K={spec.batch} records left: "
                             f"the n={self.n} records hold {self.n // spec.batch} disjoint blocks")
        loaded = self._load(params)
        if isinstance(loaded, Rejection):
            return loaded
        proto, data = loaded
        if data.get("own") is not None:
            return Rejection(wire.REFUSED_CONFIG, "secagg: this silo already sent its vector in this exchange")
        try:
            verified = proto.verify(ins.shares or {})
        except SecAggError as exc:
            return Rejection(wire.REFUSED_POLICY, f"secagg: {exc}")
        claims = {n: decode_claim(c) for n, c in verified.items()}
        peers = [c[0] for c in claims.values() if c is not None]
        counted = counted_noise(self.added(spec), peers, self.count_on)
        if counted < spec.noise_multiplier * (1.0 - 1e-9):
            return Rejection(wire.REFUSED_POLICY, f"secagg: this silo counts on {self.count_on} silos' noise and the "
                             f"{len(peers)} verified neighbours' claims reach z = {counted:.4g}, below its z = "
                             f"{spec.noise_multiplier:.4g}; nothing was released")
        kind = disjoint_kind if phase == Phase.DISJOINT else str(phase)
        try:  # the scale's integers must fit: the row bound's int64 norms, the noise's Poisson draws
            release = self.skellam_release(kind, spec.batch, spec.noise_multiplier, 1, phase == Phase.DISJOINT, phase,
                                           params.gamma)
            if (self.added(spec) * release.l2) ** 2 > skellam.MAX_VARIANCE:
                raise ValueError("its Skellam noise's variance exceeds 2**63")
        except ValueError as exc:
            return Rejection(wire.REFUSED_POLICY, f"secagg: scale gamma = {params.gamma:.6g} is too large to encode "
                             f"({exc}); nothing was released")
        self._pending = (params, proto, data, claims)
        return [release]

    #: what releases() verified, for answer() right after the ledger recorded the release
    _pending: Any = None

    def answer(self, ins: wire.Instruction, spec: ReleaseSpec, w0: Mapping[str, torch.Tensor],
               w_prev: Mapping[str, torch.Tensor] | None, seq: int, spent: float,
               gradients: RecordGradients) -> RecordDict | Rejection:
        """The recorded release: the batch's rows encoded with Skellam noise z_add l2, masked."""
        params, proto, data, claims = self._pending
        self._pending = None
        phase = ins.phase
        if phase == Phase.DIFF:
            assert w_prev is not None
            x, y = gradients.batch(spec.batch, seq, 0)
            rows = gradients.difference_rows(w0, w_prev, x, y)
        else:
            x, y = gradients.block(spec.batch, ins.round) if phase == Phase.DISJOINT else \
                gradients.batch(spec.batch, seq, 0)
            rows = gradients.clipped_rows(w0, x, y)
        _, l2 = self.sensitivities(phase, params.gamma)
        code = skellam.SkellamCode(params.bits, params.gamma, self.dim, params.seed, self.bound(phase))
        mu_add = (self.added(spec) * l2) ** 2
        mechanism = SkellamSecAggMechanism(code, mu_add, self.draws.np_rng(seq, "secagg-encoding", 0))
        encoded = mechanism.release(rows).numpy().astype(np.uint64)
        try:
            masked = proto.masked(ins.shares or {}, encoded)
        except SecAggError as exc:
            return Rejection(wire.REFUSED_POLICY, f"secagg: {exc}; the release was recorded")
        data = {k: v for k, v in data.items() if k not in ("params", "protocol")}
        data["own"] = [self.added(spec), spec.noise_multiplier]
        data["claims"] = {str(n): list(c) for n, c in claims.items() if c is not None}
        self._save(params, proto, data)
        return wire.MaskedReply(masked, spec.batch, spent, tuple(sorted(proto.u2))).encode(params.bits)

    def report(self, plan: Mapping[str, ReleaseSpec]) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
        from app.privacy.policy import collusion_threshold

        k = collusion_threshold(self.count_on, self.count_on)
        secagg = {"bits": self.options.bits, "threshold": self.options.threshold or "majority of each exchange",
                  "degree": self.options.degree or "all", "count_on": self.count_on,
                  "headroom": self.options.headroom, "padded_dim": self.padded,
                  "record_amplification": (f"sampling: {SAMPLED_BOUND}"
                                           if self.options.amplification == "sampling" else "none"),
                  "record_amplification_why": self.amplification_why,
                  "trust": {"count_on": self.count_on, "collusion_threshold": k,
                            "holds": ("unless the server colludes with at least t silos of an exchange (it then "
                                      "learns this silo's noisy vector, which carries the noise this silo adds) and, "
                                      + ("with count-on 1, whatever the other silos do" if self.count_on <= 1 else
                                         f"with count-on {self.count_on}, unless one of the silos it counts on lies "
                                         "about its noise or colludes"))}}
        planned = [{"phase": r.phase, "batch": r.batch, "count": r.count, "disjoint": r.disjoint,
                    "noise_multiplier": r.noise_multiplier, "z_add": self.added(r)} for r in plan.values()]
        return ({"mechanism": "skellam (secure aggregation)", "secagg": secagg}, planned, SKELLAM_BOUND)
