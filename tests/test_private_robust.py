"""experiment=private-robust (issue 15): the 480 jobs Hydra composes (never run here), the refused
trimmed-mean jobs recorded as such, and the report's tables and figure from a hand-made results.csv."""

from __future__ import annotations

import csv
import itertools
import math
import statistics
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import app.sweep as sweep
from app import report
from app.config import SCHEMA, ConfigError, flatten_run_config, parse_settings, resolve_presets

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
AXES = {"budget": ["eps1", "eps3", "eps8", "epsinf"], "attack": ["none", "label-flip", "sign-flip", "alie"],
        "rule": ["gradbant-noise-aware", "gradbant-paper", "fltrust", "mean", "trimmed-mean"],
        "sketch": ["none", "srht"], "seed": ["0", "1", "2"]}


def sweeper_params() -> dict[str, list[str]]:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("config", overrides=["experiment=private-robust"], return_hydra_config=True)
    return {k: str(v).split(",") for k, v in OmegaConf.to_container(cfg.hydra.sweeper.params).items()}


def _compose(overrides: list[str]) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_container(compose("config", overrides=["experiment=private-robust", *overrides]), resolve=True)


def _changes(cfg: dict, base: dict) -> dict:
    """The part of the nested ``cfg`` that differs from ``base`` (a nested partial config)."""
    out = {}
    for key, value in cfg.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            sub = _changes(value, base[key])
            if sub:
                out[key] = sub
        elif key not in base or base[key] != value:
            out[key] = value
    return out


def _leaves(partial: dict, prefix: str = "") -> set[str]:
    return set().union(*[_leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k}
                         for k, v in partial.items()]) if partial else set()


def expand_jobs() -> list[tuple[dict[str, str], dict]]:
    """What `python -m app.sweep -m experiment=private-robust` hands each job: the basic sweeper's
    cartesian product of hydra.sweeper.params, each a job's nested config. Composing all 480 takes
    about a minute, so each axis value is composed once (18 compositions) and a job is the base
    config with its axis values' changes merged in; this is exact because the axes change disjoint
    keys (checked), and 6 jobs composed in full are checked equal to their merges."""
    params = sweeper_params()
    keys = sorted(params)
    base = _compose([])
    changes = {(k, v): _changes(_compose([f"{k}={v}"]), base) for k in keys for v in params[k]}
    touched = {k: set().union(*[_leaves(changes[(k, v)]) for v in params[k]]) for k in keys}
    for a, b in itertools.combinations(keys, 2):
        assert not touched[a] & touched[b], (a, b, touched[a] & touched[b])
    jobs = []
    for combo in itertools.product(*(params[k] for k in keys)):
        over = dict(zip(keys, combo))
        merged = OmegaConf.merge(base, *[changes[(k, v)] for k, v in over.items()])
        jobs.append((over, OmegaConf.to_container(merged, resolve=True)))
    for i in (0, 97, 211, 305, 418, 479):  # the merge model against Hydra's own composition
        over, nested = jobs[i]
        assert _compose([f"{k}={v}" for k, v in over.items()]) == nested, over
    return jobs


@pytest.fixture(scope="module")
def jobs() -> list[tuple[dict[str, str], dict]]:
    return expand_jobs()


def test_the_sweep_axes_are_the_issue_grid() -> None:
    assert {k: sorted(v) for k, v in sweeper_params().items()} == {k: sorted(v) for k, v in AXES.items()}


def test_the_experiment_composes_into_480_distinct_run_configs(jobs) -> None:
    assert len(jobs) == 480
    keys = set()
    refused = 0
    for over, nested in jobs:
        flat = resolve_presets(flatten_run_config(nested))  # as app.sweep records the job
        assert set(flat) == set(SCHEMA), over
        assert nested["sweep"]["name"] == "private-robust"
        # the settings of gradbant-fmnist.yaml
        assert (flat["dataset"], flat["partition"], flat["num-silos"], flat["silos-per-round"]) == ("fashion-mnist", "iid", 10, 10)
        assert (flat["pca"], flat["mlp-hidden"], flat["trust.size"], flat["algorithm"]) == (50, "64", 500, "robust")
        assert (flat["local-steps"], flat["batch-size"], flat["lr"], flat["num-rounds"]) == (10, 64, 0.2, 20)
        assert flat["privacy.clip"] == 1.0  # as measured, not the fashion-mnist preset's 2.0
        assert flat["seed"] == int(over["seed"])
        # each axis reaches the run config
        if over["budget"] == "epsinf":
            assert flat["privacy.mode"] == "off"
        else:
            assert (flat["privacy.mode"], flat["privacy.epsilon"]) == ("isrl", float(over["budget"][3:]))
        assert (flat["attack.kind"], flat["attack.fraction"]) == {
            "none": ("none", 0.0), "label-flip": ("label-flip", 0.6), "sign-flip": ("sign-flip", 0.6),
            "alie": ("alie", 0.4)}[over["attack"]]
        assert (flat["aggregator"], flat["gradbant.noise-aware"]) == {
            "gradbant-noise-aware": ("gradbant", True), "gradbant-paper": ("gradbant", False),
            "fltrust": ("fltrust", False), "mean": ("mean", False), "trimmed-mean": ("trimmed-mean", False)}[over["rule"]]
        assert (flat["sketch.kind"], flat["sketch.ratio"]) == ((over["sketch"], 0.5))
        keys.add(sweep.job_key(flat, nested["sweep"]))
        try:
            parse_settings(flat)
        except ConfigError as exc:  # only trimmed mean against a 60% Byzantine majority
            assert over["rule"] == "trimmed-mean" and over["attack"] in ("label-flip", "sign-flip"), over
            assert "honest majority" in str(exc)
            refused += 1
    assert len(keys) == 480  # every job its own row (resume key)
    assert refused == 4 * 2 * 2 * 3


def fake_federation(calls: list[dict]):
    def run(cfg: dict, warm: bool = True, fast=None) -> dict:
        calls.append(cfg)
        rows = [{"round": 1, "wall_s": 0.1, "test_error": 0.3, "uploads_G": 1.0}]
        return {"status": "completed", "test_error": 0.3, "test_accuracy": 0.7, "rounds_rows": rows, "wall_s": 1.0,
                "overhead_s": 0.5, "run_dir": "x", "client_errors": [], "silos": []}
    return run


def test_a_two_job_slice_records_a_refused_job_and_reports_it(jobs, tmp_path: Path, monkeypatch) -> None:
    """Two jobs of the sweep through app.sweep's job path: one runs (the federation itself needs
    Flower's simulation engine, stood in for here), the refused trimmed-mean one is a failed row
    that does not stop the sweep, and the report calls it refused."""
    monkeypatch.chdir(tmp_path)
    calls: list[dict] = []
    monkeypatch.setattr(sweep, "run_federation", fake_federation(calls))
    monkeypatch.setattr(sweep, "preflight", sweep.parse_settings)  # the data check needs the data: settings only
    pick = [dict(budget="eps8", attack="sign-flip", rule=r, sketch="srht", seed="0")
            for r in ("gradbant-noise-aware", "trimmed-mean")]
    slice_ = [nested | {"sweep": nested["sweep"] | {"engine": "flower"}} for over, nested in jobs if over in pick]
    assert len(slice_) == 2
    rows = [sweep.sweep_job(n) for n in slice_]
    assert sorted(r["status"] for r in rows) == ["completed", "failed"] and len(calls) == 1
    assert calls[0]["gradbant.noise-aware"] is True and calls[0]["privacy.epsilon"] == 8.0
    out = tmp_path / "outputs/sweeps/private-robust"
    report.main([str(out)])
    md = (out / "results.md").read_text()
    assert "| Grad-BANT noise-aware | srht | 70.00% ± 0.00% (n=1) |" in md
    assert f"| trimmed mean | srht | {report.REFUSED} |" in md
    assert (out / "accuracy_vs_epsilon.png").stat().st_size > 1000


def test_report_tables_from_a_hand_made_results_csv(tmp_path: Path) -> None:
    results = sweep.ResultsFile(tmp_path / "results.csv")
    accs = {("gradbant", "true", "isrl", "none", "none"): [0.80, 0.84, 0.79],
            ("gradbant", "false", "isrl", "none", "none"): [0.075, 0.075, 0.075],
            ("mean", "false", "isrl", "label-flip", "srht"): [0.31, 0.45],
            ("fltrust", "false", "off", "sign-flip", "none"): [0.82, 0.80, 0.81]}
    n = 0
    for (agg, na, mode, attack, sketch), values in accs.items():
        for seed, acc in enumerate(values):
            n += 1
            results.append({"job": f"j{n}", "status": "completed", "algorithm": "robust", "aggregator": agg,
                            "gradbant.noise-aware": na, "privacy.mode": mode, "privacy.epsilon": 8.0,
                            "attack.kind": attack, "attack.fraction": 0.0 if attack == "none" else 0.6,
                            "sketch.kind": sketch, "seed": seed, "test_accuracy": acc, "test_error": 1 - acc})
    # a refused job (twice: a resumed sweep reruns failed jobs) and an unrelated failure
    for job in ("r", "r"):
        results.append({"job": job, "status": "failed", "algorithm": "robust", "aggregator": "trimmed-mean",
                        "gradbant.noise-aware": "false", "privacy.mode": "isrl", "privacy.epsilon": 8.0,
                        "attack.kind": "label-flip", "attack.fraction": 0.6, "sketch.kind": "none",
                        "error": "ConfigError: aggregator = 'trimmed-mean' needs an honest majority, but ..."})
    results.append({"job": "x", "status": "failed", "algorithm": "robust", "aggregator": "mean",
                    "gradbant.noise-aware": "false", "privacy.mode": "isrl", "privacy.epsilon": 8.0,
                    "attack.kind": "label-flip", "attack.fraction": 0.6, "sketch.kind": "srht", "error": "RuntimeError: boom"})
    report.main([str(tmp_path)])
    md = (tmp_path / "results.md").read_text()

    def cell(values: list[float]) -> str:  # computed here, independently of app.report
        m = sum(values) / len(values)
        s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        return f"{100 * m:.2f}% ± {100 * s:.2f}% (n={len(values)})"

    assert cell([0.80, 0.84, 0.79]) == "81.00% ± 2.65% (n=3)"
    assert statistics.stdev([0.31, 0.45]) == pytest.approx(0.0989949, rel=1e-6)
    eps8, inf = md.split("### ε = ∞")[0], md.split("### ε = ∞")[1]
    assert "### ε = 8 (ISRL-DP, each silo)" in eps8
    assert "| rule | sketch | none | label-flip 60% | sign-flip 60% |" in eps8  # columns = attack, "none" first
    assert f"| Grad-BANT noise-aware | none | {cell([0.80, 0.84, 0.79])} | n/a |" in eps8
    assert f"| Grad-BANT (paper) | none | {cell([0.075] * 3)} | n/a |" in eps8
    assert f"| mean | srht | n/a | {cell([0.31, 0.45])} (+1 failed) |" in eps8
    assert f"| trimmed mean | none | n/a | {report.REFUSED} |" in eps8
    assert "| rule | sketch | none | label-flip 60% | sign-flip 60% |" in inf  # every table: the same columns
    assert f"| FLTrust | none | n/a | n/a | {cell([0.82, 0.80, 0.81])} |" in inf
    assert "1 refused for an honest majority, 1 failed otherwise" in md and "boom" in md
    # the rows are in the rule order of the issue
    assert eps8.index("Grad-BANT noise-aware") < eps8.index("Grad-BANT (paper)") < eps8.index("| mean") < eps8.index("trimmed")
    assert (tmp_path / "accuracy_vs_epsilon.png").stat().st_size > 1000
    assert (tmp_path / "accuracy_heatmap.png").stat().st_size > 1000
    assert not (tmp_path / "error_vs_epsilon.png").exists()


def test_robust_report_labels_pre_aggregated_rules_robajol_and_the_stated_f(tmp_path: Path):
    """A row's label: the pre-aggregators first (the issue's NNM∘Krum), the f its preset stated,
    RobAJoL for a rule run on the sketches; in the issue's row order."""
    from app import report, sweep

    results = sweep.ResultsFile(tmp_path / "results.csv")
    specs = [("smea", "", "4", "lifted"), ("trimmed-mean", "nnm", "4", "sketch"), ("krum", "nnm", "3", "lifted"),
             ("median", "bucketing", "2", "lifted"), ("trimmed-mean", "arc", "4", "lifted"), ("fltrust", "", "-1", "lifted")]
    for n, (agg, pre, f, space) in enumerate(specs):
        results.append({"job": f"j{n}", "status": "completed", "algorithm": "robust", "aggregator": agg,
                        "pre-aggregators": pre, "byzantine.f": f, "aggregation-space": space,
                        "gradbant.noise-aware": "false", "privacy.mode": "off", "attack.kind": "mimic",
                        "attack.fraction": 0.4, "sketch.kind": "srht", "seed": 0, "test_accuracy": 0.5 + n / 100,
                        "test_error": 0.5 - n / 100})
    report.main([str(tmp_path)])
    md = (tmp_path / "results.md").read_text()
    labels = ["FLTrust", "NNM∘Krum (f=3)", "Bucketing∘median (f=2)", "ARC∘trimmed mean (f=4)", "SMEA (f=4)",
              "RobAJoL (NNM∘trimmed mean on y, f=4)"]
    where = [md.index(f"| {label} | srht | 5") for label in labels]
    assert where == sorted(where)
    assert (tmp_path / "accuracy_heatmap.png").stat().st_size > 1000


def test_a_robust_cell_counts_its_unhealthy_seeds(tmp_path: Path) -> None:
    """Jobs that made no progress (the paper's score under DP noise) are results: in the cell's mean
    and counted there, and listed under the table with their hint."""
    results = sweep.ResultsFile(tmp_path / "results.csv")
    for seed, status in enumerate(("no-progress", "no-progress", "completed")):
        results.append({"job": f"j{seed}", "status": status, "algorithm": "robust", "aggregator": "gradbant",
                        "gradbant.noise-aware": "false", "privacy.mode": "isrl", "privacy.epsilon": 8.0,
                        "attack.kind": "none", "attack.fraction": 0.0, "sketch.kind": "none", "seed": seed,
                        "test_accuracy": 0.1, "test_error": 0.9,
                        "error": "" if status == "completed" else "no progress: every score 0"})
    md = report.robust_markdown(report.load_rows(tmp_path))
    assert "| Grad-BANT (paper) | none | 10.00% ± 0.00% (n=3, 2 no progress) |" in md
    assert "0 failed otherwise, 2 no progress)" in md and "- no-progress job j0" in md
