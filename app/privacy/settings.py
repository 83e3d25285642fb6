"""The privacy options (``privacy.*``, ``shuffle.*``), declared once (app/options.py). No torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.options import choice, number, option
from app.privacy.amplification_choice import AMPLIFICATION_SETTINGS
from app.privacy.policy import NOISE_SEEDS
from app.privacy.shuffle import MAX_HEADROOM, auto_levels

#: "off" + app.privacy.mechanism.MECHANISMS (a copy: that module imports torch; tests/test_registries.py)
PRIVACY_MODES = ("off", "isrl", "shuffle", "secagg")
PLANNED_PRIVACY_MODES: tuple[str, ...] = ()
_OFF = ("privacy.mode", ("off",))
#: the shuffle.* keys act only in shuffle mode (under isrl a value other than the default is
#: refused, app.config._check_shuffle; under off it is inert like every privacy.* key)
_SHUFFLE_ONLY = ("privacy.mode", ("shuffle",))
#: the secagg.* keys act only in secagg mode (another mode refuses a value other than the default)
_SECAGG_ONLY = ("privacy.mode", ("secagg",))


def _delta(key: str, value: object) -> float | None:
    if isinstance(value, str) and value.strip().lower() in ("auto", "1/n^2", "1/n2"):
        return None
    return float(number(0.0, 1.0, lo_open=True, hi_open=True)(key, value))


@dataclass(frozen=True)
class PrivacySettings:
    mode: str = option("privacy.mode", choice(PRIVACY_MODES, PLANNED_PRIVACY_MODES), "isrl",
                       "isrl (Gaussian noise on each silo), shuffle (shuffle DP), secagg (secure aggregation "
                       "with distributed Skellam noise) or off")
    epsilon: float = option("privacy.epsilon", number(0, None, lo_open=True, allow_inf=True), 3.0,
                            "each silo's epsilon budget (inf: non-private)", inert=_OFF)
    #: delta in (0, 1), or None for the paper's 1/n^2 with each silo's own n.
    delta: float | None = option("privacy.delta", _delta, "auto", "each silo's delta; auto: 1/n^2", inert=_OFF)
    clip: float = option("privacy.clip", number(0, None, lo_open=True), "preset", "per-record clip norm L",
                         inert=_OFF)
    #: rounds each silo plans its noise for; 0 means num-rounds (every round, worst case).
    planned_rounds: int = option("privacy.planned-rounds", number(0, 1_000_000, integer=True), 0,
                                 "rounds the silos calibrate for (0: num-rounds)", inert=_OFF)
    #: "run": noise and batch sampling seeded from the run seed (reproducible research runs,
    #: NOT secret from the server); "os": from the operating system's CSPRNG (deployments).
    noise_seed: str = option("privacy.noise-seed", choice(NOISE_SEEDS), "run",
                             "run: noise from the run seed (research); os: from the OS CSPRNG", inert=_OFF)
    #: the budget split between release kinds: noise multiplier of full-gradient releases
    #: (SPIDER/SVRG anchors, Fed-SPIDER's fresh gradients) relative to difference releases.
    #: 1 = equal multipliers z (each kind's sigma proportional to its sensitivity).
    anchor_noise_ratio: float = option("privacy.anchor-noise-ratio", number(0, None, lo_open=True), 1.0,
                                       "noise multiplier of full-gradient releases relative to differences",
                                       inert=_OFF)

    @property
    def enabled(self) -> bool:
        return self.mode != "off" and not math.isinf(self.epsilon)

    def delta_for(self, n: int) -> float:
        """The delta of a silo with n records: ``privacy.delta``, or 1/n^2 (the paper's choice)."""
        return self.delta if self.delta is not None else 1.0 / (n * n)


@dataclass(frozen=True)
class ShuffleSettings:
    """Shuffle DP's binomial encoding (app/privacy/shuffle.py): g levels (0: chosen from the model
    size d, app.privacy.shuffle_plan.auto_levels), the noise bits' probability p, and how many
    silos' noise a silo counts on (0: silos-per-round)."""

    levels: int = option("shuffle.levels", number(0, 4096, integer=True), 0,
                         "shuffle DP: g, the levels each coordinate is rounded to (0: from d)",
                         only=_SHUFFLE_ONLY)
    p: float = option("shuffle.p", number(0, 1, lo_open=True, hi_open=True), 0.25,
                      "shuffle DP: the probability of each binomial noise bit",
                      only=_SHUFFLE_ONLY)
    count_on: int = option("shuffle.count-on", number(0, 10_000, integer=True), 0,
                           "shuffle DP: how many silos' noise each silo counts on (0: silos-per-round)",
                           only=_SHUFFLE_ONLY)
    #: each silo carries (1 + headroom) / count-on of the noise trials it needs, so that silos
    #: whose calibrations differ a little (delta = 1/n^2 with different n) meet each other's
    headroom: float = option("shuffle.headroom", number(0, MAX_HEADROOM), 0.1,
                             "shuffle DP: each silo carries (1 + headroom)/count-on of the noise it needs",
                             only=_SHUFFLE_ONLY)
    #: record-level amplification of sampled binomial releases: "sampling" (the batch of K < n
    #: records is drawn without replacement: app/privacy/amplification.py), "none", or "auto"
    #: (default: sampling only with secret batches and count-on 1, app/privacy/amplification_choice.py)
    amplification: str = option("shuffle.amplification", choice(AMPLIFICATION_SETTINGS), "auto",
                                "shuffle DP: sampling claims record-level amplification; none does not; auto decides",
                                only=_SHUFFLE_ONLY)
    #: M > 0: ask the silos to claim amplification by the shuffler keeping a random M of the N
    #: silos (app/privacy/silo_sampling.py); each silo claims it only if its node config trusts it
    silo_sample: int = option("shuffle.silo-sample", number(0, 10_000, integer=True), 0,
                              "shuffle DP: the shuffler keeps a random M of the N silos (0: all)",
                              only=_SHUFFLE_ONLY)

    def levels_for(self, dim: int) -> int:
        """g for a model of ``dim`` parameters: ``shuffle.levels``, or when it is 0 the automatic
        choice (app.privacy.shuffle.auto_levels). Silos and server both take it from here."""
        return self.levels or auto_levels(dim)



@dataclass(frozen=True)
class SecAggSettings:
    """Secure aggregation with distributed Skellam noise (privacy.mode secagg): the modulus
    2**bits each coordinate of the masked sum lives in, the SecAgg+ threshold t and neighbourhood
    degree, how many silos' noise a silo counts on (0: silos-per-round) with its headroom, and
    whether record-level amplification by sampling may be claimed (as shuffle.amplification)."""

    bits: int = option("secagg.bits", number(8, 30, integer=True), 16,
                       "secagg: bits per coordinate of the modular sum (the wire and the modulus 2**bits)",
                       only=_SECAGG_ONLY)
    threshold: int = option("secagg.threshold", number(0, 10_000, integer=True), 0,
                            "secagg: t, the shares that open a silo's secrets (0: a majority of the exchange)",
                            only=_SECAGG_ONLY)
    degree: int = option("secagg.degree", number(0, 10_000, integer=True), 0,
                         "secagg: each silo's neighbours in the SecAgg+ graph (0: every other silo)",
                         only=_SECAGG_ONLY)
    count_on: int = option("secagg.count-on", number(0, 10_000, integer=True), 0,
                           "secagg: how many silos' noise each silo counts on (0: silos-per-round)",
                           only=_SECAGG_ONLY)
    headroom: float = option("secagg.headroom", number(0, MAX_HEADROOM), 0.1,
                             "secagg: each silo adds (1 + headroom)/count-on of the noise it needs",
                             only=_SECAGG_ONLY)
    amplification: str = option("secagg.amplification", choice(AMPLIFICATION_SETTINGS), "auto",
                                "secagg: sampling claims record-level amplification; none does not; auto decides",
                                only=_SECAGG_ONLY)
