"""scripts/reproduce/robust_gap.py on a hand-made results.csv: one row per setting, mean ± std of
the seeds' accuracies (computed here independently), the gap lines, the bars."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

pytest.importorskip("pandas", reason="the script reads results.csv with pandas (a pyproject dependency)")


def test_gap_table_and_bars(tmp_path: Path):
    from app import sweep
    from scripts.reproduce import robust_gap

    results = sweep.ResultsFile(tmp_path / "results.csv")
    base = {"status": "completed", "num-silos": 10, "silos-per-round": 10, "batch-size": 1024, "lr": 1.0,
            "sketch.ratio": 0.5, "attack.fraction": 0.0, "privacy.epsilon": 8.0, "run_dir": ""}
    settings = {("gradbant", "label-flip", "isrl", "srht"): [0.2031, 0.2047, 0.2050],
                ("mean", "none", "off", "none"): [0.1392, 0.1392, 0.1414]}
    for n, ((agg, attack, mode, sketch), errors) in enumerate(settings.items()):
        for seed, err in enumerate(errors):
            results.append(base | {"job": f"{n}{seed}", "aggregator": agg, "attack.kind": attack, "privacy.mode": mode,
                                   "sketch.kind": sketch, "seed": seed, "test_error": err,
                                   "attack.fraction": 0.6 if attack != "none" else 0.0,
                                   "eps_max_spent": "inf" if mode == "off" else 7.9991})
    table = robust_gap.summarise(tmp_path / "results.csv")
    md = robust_gap.markdown(table)
    acc = [100 * (1 - e) for e in settings[("gradbant", "label-flip", "isrl", "srht")]]
    assert f"{statistics.mean(acc):.2f}% ± {statistics.stdev(acc):.2f}%" in md
    assert "Grad-BANT noise-aware, label-flip 60%, ε = 8, srht k/n = 0.5" in md
    assert f"{robust_gap.ISSUE_PLAIN - statistics.mean(acc):+.2f} points to the issue's plain run" in md
    plain = statistics.mean(100 * (1 - e) for e in settings[("mean", "none", "off", "none")])
    assert f"{plain - statistics.mean(acc):+.2f} points to: mean, no attack, privacy off, no sketch" in md
    robust_gap.plot(table, tmp_path / "bars.png")
    assert (tmp_path / "bars.png").stat().st_size > 1000


def test_a_missing_sweep_says_what_to_run(tmp_path: Path):
    from scripts.reproduce import robust_gap

    with pytest.raises(SystemExit, match="experiment=robust-gap"):
        robust_gap.main(["--sweep", str(tmp_path)])
