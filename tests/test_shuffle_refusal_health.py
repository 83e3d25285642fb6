"""A shuffle-DP run whose sums the shuffler refused (app/run_health.py): the hint names the
shuffler's refusal and its reason, never round-timeout. On hand-made rows (the row key
``shuffle_refused`` that strategies/loop.py writes) and end to end: a silo down, so the two
others carry 2/3 of the noise each counts on and the real shuffler refuses every sum."""

from __future__ import annotations

from app.config import parse_settings
from app.launch import merged_run_config
from app.run_health import NO_PROGRESS, diagnose
from tests.helpers import silo_down_hook

REASON = ("shuffler refused: no contribution's privacy calibration is met: 2000 noise trials available, "
          "at least 2900 required")


def settings(**over):
    return parse_settings(merged_run_config([]) | {"privacy.mode": "shuffle", "num-silos": 3,
                                                   "silos-per-round": 3} | over)


def rows(refused: str | None, n: int = 3) -> list[dict]:
    extra = {"shuffle_refused": refused} if refused else {}
    return [{"round": i + 1, "answered": 0, "refused": 0, "failed": 0, "shuffle_dropped": 3} | extra
            for i in range(n)]


def test_a_refused_sum_blames_the_shufflers_refusal_with_its_reason() -> None:
    h = diagnose(rows(REASON), settings())
    assert h.verdict == NO_PROGRESS
    assert h.blame.setting == "shuffle.count-on"  # count-on 0 = 3 silos: the requirements did not meet
    assert "the shuffler refused the sum in round(s) 1, 2, 3" in h.blame.suggestion
    assert "privacy calibration is met" in h.blame.suggestion and "round-timeout" not in h.blame.suggestion
    assert h.evidence["rounds_shuffle_refused"] == 3


def test_another_refusal_reason_still_blames_the_shuffler() -> None:
    h = diagnose(rows("shuffler refused: no valid contribution among 3 blob(s)"), settings(**{"shuffle.count-on": 1}))
    assert h.blame.setting == "shuffler" and "no valid contribution" in h.blame.suggestion


def test_without_a_shuffler_refusal_the_timeout_hint_is_unchanged() -> None:
    h = diagnose(rows(None), settings())
    assert h.verdict == NO_PROGRESS and h.blame.setting == "round-timeout"


def test_end_to_end_the_summary_blames_the_shuffler(federation) -> None:
    over = {"privacy.mode": "shuffle", "num-rounds": 2, "partition": "iid", "privacy.epsilon": 3.0, "num-silos": 3,
            "silos-per-round": 3, "model": "logistic", "lr": 0.5, "privacy.delta": 1e-5,
            "fail-on-client-error": False}
    summary, rows_, _ = federation(over, hook=silo_down_hook(0))
    assert all(r["answered"] == 0 and r["shuffle_dropped"] == 2 for r in rows_)
    assert all("privacy calibration is met" in r["shuffle_refused"] for r in rows_)
    blame = summary["health"]["blame"]
    assert blame["setting"] == "shuffle.count-on", blame
    assert "the shuffler refused the sum" in blame["suggestion"] and "round-timeout" not in blame["suggestion"]


def test_run_health_stops_a_shuffle_run_whose_every_sum_is_refused(federation) -> None:
    """Issue 35: a silo of a shuffle run is down (a Byzantine silo dropped), so the shuffler refuses
    every sum, while the silos that did answer recorded (spent) every release. Before: the run went
    on to its end and each honest silo's ledger read its whole budget for a run that trained
    nothing. Now run health stops it after stop-unchanged = 4 such rounds of 10, blaming the
    shuffler's refusal (measured: the two silos that answered spent 1.81 of their 3.0)."""
    over = {"privacy.mode": "shuffle", "num-rounds": 10, "partition": "iid", "privacy.epsilon": 3.0, "num-silos": 3,
            "silos-per-round": 3, "model": "logistic", "lr": 0.5, "privacy.delta": 1e-5,
            "fail-on-client-error": False}
    summary, rows_, _ = federation(over, hook=silo_down_hook(0))
    assert all(r["answered"] == 0 and r["shuffle_refused"] for r in rows_)
    # nothing trained in any round: the run fails (exit 1) as before, now after 4 rounds, and says why
    assert summary["status"] == "failed" and summary["stopped_after_round"] == 4 and len(rows_) == 4
    assert "the shuffler refused every sum" in summary["health"]["reason"]
    assert "run health no progress: stopped after round 4 of 10" in summary["status_reason"]
    assert summary["health"]["blame"]["setting"] == "shuffle.count-on"
    spent = [d["eps_spent"] for d in summary["silos"] if "eps_spent" in d]
    print(spent)
    assert spent and all(0 < e < 3.0 for e in spent)
