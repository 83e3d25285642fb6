"""The free score of a private selection (issue 39): the server's public sample
(app/data/federated.py ``public_sample``) and the calibration of K candidates that differ in their
release plans (scripts/reproduce/robust_gap_private_tuning.py), against independent facts."""

from __future__ import annotations

import numpy as np
import pytest

from app.config import parse_settings
from app.data.federated import _splits, build_federated_data, data_key, public_sample


def test_the_public_sample_is_disjoint_from_every_silo_and_the_trust_set_and_scaled_by_its_own_statistics() -> None:
    """standardize = auto is "server" for a built-in source: the shared scaler is fitted on the
    public sample itself, so the sample comes out with mean 0 and std 1 per feature; its records
    are none of a silo's (train, validation, test) nor the trust set's."""
    s = parse_settings({"dataset": "wbcd", "validation-fraction": 0.2, "algorithm": "robust"})
    trust_size = s.robust.trust_size
    assert trust_size > 0
    pub = public_sample(s, s.seed, trust_size)
    x = pub.x.numpy().astype(np.float64)
    assert len(pub.y) == min(500, max((569 - trust_size) // 10, 2))  # the documented auto size
    np.testing.assert_allclose(x.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(x.std(axis=0), 1.0, atol=1e-3)
    _, splits, _, _, vals, trust, public = _splits(data_key(s, s.seed, trust_size))
    silo_records = np.concatenate([np.concatenate([tr, te, va]) for (tr, te), va in zip(splits, vals)])
    assert not np.intersect1d(public, silo_records).size and not np.intersect1d(public, trust).size
    # the silos' records go through the same scaler: a silo's features are not standardised to 0/1
    fed = build_federated_data(s, s.seed, trust_size)
    assert abs(float(fed.silos[0].train_x.mean())) > 1e-3


def test_a_run_without_a_public_sample_is_a_one_line_refusal() -> None:
    s = parse_settings({"dataset": "wbcd", "standardize": "pooled"})
    with pytest.raises(ValueError, match="no public sample at the server"):
        public_sample(s, s.seed, 0)


def test_candidates_with_different_plans_compose_within_epsilon_by_the_silos_own_accountant() -> None:
    """robust_gap_private_tuning.calibrate_candidates: K candidates (different batch sizes, so
    different release plans) at one eps_c; each silo calibrates each candidate itself
    (ReleasePlan.calibrate) and its ledger's accountant (dp-accounting, app/privacy/accounting.py
    ``epsilon_spent``) composes all K runs' releases: within epsilon, and tight for the silo that
    sets eps_c."""
    from app.algorithms import get_algorithm
    from app.privacy.accounting import Release, epsilon_spent
    from app.privacy.release_plan import ReleasePlan
    from scripts.reproduce.robust_gap_private_tuning import calibrate_candidates

    base = {"dataset": "synthetic", "algorithm": "mbsgd", "num-rounds": 8}
    cands = [base | {"batch-size": b} for b in (16, 64, 0)]
    sizes, eps = [150, 260], 4.0
    delta_for = parse_settings(base).privacy.delta_for
    eps_c = calibrate_candidates(cands, sizes, eps, delta_for, iters=10)
    assert eps / len(cands) < eps_c < eps  # RDP composition affords more than eps / K per run
    spent = []
    for n in sizes:
        releases = []
        for c in cands:
            s = parse_settings(c | {"privacy.epsilon": eps_c})
            plan = ReleasePlan.of(get_algorithm(s.algorithm), s.algorithm_options(), n, s.privacy.clip, eps_c,
                                  s.privacy.delta_for(n))
            releases += [Release(str(r.phase), n, r.batch, float(r.noise_multiplier), r.count)
                         for r in plan.calibrated(plan.calibrate()).values()]
        spent.append(epsilon_spent(releases, delta_for(n)))
    assert max(spent) <= eps
    assert max(spent) > 0.97 * eps
