"""app.report on any sweep: the axes are the settings that vary, seeds (and only seeds) are
aggregated; every number checked against values computed here by hand."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

pytest.importorskip("pandas")

from app import report  # noqa: E402
from app.report import plots as report_plots  # noqa: E402
from app.sweep import ResultsFile  # noqa: E402

#: t_{0.975, 2} and t_{0.975, 3} from a printed t table (not from scipy)
T975 = {3: 4.302652729911275, 4: 3.182446305284263}

#: (ε, k/n) -> final test errors of seeds 0, 1, 2, ... (the hand-made sweep)
ERRORS = {(1.0, 0.1): [0.30, 0.36, 0.33], (1.0, 0.5): [0.20, 0.26],
          (3.0, 0.1): [0.15, 0.13, 0.17, 0.19], (3.0, 0.5): [0.08]}


def row(**kw) -> dict:
    base = {"status": "completed", "algorithm": "mbsgd", "dataset": "digits", "privacy.mode": "isrl",
            "privacy.delta": "auto", "sketch.kind": "srht", "lr": 0.5, "num-rounds": 5, "overhead_s": 1.0}
    return base | kw


def write_sweep(d: Path, rows: list[dict]) -> None:
    results = ResultsFile(d / "results.csv")
    for i, r in enumerate(rows):
        results.append({"job": f"j{i}"} | r)


def by_hand(values: list[float]) -> tuple[float, float, int]:
    n = len(values)
    m = sum(values) / n
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
    return m, s, n


def cell_text(values: list[float]) -> str:
    m, s, n = by_hand(values)
    if n == 1:
        return f"{100 * m:.2f}% (n=1)"
    text = f"{100 * m:.2f}% ± {100 * s:.2f}% (n={n}"
    if n >= 3:
        h = T975[n] * s / math.sqrt(n)
        text += f"; 95% CI {100 * (m - h):.2f}–{100 * (m + h):.2f}%"
    return text + ")"


def hand_made(d: Path) -> None:
    rows = [row(**{"privacy.epsilon": e, "sketch.ratio": k, "seed": s, "test_error": v, "test_accuracy": 1 - v})
            for (e, k), vals in ERRORS.items() for s, v in enumerate(vals)]
    rows.append(row(**{"privacy.epsilon": 3.0, "sketch.ratio": 0.5, "seed": 1, "status": "failed",
                       "error": "RuntimeError: boom"}))
    write_sweep(d, rows)


def test_two_swept_keys_every_cell_is_the_mean_std_n_of_its_seeds(tmp_path: Path) -> None:
    hand_made(tmp_path)
    report.main([str(tmp_path)])
    md = (tmp_path / "results.md").read_text()
    assert "| k/n | ε = 1 | ε = 3 |" in md  # x = ε (columns), one row per k/n
    for k in (0.1, 0.5):
        assert f"| {k:g} | {cell_text(ERRORS[(1.0, k)])} | {cell_text(ERRORS[(3.0, k)])} |" in md
    assert "8.00% (n=1)" in md and "± 0.00%" not in md  # one seed: no "± 0"
    assert "Jobs: 11 (1 failed)" in md and "boom" in md
    assert "lr" not in md.split("Axes")[1].split("\n")[0]  # a constant setting is no axis
    summary = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert len(summary) == 4
    for r in summary:
        m, s, n = by_hand(ERRORS[(float(r["privacy.epsilon"]), float(r["sketch.ratio"]))])
        assert int(r["n"]) == n and float(r["mean"]) == pytest.approx(m, abs=1e-12)
        if n == 1:
            assert r["std"] == "" and r["ci95_low"] == ""
        else:
            assert float(r["std"]) == pytest.approx(s, abs=1e-12)
        if n >= 3:
            assert float(r["ci95_high"]) == pytest.approx(m + T975[n] * s / math.sqrt(n), abs=1e-9)
    for name in ("error_vs_epsilon.png", "error_vs_epsilon.pdf"):
        assert (tmp_path / name).stat().st_size > 1000


def test_the_issue_sweep_one_seed_two_ratios_is_two_cells_not_a_spread(tmp_path: Path) -> None:
    """Issue 27's first finding: one seed at ε = 1 with k/n 0.1 and 0.5 was shown as one cell
    "79.53% ± 9.26% (n=2)"; it is two cells of one seed each."""
    write_sweep(tmp_path, [row(**{"privacy.epsilon": eps, "sketch.ratio": k, "seed": 0, "test_error": e})
                           for k, e in ((0.1, 0.8607), (0.5, 0.7298)) for eps in (1.0, 8.0)])
    md = report.GridReport.build(report.load_rows(tmp_path), tmp_path).markdown()
    assert "| k/n | ε = 1 | ε = 8 |" in md and "n=2" not in md
    assert "| 0.1 | 86.07% (n=1) | 86.07% (n=1) |" in md and "| 0.5 | 72.98% (n=1) | 72.98% (n=1) |" in md


def test_x_series_and_facet_options(tmp_path: Path) -> None:
    rows = []
    for mode, shift in (("isrl", 0.0), ("shuffle", 0.1)):
        for (e, k), vals in ERRORS.items():
            rows += [row(**{"privacy.mode": mode, "privacy.epsilon": e, "sketch.ratio": k, "seed": s,
                            "test_error": v + shift}) for s, v in enumerate(vals)]
    write_sweep(tmp_path, rows)
    rep = report.GridReport.build(report.load_rows(tmp_path), tmp_path, x="sketch.ratio", series=["privacy.epsilon"],
                                  facets=["privacy.mode"])
    md = rep.markdown()
    assert "#### privacy = isrl" in md and "#### privacy = shuffle" in md
    assert "| ε | k/n = 0.1 | k/n = 0.5 |" in md
    shuffle = md.split("#### privacy = shuffle")[1]
    assert f"| 3 | {cell_text([v + 0.1 for v in ERRORS[(3.0, 0.1)]])} | {cell_text([0.18])} |" in shuffle
    with pytest.raises(SystemExit, match="'sketch.ratioo' is not a setting"):
        report.GridReport.build(report.load_rows(tmp_path), tmp_path, x="sketch.ratioo")


def test_settings_that_did_not_act_neither_make_axes_nor_count_twice(tmp_path: Path) -> None:
    """ε without privacy is ∞; sketch.ratio without a sketch is no setting; a dataset's preset lr
    follows the dataset (listed, not an axis)."""
    rows = [row(**{"privacy.mode": "off", "privacy.epsilon": e, "sketch.kind": "none", "sketch.ratio": k,
                   "seed": 0, "test_error": 0.05}) for e in (1.0, 3.0) for k in (0.1, 0.5)]
    rows += [row(**{"privacy.epsilon": e, "sketch.kind": "none", "sketch.ratio": 0.5, "seed": s,
                    "test_error": v}) for e, vals in ((1.0, [0.2, 0.3]), (3.0, [0.1, 0.12])) for s, v in enumerate(vals)]
    rows += [row(**{"dataset": "wbcd", "lr": 0.1, "privacy.epsilon": 1.0, "sketch.kind": "none", "seed": 0,
                    "test_error": 0.07})]
    write_sweep(tmp_path, rows)
    md = report.GridReport.build(report.load_rows(tmp_path), tmp_path).markdown()
    axes = md.split("Axes")[1].split("\n")[0]
    assert "privacy.epsilon (x)" in axes and "dataset (rows)" in axes and "sketch.ratio" not in axes
    assert "privacy.mode" in md.split("Also varying")[1].split("\n")[0] and "lr" in md.split("Also varying")[1]
    assert f"| digits | {cell_text([0.2, 0.3])} | {cell_text([0.1, 0.12])} | 5.00% (n=1) |" in md
    assert "3 job(s) repeat another's settings" in md


def _rounds(path: Path, accs: list[float], ratio: float) -> None:
    path.mkdir(parents=True)
    path.joinpath("rounds.jsonl").write_text("".join(
        json.dumps({"round": i + 1, "uploads_G": 10 * ratio * (i + 1), "test_error": 1 - a}) + "\n"
        for i, a in enumerate(accs)))


def test_rounds_and_uploads_to_a_target_accuracy_and_the_figures(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    curves = {(1.0, 0.1): [[0.5, 0.7, 0.8, 0.85], [0.6, 0.8, 0.82, 0.9]],
              (1.0, 1.0): [[0.7, 0.85, 0.9, 0.9], [0.82, 0.88, 0.9, 0.91]],
              (8.0, 0.1): [[0.6, 0.75, 0.79, 0.79]], (8.0, 1.0): [[0.8, 0.9, 0.95, 0.96]]}
    rows = []
    for (e, k), runs in curves.items():
        for s, accs in enumerate(runs):
            d = tmp_path / "runs" / f"e{e}k{k}s{s}"
            _rounds(d, accs, k)
            rows.append(row(**{"privacy.epsilon": e, "sketch.ratio": k, "seed": s, "test_error": 1 - accs[-1],
                               "run_dir": f"elsewhere/{d.name}"}))  # recorded relative to another cwd
    write_sweep(tmp_path, rows)
    figs = []
    monkeypatch.setattr(report_plots, "_save_both", lambda fig, stem: figs.append((stem.name, fig)) or [stem.name])
    rep = report.GridReport.build(report.load_rows(tmp_path), tmp_path, target=80)
    rep.write()
    md = (tmp_path / "results.md").read_text()
    # target 0.8: (ε 1, k/n 0.1): seed 0 at round 3 (G = 3), seed 1 at round 2 (G = 2)
    assert "### Rounds R and uploads G(t) to reach 80% test accuracy" in md
    assert "| 0.1 | R 2.5 ± 0.71, G 2.5 ± 0.71 (2/2) | not reached (0/1) |" in md
    assert "| 1 | R 1.5 ± 0.71, G 15 ± 7.1 (2/2) | R 1, G 10 (1/1) |" in md
    assert report.GridReport.build(report.load_rows(tmp_path), tmp_path).target == 0.86  # 90% of the best mean curve (0.96)
    names = dict(figs)
    ax = names["error_vs_epsilon"].axes[0]
    assert ax.get_xscale() == "log" and list(ax.get_xticks()) == [1.0, 8.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "8"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["k/n = 0.1", "k/n = 1"]
    assert ax.lines[0].get_marker() != ax.lines[1].get_marker() or ax.lines[0].get_color() != ax.lines[1].get_color()
    assert "%" in ax.yaxis.get_major_formatter()(0.25, 0)  # percent, as the table
    assert "digits" in names["error_vs_epsilon"]._suptitle.get_text()
    assert "δ = 1/n² per silo" in names["error_vs_epsilon"]._suptitle.get_text()
    assert "1–2 seeds" in names["error_vs_epsilon"]._suptitle.get_text()
    # error bars only for the cells with 2 seeds (ε = 1), none for the single seeds at ε = 8
    bars = [c for c in ax.containers]
    assert sum(len(c.lines[2][0].get_segments()) for c in bars) == 2
    traffic = names["accuracy_vs_uploads"]
    assert [a.get_title() for a in traffic.axes if a.get_visible()] == ["k/n = 0.1", "k/n = 1"]


def test_a_sweep_whose_every_job_failed_lists_them_and_draws_nothing(tmp_path: Path) -> None:
    write_sweep(tmp_path, [{"status": "failed", "privacy.epsilon": e, "error": f"ConfigError: eps {e}"}
                           for e in (-1, -3)])
    report.main([str(tmp_path)])
    md = (tmp_path / "results.md").read_text()
    assert "No job ran to its end" in md and "Jobs: 2 (2 failed)" in md and "ConfigError: eps -3" in md
    assert "nan" not in md and not list(tmp_path.glob("*.png"))


def test_settings_a_job_chose_on_validation_data_are_not_axes(tmp_path: Path) -> None:
    """sweep.tuning=grid: each seed may pick another lr; its row holds that lr, but the cell is
    still (ε), aggregated over seeds."""
    rows = [row(**{"privacy.epsilon": 1.0, "seed": s, "lr": lr, "selected": json.dumps({"lr": lr}),
                   "test_error": e}) for s, (lr, e) in enumerate([(0.1, 0.2), (0.3, 0.25), (0.1, 0.3)])]
    rows += [row(**{"privacy.epsilon": 3.0, "seed": 0, "lr": 0.3, "selected": json.dumps({"lr": 0.3}),
                    "test_error": 0.1})]
    write_sweep(tmp_path, rows)
    md = report.GridReport.build(report.load_rows(tmp_path), tmp_path).markdown()
    assert "| jobs | ε = 1 | ε = 3 |" in md and f"| all | {cell_text([0.2, 0.25, 0.3])} | 10.00% (n=1) |" in md
    assert "Chosen by each job on validation data (sweep.tuning=grid), not axes: lr." in md


def test_every_report_says_what_its_epsilon_covers(tmp_path: Path) -> None:
    """Issue 39: a sweep's table must not pass one run's ε off as the whole experiment's."""
    hand_made(tmp_path)
    report.main([str(tmp_path)])
    md = (tmp_path / "results.md").read_text()
    assert md.rstrip().endswith(report.EPSILON_NOTE) and "is not covered by it" in md
