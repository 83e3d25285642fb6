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
from app.run_health import DIVERGED, DIVERGENCE_FACTOR, HEALTHY, NO_PROGRESS, Watch, diagnose, weighted
from app.server_app import progress_line

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
    # issue 35 (the wine split): noise-aware under ISRL-DP, every message mostly noise: the noise, not L
    ({"privacy.mode": "isrl", "privacy.epsilon": 3.0, "gradbant.noise-aware": True}, "privacy.epsilon",
     "docs/your-data.md#small-silos"),
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
    cfg = ROBUST | {"privacy.mode": "off", "batch-size": 32, "num-rounds": 4, "gradbant.smoothness": 1000.0,
                    "stop-unchanged": 0}  # run to the end: the end-of-run verdict
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


# -- the weight the rule gave, on the console (issue 35) ----------------------------------------
def _row(**extra) -> dict:
    return {"round": 2, "sampled": 3, "answered": 3, "refused": 0, "malformed": 0, "failed": 0, "missing": 0,
            "eps_max": 1.0, "wall_s": 0.1} | extra


def test_the_console_line_shows_the_weight_the_rule_gave() -> None:
    """Before: ``silos 3/3`` every round while Grad-BANT gave every silo weight 0. Now the line
    also says how many silos the rule gave a weight > 0 (rounds.jsonl: ``silo_weights``)."""
    zero = _row(silo_weights={"0": 0.0, "1": 0.0, "2": 0.0})
    assert weighted(zero) == (0, 3)
    assert "silos 3/3  weighted 0/3" in progress_line(zero, 15)
    one = _row(silo_weights={"0": 0.0, "1": 0.7, "2": 0.0})
    assert "weighted 1/3" in progress_line(one, 15)
    assert "silos 3/3  weighted 3/3" in progress_line(_row(), 15)  # the mean: 1/m each
    kept = _row(silo_weights={"0": 0.0, "1": 0.0}, answered=2,
                model_kept={"rule": "krum", "f": 1, "replies": 2, "rows": 2, "reason": "x"})
    assert "weighted 0/2 (kept by krum: f=1, 2 replies)" in progress_line(kept, 15)


# -- run health during the run: the rules on hand-made rows -----------------------------------
def _all_zero(rnd: int) -> dict:
    return {"round": rnd, "answered": 3, "silo_weights": {"0": 0.0, "1": 0.0, "2": 0.0}}


def _moved(rnd: int) -> dict:
    return {"round": rnd, "answered": 3, "silo_weights": {"0": 0.5, "1": 0.5, "2": 0.0}}


def test_the_watch_stops_after_k_consecutive_rounds_that_spent_budget_on_nothing() -> None:
    s = settings(**{"algorithm": "robust", "privacy.mode": "off"})
    w = Watch(s, 20, stop_unchanged=3, stop_patience=0)
    w.start(None)
    # a round with no valid reply (nothing spent) neither counts nor breaks the streak
    seq = [_moved(1), _all_zero(2), _all_zero(3), {"round": 4, "answered": 0}, _moved(5), _all_zero(6),
           {"round": 7, "answered": 0}, _all_zero(8)]
    assert [w.see(r) for r in seq] == [None] * len(seq)
    h = w.see(_all_zero(9))
    assert h is not None and h.verdict == NO_PROGRESS and h.status == "no-progress"
    assert h.reason.startswith("stopped after round 9 of 20: the model stayed in 3 consecutive round(s) (6, 8, 9)")
    assert h.evidence["stopped_after_round"] == 9 and h.evidence["rounds_all_rejected"] == 5
    assert h.blame is not None and h.blame.setting == "gradbant.smoothness"
    # the last round is never stopped (nothing left to save); 0 never stops
    last = Watch(s, 3, 1, 0)
    assert [last.see(_all_zero(r)) for r in (1, 2, 3)][2] is None
    never = Watch(s, 20, 0, 5)
    never.start(1.0)
    assert all(never.see(_all_zero(r), 2.0) is None for r in range(1, 20))


def test_a_run_that_learned_and_then_stalled_stops_early_as_completed() -> None:
    """The own-data smoke's run (Grad-BANT, WBCD, 93% on the server's test file) gave every silo
    weight 0 in rounds 14-17 once it had converged; run health stopped it as no-progress, exit 3.
    A run whose model beat the untrained one on the server's records by LEARNED_MARGIN has
    learned: the same streak stops it early as completed, and the silos keep the rest."""
    from app.run_health import HEALTHY, LEARNED_MARGIN

    s = settings(**{"algorithm": "robust", "privacy.mode": "off"})
    w = Watch(s, 20, stop_unchanged=3, stop_patience=5)
    w.start(0.69)
    seq = [(_moved(1), 0.50), (_moved(2), 0.30), (_all_zero(3), 0.30), (_all_zero(4), 0.30)]
    assert [w.see(r, v) for r, v in seq] == [None] * 4
    h = w.see(_all_zero(5), 0.30)
    assert h is not None and h.verdict == HEALTHY and h.status == "completed" and h.blame is None
    assert h.reason.startswith("stopped early after round 5 of 20: the model stayed in 3 consecutive round(s)")
    assert "loss 0.69 untrained, 0.3 at round 2" in h.reason and h.evidence["stopped_early"] is True
    # a model that never got LEARNED_MARGIN below the untrained one has not learned: no-progress
    flat = Watch(s, 20, stop_unchanged=3, stop_patience=5)
    flat.start(0.69)
    near = 0.69 * (1 - LEARNED_MARGIN / 2)
    assert [flat.see(r, near) for r in (_moved(1), _all_zero(2), _all_zero(3))] == [None] * 3
    h = flat.see(_all_zero(4), near)
    assert h is not None and h.verdict == NO_PROGRESS


def test_the_watch_stops_once_the_run_can_only_end_no_progress() -> None:
    """Half of num-rounds unchanged already: diagnose's verdict at the end is no-progress
    whatever the other rounds do, so the rest of the budget buys nothing."""
    s = settings(**{"algorithm": "robust", "privacy.mode": "off"})
    w = Watch(s, 10, stop_unchanged=4, stop_patience=0)
    w.start(None)
    seq = [_all_zero(1), _moved(2), _all_zero(3), _all_zero(4), _moved(5), _all_zero(6), _moved(7)]
    assert [w.see(r) for r in seq] == [None] * 7
    h = w.see(_all_zero(8))  # 5 of 10
    assert h is not None and "left unchanged in 5 of the 8 round(s)" in h.reason
    assert "at least half of the num-rounds=10 planned" in h.reason


def test_the_watch_stops_when_no_recent_model_beats_the_untrained_one_on_the_servers_records() -> None:
    s = settings(**{"privacy.epsilon": 3.0})
    w = Watch(s, 15, stop_unchanged=4, stop_patience=3)
    w.start(1.10)
    assert w.see(_row(round=1), 1.05) is None  # better than untrained
    assert w.see(_row(round=2), 1.20) is None
    assert w.see(_row(round=3), 1.15) is None  # the last 3 hold 1.05 < 1.10
    h = w.see(_row(round=4), 1.12)  # the last 3: 1.20, 1.15, 1.12, none below 1.10
    assert h is not None and h.verdict == NO_PROGRESS
    assert "below the untrained model's (1.1; the best, round 4: 1.12; stop-patience=3)" in h.reason
    assert h.blame is not None and h.blame.setting == "privacy.epsilon"
    assert h.evidence["validation_loss"] == [1.05, 1.2, 1.15, 1.12]


def test_the_watch_names_an_honest_majority_rule_that_keeps_the_model() -> None:
    s = settings(**{"algorithm": "robust", "aggregator": "krum", "byzantine.f": 1, "privacy.mode": "off",
                    "num-silos": 5, "silos-per-round": 5})
    kept = {"rule": "krum", "f": 1, "replies": 4, "rows": 4,
            "reason": "krum needs n > 2f + 2 (Blanchard et al. 2017): f = 1 Byzantine of n = 4 clients"}
    rows = [_moved(1)] + [_row(round=r, answered=4, silo_weights={str(i): 0.0 for i in range(4)}, model_kept=kept)
                          for r in (2, 3)]
    w = Watch(s, 10, stop_unchanged=2, stop_patience=0)
    assert w.see(rows[0]) is None and w.see(rows[1]) is None
    h = w.see(rows[2])
    assert h is not None and "an honest-majority rule kept the model" in h.reason
    assert h.blame is not None and h.blame.setting == "byzantine.f" and h.blame.value == 1
    assert h.blame.suggestion.startswith("from round 2 aggregator=krum kept the model: 4 replies cannot outvote "
                                         "byzantine.f=1")
    end = diagnose(rows, s)
    assert end.verdict == NO_PROGRESS and "1 in which an honest-majority rule kept the model" not in end.reason
    assert "2 in which an honest-majority rule kept the model" in end.reason
    assert end.evidence["model_kept_first"]["round"] == 2 and end.blame.setting == "byzantine.f"


# -- run health during the run: real federations ----------------------------------------------
def test_run_health_stops_a_grad_bant_run_whose_every_score_is_zero(federation, capsys) -> None:
    """Before: the run went on to its end (every round weight 0, every silo's whole budget spent)
    and only then said no-progress. Now it stops after stop-unchanged = 4 rounds of 12, with the
    console saying ``weighted 0/4`` each round, and the silos have spent a third of the run's."""
    cfg = ROBUST | {"privacy.mode": "isrl", "privacy.epsilon": 3.0, "batch-size": 32, "num-rounds": 12,
                    "gradbant.smoothness": 1000.0}
    summary, rows, _ = federation(cfg)
    out = capsys.readouterr().out
    assert summary["status"] == "no-progress" and summary["stopped_after_round"] == 4
    assert summary["rounds_done"] == 4 and len(rows) == 4 and summary["rounds"] == 12
    assert out.count("silos 4/4  weighted 0/4") == 4
    assert "stopped after round 4 of 12: the model stayed in 4 consecutive round(s) (1, 2, 3, 4)" in out
    assert summary["health"]["blame"]["setting"] == "gradbant.smoothness"
    assert out.rstrip().splitlines()[-1].startswith("[silofl] run NO PROGRESS: stopped after round 4 of 12")
    print({d["silo"]: d["eps_spent"] for d in summary["silos"]})
    assert all(0 < d["eps_spent"] < 2.2 for d in summary["silos"])  # short of the whole 3.0 (composition: ~sqrt(4/12))


def test_run_health_names_krum_f_and_the_replies_from_the_first_kept_round(federation, capsys) -> None:
    """Krum at n = 5, f = 1 with one silent silo (its replies never come): 4 replies cannot
    outvote f (Krum needs n > 2f + 2), so Krum keeps the model every round. Before: the run went
    on (52 of 52 rounds unchanged) and only the end said no-progress, blaming the aggregator's
    reference. Now the console names the rule, f and the replies from round 1 and run health
    stops the run after stop-unchanged rounds, blaming byzantine.f."""
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    def silent(node, msg, reply):
        if node == 1004 and msg.metadata.message_type == "train":
            return create_message_error_unavailable_res_message(msg.metadata, "node_unavail")
        return reply

    cfg = {"algorithm": "robust", "aggregator": "krum", "byzantine.f": 1, "num-silos": 5, "silos-per-round": 5,
           "partition": "iid", "privacy.mode": "off", "model": "logistic", "num-rounds": 10, "batch-size": 32}
    summary, rows, _ = federation(cfg, hook=silent)
    out = capsys.readouterr().out
    assert rows[0]["model_kept"]["rule"] == "krum" and rows[0]["model_kept"]["f"] == 1
    assert rows[0]["model_kept"]["replies"] == 4
    assert "[silofl] round 1: aggregator=krum kept the model: 4 replies cannot outvote byzantine.f=1" in out
    assert "weighted 0/4 (kept by krum: f=1, 4 replies)" in out
    assert summary["status"] == "no-progress" and summary["stopped_after_round"] == 4
    assert summary["health"]["blame"]["setting"] == "byzantine.f"
