"""Privacy mechanisms: what a silo applies to its clipped per-record rows, and what the server
undoes. One object per mechanism, both halves together:

* ``release(rows, generator)`` (silo side): the message for K clipped rows [K, d] (each of
  norm <= the clip, so the replace-one sensitivity of their mean is the plan's);
* ``decode(message)`` (server side, after lifting a sketch): the estimate of the rows' mean
  that the server step uses.

The silo's pipeline is clip -> mechanism -> sketch, the server's lift -> decode -> aggregate.
Three mechanisms: the Gaussian mechanism (ISRL-DP); the binomial shuffle encoding (shuffle DP,
app/privacy/shuffle.py), whose message is an integer count vector sealed to the shuffler and
whose server half (``aggregated``) runs on the shuffler's totals, not on each message
(strategies/shuffle_relay.py); and the distributed Skellam encoding (secure aggregation,
app/privacy/skellam/), masked so that the server holds only the sum (strategies/secagg_relay.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch

from app.privacy.shuffle import ShuffleCode, encode_counts
from app.privacy.skellam.encoding import SkellamCode, encode as encode_skellam


def add_gaussian_noise(vec: torch.Tensor, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """Return vec + N(0, sigma^2 I). The noise is drawn on the generator's device (CPU)
    and moved to ``vec``'s device, so the draw is identical on any hardware."""
    if not 0 <= sigma < float("inf"):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if sigma == 0:
        return vec
    noise = torch.randn(vec.shape, generator=generator, dtype=vec.dtype, device=generator.device)
    return vec + sigma * noise.to(vec.device)


class Mechanism(ABC):
    """A privacy mechanism's two halves (see the module docstring)."""

    @abstractmethod
    def release(self, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Silo side: the message for the clipped rows [K, d]."""

    #: whether the server must decode the (lifted) message; False: it is already the estimate
    encoded: bool = False

    @classmethod
    def decode(cls, message: np.ndarray) -> np.ndarray:
        """Server side: the estimate of the mean of the rows (the identity unless ``encoded``)."""
        return message


class GaussianMechanism(Mechanism):
    """(1/K) sum_i rows_i + N(0, sigma^2 I); sigma = z * sensitivity from the silo's calibration."""

    def __init__(self, sigma: float) -> None:
        if not 0 <= sigma < float("inf"):
            raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
        self.sigma = sigma

    def release(self, rows: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return add_gaussian_noise(rows.mean(dim=0), self.sigma, generator)


class BinomialShuffleMechanism(Mechanism):
    """The randomizer of the binomial vector-summation protocol: per-coordinate counts of the
    rows' rounded levels plus Bin(K b, p) noise (app/privacy/shuffle.py). Its server half is the
    analyzer on the shuffler's totals (``shuffle.debias``), so ``decode`` is never applied to a
    single message."""

    #: the server decodes the shuffler's sum of all messages, not each message
    aggregated = True

    def __init__(self, code: ShuffleCode, trials_per_record: int, rng: np.random.Generator) -> None:
        self.code = code
        self.trials_per_record = trials_per_record
        self.rng = rng

    def release(self, rows: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The int64 counts c_j = sum_i floor(a_ij + U_ij) + Bin(K b, p) (draws from ``self.rng``)."""
        counts = encode_counts(rows.detach().cpu().numpy(), self.code, self.trials_per_record, self.rng)
        return torch.from_numpy(counts)


class SkellamSecAggMechanism(Mechanism):
    """Distributed DP over secure aggregation: the integer sum of the rows rotated, scaled and
    conditionally rounded, plus Sk(mu_add) per coordinate, mod 2**bits
    (app/privacy/skellam/encoding.py ``encode``). Its server half decodes the masked *sum* of all
    silos' messages (strategies/secagg_relay.py), so ``decode`` is never applied to one message."""

    aggregated = True

    def __init__(self, code: SkellamCode, mu_add: float, rng: np.random.Generator) -> None:
        self.code = code
        self.mu_add = mu_add
        self.rng = rng

    def release(self, rows: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """The uint64 vector of length D in [0, 2**bits) (draws from ``self.rng``)."""
        encoded = encode_skellam(rows.detach().cpu().double().numpy(), self.code, self.mu_add, self.rng)
        return torch.from_numpy(encoded.astype(np.int64))


#: privacy.mode -> the mechanism a silo releases with
MECHANISMS: dict[str, type[Mechanism]] = {"isrl": GaussianMechanism, "shuffle": BinomialShuffleMechanism,
                                          "secagg": SkellamSecAggMechanism}


def make_mechanism(mode: str, sigma: float) -> Mechanism:
    """The Gaussian mechanism of a release with standard deviation ``sigma`` (``mode`` isrl)."""
    if mode != "isrl":
        raise ValueError(f"make_mechanism builds the Gaussian mechanism (privacy.mode = isrl), not {mode!r}; "
                         "shuffle releases are encoded by BinomialShuffleMechanism")
    return GaussianMechanism(sigma)


def server_decoder(mode: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The server-side half for ``privacy.mode`` (None: messages are estimates already)."""
    mechanism = MECHANISMS.get(mode)
    if mechanism is None or getattr(mechanism, "aggregated", False):
        return None
    return mechanism.decode if mechanism.encoded else None
