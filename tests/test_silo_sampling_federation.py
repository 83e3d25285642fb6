"""Silo sampling end to end on the in-process grid (real ServerApp, silos, shuffler node): claimed
only where the silo's node trusts it and the shuffler really samples; summary.json and the ledger
say so; a server asking for it while the shuffler does not sample gets every contribution dropped."""

from __future__ import annotations

from pathlib import Path

from app.privacy.envelope import StaticKeys

SHUFFLE = {"privacy.mode": "shuffle", "num-rounds": 2, "partition": "iid", "privacy.epsilon": 3.0, "num-silos": 3,
           "silos-per-round": 3, "shuffle.count-on": 1, "model": "logistic", "lr": 0.5, "privacy.delta": 1e-5,
           "algorithm": "mbsgd"}


def _pins(state: Path, silos: int = 3) -> dict:
    shuffler = StaticKeys.load_or_create(state / "shuffler.key")
    senders = [StaticKeys.load_or_create(state / f"shuffle-sender-silo{i}.key") for i in range(silos)]
    return {"shuffler-public-key": shuffler.public_hex, "silo-keys": ",".join(k.public_hex for k in senders)}


def test_server_asking_for_silo_sampling_the_shuffler_does_not_do_gets_nothing(federation, tmp_path: Path) -> None:
    """Attack: the run config asks the silos to claim 2 of 3; the shuffler sums everyone."""
    node = _pins(tmp_path / "state") | {"shuffle-trust-silo-sampling": True}
    summary, rows, _ = federation(SHUFFLE | {"shuffle.silo-sample": 2}, node_config=node)
    assert all(r["shuffle_dropped"] == 3 for r in rows)
    assert all(s["shuffle"]["silo_sampling"]["claimed"] for s in summary["silos"])


def test_claimed_where_trusted_and_the_shuffler_samples(federation, tmp_path: Path) -> None:
    node = {"shuffle-silo-sample": 2}
    trusted, rows, _ = federation(SHUFFLE | {"shuffle.silo-sample": 2}, sub="a",
                                  node_config=node | _pins(tmp_path / "a" / "state") | {"shuffle-trust-silo-sampling": True})
    assert summary_ok(trusted, rows)
    for s in trusted["silos"]:
        assert s["shuffle"]["silo_sampling"]["claimed"] and s["shuffle"]["silo_sampling"]["q"] == 2 / 3
        assert all(r["silo_sampling"] == 2 / 3 for r in s["releases"])
    # the same run on a node that does not trust it: nothing claimed (the shuffler still samples)
    plain, rows, _ = federation(SHUFFLE | {"shuffle.silo-sample": 2}, node_config=node | _pins(tmp_path / "b" / "state"),
                                sub="b")
    assert summary_ok(plain, rows)
    for s, t in zip(plain["silos"], trusted["silos"]):
        assert not s["shuffle"]["silo_sampling"]["claimed"]
        assert all("silo_sampling" not in r for r in s["releases"])
        assert t["eps_spent"] < s["eps_spent"]


def summary_ok(summary: dict, rows: list[dict]) -> bool:
    """Every round released a sum of exactly the 2 kept silos' contributions (1 discarded)."""
    return summary["status"] == "completed" and all(r["shuffle_dropped"] == 0 and r["answered"] == 2 for r in rows)
