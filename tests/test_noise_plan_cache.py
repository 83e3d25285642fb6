"""The launcher's noise plan read back (app/noise_plan_cache.py): the same lines as computing them,
another key for any other input or code, nothing stored for a plan that fails, and a launch that
reads it back imports neither dp-accounting nor torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app import launch, noise_plan, noise_plan_cache
from app.launch import merged_run_config

ROOT = Path(__file__).resolve().parent.parent
ISRL = {"privacy.mode": "isrl", "privacy.epsilon": 3.0}


def _preflight(cfg: dict, capsys: pytest.CaptureFixture[str]) -> list[str]:
    launch.preflight(merged_run_config([]) | cfg)
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("[silofl] pre-flight")]


def test_a_second_launch_prints_the_same_lines_without_computing_them(no_flower, tmp_path: Path, capsys,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    first = _preflight(ISRL, capsys)
    assert first and "planned noise per silo" in first[0]
    assert len(list((tmp_path / noise_plan_cache.CACHE_DIR).glob("*.json"))) == 1

    def refuse(*a, **k):
        raise AssertionError("computed again")

    monkeypatch.setattr(noise_plan, "preflight_lines", refuse)
    assert _preflight(ISRL, capsys) == first
    with pytest.raises(AssertionError, match="computed again"):  # another epsilon: another key
        _preflight(ISRL | {"privacy.epsilon": 2.0}, capsys)


def test_every_input_is_in_the_key() -> None:
    from app.config import parse_settings

    run = launch.noise_run(parse_settings(merged_run_config([]) | ISRL))
    other = launch.noise_run(parse_settings(merged_run_config([]) | ISRL | {"privacy.clip": 0.5}))
    key = noise_plan_cache.plan_key(run, [10, 20], 167, "from the run's partition")
    assert key == noise_plan_cache.plan_key(run, [10, 20], 167, "from the run's partition")
    assert len({key, noise_plan_cache.plan_key(other, [10, 20], 167, "from the run's partition"),
                noise_plan_cache.plan_key(run, [10, 21], 167, "from the run's partition"),
                noise_plan_cache.plan_key(run, None, 167, "from the run's partition"),
                noise_plan_cache.plan_key(run, [10, 20], 168, "from the run's partition"),
                noise_plan_cache.plan_key(run, [10, 20], 167, "assumed")}) == 6


def test_any_edit_of_the_code_is_another_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    before = noise_plan_cache.code_fingerprint(tmp_path)
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert noise_plan_cache.code_fingerprint(tmp_path) != before
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    assert noise_plan_cache.code_fingerprint(tmp_path) == before
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")
    assert noise_plan_cache.code_fingerprint(tmp_path) != before


def test_a_failing_plan_stores_nothing_and_a_damaged_file_is_computed_again(tmp_path: Path) -> None:
    def fail() -> list[str]:
        raise ValueError("cannot calibrate")

    with pytest.raises(ValueError, match="cannot calibrate"):
        noise_plan_cache.noise_plan_lines("run", [1], 1, "x", tmp_path, fail)
    assert not list(tmp_path.rglob("*.json"))
    assert noise_plan_cache.noise_plan_lines("run", [1], 1, "x", tmp_path, lambda: ["a", "b"]) == ["a", "b"]
    (stored,) = (tmp_path / noise_plan_cache.CACHE_DIR).glob("*.json")
    assert noise_plan_cache.noise_plan_lines("run", [1], 1, "x", tmp_path, fail) == ["a", "b"]
    stored.write_text('{"lines": [1')
    assert noise_plan_cache.noise_plan_lines("run", [1], 1, "x", tmp_path, lambda: ["c"]) == ["c"]
    assert noise_plan_cache.noise_plan_lines("run", [1], 1, "x", tmp_path, fail) == ["c"]


def test_a_launch_that_reads_the_plan_back_imports_no_accounting_nor_torch(tmp_path: Path) -> None:
    """The default run's pre-flight in a fresh process, twice: the first computes the plan
    (dp-accounting), the second reads it back and loads neither dp-accounting, scipy nor torch."""
    code = ("import sys; from app.launch import merged_run_config, preflight; preflight(merged_run_config([])); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'dp_accounting', 'scipy'}))")
    env = {"PATH": str(Path(sys.executable).parent), "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT),
           "FLWR_HOME": str(tmp_path)}
    outs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=env) for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), outs[-1].stderr
    first, second = (o.stdout.strip().splitlines() for o in outs)
    assert first[:-1] == second[:-1] and "planned noise per silo" in first[0]
    assert eval(first[-1]) == ["dp_accounting", "scipy"]
    assert eval(second[-1]) == []
