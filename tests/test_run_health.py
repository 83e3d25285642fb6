"""Divergence and no-progress (app/run_health.py): the rules on hand-made rows (boundaries,
non-finite values, the blame ladder), the launcher's verdict on a summary, and real in-process
federations: a huge lr diverges and blames lr, a Grad-BANT run whose every score is 0 makes no
progress and blames the smoothness, the default run stays completed. The sweep and the report
keeping unhealthy jobs: tests/test_sweep.py, tests/test_private_robust.py; the launcher's last
line: tests/test_startup.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from app import launch
from app.config import parse_settings
from app.launch import merged_run_config
from app.run_health import DIVERGED, DIVERGENCE_FACTOR, HEALTHY, NO_PROGRESS, diagnose

LN2 = math.log(2)


def settings(**over):
    return parse_settings(merged_run_config([]) | over)


def rows_with_losses(losses, **extra) -> list[dict]:
    return [{"round": i + 1, "answered": 2, "train_loss": loss} | extra for i, loss in enumerate(losses)]


# -- the rules on hand-made rows --------------------------------------------------------------
def test_a_decreasing_loss_is_healthy() -> None:
    h = diagnose(rows_with_losses([0.7, 0.4, 0.2, 0.1]), settings(), num_classes=2)
    assert h.verdict == HEALTHY and h.status == "completed" and h.blame is None
    assert h.evidence["train_loss_last"] == 0.1 and h.evidence["rounds_unchanged"] == 0


def test_growth_boundary_is_ten_times_the_minimum_and_at_least_ln_c() -> None:
    s = settings()
    grown = diagnose(rows_with_losses([0.5, 0.1, DIVERGENCE_FACTOR * 0.1]), s, num_classes=2)
    assert grown.verdict == DIVERGED and grown.evidence["growth"] == pytest.approx(10.0)
    assert "from 0.1 (round 2) to 1 (round 3)" in grown.reason
    just_below = diagnose(rows_with_losses([0.5, 0.1, 0.999]), s, num_classes=2)
    assert just_below.verdict == HEALTHY
    # 10x a tiny minimum but still better than the uniform predictor (ln 2): a bounce, not a divergence
    bounce = diagnose(rows_with_losses([0.3, 0.001, 0.02]), s, num_classes=2)
    assert bounce.verdict == HEALTHY
    assert diagnose(rows_with_losses([0.3, 0.001, LN2]), s, num_classes=2).verdict == DIVERGED
    # no class count: the 10x rule alone
    assert diagnose(rows_with_losses([0.3, 0.001, 0.02]), s).verdict == DIVERGED
    # only the last round counts: a spike that came back down is not a divergence
    assert diagnose(rows_with_losses([0.6, 0.1, 50.0, 0.2]), s, num_classes=2).verdict == HEALTHY
    # one evaluated round cannot show growth
    assert diagnose(rows_with_losses([1e6]), s, num_classes=2).verdict == HEALTHY


@pytest.mark.parametrize("row", [
    {"train_loss": "nan"}, {"train_loss": "inf"}, {"train_loss": math.nan}, {"train_loss": math.inf},
    {"non_finite_evaluations": 1}, {"non_finite_updates": 2}, {"step_skipped": True},
])
def test_any_non_finite_sign_is_a_divergence(row: dict) -> None:
    rows = rows_with_losses([0.7, 0.5, 0.4])
    rows[1] = {k: v for k, v in rows[1].items() if k != "train_loss"} | row
    h = diagnose(rows, settings(), num_classes=2)
    assert h.verdict == DIVERGED and h.evidence["non_finite_rounds"] == [2]
    assert "non-finite in round(s) 2" in h.reason and h.blame is not None and h.blame.setting == "lr"


def test_the_private_batch_loss_being_nan_is_not_a_divergence() -> None:
    """eval-every = 0: the batch loss is NaN in every row of a private run (a private silo does not
    report it); that says nothing about the model."""
    rows = [{"round": r, "answered": 2, "train_loss_private_batch": "nan"} for r in range(1, 5)]
    assert diagnose(rows, settings(), num_classes=2).verdict == HEALTHY
    rows = [{"round": r, "answered": 2, "train_loss_private_batch": v} for r, v in ((1, 0.5), (2, 0.2), (3, 3.0))]
    h = diagnose(rows, settings(**{"privacy.mode": "off"}), num_classes=2)
    assert h.verdict == DIVERGED and h.evidence["loss_key"] == "train_loss_private_batch"


def test_no_progress_boundary_is_half_of_the_rounds() -> None:
    rejected = {"silo_weights": {"0": 0.0, "1": 0.0}}
    moved = {"silo_weights": {"0": 0.5, "1": 0.5}}
    s = settings(**{"algorithm": "robust", "privacy.mode": "off", "trust.size": 60})
    half = [{"round": r, "answered": 2, "train_loss": 0.6} | (rejected if r <= 2 else moved) for r in range(1, 5)]
    h = diagnose(half, s, num_classes=2)
    assert h.verdict == NO_PROGRESS and h.evidence["rounds_all_rejected"] == 2
    assert "left unchanged in 2 of the 4 round(s) (2 in which the aggregator" in h.reason
    less = [{"round": r, "answered": 2, "train_loss": 0.6} | (rejected if r == 1 else moved) for r in range(1, 4)]
    assert diagnose(less, s, num_classes=2).verdict == HEALTHY
    no_reply = [{"round": r, "answered": 0 if r % 2 else 2} for r in range(1, 5)]
    assert diagnose(no_reply, s).verdict == NO_PROGRESS


def test_divergence_wins_over_no_progress() -> None:
    rows = [{"round": 1, "answered": 2, "train_loss": 0.5}] + \
           [{"round": r, "answered": 0, "non_finite_updates": 2} for r in (2, 3, 4)]
    assert diagnose(rows, settings(), num_classes=2).verdict == DIVERGED


def test_blame_for_a_divergence() -> None:
    grow = rows_with_losses([0.5, 0.1, 5.0])
    off = diagnose(grow, settings(**{"lr": 50.0, "privacy.mode": "off"}), num_classes=2).blame
    assert off.setting == "lr" and off.value == 50.0 and "try lr=5" in off.suggestion and "no clipping" in off.suggestion
    private = diagnose(grow, settings(**{"lr": 0.5, "local-steps": 3, "algorithm": "localsgd", "privacy.mode": "isrl",
                                         "privacy.clip": 1.0}), num_classes=2).blame
    assert "lr=0.5 is too large" in private.suggestion and "try lr=0.05" in private.suggestion
    assert "privacy.clip=1" in private.suggestion and "local-steps=3" in private.suggestion
    attacked = settings(**{"algorithm": "robust", "aggregator": "mean", "attack.kind": "sign-flip",
                           "attack.fraction": 0.5, "privacy.mode": "off", "partition": "iid", "num-silos": 4,
                           "silos-per-round": 4})
    blame = diagnose(grow, attacked, num_classes=2).blame
    assert blame.setting == "aggregator" and "try aggregator=gradbant" in blame.suggestion


ALL_ZERO = [{"round": r, "answered": 4, "train_loss": 2.3, "silo_weights": {str(i): 0.0 for i in range(4)}}
            for r in range(1, 5)]
ROBUST = {"algorithm": "robust", "partition": "iid", "num-silos": 4, "silos-per-round": 4, "dataset": "digits",
          "model": "logistic", "trust.size": 60, "lr": 0.5, "gradbant.smoothness": 1.0}


@pytest.mark.parametrize("over,setting,text", [
    ({"privacy.mode": "off", "gradbant.smoothness": 1000.0}, "gradbant.smoothness",
     "= 500 >= 2: the norm penalty outweighs the alignment even for a message equal to the trust-set gradient"),
    ({"gradbant.smoothness": "auto", "privacy.mode": "off"}, "gradbant.smoothness",
     "gradbant.smoothness=auto (median L 9) x lr=0.5 = 4.5 >= 2"),
    ({"privacy.mode": "isrl", "privacy.epsilon": 8.0}, "gradbant.noise-aware", "try gradbant.noise-aware=true"),
    ({"privacy.mode": "off", "sketch.kind": "srht"}, "sketch.ratio",
     "try gradbant.noise-aware=true (it subtracts that noise's expected energy) or a larger sketch.ratio"),
    ({"privacy.mode": "off", "batch-size": 32}, "batch-size", "batch-size=128 or local-steps > 1"),
    ({"privacy.mode": "off", "gradbant.noise-aware": True, "batch-size": 32}, "gradbant.smoothness",
     "try a smaller gradbant.smoothness (e.g. 0.1)"),
    ({"privacy.mode": "off"}, "gradbant.smoothness", "try a smaller gradbant.smoothness (e.g. 0.1)"),
    ({"privacy.mode": "isrl", "aggregator": "fltrust"}, "aggregator", "try aggregator=gradbant with gradbant.noise-aware"),
])
def test_blame_when_grad_bant_gives_every_silo_zero(over: dict, setting: str, text: str) -> None:
    rows = [r | {"gradbant_smoothness": smooth} for r, smooth in zip(ALL_ZERO, (8.0, 9.0, 9.0, 12.0))]
    h = diagnose(rows, settings(**ROBUST | over), num_classes=10)
    assert h.verdict == NO_PROGRESS and h.blame.setting == setting and text in h.blame.suggestion, h.blame
    assert h.message().startswith("no progress: the model was left unchanged in 4 of the 4 round(s)")


def test_blame_when_no_silo_answered() -> None:
    rows = [{"round": r, "answered": 0} for r in (1, 2)] + [{"round": 3, "answered": 2, "train_loss": 0.5}]
    budget = diagnose(rows, settings(), refusals=["budget-exceeded: round 2 would spend 3.2 > 3"]).blame
    assert budget.setting == "privacy.epsilon" and "budget ran out" in budget.suggestion
    planned = diagnose(rows, settings(**{"num-rounds": 3, "privacy.planned-rounds": 1}), refusals=["budget-exceeded: x"])
    assert planned.blame.setting == "privacy.planned-rounds" and "try privacy.planned-rounds=3" in planned.blame.suggestion
    assert diagnose(rows, settings(), refusals=["silo-policy: evaluation off"]).blame.setting == "silos"
    assert diagnose(rows, settings()).blame.setting == "round-timeout"


def test_the_health_is_plain_json() -> None:
    h = diagnose(rows_with_losses([0.5, 0.1, 5.0]), settings(), num_classes=2)
    d = json.loads(json.dumps(h.to_dict()))
    assert d["verdict"] == "diverged" and d["blame"]["setting"] == "lr" and d["evidence"]["train_loss_last"] == 5.0
    assert diagnose([], settings()).verdict == HEALTHY


# -- the launcher ---------------------------------------------------
def test_the_launcher_exits_3_with_the_hint_for_an_unhealthy_run(tmp_path: Path) -> None:
    path = tmp_path / "run" / "summary.json"
    assert launch.summary_verdict({"status": "completed"}, "7", path) == (0, None)
    code, line = launch.summary_verdict({"status": "failed", "status_reason": "boom"}, "7", path)
    assert code == 1 and "FAILED" in line and "boom" in line
    summary = {"status": "diverged", "status_reason": "diverged: x; most likely y",
               "health": {"verdict": "diverged", "reason": "the train loss grew from 1 (round 1) to 50 (round 3)",
                          "blame": {"setting": "lr", "value": 50.0, "suggestion": "lr=50 is too large; try lr=5"}}}
    code, line = launch.summary_verdict(summary, "7", path)
    assert code == launch.EXIT_UNHEALTHY == 3
    assert line.startswith("[silofl] DIVERGED: run 7: the train loss grew") and "most likely lr=50 is too large" in line
    code, line = launch.summary_verdict({"status": "no-progress", "status_reason": "no progress: z"}, "7", path)
    assert code == 3 and line.startswith("[silofl] NO PROGRESS: run 7: no progress: z")


# -- real federations (in-process) ------------------------------------------------------------
def test_a_huge_lr_diverges_and_blames_lr(federation) -> None:
    """WBCD without privacy, lr = 50: the loss grows a thousandfold a round until the silos' updates
    and evaluations go non-finite (they refuse / are dropped); the run says so and blames lr."""
    summary, rows, _ = federation({"lr": 50.0, "privacy.mode": "off", "num-rounds": 12, "num-silos": 2,
                                   "silos-per-round": 2})
    assert summary["status"] == "diverged"
    health = summary["health"]
    assert health["verdict"] == "diverged" and health["blame"]["setting"] == "lr" and health["blame"]["value"] == 50.0
    assert "try lr=5" in health["blame"]["suggestion"] and "try lr=5" in summary["status_reason"]
    assert health["evidence"]["growth"] > 1e6 and health["evidence"]["non_finite_rounds"]
    bad = health["evidence"]["non_finite_rounds"][0]
    row = rows[bad - 1]
    assert row["non_finite_evaluations"] == 2 and "train_loss" not in row  # dropped, and said so
    assert any(r.get("non_finite_updates") == 2 and r["answered"] == 0 for r in rows)


def test_grad_bant_with_every_score_zero_makes_no_progress(federation) -> None:
    """gradbant.smoothness x lr = 500 >= 2: even a message equal to the trust-set gradient scores 0,
    so the model never moves; the run says no-progress and blames the smoothness."""
    cfg = ROBUST | {"privacy.mode": "off", "batch-size": 32, "num-rounds": 4, "gradbant.smoothness": 1000.0}
    summary, rows, _ = federation(cfg)
    assert all(not any(r["silo_weights"].values()) for r in rows)
    assert summary["status"] == "no-progress" and summary["rounds_all_rejected"] == 4
    blame = summary["health"]["blame"]
    assert blame["setting"] == "gradbant.smoothness" and "try gradbant.smoothness=1" in blame["suggestion"]


def test_the_default_run_stays_completed(federation) -> None:
    summary, rows, _ = federation({})
    assert summary["status"] == "completed" and summary["status_reason"] is None
    assert summary["health"]["verdict"] == "healthy" and summary["health"]["blame"] is None
    assert not any(k in r for r in rows for k in ("non_finite_evaluations", "non_finite_updates", "step_skipped"))
