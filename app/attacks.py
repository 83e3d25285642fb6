"""Byzantine behaviours of a silo: data-level label attacks and update-level (model) attacks.

Base layer (shared by the Byzantine silos in clients/ and the simulation's server-side harness in
strategies/, which must not import each other). Pure numpy functions; every random draw takes an explicit ``numpy.random.Generator``.
Data-level attacks (``label-flip``, ``random-labels``) change the Byzantine silo's own training
labels before it trains honestly on them. Update-level attacks replace the update the silo sends;
the omniscient ones (``ipm``, ``alie``) need the honest updates of the round.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
import numpy as np

from app.edge_attack import EDGE_TARGETS
from app.options import choice, number, option


def _check_num_classes(num_classes: object) -> int:
    if isinstance(num_classes, bool):
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    try:
        c = operator.index(num_classes)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}") from None
    if c < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {c}")
    return c


def _check_labels(y: np.ndarray, num_classes: int) -> np.ndarray:
    a = np.asarray(y)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"y must hold integer class labels, got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= num_classes):
        raise ValueError(f"y labels must be in [0, {num_classes - 1}], got values in [{a.min()}, {a.max()}]")
    return a


def _check_honest(honest: np.ndarray) -> np.ndarray:
    h = np.asarray(honest, dtype=np.float64)
    if h.ndim != 2 or h.shape[0] < 1:
        raise ValueError(f"honest must be a 2-D array [h, d] with h >= 1, got shape {h.shape}")
    if not np.all(np.isfinite(h)):
        raise ValueError("honest must be finite, got non-finite entries")
    return h


# ---------------------------------------------------------------------------------------------
# data-level attacks
# ---------------------------------------------------------------------------------------------

def flip_labels(y: np.ndarray, num_classes: int) -> np.ndarray:
    """Label flipping: y -> C - 1 - y (same dtype and shape; a new array)."""
    c = _check_num_classes(num_classes)
    a = _check_labels(y, c)
    return (c - 1 - a).astype(a.dtype, copy=False)


def random_labels(y: np.ndarray, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Random labels: each label replaced by an independent uniform draw from {0, ..., C - 1}."""
    c = _check_num_classes(num_classes)
    a = _check_labels(y, c)
    return rng.integers(0, c, size=a.shape).astype(a.dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# update-level attacks
# ---------------------------------------------------------------------------------------------

def sign_flip(update: np.ndarray) -> np.ndarray:
    """Sign flipping: send -update."""
    return -np.asarray(update, dtype=np.float64)


def ipm(honest: np.ndarray, epsilon: float) -> np.ndarray:
    """Inner-product manipulation (Xie, Koyejo & Gupta, UAI 2020): -epsilon * mean(honest), the
    mean over the h honest updates [h, d]. epsilon must be finite and > 0 (the paper uses small
    values such as 0.1 against median-type rules and large ones such as 100 against Krum)."""
    h = _check_honest(honest)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon}")
    return -epsilon * h.mean(axis=0)


def alie_z(n: int, f: int) -> float:
    """z of "A little is enough" (Baruch, Baruch & Goldberg, NeurIPS 2019):
    s = floor(n/2 + 1) - f, z = Phi^{-1}((n - s) / n), Phi the standard normal CDF.

    The formula assumes an honest majority: for f >= n/2 the "supporters" count s is <= 1, so
    (n - s)/n >= 1 - 1/n, and once s <= 0 (f >= floor(n/2 + 1)) Phi^{-1} is inf (s = 0) or nan
    (s < 0). A ValueError therefore asks for an explicit z whenever f >= n/2, and also when
    (n - s)/n is not in (0, 1) with an honest majority (n <= 2, f = 0: s = n, argument 0).
    """
    if isinstance(n, bool) or isinstance(f, bool):
        raise ValueError(f"n and f must be integers, got n = {n!r}, f = {f!r}")
    try:
        n, f = operator.index(n), operator.index(f)
    except TypeError:
        raise ValueError(f"n and f must be integers, got n = {n!r}, f = {f!r}") from None
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= f <= n:
        raise ValueError(f"f must be in [0, n] = [0, {n}], got {f}")
    if 2 * f >= n:
        raise ValueError(f"alie_z is only defined for an honest majority: f = {f} Byzantine of n = {n} "
                         f"(f < n/2 required); pass z explicitly to alie()")
    s = math.floor(n / 2 + 1) - f
    p = (n - s) / n
    if not 0.0 < p < 1.0:
        raise ValueError(f"alie_z: Phi^-1 argument (n - s)/n = ({n} - {s})/{n} = {p} is not in (0, 1) "
                         f"for n = {n}, f = {f}; pass z explicitly to alie()")
    from scipy.stats import norm  # scipy.stats takes seconds to import: only where ALIE needs it

    return float(norm.ppf(p))


def alie(honest: np.ndarray, n: int, f: int, z: float | None = None) -> np.ndarray:
    """"A little is enough" (Baruch et al. 2019): coordinate-wise mu + z * sigma over the honest
    updates [h, d], sigma the sample standard deviation (ddof = 1, the unbiased variance, as ByzFL
    and torch.std compute it; 0 when only one honest update is known); z = :func:`alie_z` (n, f)
    when None. All Byzantine silos send this same vector."""
    h = _check_honest(honest)
    if z is None:
        z = alie_z(n, f)
    elif not math.isfinite(z):
        raise ValueError(f"z must be finite, got {z}")
    sigma = h.std(axis=0, ddof=1) if h.shape[0] > 1 else np.zeros(h.shape[1])
    return h.mean(axis=0) + z * sigma


def gaussian_noise(shape: int | tuple[int, ...], sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Gaussian attack: send pure noise N(0, sigma^2 I) of ``shape`` instead of an update."""
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")
    return rng.normal(0.0, sigma, size=shape)


# ---------------------------------------------------------------------------------------------
# registry and Byzantine silo selection
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttackInfo:
    """A registered attack: ``level`` is "data" (the silo's own labels) or "update" (the sent
    update); ``omniscient`` attacks need the honest updates of the round."""

    description: str
    level: str
    omniscient: bool


ATTACKS: dict[str, AttackInfo] = {
    "label-flip": AttackInfo("train on flipped labels y -> C - 1 - y", "data", False),
    "random-labels": AttackInfo("train on uniformly random labels", "data", False),
    "sign-flip": AttackInfo("send the negated honest update -u", "update", False),
    "ipm": AttackInfo("inner-product manipulation: send -epsilon * mean(honest) (Xie et al. 2020)", "update", True),
    "alie": AttackInfo("a little is enough: send mu + z * sigma of the honest updates (Baruch et al. 2019)",
                       "update", True),
    "gaussian": AttackInfo("send pure Gaussian noise N(0, sigma^2 I)", "update", False),
    # adaptive (app/adaptive_attacks.py): the scale tuned each round against the rule in use
    "alie-adaptive": AttackInfo("ALIE mu + tau sigma, tau searched against the rule (ByzFL's optimal ALIE)",
                                "update", True),
    "ipm-adaptive": AttackInfo("IPM -tau mean(honest), tau searched against the rule (ByzFL's optimal IPM)",
                               "update", True),
    "mimic": AttackInfo("repeat the honest silo that most skews the mean, learned over attack.mimic-warmup "
                        "exchanges (Karimireddy et al. 2022)", "update", True),
    # aimed at Grad-BANT's score (app/edge_attack.py): the most harmful message that still scores > 0
    "edge-of-score": AttackInfo("the message of largest damage along attack.edge-target whose Grad-BANT score stays "
                                "positive (white box: g0, L, c), its kept score searched against the rule",
                                "update", True),
}


def byzantine_silos(num_silos: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of the Byzantine silos, sorted ascending (int64).

    k = floor(fraction * N) (rounded down; computed as floor(fraction * N + 1e-9) so that e.g.
    0.29 * 100 gives 29, not 28 from floating-point error), capped to [0, N - 1] so at least one
    silo is honest; k silos drawn uniformly without replacement from ``rng``.
    fraction must be in [0, 0.9].
    """
    if isinstance(num_silos, bool):
        raise ValueError(f"num_silos must be an integer >= 1, got {num_silos!r}")
    try:
        n = operator.index(num_silos)
    except TypeError:
        raise ValueError(f"num_silos must be an integer >= 1, got {num_silos!r}") from None
    if n < 1:
        raise ValueError(f"num_silos must be an integer >= 1, got {n}")
    if isinstance(fraction, bool) or not (0.0 <= fraction <= 0.9):
        raise ValueError(f"fraction must be in [0, 0.9], got {fraction!r}")
    return np.sort(rng.choice(n, size=byzantine_count(n, fraction), replace=False)).astype(np.int64)


def byzantine_count(num_silos: int, fraction: float) -> int:
    """f = floor(fraction * N) (computed as floor(fraction * N + 1e-9) so that e.g. 0.29 * 100
    gives 29, not 28 from floating-point error), capped to [0, N - 1]: at least one silo is honest."""
    return min(max(math.floor(fraction * num_silos + 1e-9), 0), num_silos - 1)


#: attacks that a Byzantine silo runs on its own data (clients/byzantine.py); the others are applied
#: to messages by the simulation's server-side harness (strategies/byzantine_harness.py)
DATA_ATTACKS = tuple(name for name, info in ATTACKS.items() if info.level == "data")
MODEL_ATTACKS = tuple(name for name, info in ATTACKS.items() if info.level == "update")


def byzantine_indices(attack: AttackSettings, num_silos: int, seed: int) -> set[int]:
    """The Byzantine silos of an experiment of ``num_silos`` silos, from (``seed``,
    ``attack.fraction``): public in an experiment, computed the same way by the silos and by the
    server's harness."""
    from app.seeding import np_rng

    if attack.kind == "none" or attack.fraction == 0:
        return set()
    return {int(i) for i in byzantine_silos(num_silos, attack.fraction, np_rng(seed, "byzantine"))}


# -- the attack.* run-config options, declared once (app/options.py) -----------------------------

@dataclass(frozen=True)
class AttackSettings:
    """The experiment's Byzantine silos (a simulation's attack harness)."""

    kind: str = option("attack.kind", choice(("none", *ATTACKS)), "none", "the Byzantine silos' attack")
    fraction: float = option("attack.fraction", number(0, 0.9), 0.0, "share of Byzantine silos")
    ipm_epsilon: float = option("attack.ipm-epsilon", number(0, None, lo_open=True), 0.5, "IPM's epsilon")
    alie_z: float = option("attack.alie-z", number(0, None), 0.0, "ALIE's z (0: Baruch et al.'s formula)")
    noise_std: float = option("attack.noise-std", number(0, None), 1.0, "the Gaussian attack's standard deviation")
    #: Karimireddy et al.'s warm-up T0 (app/adaptive_attacks.py mimic_learning); 0 copies the first honest silo
    mimic_warmup: int = option("attack.mimic-warmup", number(0, 1_000_000, integer=True), 5,
                               "exchanges over which Mimic learns whom to copy (0: the first honest silo)")
    #: app/edge_attack.py: the direction h the edge attacker moves the model along (damage -<h, u>)
    edge_target: str = option("attack.edge-target", choice(EDGE_TARGETS), "honest-mean",
                              "what edge-of-score moves the model along: up the honest mean, or one class's output bias",
                              only=("attack.kind", ("edge-of-score",)))
    edge_class: int = option("attack.edge-class", number(0, 1_000_000, integer=True), 0,
                             "the class whose output bias edge-of-score raises (edge-target = class-bias)",
                             only=("attack.kind", ("edge-of-score",)))


__all__ = ["ATTACKS", "DATA_ATTACKS", "MODEL_ATTACKS", "AttackInfo", "AttackSettings", "alie", "alie_z",
           "byzantine_count", "byzantine_indices", "byzantine_silos", "flip_labels", "gaussian_noise", "ipm",
           "random_labels", "sign_flip"]
