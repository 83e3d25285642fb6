"""Pre-processing inside the guarantee (app/data/scaling.py, app/privacy/preprocessing.py):
checked against independent facts: the replace-one sensitivities of the DP statistics (attained
by an explicit neighbouring pair), the Gaussian mechanism's exact (eps, delta) (Balle & Wang 2018,
tests/helpers.py) for the noise, and the Gaussian-DP composition of every release a silo's
ledger holds after a run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from app.config import ConfigError, parse_settings
from app.data.scaling import clip_records, dp_moments, dp_standardizer, dp_stats_sigmas, range_scaler, resolve_scaling
from app.privacy.preprocessing import PREPROCESS_KIND, preprocess_noise_multiplier
from tests.helpers import analytic_gaussian_delta, run


def _eps_of_gaussian(mu: float, delta: float) -> float:
    """The smallest eps with delta(eps) <= delta for one Gaussian mechanism of shift/std ``mu``
    (bisection on Balle & Wang's exact delta(eps))."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if analytic_gaussian_delta(1.0 / mu, 1.0, mid) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def test_dp_statistics_sensitivities_are_attained_and_never_exceeded() -> None:
    n, c, d = 50, 2.0, 6
    rng = np.random.default_rng(0)
    s_mean, s_second = dp_stats_sigmas(n, c, 1.0)  # z = 1: the sigmas are the sensitivities
    assert (s_mean, s_second) == pytest.approx((2 * c / n, math.sqrt(2) * c * c / n))
    base = rng.normal(0, 3, size=(n, d))
    worst_mean = worst_second = 0.0
    for _ in range(300):  # random replacements of one record never move the clipped moments further
        other = base.copy()
        other[rng.integers(n)] = rng.normal(0, 10, size=d) * rng.choice([0.0, 1.0, 100.0])
        a, b = clip_records(base, c), clip_records(other, c)
        worst_mean = max(worst_mean, np.linalg.norm(a.mean(0) - b.mean(0)))
        worst_second = max(worst_second, np.linalg.norm((a * a).mean(0) - (b * b).mean(0)))
    assert worst_mean <= 2 * c / n + 1e-12 and worst_second <= math.sqrt(2) * c * c / n + 1e-12
    # the bounds are attained: x0 = C e1 -> -C e1 (mean), C e1 -> C e2 (second moment)
    x = np.zeros((n, d))
    x[0, 0] = 5 * c
    y = x.copy()
    y[0, 0] = -5 * c
    assert np.linalg.norm(clip_records(x, c).mean(0) - clip_records(y, c).mean(0)) == pytest.approx(2 * c / n)
    y = np.zeros((n, d))
    y[0, 1] = 5 * c
    cx, cy = clip_records(x, c), clip_records(y, c)
    assert np.linalg.norm((cx * cx).mean(0) - (cy * cy).mean(0)) == pytest.approx(math.sqrt(2) * c * c / n)


def test_dp_statistics_noise_std_is_the_gaussian_mechanisms() -> None:
    """The released mean and second moment carry N(0, (z * sensitivity)^2) noise per feature, with
    the sensitivities 2C/n and sqrt(2) C^2/n, centred on the clipped records' true moments."""
    n, c, z, draws = 40, 1.0, 3.0, 4000
    x = np.random.default_rng(1).normal(0, 1.0, size=(n, 3))
    cx = clip_records(x, c)
    ms, qs = zip(*[dp_moments(x, c, z, np.random.default_rng(seed))[:2] for seed in range(draws)])
    ms, qs = np.array(ms), np.array(qs)
    s_mean, s_second = z * 2 * c / n, z * math.sqrt(2) * c * c / n
    assert np.abs(ms.mean(0) - cx.mean(0)).max() < 4 * s_mean / math.sqrt(draws)
    assert np.abs(qs.mean(0) - (cx * cx).mean(0)).max() < 4 * s_second / math.sqrt(draws)
    assert ms.std(0) == pytest.approx([s_mean] * 3, rel=0.05)
    assert qs.std(0) == pytest.approx([s_second] * 3, rel=0.05)
    st = dp_standardizer(x, c, z, np.random.default_rng(7))  # post-processing of the same draw
    m, q, s2 = dp_moments(x, c, z, np.random.default_rng(7))
    assert np.allclose(st.mean, m) and np.allclose(st.std, np.sqrt(np.maximum(q - m * m, s2)))


@pytest.mark.parametrize("n,eps,share", [(170, 3.0, 0.1), (286, 1.0, 0.25), (5000, 8.0, 0.1)])
def test_preprocess_multiplier_spends_its_share_by_the_analytic_gaussian(n: int, eps: float, share: float) -> None:
    """Two Gaussian releases with multiplier z compose into one with z / sqrt(2) (Gaussian DP);
    Balle & Wang's exact delta at share * eps is then the silo's delta (z the smallest, rtol 1e-3)."""
    delta = 1.0 / n**2
    z = preprocess_noise_multiplier(n, eps, share, delta)
    assert analytic_gaussian_delta(z / math.sqrt(2), 1.0, share * eps) <= delta * (1 + 1e-6)
    assert analytic_gaussian_delta(z * (1 - 3e-3) / math.sqrt(2), 1.0, share * eps) > delta


def test_ledger_after_preprocessing_and_training_is_the_gaussian_composition(tmp_path: Path) -> None:
    """A WBCD run with standardize = dp: each silo's ledger holds the pre-processing release first,
    then the full-batch training releases; its epsilon is the exact composition of all of them
    (1/mu^2 = sum count / z^2, Balle & Wang at delta = 1/n^2), within the run's epsilon, recomputed
    here from the released multipliers only."""
    summary, _, _ = run(tmp_path, {"privacy.mode": "isrl", "privacy.epsilon": 3.0, "standardize": "dp",
                                   "num-rounds": 4})
    assert summary["preprocessing"]["covered_by_eps"] is True
    for silo in summary["silos"]:
        kinds = {r["kind"]: r for r in silo["releases"]}
        assert set(kinds) == {PREPROCESS_KIND, "grad"}
        pre, grad = kinds[PREPROCESS_KIND], kinds["grad"]
        assert (pre["count"], pre["batch"], grad["count"], grad["batch"]) == (2, silo["n"], 4, silo["n"])
        delta = 1.0 / silo["n"] ** 2
        mu = math.sqrt(2 / pre["noise_multiplier"] ** 2 + 4 / grad["noise_multiplier"] ** 2)
        assert silo["eps_spent"] == pytest.approx(_eps_of_gaussian(mu, delta), rel=1e-6)
        assert silo["eps_spent"] <= 3.0 * (1 + 1e-9)
        assert silo["eps_spent"] == pytest.approx(3.0, rel=2e-3)  # the training spends the rest
        pre_alone = _eps_of_gaussian(math.sqrt(2) / pre["noise_multiplier"], delta)
        assert pre_alone == pytest.approx(0.3, rel=2e-3)
    ledgers = sorted((tmp_path / "state").rglob("ledger-*-silo*.json"))
    assert ledgers
    for path in ledgers:  # the pre-processing release is recorded before any training release
        rows = [line for line in path.read_text().splitlines() if '"release"' in line]
        assert PREPROCESS_KIND in rows[0] and all(PREPROCESS_KIND not in r for r in rows[1:])


def test_pooled_preprocessing_is_marked_not_covered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary, _, _ = run(tmp_path, {"privacy.mode": "isrl", "privacy.epsilon": 3.0, "standardize": "pooled",
                                   "num-rounds": 2})
    out = capsys.readouterr().out
    pre = summary["preprocessing"]
    assert pre["covered_by_eps"] is False and pre["steps"][-1]["covered_by_eps"] is False
    assert "NOT covered" in pre["caveat"] and "certified" not in pre["caveat"]
    assert "[silofl] CAVEAT: pre-processing NOT covered by epsilon" in out
    assert "(pre-processing NOT covered)" in out
    summary, _, _ = run(tmp_path, {"privacy.mode": "isrl", "privacy.epsilon": 3.0, "num-rounds": 2}, name="d")
    assert summary["preprocessing"]["covered_by_eps"] is True and summary["preprocessing"]["caveat"] is None
    assert "CAVEAT" not in capsys.readouterr().out


def test_public_scaling_reads_no_record() -> None:
    """Public ranges: each record's features are a function of that record alone (adding or
    changing any other record changes nothing): x -> x / 16 for the digits."""
    x = np.random.default_rng(2).integers(0, 17, size=(30, 64)).astype(np.float32)
    sc = range_scaler(0.0, 16.0, (64,))
    assert np.array_equal(sc.apply(x), (x / 16).astype(np.float32))
    assert np.array_equal(sc.apply(np.concatenate([x, x[:1] * 0 + 16]))[:30], sc.apply(x))


def test_defaults_and_refusals() -> None:
    assert resolve_scaling("auto", "digits") == "server" and resolve_scaling("auto", "wbcd") == "server"
    assert resolve_scaling("auto", "digits", server_data=False) == "public"
    assert resolve_scaling("auto", "mine", (0.0, 1.0), server_data=False) == "public"
    assert resolve_scaling("auto", "mine", server_data=False) == "dp"
    s = parse_settings({})
    assert (s.standardize, s.pca_fit) == ("auto", "public")
    with pytest.raises(ConfigError, match="standardize = 'dp' is not allowed with privacy.mode = 'shuffle'"):
        parse_settings({"privacy.mode": "shuffle", "privacy.epsilon": 3.0, "standardize": "dp"})


def test_public_pca_is_fitted_on_records_no_silo_holds() -> None:
    from app.data.federated import _splits, data_key

    s = parse_settings({"dataset": "digits", "pca": 8, "num-silos": 3, "silos-per-round": 3})
    _, splits, _, _, vals, trust, public = _splits(data_key(s, s.seed, s.robust.trust_size))
    held = np.concatenate([np.concatenate([tr, te]) for tr, te in splits] + vals)
    assert len(public) == min(500, (1797 - len(trust)) // 10) and not np.intersect1d(public, held).size
    old = parse_settings({"dataset": "digits", "pca": 8, "num-silos": 3, "silos-per-round": 3, "pca-fit": "pooled",
                          "standardize": "pooled"})
    assert len(_splits(data_key(old, old.seed, old.robust.trust_size))[6]) == 0  # the reproducing mode carves nothing out


@pytest.mark.parametrize("noise_seed", ["run", "os"])
def test_a_restarted_silo_reuses_its_charged_preprocessing(tmp_path: Path, noise_seed: str) -> None:
    """The release is recorded once per calibration; a silo restarted on the same ledger applies the
    same noisy statistics (their seed is kept in the ledger's calibration, OS-drawn with
    noise-seed = os) and records nothing more."""
    import torch

    from app.data.federated import build_federated_data
    from clients.silo import Silo

    s = parse_settings({"privacy.mode": "isrl", "privacy.epsilon": 3.0, "standardize": "dp",
                        "privacy.noise-seed": noise_seed})
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    first = Silo(s, fed.silos[0], fed.num_classes, fed.feature_shape, tmp_path, "k")
    again = Silo(s, fed.silos[0], fed.num_classes, fed.feature_shape, tmp_path, "k")
    other = Silo(s, fed.silos[0], fed.num_classes, fed.feature_shape, tmp_path / "b", "k")
    assert [r.kind for r in again.ledger.recorded()] == [PREPROCESS_KIND]
    assert torch.equal(first.records.train_x, again.records.train_x) and torch.equal(first.records.test_x, again.records.test_x)
    assert not torch.equal(first.records.train_x, fed.silos[0].train_x)  # the silo's data were transformed
    assert torch.equal(first.records.train_x, other.records.train_x) == (noise_seed == "run")


def test_the_preprocessing_release_is_planned_as_it_is_released(tmp_path: Path) -> None:
    """summary.json's silo entry (Silo.ledger_report): the pre-processing release of standardize =
    dp is in `planned`, with the count, batch and multiplier its `releases` entry shows (issue 35:
    before, it was in `releases` only, so planned did not add up to what the silo spent)."""
    from app.data.federated import build_federated_data
    from clients.silo import Silo

    s = parse_settings({"privacy.mode": "isrl", "privacy.epsilon": 3.0, "standardize": "dp"})
    fed = build_federated_data(s, s.seed, s.robust.trust_size)
    report = Silo(s, fed.silos[0], fed.num_classes, fed.feature_shape, tmp_path, "k").ledger_report()
    planned = {r["phase"]: r for r in report["planned"]}
    released = {r["kind"]: r for r in report["releases"]}
    assert PREPROCESS_KIND in planned and set(released) == {PREPROCESS_KIND}
    assert list(planned)[0] == "grad"  # training rows first (readers take planned[0]'s sigma)
    for key in ("count", "batch", "noise_multiplier"):
        assert planned[PREPROCESS_KIND][key] == released[PREPROCESS_KIND][key]
    assert "grad" in planned
    plain = parse_settings({"privacy.mode": "isrl", "privacy.epsilon": 3.0})
    fed = build_federated_data(plain, plain.seed, plain.robust.trust_size)
    report = Silo(plain, fed.silos[0], fed.num_classes, fed.feature_shape, tmp_path / "b", "k").ledger_report()
    assert PREPROCESS_KIND not in {r["phase"] for r in report["planned"]}
