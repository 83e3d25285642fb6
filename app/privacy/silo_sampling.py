"""Amplification by silo sampling done by the shuffler (not the server), and its seal tag.

Setting. Every silo sends; the shuffler, with its own generator from OS randomness (never the
server's), keeps a uniformly random M of its N allowed senders for each exchange and sums only
the kept ones' contributions (a kept sender whose blob is missing adds nothing). Silo i is kept
with probability q = M / N, independently of the data and of anything the server does (the
sample is drawn from the shuffler's own sender list, so withholding blobs cannot raise q, and
each exchange is aggregated once, so the server cannot redraw it).

The bound. Fix everything but silo i's records; D, D' differ by replacing one of its records.
The release is the mixture

    mu_D = (1 - q) A + q B(D),    mu_D' = (1 - q) A + q B(D'),

A the release when silo i is not kept (it does not depend on silo i's records or noise, and may
be any distribution), B the release when it is. With H_a(P || Q) = sum P^a Q^(1-a), a > 1, the
map (P, Q) -> H_a(P || Q) is jointly convex (x^a y^(1-a) is the perspective of the convex
x -> x^a), so

    H_a(mu_D || mu_D') <= (1 - q) H_a(A || A) + q H_a(B(D) || B(D'))
                        = (1 - q) + q exp((a - 1) eps_B(a)),

    eps'(a) = log(1 - q + q exp((a - 1) eps_B(a))) / (a - 1)          (:func:`silo_sampled_rdp`)

for any eps_B(a) >= D_a(B(D) || B(D')); replace-one is symmetric, so the same holds with D, D'
swapped. Nothing about A is needed; the bound is attained when A and B have disjoint supports
(e.g. when the server learns which silos were kept), so it does NOT need the kept set to stay
secret, only that the server cannot choose or bias it. eps' is non-decreasing in eps_B, so an
upper bound on eps_B gives an upper bound on eps'. For small (a - 1) eps_B it is ~ q eps_B
(linear in q: weaker than record-level sampling's q^2, which needs A and B to be neighbours).

Ideal vs real. app/privacy/binomial/ bounds D_a(I(Y) || R(Y')), I the release with silo i's
noise conditioned on its window, TV(I, R) <= d * tail. The same argument with B_I(D) in place of
B(D) holds (A does not contain silo i's noise, so its ideal and real forms coincide), and
TV((1-q) A + q B_I, (1-q) A + q B_R) <= q d tail <= d tail: the tail is charged as before. A
record-level amplified curve (app/privacy/amplification.py) may be used as eps_B: the silo's
batch and the shuffler's sample are drawn independently.

Noise. B must carry silo i's whole calibration by itself: silo sampling is claimed only with
count-on = 1 (each silo adds all the noise its guarantee needs). With count-on > 1 silo i counts
on the other silos' noise, and the shuffler discards some of them: refused
(:func:`count_on_violation`).

Seal tag. A silo that claims q seals the tag b"SSMP" + "<II" (M, N) after its binding
(SHA-256(context) + "<Q" seq, app/privacy/contribution.py): the shuffler drops a tagged
contribution unless it samples exactly M of exactly N senders itself (:func:`tag_mismatch`).
"""

from __future__ import annotations

import math
import secrets
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from app.privacy.binomial import BinomialCurve

TAG_MAGIC = b"SSMP"
_TAG = struct.Struct("<4sII")
#: length of the binding a silo seals without the tag: SHA-256(context) + "<Q" sequence number
BASE_BINDING = 32 + 8


def silo_sampled_rdp(eps_b: float, alpha: float, q: float) -> float:
    """eps'(alpha) = log(1 - q + q exp((alpha - 1) eps_B)) / (alpha - 1) (module docstring), for a
    silo kept with probability ``q`` whose release, when kept, has Renyi bound ``eps_b``."""
    if not alpha > 1:
        raise ValueError(f"alpha must be > 1, got {alpha!r}")
    if not 0 < q <= 1:
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    if math.isnan(eps_b) or eps_b < 0:
        raise ValueError(f"eps_B must be >= 0, got {eps_b!r}")
    if q >= 1 or eps_b == 0 or math.isinf(eps_b):
        return float(eps_b)
    x = (alpha - 1) * eps_b
    if x < 700:
        cgf = math.log1p(q * math.expm1(x))
    else:  # log((1 - q) + q e^x), shifted by x
        cgf = x + math.log(q) + math.log1p((1 - q) / q * math.exp(-x))
    return min(float(eps_b), cgf / (alpha - 1) * (1.0 + 1e-12))


def silo_sampled_curve(orders: Sequence[float], curve: BinomialCurve, q: float) -> BinomialCurve:
    """``curve`` (a release's RDP at ``orders`` and its tail delta) when the shuffler keeps the
    silo with probability ``q``: eps' at every order, the same tail (charged once)."""
    if len(orders) != len(curve.rdp):
        raise ValueError(f"{len(orders)} orders but a curve of {len(curve.rdp)} values")
    from app.privacy.binomial import BinomialCurve  # scipy and dp-accounting: only when an epsilon is computed

    return BinomialCurve(rdp=tuple(silo_sampled_rdp(float(r), float(a), q) for a, r in zip(orders, curve.rdp)),
                         tail=curve.tail)


def count_on_violation(count_on: int) -> str | None:
    """Why silo sampling cannot be claimed at ``count_on`` (None: it can, count-on = 1)."""
    if int(count_on) == 1:
        return None
    return (f"silo sampling is claimed only with shuffle.count-on = 1, got {count_on}: with count-on > 1 the silo "
            "counts on other silos' noise, which the shuffler discards with the silos it does not keep")


def rate(keep: int, of: int) -> float:
    """q = M / N, checked: 1 <= M <= N."""
    if not (isinstance(keep, int) and isinstance(of, int) and 1 <= keep <= of):
        raise ValueError(f"silo sampling needs integers 1 <= M <= N, got M={keep!r}, N={of!r}")
    return keep / of


def tag(keep: int, of: int) -> bytes:
    """The bytes a silo claiming q = M / N appends to its binding."""
    rate(keep, of)
    return _TAG.pack(TAG_MAGIC, keep, of)


def parse_tag(binding: bytes) -> tuple[int, int] | None:
    """(M, N) a binding claims, or None when it claims no silo sampling; ValueError if malformed."""
    rest = bytes(binding)[BASE_BINDING:]
    if not rest:
        return None
    if len(rest) != _TAG.size:
        raise ValueError(f"binding has {len(rest)} trailing bytes; a silo-sampling tag has {_TAG.size}")
    magic, keep, of = _TAG.unpack(rest)
    if magic != TAG_MAGIC:
        raise ValueError(f"binding's trailing bytes are not a silo-sampling tag (magic {magic!r})")
    rate(keep, of)
    return keep, of


def tag_mismatch(binding: bytes, keep: int, of: int) -> str | None:
    """Why the shuffler (sampling ``keep`` of ``of`` senders; keep = 0: no sampling) must drop a
    contribution with this binding, or None. A contribution claiming no silo sampling is always
    fine (sampling only helps it); one claiming M/N needs the shuffler to sample exactly M of N."""
    try:
        claimed = parse_tag(binding)
    except ValueError as exc:
        return f"its silo-sampling tag is malformed: {exc}"
    if claimed is None or claimed == (keep, of):
        return None
    mine = f"keeps {keep} of {of} senders" if keep else "does not sample silos"
    return (f"it claims silo sampling of {claimed[0]} of {claimed[1]} silos, but this shuffler {mine}: "
            "its privacy accounting would not hold")


def os_generator() -> np.random.Generator:
    """A generator seeded from the OS (128 bits of ``secrets``), never from a run's seed."""
    return np.random.default_rng(secrets.randbits(128))


def kept_senders(senders: Sequence[bytes], keep: int, rng: np.random.Generator) -> frozenset[bytes]:
    """A uniformly random ``keep``-subset of ``senders`` (sorted first, so the draw depends on
    ``rng`` only)."""
    pool = sorted(set(bytes(s) for s in senders))
    rate(keep, len(pool))
    chosen = rng.choice(len(pool), size=keep, replace=False)
    return frozenset(pool[int(i)] for i in chosen)


def claim(keep: int, silos: int, trusted: bool, count_on: int, pinned: bool = True) -> tuple[float, bytes, str]:
    """What a silo claims for one release: (q, the tag to seal after its binding, why). It claims
    q = M / N only when the run asks for silo sampling (M = ``keep`` > 0 of N = ``silos``), its
    node config trusts the shuffler for it (``trusted``) and pins the shuffler's key (``pinned``:
    else the server could hand it a key of its own) and count-on is 1; else (1, b"", why not).
    A shuffler that does not keep exactly M of N drops a tagged contribution (:func:`tag_mismatch`)."""
    if keep <= 0:
        return 1.0, b"", "not claimed: the run asks for no silo sampling (shuffle.silo-sample = 0)"
    if not trusted:
        return 1.0, b"", ("not claimed: this node does not trust the shuffler's silo sampling (node config "
                          "shuffle-trust-silo-sampling = false)")
    if not pinned:
        return 1.0, b"", ("not claimed: this node pinned no shuffler key (node config shuffler-public-key), so the "
                          "server could relay its contributions to a shuffler of its own")
    violation = count_on_violation(count_on)
    if violation is not None:
        return 1.0, b"", f"not claimed: {violation}"
    return rate(keep, silos), tag(keep, silos), (f"claimed: the shuffler keeps a random {keep} of the {silos} silos' "
                                                 "contributions (OS randomness), so this silo's releases are accounted "
                                                 f"at q = {keep}/{silos}")
