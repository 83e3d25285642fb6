"""A silo's own privacy policy, read from its node config (never from the run config).

The run config is written by whoever submits the run (the server side), so everything that
protects the silo's records is decided here, by the silo's operator:

``epsilon-cap`` / ``delta-cap``
    the largest (epsilon, delta) the silo agrees to; a run asking for more, for ``delta="auto"``
    whose 1/n^2 is above the cap, or for no privacy at all is refused.
``ledger-scope``
    ``node``: one lifetime ledger for everything the node ever releases, with the caps as its
    budget (delta 1/n^2 without a delta cap, whatever a run asks), the default when
    ``epsilon-cap`` is set; ``run``: one ledger and budget per Flower run (the default without
    caps, i.e. in simulations; with a cap only when the operator says so). A ledger that cannot
    be read, or was written for another budget, makes the silo refuse everything, not crash.
``noise-seed``
    ``os``: noise and batches from the OS CSPRNG (the default when a cap is set); ``run``:
    derived from the run seed (reproducible simulations; the server can recompute them).
``evaluation``
    ``open``: exact evaluation statistics and, on request, the full training gradient (outside
    the DP guarantee; the default without caps, as in the paper's experiments); ``private``:
    noisy error counts and clipped loss sums, each evaluation a Gaussian release charged to the
    ledger and planned in the calibration; ``off``: evaluation is refused (the default when a
    cap is set).
``evaluation-noise-ratio``
    with ``evaluation="private"``: an evaluation's noise multiplier relative to the training
    releases' (default 1).

``allow-non-private``
    ``true``: the node also trains in runs with ``privacy.mode = "off"`` (no noise, no ledger
    budget); ``false``: it refuses them. The default is ``true`` only in a simulation without
    caps; a deployed node refuses non-private runs unless its operator sets it, and a node with a
    cap refuses them whatever it says (``allow-non-private = true`` with a cap is an error).

``shuffle-count-on-max``
    shuffle DP: the most silos whose noise this silo agrees to count on. A silo carries
    (1 + headroom) / count-on of the noise its guarantee needs and trusts the other silos in its
    sums for the rest, so the run config (``shuffle.count-on``, written by the server's side)
    cannot raise it above this bound: a run asking for more is refused. Default 1 (the silo
    adds all the noise its epsilon needs, trusting no other silo) when a cap is set or the node
    is deployed; unbounded in a simulation without caps.
``secagg-count-on-max``
    secure aggregation: the same bound for ``secagg.count-on``.
``secagg-peer-keys``
    secure aggregation: a file of the other silos' static public keys (64 hex characters a
    line). The silo seals its shares only to these keys and opens only payloads from them, so a
    server that substitutes keys gets nothing. A deployed silo refuses secagg without it; a
    simulation's silos take the keys the server saw.

A node "sets a cap" when it has ``epsilon-cap`` or ``delta-cap``: that is how an operator says
this node guards real records, and every default above then takes the safe side.

A node is **deployed** when it serves a real federation: the silo service
(app/runtime/silo_service.py) always is, and so is a ClientApp running in one of Flower's
``flwr-clientapp`` processes; Flower's simulation engine and the in-process grid
(app/local_grid.py) are not. A deployed node takes the safe side without caps too: noise and
batches from the OS CSPRNG (unless ``noise-seed = "run"``), no evaluation replies (unless
``evaluation`` says otherwise) and no non-private runs (unless ``allow-non-private = true``).
Simulations keep the defaults above, so their runs stay reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LEDGER_SCOPES = ("run", "node")
NOISE_SEEDS = ("run", "os")
EVALUATION_POLICIES = ("open", "private", "off")
#: node-config keys this module reads (besides the silo's identity and paths, read by the ClientApp)
POLICY_KEYS = ("epsilon-cap", "delta-cap", "ledger-scope", "noise-seed", "evaluation", "evaluation-noise-ratio",
               "allow-non-private", "shuffle-count-on-max", "shuffle-trust-silo-sampling", "secagg-count-on-max",
               "secagg-peer-keys")


class PolicyError(ValueError):
    """A node-config policy value is malformed."""


@dataclass(frozen=True)
class NodePolicy:
    epsilon_cap: float | None = None
    delta_cap: float | None = None
    ledger_scope: str = "run"
    #: None: the run config decides (only possible without caps)
    noise_seed: str | None = None
    evaluation: str = "open"
    evaluation_noise_ratio: float = 1.0
    #: whether the node trains in runs without privacy (privacy.mode = "off")
    allow_non_private: bool = True
    #: a real deployment (silo service, flwr-clientapp), not a simulation
    deployed: bool = False
    #: shuffle DP: the most silos whose noise this silo counts on (None: no bound)
    shuffle_count_on_max: int | None = None
    #: shuffle DP: claim amplification by the shuffler's silo sampling (app/privacy/silo_sampling.py)
    shuffle_trust_silo_sampling: bool = False
    #: secure aggregation: the most silos whose noise this silo counts on (None: no bound)
    secagg_count_on_max: int | None = None
    #: secure aggregation: the file of the other silos' static public keys (64 hex characters a
    #: line) its operator pinned; None: take them from the server (simulations only)
    secagg_peer_keys: str | None = None

    @property
    def capped(self) -> bool:
        return self.epsilon_cap is not None or self.delta_cap is not None

    @property
    def safe(self) -> bool:
        """The node guards real records (it has a cap, or it is deployed): every default, and
        every rule about what a run may ask of it, takes the safe side."""
        return self.capped or self.deployed


def _choice(node: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str | None) -> str | None:
    if key not in node:
        return default
    value = str(node[key])
    if value not in allowed:
        raise PolicyError(f"node config {key} = {value!r}; allowed: {', '.join(allowed)}")
    return value


def _positive(node: Mapping[str, Any], key: str, hi: float | None = None) -> float | None:
    if key not in node:
        return None
    try:
        value = float(node[key])
    except (TypeError, ValueError):
        raise PolicyError(f"node config {key} = {node[key]!r} must be a number") from None
    if not (math.isfinite(value) and value > 0 and (hi is None or value < hi)):
        allowed = "(0, inf)" if hi is None else f"(0, {hi:g})"
        raise PolicyError(f"node config {key} = {node[key]!r} is out of range; allowed: {allowed}")
    return value


def _flag(node: Mapping[str, Any], key: str) -> bool | None:
    if key not in node:
        return None
    value = node[key]
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise PolicyError(f"node config {key} = {value!r}; allowed: true, false")


def node_policy(node: Mapping[str, Any], *, deployed: bool = False) -> NodePolicy:
    """Parse the policy keys of a node config, with the defaults described above (``deployed``:
    the node serves a real federation, so the safe defaults hold without caps too)."""
    eps_cap = _positive(node, "epsilon-cap")
    delta_cap = _positive(node, "delta-cap", hi=1.0)
    capped = eps_cap is not None or delta_cap is not None
    safe = capped or deployed
    scope = _choice(node, "ledger-scope", LEDGER_SCOPES, "node" if eps_cap is not None else "run")
    if scope == "node" and eps_cap is None:
        raise PolicyError("node config ledger-scope = 'node' needs epsilon-cap (the silo's lifetime budget)")
    ratio = _positive(node, "evaluation-noise-ratio")
    allow = _flag(node, "allow-non-private")
    if allow and capped:
        raise PolicyError("node config allow-non-private = true contradicts its privacy cap (epsilon-cap/delta-cap); "
                          "remove one of them")
    return NodePolicy(
        epsilon_cap=eps_cap, delta_cap=delta_cap, ledger_scope=str(scope),
        noise_seed=_choice(node, "noise-seed", NOISE_SEEDS, "os" if safe else None),
        evaluation=str(_choice(node, "evaluation", EVALUATION_POLICIES, "off" if safe else "open")),
        evaluation_noise_ratio=1.0 if ratio is None else ratio,
        allow_non_private=(not safe) if allow is None else allow,
        deployed=deployed,
        shuffle_count_on_max=_count_on_max(node, 1 if safe else None),
        shuffle_trust_silo_sampling=bool(_flag(node, "shuffle-trust-silo-sampling")),
        secagg_count_on_max=_count_on_max(node, 1 if safe else None, "secagg-count-on-max"),
        secagg_peer_keys=str(node["secagg-peer-keys"]) if node.get("secagg-peer-keys") else None,
    )


def _count_on_max(node: Mapping[str, Any], default: int | None, key: str = "shuffle-count-on-max") -> int | None:
    if key not in node:
        return default
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise PolicyError(f"node config {key} = {value!r} must be an integer >= 1")
    try:
        number = float(value)
    except ValueError:
        raise PolicyError(f"node config {key} = {value!r} must be an integer >= 1") from None
    if not (math.isfinite(number) and number >= 1 and number == int(number)):
        raise PolicyError(f"node config {key} = {value!r} is out of range; allowed: integers >= 1")
    return int(number)


def shuffle_trust_violation(policy: NodePolicy, count_on: int) -> str | None:
    """Why this silo refuses a shuffle-DP run that asks it to count on ``count_on`` silos'
    noise (``shuffle.count-on``, or silos-per-round when 0), or None."""
    return _count_on_violation(policy.shuffle_count_on_max, policy.safe, count_on, "shuffle")


def secagg_trust_violation(policy: NodePolicy, count_on: int) -> str | None:
    """Why this silo refuses a secagg run that asks it to count on ``count_on`` silos' noise
    (``secagg.count-on``, or silos-per-round when 0), or None."""
    return _count_on_violation(policy.secagg_count_on_max, policy.safe, count_on, "secagg")


def _count_on_violation(bound: int | None, safe: bool, count_on: int, mode: str) -> str | None:
    """The refusal of a run asking ``count_on`` above the node's ``<mode>-count-on-max`` ``bound``."""
    if bound is None or count_on <= bound:
        return None
    source = f"its node config {mode}-count-on-max" if safe else f"{mode}-count-on-max"
    return (f"this silo counts on the noise of at most {bound} silo(s) ({source}); the run asks it to count on "
            f"{count_on} ({mode}.count-on), which would let fewer dishonest silos break its epsilon")


def collusion_threshold(count_on: int, silos: int) -> int:
    """k such that a shuffle-DP silo's epsilon holds unless more than k of the other silos are
    dishonest or collude with the server: with count-on 1 it adds all its noise itself (k = all
    silos - 1; only the shuffler is trusted); with count-on > 1 it counts on the others in its sums
    for (count-on - 1 - headroom)/count-on of its noise, and ONE of them claiming noise it did not
    add, or whose counts reach the server, is enough to shrink that noise (k = 0)."""
    return max(int(silos) - 1, 0) if int(count_on) <= 1 else 0


def policy_violation(policy: NodePolicy, private: bool, epsilon: float, delta: float, delta_asked: str) -> str | None:
    """Why this silo's policy (its caps, or no runs without privacy) forbids training in this run
    (or None). ``delta`` is the delta the silo would use (1/n^2 for ``auto``), ``delta_asked``
    how the run config said it."""
    if policy.capped and not private:
        return "this silo's policy sets a privacy cap; the run asks for no privacy"
    if not private and not policy.allow_non_private:
        why = ("a deployed silo trains without privacy only with node config allow-non-private = true"
               if policy.deployed else "its node config sets allow-non-private = false")
        return f"this silo refuses runs without privacy (privacy.mode = 'off'): {why}"
    if policy.epsilon_cap is not None and epsilon > policy.epsilon_cap:
        return f"this silo's policy caps epsilon at {policy.epsilon_cap:g}; the run asks for epsilon={epsilon:g}"
    if policy.delta_cap is not None and delta > policy.delta_cap:
        return (f"this silo's policy caps delta at {policy.delta_cap:g}; the run asks for delta={delta_asked} "
                f"= {delta:.3g} for this silo (set privacy.delta <= {policy.delta_cap:g})")
    return None
