"""Privacy mechanisms: what a silo applies to its clipped per-record rows, and what the server
undoes. One object per mechanism, both halves together:

* ``release(rows, generator)`` (silo side): the message for K clipped rows [K, d] (each of
  norm <= the clip, so the replace-one sensitivity of their mean is the plan's);
* ``decode(message)`` (server side, after lifting a sketch): the estimate of the rows' mean
  that the server step uses.

The silo's pipeline is clip -> mechanism -> sketch, the server's lift -> decode -> aggregate.
Today: the Gaussian mechanism (ISRL-DP). The binomial shuffle encoding (shuffle DP) is a second
implementation of the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np
import torch


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


#: privacy.mode -> the mechanism a silo releases with, given the release's sigma
MECHANISMS = {"isrl": GaussianMechanism}


def make_mechanism(mode: str, sigma: float) -> Mechanism:
    try:
        return MECHANISMS[mode](sigma)
    except KeyError:
        raise ValueError(f"no mechanism for privacy.mode = {mode!r}; known: {', '.join(MECHANISMS)}") from None


def server_decoder(mode: str) -> Callable[[np.ndarray], np.ndarray] | None:
    """The server-side half for ``privacy.mode`` (None: messages are estimates already)."""
    mechanism = MECHANISMS.get(mode)
    return mechanism.decode if mechanism is not None and mechanism.encoded else None
