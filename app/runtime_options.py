"""The run's runtime options (outputs, failure rules, timeouts, device, checkpoints), declared
once (app/options.py). Light: no torch."""

from __future__ import annotations

from dataclasses import dataclass

from app.options import boolean, choice, number, option

DEVICES = ("cpu", "cuda", "auto")
#: the server's device: "device" (the run's ``device``) or one of DEVICES (app/server_device.py)
SERVER_DEVICES = ("device", *DEVICES)


@dataclass(frozen=True)
class RuntimeOptions:
    """The top-level runtime options of app.config.Settings."""

    outputs_dir: str = option("outputs-dir", choice(), "outputs", "where results go")
    run_name: str = option("run-name", choice(), "", "the run's folder name")
    fail_on_client_error: bool = option("fail-on-client-error", boolean, True,
                                        "a ClientApp exception marks the run failed")
    #: mark a run failed when the aggregator kept the model in at least half of its rounds
    fail_on_no_progress: bool = option("fail-on-no-progress", boolean, False,
                                       "a run that made no progress fails instead of ending no-progress")
    #: run health stops a run that cannot learn (app/run_health.py ``Watch``): after this many
    #: consecutive rounds whose silos answered but whose model stayed (0: never stop early)
    stop_unchanged: int = option("stop-unchanged", number(0, 1_000_000, integer=True), 4,
                                 "stop after this many consecutive rounds that spent budget but left the model (0: never)")
    #: ... and when none of the last this many rounds' models beats the untrained one on the
    #: server's own validation records (its trust set, else server.test-file; 0: never)
    stop_patience: int = option("stop-patience", number(0, 1_000_000, integer=True), 5,
                                "stop when no model of this many last rounds beats the untrained one on the server's records (0: never)")
    round_timeout: float = option("round-timeout", number(1, None), 600.0, "seconds to wait for replies")
    device: str = option("device", choice(DEVICES), "cpu", "cpu, cuda or auto on the silos")
    #: where the ServerApp computes (trust-set gradients, sketch lifts): "device" = the run's device
    server_device: str = option("server-device", choice(SERVER_DEVICES), "device",
                                "where the ServerApp computes: device (the run's), cpu, cuda or auto")
    #: write every message the ServerApp receives under outputs/<run>/transcript/ (audits)
    transcript: bool = option("transcript", boolean, False, "write every message the ServerApp receives")
    #: seconds the server waits for num-silos silo nodes (at the start, or when fewer than
    #: min-silos are connected); then it goes on with those present (the paper's M_r <= M)
    node_wait: float = option("node-wait", number(0, None), 120.0, "seconds the server waits for the silo nodes")
    #: the fewest connected silo nodes a round may run with; below it, after node-wait, the run fails
    min_silos: int = option("min-silos", number(1, 1_000_000, integer=True), 1,
                            "the fewest connected silo nodes a round runs with")
    #: the server's longest pause between two pulls of replies (seconds; it starts at 5 ms)
    poll_interval: float = option("poll-interval", number(0, 10, lo_open=True), 0.05,
                                  "the server's longest pause between two pulls of replies")
    #: write the server's whole state to outputs/<run>/checkpoint/ after every round
    checkpoint: bool = option("checkpoint", boolean, True, "write the server's state after every round")
    #: continue the run named run-name from its last checkpoint (same settings, same outputs)
    resume: bool = option("resume", boolean, False, "continue the run named run-name from its last checkpoint")
    #: the silos' per-run ledger name ("" = the Flower run id): a resumed run sets its
    #: original's, so a silo with a per-run budget keeps spending the same budget
    ledger_run_key: str = option("ledger-run-key", choice(), "", "the name of the silos' per-run ledgers")
