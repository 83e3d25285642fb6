"""The evaluation harness for model-level attacks (threat model: colluding, omniscient adversary).

In a simulation the Byzantine silos answer honestly; after all replies of the round have arrived
the harness replaces each Byzantine silo's message, in the space in which it was sent (the flat
update, or the sketch payload y when the round is sketched: a Byzantine silo can only send some
y, and the server lifts S^T y), by the attack's output:

* ``sign-flip``: the negation of the silo's own honest message;
* ``ipm``: -epsilon * mean of the honest messages (Xie et al. 2020);
* ``alie``: coordinate-wise mu + z sigma over the honest messages (Baruch et al. 2019; z from their
  formula when f < n/2, ``attack.alie-z`` otherwise, where the formula is undefined);
* ``gaussian``: N(0, attack.noise-std^2) in every coordinate.

Data-level attacks (label flipping, random labels) run on the Byzantine silos themselves
(clients/byzantine.py) and need nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from app.config import Settings
from app.seeding import np_rng
from app.attacks import MODEL_ATTACKS, alie, alie_z, byzantine_count, gaussian_noise, ipm, sign_flip


def alie_z_for(s: Settings, n: int, f: int) -> float:
    """``attack.alie-z`` when set; else Baruch et al.'s z for this round's n and f, or, in a round
    where the sampled Byzantine silos happen to be a majority, for the whole federation's N and f."""
    if s.attack.alie_z:
        return s.attack.alie_z
    if f < n / 2:
        return alie_z(n, f)
    return alie_z(s.num_silos, byzantine_count(s.num_silos, s.attack.fraction))


def attack_messages(s: Settings, server_round: int, messages: Mapping[int, np.ndarray], byzantine: set[int]
                    ) -> dict[int, np.ndarray]:
    """Messages (node -> vector) after the Byzantine nodes' ones are replaced; honest ones unchanged.
    The omniscient attacks need at least one honest message; without one they send their own."""
    out = {node: np.asarray(m, dtype=np.float32) for node, m in messages.items()}
    if s.attack.kind not in MODEL_ATTACKS or not byzantine:
        return out
    honest = [m for node, m in out.items() if node not in byzantine]
    stack = np.stack(honest).astype(np.float64) if honest else None
    n, f = len(out), len([node for node in out if node in byzantine])
    for node in sorted(byzantine & set(out)):
        own = out[node]
        if s.attack.kind == "sign-flip":
            new = sign_flip(own)
        elif s.attack.kind == "gaussian":
            new = gaussian_noise(own.shape, s.attack.noise_std, np_rng(s.seed, "attack-noise", server_round, node))
        elif stack is None:
            new = own
        elif s.attack.kind == "ipm":
            new = ipm(stack, s.attack.ipm_epsilon)
        else:
            new = alie(stack, n, f, z=alie_z_for(s, n, f))
        out[node] = np.asarray(new, dtype=np.float32)
    return out
