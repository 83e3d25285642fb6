"""The silo's and the server's halves of the distributed Skellam mechanism over secure aggregation
(Agarwal, Kairouz & Liu, NeurIPS 2021, "The Skellam Mechanism for Differentially Private Federated
Learning", Algorithm 1; TensorFlow Federated's ``DistributedDpSumFactory``,
tensorflow_federated/python/aggregators/distributed_dp.py, with ``mechanism='distributed_skellam'``).

A silo's release is its batch of K clipped per-record rows x_i (||x_i||_2 <= C, dimension d). It sends

    v = sum_i round_c(gamma * R(x_i)) + Sk(mu_add)   (mod 2**bits)

* R: randomized Hadamard rotation, R(x) = H diag(s) pad(x) / sqrt(D), D the next power of two >= d,
  H the Sylvester Hadamard matrix, s in {-1, +1}^D from a PUBLIC seed (broadcast by the server: every
  silo must use the same R so that the sum can be inverted). Orthonormal: norms are kept.
* round_c: conditional randomized rounding (Kairouz, Liu & Steinke, ICML 2021, "The Distributed
  Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", Sec. 4.1): each
  coordinate goes up with probability equal to its fractional part; the whole row is redrawn until
  its squared norm is at most S = floor(B**2), B = :func:`rounded_row_bound`.
* Sk(mu): per coordinate Poisson(mu/2) - Poisson(mu/2), variance mu (the convention of TF Privacy's
  ``DistributedSkellamSumQuery.add_noise_to_sample``, lambda = local_stddev**2 / 2). A sum of
  independent Sk(mu_k) is Sk(sum mu_k), so the silos' shares add up to the mechanism the accountant
  analyses.

The server sums the silos' vectors mod 2**bits (secure aggregation reveals only this sum), centres
it into [-2**(bits-1), 2**(bits-1)), inverts the rotation, divides by gamma and by the number of
records: the mean of all records' rows, plus noise (:func:`decode_sum`).

Sensitivity (replace one record of one silo, :func:`sensitivity`). The enforced check makes every
rounded row an integer vector r with ||r||_2^2 <= S. Two such rows differ by at most
Delta_2 = 2 sqrt(S) in L2, and, as |r_j| <= r_j^2 for integers, ||r - r'||_1 <= ||r||_1 + ||r'||_1
<= 2 min(S, sqrt(D S)) = Delta_1. TFF (distributed_dp.py, ``scaled_l1``) bounds the L1 norm of one
row, min(B^2, sqrt(D) B), for add/remove neighbours; for replace-one its Delta_1 would be
min((2B)^2, sqrt(D) 2B), which is twice ours in the B^2 branch and equal in the other. The rounding
randomness of a batch's other rows is the same under both neighbours, and joint convexity of
exp((alpha - 1) D_alpha) reduces the mixture over it to the worst pair of rounded rows.

Wrap-around (:func:`wrap_probability`) and rounding bias (:func:`rounding_bias_bound`) are proven
bounds, stated at each function; :func:`choose_gamma` picks the largest gamma whose per-coordinate
wrap bound is within a target (TFF's ``_heuristic_scale_factor`` solves the same problem with
k standard deviations of an assumed sub-Gaussian aggregate; here the tail is a Chernoff bound).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: conditional rounding's beta, exp(-0.5) (the value Kairouz et al. 2021 and TFF recommend)
BETA = math.exp(-0.5)
#: redraws of one row before conditional rounding gives up: fails with probability <= BETA**1000 < 1e-217
MAX_TRIES = 1000
#: largest modulus exponent: every integer here (row norms, sums) stays exact in int64
MAX_BITS = 30
#: the largest Skellam variance drawn: each Poisson half has mean <= 2**62, within numpy's sampler
MAX_VARIANCE = 2.0**63
#: default per-coordinate wrap-around target of :func:`choose_gamma`
WRAP_TARGET = 1e-6
_ROTATION_TAG = b"silofl/skellam/rotation/v1\x00"
#: float64 elements of rows rotated at once by encode (32 MiB)
_CHUNK = 1 << 22


def padded_dim(d: int) -> int:
    """D: the smallest power of two >= d (the Hadamard transform's length)."""
    if not (isinstance(d, (int, np.integer)) and d >= 1):
        raise ValueError(f"dimension must be an integer >= 1, got {d!r}")
    return 1 << (int(d) - 1).bit_length()


def _signs(seed: bytes | int, D: int) -> np.ndarray:
    """The rotation's public signs s in {-1, +1}^D from ``seed`` (bytes: hashed with a domain tag;
    int >= 0: used as the SeedSequence entropy)."""
    if isinstance(seed, (bytes, bytearray)):
        entropy = int.from_bytes(hashlib.sha256(_ROTATION_TAG + bytes(seed)).digest(), "big")
    elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        entropy = int(seed)
    else:
        raise ValueError(f"rotation seed must be bytes or an int >= 0, got {seed!r}")
    rng = np.random.default_rng(np.random.SeedSequence(entropy))
    return rng.integers(0, 2, size=D).astype(np.float64) * 2.0 - 1.0


def _fwht(x: np.ndarray) -> np.ndarray:
    """H x / sqrt(D) along the last axis (Sylvester order, H = scipy.linalg.hadamard(D)): the
    normalized fast Walsh-Hadamard transform, orthonormal and its own inverse."""
    D = x.shape[-1]
    y = np.array(x, dtype=np.float64).reshape(-1, D)  # a copy: the butterflies run in place on it
    h = 1
    while h < D:
        v = y.reshape(y.shape[0], D // (2 * h), 2, h)
        a, b = v[:, :, 0, :], v[:, :, 1, :]
        diff = a - b
        a += b
        b[...] = diff
        h *= 2
    return y.reshape(x.shape) / math.sqrt(D)


def rotate(x: np.ndarray, seed: bytes | int) -> np.ndarray:
    """R(x) = H diag(s) pad(x) / sqrt(D) along the last axis: [..., d] -> [..., D] (float64)."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    D = padded_dim(d)
    pad = np.zeros(x.shape[:-1] + (D,), dtype=np.float64)
    pad[..., :d] = x
    return _fwht(pad * _signs(seed, D))


def unrotate(y: np.ndarray, seed: bytes | int, d: int) -> np.ndarray:
    """The inverse of :func:`rotate`: diag(s) H y / sqrt(D), first d coordinates: [..., D] -> [..., d]."""
    y = np.asarray(y, dtype=np.float64)
    D = y.shape[-1]
    if D != padded_dim(d):
        raise ValueError(f"a rotated vector of dimension {d} has length {padded_dim(d)}, got {D}")
    return (_fwht(y) * _signs(seed, D))[..., :d]


def rounded_row_bound(clip_scaled: float, D: int, beta: float) -> float:
    """B: the L2 bound of a row of norm <= ``clip_scaled`` after conditional randomized rounding
    (Kairouz, Liu & Steinke 2021, Theorem 1 / Sec. 4.1; google-research/federated
    distributed_dp/accounting_utils.py ``rounded_l2_norm_bound``, TFF discretization.py
    ``inflated_l2_norm_bound`` at gamma = 1):

        B = min(c + sqrt(D),  sqrt(c^2 + D/4 + sqrt(2 ln(1/beta)) (c + sqrt(D)/2)))   (beta > 0)
        B = c + sqrt(D)                                                             (beta = 0)

    The first holds always (the rounding error has norm < sqrt(D)). Unconditional rounding lands
    within the second with probability >= 1 - beta: ||r||^2 - ||x||^2 = sum_j (2 x_j e_j + e_j^2),
    independent terms of mean sum f_j (1 - f_j) <= D/4, each in an interval of width
    |2 x_j + 1 - 2 f_j| <= 2|x_j| + 1, so Hoeffding's inequality with sum (2|x_j| + 1)^2 <=
    (2 c + sqrt(D))^2 gives the excess sqrt(2 ln(1/beta)) (c + sqrt(D)/2) w.p. <= beta."""
    if not (clip_scaled >= 0 and math.isfinite(clip_scaled)):
        raise ValueError(f"scaled clip must be finite and >= 0, got {clip_scaled!r}")
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta!r}")
    c, root = float(clip_scaled), math.sqrt(D)
    bound_1 = c + root
    if beta == 0:
        return bound_1
    bound_2 = math.sqrt(c * c + 0.25 * D + math.sqrt(2.0 * math.log(1.0 / beta)) * (c + 0.5 * root))
    return min(bound_1, bound_2)


def row_sq_bound(bound: float) -> int:
    """S = floor(bound^2): the integer bound on a rounded row's squared norm that
    :func:`conditional_round` enforces (the accountant's sensitivity is computed from S, so a
    floating-point error in B cannot weaken the guarantee)."""
    if not (bound >= 0 and math.isfinite(bound)):
        raise ValueError(f"bound must be finite and >= 0, got {bound!r}")
    s = math.floor(bound * bound)
    if s >= 2**62:
        raise ValueError(f"bound {bound!r} too large for exact int64 norms")
    return int(s)


def conditional_round(rows_scaled: np.ndarray, bound: float, rng: np.random.Generator,
                      max_tries: int = MAX_TRIES) -> np.ndarray:
    """Conditional randomized rounding of each row of ``rows_scaled`` [K, D] to int64: coordinate
    x goes to floor(x) + 1 with probability x - floor(x), else floor(x); a row is redrawn until its
    squared norm (exact, in integers) is <= floor(bound^2). Every returned row satisfies it.

    A row whose norm is <= c with bound = rounded_row_bound(c, D, beta) is accepted per draw with
    probability >= 1 - beta (see there), so one row exhausts ``max_tries`` with probability
    <= beta**max_tries (< 1e-217 at beta = exp(-0.5), 1000 tries); then RuntimeError is raised. The
    raise depends on the data: its probability belongs in delta, and is negligible next to it."""
    x = np.asarray(rows_scaled, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"rows must be a [K, D] array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("rows must be finite")
    limit = row_sq_bound(bound)
    if x.size and (float(np.max(np.linalg.norm(x, axis=1))) + math.sqrt(x.shape[1])) ** 2 >= 2.0**61:
        raise ValueError("scaled rows too large for exact int64 squared norms")
    low = np.floor(x)
    frac = x - low
    low = low.astype(np.int64)
    out = np.empty(x.shape, dtype=np.int64)
    todo = np.arange(x.shape[0])
    for _ in range(int(max_tries)):
        if todo.size == 0:
            return out
        cand = low[todo] + (rng.random((todo.size, x.shape[1])) < frac[todo])
        ok = np.einsum("ij,ij->i", cand, cand) <= limit
        out[todo[ok]] = cand[ok]
        todo = todo[~ok]
    if todo.size == 0:
        return out
    raise RuntimeError(f"conditional rounding failed {max_tries} times for {todo.size} row(s): the rows exceed the "
                       f"bound's clip, or beta is too small")


def skellam_noise(mu: float, shape: int | Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Sk(mu) iid of the given shape: Poisson(mu/2) - Poisson(mu/2) (mean 0, variance mu), int64."""
    if not 0 <= mu <= MAX_VARIANCE:
        raise ValueError(f"Skellam variance must be in [0, 2**63], got {mu!r}")
    if mu == 0:
        return np.zeros(shape, dtype=np.int64)
    lam = 0.5 * float(mu)
    return rng.poisson(lam, shape).astype(np.int64) - rng.poisson(lam, shape).astype(np.int64)


@dataclass(frozen=True)
class SkellamCode:
    """What every silo of a secure-aggregation sum and the server agree on: the modulus 2**bits,
    the scale gamma, the data dimension d, the public rotation seed, the clip C the rows were
    clipped to and conditional rounding's beta (encode clips rows to C and enforces the row
    bound of (gamma C, D, beta))."""

    bits: int
    gamma: float
    dim: int
    rotation_seed: bytes | int
    clip: float = 1.0
    beta: float = BETA

    def __post_init__(self) -> None:
        if not (isinstance(self.bits, (int, np.integer)) and 2 <= self.bits <= MAX_BITS):
            raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {self.bits!r}")
        if not (self.gamma > 0 and math.isfinite(self.gamma)):
            raise ValueError(f"gamma must be finite and > 0, got {self.gamma!r}")
        if not (self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be finite and > 0, got {self.clip!r}")
        if not 0 <= self.beta < 1:
            raise ValueError(f"beta must be in [0, 1), got {self.beta!r}")
        padded_dim(self.dim)
        _signs(self.rotation_seed, 1)  # validates the seed's type

    @property
    def padded(self) -> int:
        """D, the rotated (and sent) vector's length."""
        return padded_dim(self.dim)

    @property
    def modulus(self) -> int:
        return 1 << int(self.bits)

    @property
    def row_bound(self) -> float:
        """B of :func:`rounded_row_bound` at the scaled clip gamma C."""
        return rounded_row_bound(self.gamma * self.clip, self.padded, self.beta)

    @property
    def sensitivity(self) -> tuple[float, float]:
        """(Delta_1, Delta_2) of one silo's integer sum, replace-one (:func:`sensitivity`)."""
        return sensitivity(self.gamma, self.clip, self.dim, self.beta)


def sensitivity(gamma: float, clip: float, dim: int, beta: float = BETA) -> tuple[float, float]:
    """(Delta_1, Delta_2) of a silo's integer sum when one record is replaced:
    Delta_2 = 2 sqrt(S), Delta_1 = 2 min(S, sqrt(D S)), S = floor(B^2), B = rounded_row_bound(gamma C,
    D, beta) (module docstring)."""
    D = padded_dim(dim)
    s = row_sq_bound(rounded_row_bound(gamma * clip, D, beta))
    return 2.0 * min(float(s), math.sqrt(D * s)), 2.0 * math.sqrt(s)


def encode(rows: np.ndarray, code: SkellamCode, mu_add: float, rng: np.random.Generator) -> np.ndarray:
    """A silo's secure-aggregation input: rows [K, d] (projected onto the C-ball, a per-record
    map), rotated, scaled by gamma, conditionally rounded, summed, plus Sk(mu_add) per coordinate,
    reduced mod 2**bits: uint64 [D] in [0, 2**bits)."""
    x = np.asarray(rows, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != code.dim:
        raise ValueError(f"rows must be [K, {code.dim}], got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("rows must be finite")
    norms = np.linalg.norm(x, axis=1)
    x = x * np.minimum(1.0, code.clip / np.maximum(norms, 1e-300))[:, None]
    total = np.zeros(code.padded, dtype=np.int64)
    step = max(1, _CHUNK // code.padded)  # rows rotated and rounded at a time (memory)
    for start in range(0, x.shape[0], step):
        rotated = rotate(x[start:start + step], code.rotation_seed) * code.gamma
        total += conditional_round(rotated, code.row_bound, rng).sum(axis=0)
    total += skellam_noise(mu_add, code.padded, rng)
    return np.mod(total, code.modulus).astype(np.uint64)


def modular_sum(encodings: Sequence[np.ndarray], bits: int) -> np.ndarray:
    """What secure aggregation reveals: the sum of the silos' vectors mod 2**bits (uint64
    arithmetic wraps mod 2**64, a multiple of 2**bits)."""
    total = np.zeros_like(np.asarray(encodings[0], dtype=np.uint64))
    for e in encodings:
        total = total + np.asarray(e, dtype=np.uint64)
    return total % np.uint64(1 << int(bits))


def decode_sum(modsum: np.ndarray, code: SkellamCode, records: int) -> np.ndarray:
    """The server's half: centre the modular sum [..., D] into [-2**(bits-1), 2**(bits-1)), undo the
    rotation, divide by gamma and by ``records`` (all records summed): the noisy mean [..., d]."""
    if not (isinstance(records, (int, np.integer)) and records >= 1):
        raise ValueError(f"records must be an integer >= 1, got {records!r}")
    m = code.modulus
    v = np.asarray(modsum).astype(np.int64) % m
    v = np.where(v >= m // 2, v - m, v)
    return unrotate(v.astype(np.float64) / code.gamma, code.rotation_seed, code.dim) / int(records)


def rounding_bias_bound(gamma: float, beta: float = BETA) -> float:
    """Bound on the L2 norm of the bias of the decoded mean (signal units) from conditional
    rounding. Unconditional rounding error e has E e = 0 and independent coordinates of variance
    f(1 - f) <= 1/4; conditioning on the accepted event A (P(A) = 1 - q >= 1 - beta) gives
    E[e | A] = -E[e 1_{A^c}] / P(A), and for a unit u, |E[<u, e> 1_{A^c}]| <= sqrt(E<u, e>^2) sqrt(q)
    <= sqrt(q)/2 (Cauchy-Schwarz). So each row's bias has norm <= sqrt(beta) / (2 (1 - beta)) in
    integer units; the mean's bias is an average of rows' biases, rotated back (orthonormal) and
    divided by gamma. 0 at beta = 0 (plain randomized rounding is unbiased)."""
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma!r}")
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta!r}")
    return 0.0 if beta == 0 else math.sqrt(beta) / (2.0 * (1.0 - beta)) / gamma


def coordinate_bias_bound(beta: float = BETA) -> float:
    """Bound on |E[e_j | A]|, one rounded coordinate's bias in integer units. With T_-j the rest of
    the norm excess (independent of e_j), E[e_j 1_A] = E g(tau - T_-j) where g(u) = E[e_j 1{t_j <= u}]
    takes only the values 0 and +-f(1 - f) (e_j has two values and mean 0), so
    |E[e_j | A]| <= min(1/4, sqrt(beta)/2) / (1 - beta) (the second by Cauchy-Schwarz as in
    :func:`rounding_bias_bound`)."""
    if not 0 <= beta < 1:
        raise ValueError(f"beta must be in [0, 1), got {beta!r}")
    return 0.0 if beta == 0 else min(0.25, 0.5 * math.sqrt(beta)) / (1.0 - beta)


def wrap_probability(gamma: float, *, bits: int, clip: float, dim: int, records_total: int, noise_std: float,
                     beta: float = BETA) -> float:
    """Bound on the probability that ONE coordinate of the aggregate leaves [-2**(bits-1), 2**(bits-1))
    (a modular wrap), over the rotation's signs, the rounding and the noise.

    Coordinate j of the integer aggregate is A = S + E + N (T = 2**(bits-1), N_r = records_total):
    * S = gamma (H diag(s) v)_j / sqrt(D), v the sum of all records' rows, ||v|| <= N_r C: a Rademacher
      sum with coefficients of squared sum ||gamma v||^2 / D, so E e^{lambda S} <= e^{lambda^2 s2 / 2},
      s2 = (gamma N_r C)^2 / D (the rotation's flatness, Kairouz et al. 2021 Sec. 4.2; signs
      independent of the data);
    * E = sum of the N_r rows' rounding errors: given the signs, independent across rows, each in
      an interval of width 1 and of mean at most b = :func:`coordinate_bias_bound` in absolute value:
      E e^{lambda E} <= e^{lambda N_r b + lambda^2 N_r / 8} (Hoeffding's lemma);
    * N ~ Sk(mu), mu = (gamma noise_std)^2 (the noise actually added, ``noise_std`` in signal units):
      E e^{lambda N} = e^{mu (cosh lambda - 1)}.
    Chernoff: P(A >= T) <= exp(min_lambda psi(lambda) - lambda T) with
    psi = lambda N_r b + lambda^2 (s2 + N_r/4) / 2 + mu (cosh lambda - 1); -A has the same bound, so the
    result is min(1, 2 exp(...)). Any lambda gives a valid bound; the minimiser is found by bisection
    on psi'(lambda) = T."""
    if not (gamma > 0 and math.isfinite(gamma)):
        raise ValueError(f"gamma must be finite and > 0, got {gamma!r}")
    if not (isinstance(bits, (int, np.integer)) and 2 <= bits <= MAX_BITS):
        raise ValueError(f"bits must be an integer in [2, {MAX_BITS}], got {bits!r}")
    if not (clip > 0 and math.isfinite(clip)):
        raise ValueError(f"clip must be finite and > 0, got {clip!r}")
    if not (isinstance(records_total, (int, np.integer)) and records_total >= 1):
        raise ValueError(f"records_total must be an integer >= 1, got {records_total!r}")
    if not noise_std >= 0:
        raise ValueError(f"noise_std must be >= 0, got {noise_std!r}")
    D = padded_dim(dim)
    T = float(2 ** (int(bits) - 1))
    n_r = float(records_total)
    m = n_r * coordinate_bias_bound(beta)
    v = (gamma * n_r * clip) ** 2 / D + n_r / 4.0
    mu = (gamma * noise_std) ** 2
    if m >= T:
        return 1.0

    def psi_minus(lam: float) -> float:
        try:
            cosh_term = mu * 2.0 * math.sinh(0.5 * lam) ** 2 if mu > 0 else 0.0
        except OverflowError:
            return math.inf
        return lam * m + 0.5 * lam * lam * v + cosh_term - lam * T

    def slope(lam: float) -> float:
        try:
            return m + lam * v + (mu * math.sinh(lam) if mu > 0 else 0.0) - T
        except OverflowError:
            return math.inf

    hi = (T - m) / v
    if mu > 0:
        hi = min(hi, math.asinh((T - m) / mu))
    lo = 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if slope(mid) > 0:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-15 * hi:
            break
    log_p = min(psi_minus(lo), psi_minus(hi))
    return min(1.0, 2.0 * math.exp(log_p)) if log_p < 0 else 1.0


def gamma_floor(padded: int, bound: float) -> float:
    """gamma_min = sqrt(D) / R: the smallest scale a silo accepts and the one it calibrates its
    noise at (clients/silo_secagg.py; its accounting only gets better for a larger gamma, as every
    term of the Skellam bound falls with Delta_2 at a fixed noise multiplier). Public: the
    server never sends less (strategies/secagg_relay.py)."""
    return math.sqrt(padded) / bound


@dataclass(frozen=True)
class GammaChoice:
    """:func:`choose_gamma`'s answer: the scale, the per-coordinate and whole-vector (union over the
    D coordinates) wrap bounds, and the decoded mean's rounding-bias bound (L2, signal units)."""

    gamma: float
    wrap_probability: float
    vector_wrap_probability: float
    rounding_bias: float


def choose_gamma(bits: int, clip: float, dim: int, records_total: int, noise_std: float, *, beta: float = BETA,
                 wrap_target: float = WRAP_TARGET) -> GammaChoice:
    """The largest gamma (to relative 1e-6, rounded down) whose per-coordinate wrap bound
    (:func:`wrap_probability`) is <= ``wrap_target``; ``noise_std`` is the total noise's standard
    deviation in signal units (the integer noise is then Sk((gamma noise_std)^2)). The bound grows
    with gamma (every term of psi does), so bisection finds it. ValueError if no gamma fits (the
    rounding errors of ``records_total`` rows alone overflow 2**bits)."""
    if not 0 < wrap_target < 1:
        raise ValueError(f"wrap_target must be in (0, 1), got {wrap_target!r}")

    def p(g: float) -> float:
        return wrap_probability(g, bits=bits, clip=clip, dim=dim, records_total=records_total, noise_std=noise_std,
                                beta=beta)

    lo = hi = 1.0
    if p(hi) <= wrap_target:
        while p(hi) <= wrap_target:
            lo, hi = hi, hi * 2.0
            if hi > 2.0 ** (2 * MAX_BITS):
                raise ValueError("gamma is unbounded: no data or noise to fit")
    else:
        while p(lo) > wrap_target:
            hi, lo = lo, lo / 2.0
            if lo < 1e-12:
                raise ValueError(f"no scale fits {records_total} records in {bits} bits with wrap probability "
                                 f"<= {wrap_target}")
    while hi - lo > 1e-6 * lo:
        mid = math.sqrt(lo * hi)
        if p(mid) <= wrap_target:
            lo = mid
        else:
            hi = mid
    pw = p(lo)
    return GammaChoice(lo, pw, min(1.0, padded_dim(dim) * pw), rounding_bias_bound(lo, beta))
