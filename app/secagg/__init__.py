"""Secure aggregation (SecAgg, Bonawitz et al. CCS 2017; SecAgg+, Bell et al. CCS 2020), no Flower.

:mod:`shamir` (t-of-n sharing over GF(2**521 - 1)), :mod:`prg` (AES-CTR masks, X25519 pair
seeds), :mod:`graph` (the k-regular communication graph), :mod:`protocol` (messages and the
silo's and server's state machines).
"""

from app.secagg.protocol import (
    Advert,
    SecAggAborted,
    SecAggError,
    SecAggServer,
    SecAggSilo,
    SharePayload,
    UnmaskReply,
    default_threshold,
)

__all__ = ["Advert", "SecAggAborted", "SecAggError", "SecAggServer", "SecAggSilo", "SharePayload",
           "UnmaskReply", "default_threshold"]
