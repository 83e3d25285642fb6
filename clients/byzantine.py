"""Byzantine silos in experiments: which silos are Byzantine, and the data-level attacks they
run on their own side (label flipping, random labels). The model-level attacks (sign flip, IPM,
ALIE, Gaussian noise) are applied by the evaluation harness on the server side of the simulation
(strategies/byzantine_harness.py), because the omniscient ones need the honest updates of the
round. Which silos are Byzantine is public in an experiment: (seed, attack.fraction)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from app.config import Settings
from app.data.federated import SiloData
from app.seeding import np_rng
from clients.attacks import byzantine_silos, flip_labels, random_labels

#: attacks that a Byzantine silo runs on its own data
DATA_ATTACKS = ("label-flip", "random-labels")


def byzantine_indices(s: Settings) -> set[int]:
    """The Byzantine silos of this experiment, from (seed, attack.fraction)."""
    if s.attack_kind == "none" or s.attack_fraction == 0:
        return set()
    return {int(i) for i in byzantine_silos(s.num_silos, s.attack_fraction, np_rng(s.seed, "byzantine"))}


def poison_labels(data: SiloData, s: Settings, num_classes: int) -> SiloData:
    """The silo's training labels flipped (y -> C - 1 - y) or drawn at random."""
    y = data.train_y.numpy()
    if s.attack_kind == "label-flip":
        new = flip_labels(y, num_classes)
    else:
        new = random_labels(y, num_classes, np_rng(s.seed, "random-labels", data.index))
    return replace(data, train_y=torch.from_numpy(np.asarray(new, dtype=np.int64)))
