"""Explicit random generators derived from (run seed, purpose, round, node, ...).

Every random draw in silofl takes a generator made here (DESIGN.md section 4): the same
parts always give the same stream on any machine, and different parts give independent
streams (the parts are hashed with SHA-256).
"""

from __future__ import annotations

import hashlib

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any sequence of printable parts."""
    digest = hashlib.sha256("/".join(repr(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def np_rng(*parts: object) -> np.random.Generator:
    """A numpy Generator (PCG64) for ``parts``."""
    return np.random.default_rng(derive_seed(*parts))


def torch_gen(*parts: object) -> "torch.Generator":
    """A CPU torch.Generator for ``parts`` (draws are moved to the device afterwards)."""
    import torch

    return torch.Generator(device="cpu").manual_seed(derive_seed(*parts))
