"""The server's part in secure aggregation (privacy.mode secagg): SecAgg+ on Flower's Message API.

The server never holds a silo's vector: each silo sends its Skellam-noised integer encoding
(app/privacy/skellam/) masked with pairwise masks and a self-mask (app/secagg/protocol.py), and
the server learns only their sum modulo 2**bits, unless it colludes with at least t silos. One
exchange is four message rounds (app/wire/secagg.py):

1. **keys**: each sampled silo sends a fresh X25519 mask key (its advert), its batch K and the
   noise multiplier it adds (both public: the ledger reports them); the adverts that arrive are
   the roster U1, and U1 must reach the threshold t;
2. **share**: the server sends U1 the roster and the static keys it knows the silos by; each silo
   seals, to each neighbour, Shamir shares of its self-mask seed and mask key with its noise
   claim; U2 is the silos whose payloads arrived;
3. **train**: each silo of U2 gets the instruction with the payloads sealed to it, records its
   release, and sends y = encode(rows) + masks mod 2**bits; U3 is the silos whose vector arrived;
4. **unmask**: U3 is asked for the shares of U3's self-mask seeds and of the dropped silos' mask
   keys (never both for one silo: a silo refuses that); with t replies the server removes the
   masks and decodes the sum into the mean of the records' rows (rotation undone, scale divided).

The encoding's scale gamma is the server's choice for the exchange (from the bits, the rows'
bound, the model size and the K and noise the silos announced), so that the sum rarely wraps
around the modulus (``wrap_bound`` in the round's row); whatever gamma it sends, each silo
calibrates its noise for it, so a hostile gamma costs accuracy, never privacy. A silo that drops
out at any step is a dropped silo; fewer than t left, or a malformed message, abort the exchange
(no update), never the run.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid

from app import wire
from app.algorithms import Phase
from app.privacy.settings import SecAggSettings
from app.privacy.shuffle import row_bound
from app.privacy.skellam import encoding as skellam
from app.secagg.protocol import Advert, SecAggAborted, SecAggError, SecAggServer, UnmaskReply, default_threshold
from strategies.messaging import query_keys
from strategies.replies import Updates, check_bounded, sort_replies


def exchange_threshold(setting: int, holders: int) -> int:
    """t for neighbourhoods of ``holders`` share holders (every silo of the exchange, or a
    SecAgg+ neighbourhood: degree + 1): ``secagg.threshold``, or a majority
    (app/secagg/protocol.py ``default_threshold``): no two disjoint sets can then both open a secret."""
    return int(setting) if setting else default_threshold(max(holders, 1))


@dataclass
class SecAggExchange:
    """One exchange's state on the server: its parameters, the protocol's server half, the
    payloads routed to each silo of U2, and the announced K and noise of each silo."""

    params: wire.SecAggParams | None
    server: SecAggServer | None = None
    routed: dict[int, dict[int, bytes]] = field(default_factory=dict)
    records: dict[int, int] = field(default_factory=dict)
    noise: dict[int, float] = field(default_factory=dict)
    code: Any = None
    wrap_bound: float = math.nan
    aborted: str = ""


class SecAggRelay:
    """The secure-aggregation mechanism's server half (strategies/server_mechanism.py).
    ``options``: the run's secagg settings; ``clip``, ``diff_clip``: the rows' bounds;
    ``seed``: the run seed (the rotation's and graph's public seeds derive from it)."""

    helper_nodes = 0
    folds_evaluation = False
    under_flower_start = False

    def __init__(self, options: SecAggSettings, clip: float, diff_clip: float, seed: int,
                 client_error: Callable[[Message, str], str]) -> None:
        self.options = options
        self.clip, self.diff_clip = clip, diff_clip
        self.seed = int(seed)
        self.client_error = client_error
        self.layout: Mapping[str, tuple[int, ...]] = {}
        self.dim = 0
        self.silo_keys: dict[int, str] = {}
        self.exchanges = 0
        self.last: SecAggExchange | None = None

    def bind(self, layout: Mapping[str, tuple[int, ...]]) -> None:
        self.layout = layout
        self.dim = sum(int(np.prod(shape)) for shape in layout.values())

    def silo_nodes(self, nodes: Iterable[int]) -> list[int]:
        return list(nodes)

    def silo_count(self, nodes: Iterable[int]) -> int:
        return len(list(nodes))

    def discover(self, grid: Grid, nodes: Iterable[int], timeout: float) -> None:
        """Every silo's static public key (the shares it is sent are sealed to it)."""
        for node, (role, key) in query_keys(grid, nodes, timeout, self.client_error).items():
            if role == wire.ROLE_SILO:
                self.silo_keys[node] = key

    # -- rounds 1 and 2 ---------------------------------------------------------------------------
    def open_exchange(self, grid: Grid, rnd: int, phase: Phase, nodes: list[int], timeout: float,
                      run_id: int) -> SecAggExchange:
        """Keys and shares for the next exchange among ``nodes``; the returned state routes the
        training instruction (:meth:`address`) and is closed by :meth:`collect`."""
        self.exchanges += 1
        missing = [n for n in nodes if n not in self.silo_keys]
        if missing:  # a silo that was slow or absent at discovery (its first ClientApp start) is asked again
            self.discover(grid, missing, timeout)
        seed = int.from_bytes(hashlib.sha256(f"silofl-secagg|{self.seed}|{self.exchanges}".encode()).digest()[:8],
                              "big") >> 1
        candidates = [n for n in nodes if n in self.silo_keys]
        degree = self.options.degree
        t = exchange_threshold(self.options.threshold, min(degree + 1, len(candidates)) if degree else len(candidates))
        params = wire.SecAggParams(self.exchanges, rnd, str(phase), self.options.bits, t, self.options.degree, 1.0,
                                   seed)
        ex = SecAggExchange(params)
        self.last = ex
        if len(candidates) < t or len(candidates) < 2:
            ex.aborted = f"{len(candidates)} silo(s) with known keys, fewer than the threshold t = {t}"
            return ex
        context = params.context(run_id)
        ex.server = SecAggServer(context, t, self.options.bits, skellam.padded_dim(self.dim),
                                 self.options.degree or None, seed.to_bytes(8, "big"))
        adverts: dict[int, Advert] = {}

        def keep_advert(node: int, content: RecordDict) -> None:
            reply = wire.BlobReply.decode(content)
            k, z = wire.advert_terms(content)
            try:
                adverts[node] = Advert.decode(reply.blob)
            except SecAggError as exc:
                raise wire.ReplyError(f"secagg advert: {exc}") from exc
            ex.records[node], ex.noise[node] = k, z

        self._round(grid, rnd, [Message(params.encode(), dst_node_id=n, message_type=wire.SECAGG_KEYS_QUERY)
                                for n in candidates], candidates, keep_advert, "secagg keys", timeout)
        try:
            roster = ex.server.adverts(adverts)
        except SecAggAborted as exc:
            ex.aborted = f"keys: {exc}"
            return ex
        gamma, ex.wrap_bound = self._scale(phase, [n for n in roster], ex)
        ex.params = params = wire.SecAggParams(params.exchange, rnd, str(phase), params.bits, t, params.degree,
                                               gamma, seed)
        ex.code = skellam.SkellamCode(params.bits, gamma, self.dim, seed,
                                      row_bound(phase == Phase.DIFF, self.clip, self.diff_clip))
        shares: dict[int, dict[int, bytes]] = {}

        def keep_shares(node: int, content: RecordDict) -> None:
            shares[node] = dict(wire.ShareReply.decode(content).blobs)

        requests = []
        for n in sorted(roster):  # each silo gets its neighbourhood's adverts and static keys (and its own)
            near = ex.server.roster_for(n)
            request = wire.ShareRequest(params, {j: a.encode() for j, a in near.items()},
                                        {j: self.silo_keys[j] for j in near})
            requests.append(Message(request.encode(), dst_node_id=n, message_type=wire.SECAGG_SHARE_QUERY))
        self._round(grid, rnd, requests, sorted(roster), keep_shares, "secagg share", timeout)
        try:
            ex.routed = ex.server.route(shares)
        except SecAggAborted as exc:
            ex.aborted = f"share: {exc}"
        return ex

    def _scale(self, phase: Phase, roster: list[int], ex: SecAggExchange) -> tuple[float, float]:
        """gamma for the exchange and the bound on a coordinate's wrap-around probability: the
        largest gamma within the wrap target (app/privacy/skellam/encoding.py ``choose_gamma``),
        from the K and noise the roster announced, and never below the silos' floor sqrt(D)/R
        (``gamma_floor``: the scale they calibrated at; below it they refuse)."""
        bound = row_bound(phase == Phase.DIFF, self.clip, self.diff_clip)
        padded = skellam.padded_dim(self.dim)
        floor = skellam.gamma_floor(padded, bound)
        records = sum(ex.records[n] for n in roster)
        # the noise's std in signal units: z * l2 / gamma, largest (most rounding slack) at the floor
        _, l2 = skellam.sensitivity(floor, bound, self.dim)
        noise = math.sqrt(sum(ex.noise[n] ** 2 for n in roster)) * l2 / floor
        try:
            gamma = max(skellam.choose_gamma(self.options.bits, bound, self.dim, records, noise).gamma, floor)
        except ValueError:  # no scale fits these records in the bits: the floor, and its (large) wrap bound
            gamma = floor
        wrap = skellam.wrap_probability(gamma, bits=self.options.bits, clip=bound, dim=self.dim,
                                        records_total=records, noise_std=noise)
        return gamma, wrap

    def _round(self, grid: Grid, rnd: int, messages: list[Message], sent_to: list[int],
               accept: Callable[[int, RecordDict], None], what: str, timeout: float) -> Updates:
        """Send one protocol round and sort its replies (a failed, refused or malformed reply
        drops that silo; nothing raises)."""
        out = Updates()
        replies = grid.send_and_receive(messages, timeout=timeout)
        sort_replies(rnd, replies, sent_to, lambda msg, _: self.client_error(msg, what), accept, out)
        return out

    # -- round 3 ----------------------------------------------------------------------------------
    def address(self, messages: list[Message], ex: SecAggExchange | None) -> list[Message]:
        """The training instructions of U2, each with the share payloads sealed to its silo and
        the exchange's parameters (the instruction's content is shared; each gets its own copy)."""
        if ex is None or ex.aborted or ex.params is None:
            return []
        out = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            if node not in ex.routed:
                continue
            content = wire.with_secagg(msg.content, ex.params, ex.routed[node])
            out.append(Message(content, dst_node_id=node, message_type=msg.metadata.message_type))
        return out

    # -- round 4 ----------------------------------------------------------------------------------
    def collect(self, grid: Grid, rnd: int, phase: Phase, ticket: SecAggExchange | None, replies: Iterable[Message],
                nodes: list[int], reader: Any, timeout: float, run_id: int) -> Updates:
        """The masked vectors, the unmask round, and the decoded mean as the exchange's one update."""
        out = Updates()
        ex = ticket
        if ex is None or ex.server is None or ex.params is None or ex.aborted:
            out.shuffle_refusal = f"secagg aborted: {ex.aborted if ex is not None else 'no exchange'}"
            log(WARNING, "round %d: %s", rnd, out.shuffle_refusal)
            return out
        params = ex.params
        padded = skellam.padded_dim(self.dim)
        masked: dict[int, np.ndarray] = {}
        views: dict[int, frozenset[int]] = {}

        def accept(node: int, content: RecordDict) -> None:
            reply = wire.MaskedReply.decode(content, params.bits, padded)
            if reply.records != ex.records.get(node):
                raise wire.ReplyError(f"secagg: the reply sums {reply.records} records, the advert announced "
                                      f"{ex.records.get(node)}")
            masked[node], views[node] = reply.vector, frozenset(reply.view)
            out.nodes.append(node)
            out.metrics.append(wire.TrainReply({}, reply.eps_spent))

        sent_to = sorted(ex.routed)
        sort_replies(rnd, replies, sent_to, self.client_error, accept, out)
        out.uplink_floats = len(masked) * padded * wire.vector_dtype(params.bits).itemsize / 4.0
        survivors = ex.server.collect(masked, views=views)
        dropped = ex.server.dropped
        requests = [Message(wire.UnmaskRequest(params, sorted(alive), sorted(gone)).encode(), dst_node_id=n,
                            message_type=wire.SECAGG_UNMASK_QUERY)
                    for n, (alive, gone) in sorted(ex.server.unmask_requests().items())]
        unmasks: dict[int, UnmaskReply] = {}

        def keep_unmask(node: int, content: RecordDict) -> None:
            try:
                unmasks[node] = UnmaskReply.decode(wire.BlobReply.decode(content).blob)
            except SecAggError as exc:
                raise wire.ReplyError(f"secagg unmask: {exc}") from exc

        tally = self._round(grid, rnd, requests, sorted(survivors), keep_unmask, "secagg unmask", timeout)
        try:
            total = ex.server.finish(unmasks)
        except SecAggAborted as exc:
            reasons = "; ".join(sorted(set(tally.refused.values())))[:500]
            out.shuffle_refusal = f"secagg: the sum did not open ({exc})" + (f"; silos said: {reasons}" if reasons else "")
            out.shuffle_dropped = len(masked)
            log(WARNING, "round %d: %s", rnd, out.shuffle_refusal)
            return out
        records = sum(ex.records[n] for n in survivors)
        mean = skellam.decode_sum(total, ex.code, records)
        try:
            check_bounded("decoded secure sum", mean)
        except wire.ReplyError as exc:
            log(WARNING, "round %d: the decoded sum was dropped: %s", rnd, exc)
            out.shuffle_dropped = len(masked)
            return out
        out.updates.append(wire.unflatten(mean.astype(np.float32), self.layout))
        out.shuffle_accepted = len(survivors)
        out.shuffle_dropped = len(dropped)
        return out

    def row(self, tally: Updates) -> dict[str, Any]:
        """The round's row entries: silos that dropped after sharing, the exchange's scale, its
        wrap-around bound (per coordinate) and rounding-bias bound, and why the sum did not open."""
        extra: dict[str, Any] = {"secagg_dropped": tally.shuffle_dropped}
        if self.last is not None and self.last.params is not None:
            extra |= {"secagg_gamma": self.last.params.gamma, "secagg_wrap_bound": self.last.wrap_bound,
                      # the L2 bound on the decoded mean's bias from conditional rounding (signal units)
                      "secagg_bias_bound": skellam.rounding_bias_bound(self.last.params.gamma)}
        if tally.shuffle_refusal:
            extra["secagg_refused"] = tally.shuffle_refusal
        return extra
