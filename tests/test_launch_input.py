"""The operator's input (issue 23, item 7): what the launcher refuses before any Flower process
starts (exit 2, one line naming what is wrong), and how a run on machines the launcher cannot
check ends when its silos cannot run.

The reference for "Flower would drop it" is Flower's own parser (flwr.common.config.parse_config_args,
flwr 1.42): each refused fragment is shown to be lost there, so that running it would silently
use the default."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import launch
from app.config import ConfigError, parse_settings
from app.run_config_args import check_run_config_args
from tests.helpers import FlowerStarted


def _launch(capsys: pytest.CaptureFixture, tmp_path: Path, run_config: str, *extra: str) -> tuple[int, str]:
    code = launch.main(["--run-config", f'outputs-dir="{tmp_path / "out"}"', "--run-config", run_config, *extra])
    return code, capsys.readouterr().err.strip()


DROPPED = {  # what the operator typed -> what the one-line error must show
    "num-rounds=": "'num-rounds='",
    "num-rounds = 3": "'num-rounds'",
    'num-rounds=3 "x': "'\"x'",
}


@pytest.mark.parametrize("text", list(DROPPED))
def test_flower_drops_these_fragments_silently(text: str) -> None:
    """The fault: Flower's parser returns no num-rounds (so a run would use the 25-round default)."""
    from flwr.common.config import parse_config_args

    parsed = parse_config_args([text])
    assert "num-rounds" not in parsed or text.startswith("num-rounds=3 ")
    assert "x" not in "".join(map(str, parsed))


@pytest.mark.parametrize("text", list(DROPPED))
def test_a_fragment_that_does_not_parse_exits_2_naming_it(text: str, tmp_path: Path, no_flower,
                                                          capsys: pytest.CaptureFixture) -> None:
    code, err = _launch(capsys, tmp_path, text)
    assert code == 2 and len(err.splitlines()) == 1 and DROPPED[text] in err, err


@pytest.mark.parametrize("text", ['num-rounds=3 dataset="digits"', "privacy.epsilon=inf seed=2",
                                  "lr=0.5 fail-on-client-error=false", "run-name='a b'", "  num-rounds=3  ", ""])
def test_well_formed_run_configs_pass(text: str) -> None:
    check_run_config_args([text])


def test_an_unquoted_string_names_the_key_and_shows_the_quoting(tmp_path: Path, no_flower,
                                                                capsys: pytest.CaptureFixture) -> None:
    code, err = _launch(capsys, tmp_path, "dataset=digits")
    assert code == 2 and len(err.splitlines()) == 1
    assert 'dataset="digits"' in err and "dataset=digits" in err, err
    with pytest.raises(ConfigError, match="lower case"):
        check_run_config_args(["checkpoint=True"])


def test_a_misspelt_key_gets_the_closest_keys_not_all_of_them() -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings({"num-round": 3})
    message = str(info.value)
    assert "did you mean 'num-rounds'" in message
    assert "privacy.anchor-noise-ratio" not in message and len(message) < 200, message
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        parse_settings({"privacy.epsilom": 1.0})


def test_an_outputs_dir_that_cannot_be_written_exits_2_before_the_run(tmp_path: Path, no_flower,
                                                                      capsys: pytest.CaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # a folder cannot be made below a file (even by root)
    code = launch.main(["--run-config", f'outputs-dir="{blocker / "out"}"'])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "outputs-dir" in err and "cannot be written" in err and len(err.splitlines()) == 1, err


def test_cuda_without_cuda_is_refused_for_the_local_simulation(tmp_path: Path, no_flower, monkeypatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = _launch(capsys, tmp_path, 'device="cuda"')
    assert code == 2 and 'device = "cuda"' in err and len(err.splitlines()) == 1, err
    # with --superlink the silos run elsewhere: the launcher cannot know, and goes on
    with pytest.raises(FlowerStarted):
        launch.main(["--run-config", f'outputs-dir="{tmp_path / "out"}" device="cuda"', "--superlink", "remote"])


def test_a_deployed_run_whose_silos_lack_cuda_ends_after_the_first_round(federation, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """Where the launcher cannot know (a deployment), the real silos raise in their first round
    (clients/silo.py: no CUDA device): that round ends the run, failed, with their reason, instead
    of num-rounds rounds of failures."""
    import torch

    from app import server_app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(server_app.ClientAppFailure, match="no CUDA device"):  # a server without a GPU says so
        federation({"num-rounds": 5, "device": "cuda", "server-device": "cpu"})
    import json

    summary = json.loads((tmp_path / "out" / "t" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_done"] == 1
    assert "round 1" in summary["status_reason"] and "no CUDA device" in summary["status_reason"]
    assert len(summary["client_errors"]) == 2  # the two silos of round 1, not 2 per round for 5 rounds


def test_the_missing_cifar10_message_names_what_works(tmp_path: Path) -> None:
    """No ``download=true`` (not a run-config key): the folder to pass as data-dir, and how to fetch."""
    from app.data.sources import DataUnavailableError, load_source

    with pytest.raises(DataUnavailableError) as info:
        load_source("cifar10", str(tmp_path), download=False)
    message = str(info.value)
    assert "download=true" not in message
    assert 'data-dir="<folder containing cifar-10-batches-py>"' in message and str(tmp_path) in message
    assert "torchvision.datasets.CIFAR10(" in message and "download=True" in message
