"""The silo's parts (clients/silo.py): the privacy mode picks the mechanism a silo holds, whose
silo half has every member of the SiloMechanism interface the silo asks; the silo holds its
gradients and its evaluation as the types it declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import parse_settings
from app.data.federated import build_federated_data
from clients.silo import Silo
from clients.silo_evaluation import Evaluator
from clients.silo_gradients import RecordGradients
from clients.silo_mechanism import GaussianSiloMechanism, SiloMechanism
from clients.silo_shuffle import ShuffleSiloMechanism

#: what the silo asks of its mechanism: the interface's methods and declared attributes
MEMBERS = sorted({m for m in vars(SiloMechanism) if not m.startswith("_")} | set(SiloMechanism.__annotations__))


@pytest.mark.parametrize("mode, mechanism", [("isrl", GaussianSiloMechanism), ("off", GaussianSiloMechanism),
                                             ("shuffle", ShuffleSiloMechanism)])
def test_the_privacy_mode_picks_the_mechanism_the_silo_holds(tmp_path: Path, mode: str, mechanism: type) -> None:
    s = parse_settings({"privacy.mode": mode, "standardize": "pooled", "model": "logistic"}
                       | ({"shuffle.amplification": "none"} if mode == "shuffle" else {}))
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    silo = Silo(s, fed.silos[0], fed.num_classes, fed.feature_shape, tmp_path, "parts")
    assert type(silo.mechanism) is mechanism
    assert [m for m in MEMBERS if not hasattr(silo.mechanism, m)] == []
    assert isinstance(silo.gradients, RecordGradients) and isinstance(silo.evaluation, Evaluator)
    assert silo.mechanism.sealed == (mode == "shuffle") == (silo.mechanism.sender_keys is not None)
