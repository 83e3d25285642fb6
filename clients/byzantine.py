"""Byzantine silos in experiments: which silos are Byzantine, and the data-level attacks they
run on their own side (label flipping, random labels). The model-level attacks (sign flip, IPM,
ALIE, Gaussian noise) are applied by the evaluation harness on the server side of the simulation
(strategies/byzantine_harness.py), because the omniscient ones need the honest updates of the
round. Which silos are Byzantine is public in an experiment: (seed, attack.fraction)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from app.attacks import DATA_ATTACKS, byzantine_indices, flip_labels, random_labels
from app.data.federated import SiloData
from app.seeding import np_rng

__all__ = ["DATA_ATTACKS", "byzantine_indices", "poison_labels"]


def poison_labels(data: SiloData, attack_kind: str, seed: int, num_classes: int) -> SiloData:
    """The silo's training labels flipped (y -> C - 1 - y, ``label-flip``) or drawn at random
    from (``seed``, the silo's index)."""
    import torch  # only a silo that poisons its labels needs it here

    y = data.train_y.numpy()
    if attack_kind == "label-flip":
        new = flip_labels(y, num_classes)
    else:
        new = random_labels(y, num_classes, np_rng(seed, "random-labels", data.index))
    return replace(data, train_y=torch.from_numpy(np.asarray(new, dtype=np.int64)))
