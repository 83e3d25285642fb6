"""Flower ServerApp: run config -> strategy -> rounds -> results.

Writes ``<outputs-dir>/<run>/rounds.jsonl`` (one object per round) and ``summary.json``
(DESIGN.md section 5), prints one progress line per round, and fails the run (so
``flwr ls`` shows ``finished:failed``, and the launcher exits 1) when a ClientApp crashed and
fail-on-client-error is set, when nothing trained (every silo refused or dropped every round),
or when fewer than min-silos silo nodes are connected. A run that ran to its end is diagnosed
(app/run_health.py): its status is ``completed``, or ``diverged`` / ``no-progress`` with the
setting most likely to blame in ``health`` and in warnings at the end (the Flower run itself
completes; the launcher exits 3; with fail-on-no-progress a no-progress run fails instead).
The run config is validated here too
(the same one-line errors as the launcher's, and K <= n where the server can read the data),
so a direct ``flwr run`` fails before round 1. With ``checkpoint`` the server's whole state is
written to ``<run>/checkpoint.npz`` after every round; ``resume`` continues from it.
"""

from __future__ import annotations

import math
import time
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from app import wire
from app.checkpoint import CheckpointError, check_resume_state, load_checkpoint, save_checkpoint
from app.config import ConfigError, Settings, check_silo_sizes, parse_settings
from app.data.federated import dataset_meta, silo_splits
from app.data.preprocessing_report import preprocessing_steps
from app.models import build_model
from app.privacy.ledger.witness import WITNESS_FILE, WitnessStore
from app.results import RunRecorder, run_name
from app.run_health import NO_PROGRESS, Health, Watch, diagnose, kept_text, weighted
from app.seeding import torch_gen
from app.server_device import server_device
from app.server_eval import load_server_test, server_test_metrics
from app.transcript import TranscriptGrid
from strategies import STRATEGIES
from strategies.nodes import ClientAppsFailed, TooFewSilos
from strategies.messaging import ExchangeGrid

app = ServerApp()


class ClientAppFailure(RuntimeError):
    """At least one ClientApp raised; the run is marked failed after its outputs are written."""


class NothingTrained(RuntimeError):
    """No round had a single valid update (every silo refused, dropped or failed every round)."""


class NoProgress(NothingTrained):
    """fail-on-no-progress: the model was left unchanged in at least half of the rounds."""


#: settings that may differ between a run and its resumption
RESUME_FREE = ("resume", "ledger_run_key", "node_wait", "min_silos", "poll_interval", "round_timeout")
CHECKPOINT_FILE = "checkpoint.npz"


def validate(run_config: dict[str, Any]) -> Settings:
    """The run config as Settings, checked as the launcher checks it: ConfigError (one line) for a
    bad value, and for a batch size (or anchor batch) above a silo's n when the server can read
    the data (a deployment whose data lives only on the silos skips that part: each silo
    refuses what does not fit its own data, with the reason)."""
    s = parse_settings(run_config)
    from app.data.schema import SchemaError, load_schema
    from app.data.sources import DataUnavailableError

    if s.data_schema:  # the silos' own records: the schema they must match is the server's metadata
        try:
            load_schema(s.data_schema)
            if s.server_trust_file:  # the server's own trust file matches it too
                from app.data.own_data import server_records

                server_records(s, s.server_trust_file)
        except SchemaError as exc:
            raise ConfigError(f"server.trust-file: {exc}" if s.server_trust_file and "data-file" in str(exc)
                              else str(exc)) from None

    try:
        _, splits, _, _ = silo_splits(s, s.seed, s.robust.trust_size)
    except (OSError, DataUnavailableError) as exc:
        log(INFO, "the server cannot read %s (%s); the silos check K <= n themselves",
            "the silos' own records" if s.data_schema else s.dataset, exc)
        return s
    except SchemaError as exc:  # data.simulation-file does not match the schema
        raise ConfigError(str(exc)) from None
    check_silo_sizes(s, [len(train) for train, _ in splits])
    return s


def comparable(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in settings.items() if k not in RESUME_FREE}


def load_resume_state(s: Settings, out: Path, layout: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """The checkpoint of the run to resume; CheckpointError if it is missing, unreadable,
    malformed (:func:`app.checkpoint.check_resume_state`: its round outside [0, num-rounds], a
    model not of ``layout``'s shapes or not finite, a field of the wrong type) or was written for
    other settings (a resumed run must be the same run)."""
    state = load_checkpoint(out / CHECKPOINT_FILE)
    if not isinstance(state.get("settings"), dict):
        raise CheckpointError(f"checkpoint of run {out.name} is malformed: it holds no settings")
    saved, now = comparable(state["settings"]), comparable(_jsonish(s.to_dict()))
    diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    if diff:
        raise CheckpointError(f"run {out.name} was checkpointed with other settings ({', '.join(diff)}); "
                              "a resumed run must use the settings of the original")
    if layout is not None:
        try:
            check_resume_state(state, s.num_rounds, layout)
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint of run {out.name} is malformed: {exc}") from exc
    return state


def _jsonish(d: dict[str, Any]) -> dict[str, Any]:
    import json

    return json.loads(json.dumps(d, default=list))


def nothing_trained(rows: list[dict[str, Any]]) -> bool:
    return bool(rows) and all(int(r.get("answered", 0)) == 0 for r in rows)


def progress_line(row: dict[str, Any], num_rounds: int) -> str:
    def f(key: str, fmt: str) -> str:
        v = row.get(key)
        return "   -  " if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

    drops = row["refused"] + row["malformed"] + row["failed"] + row["missing"]
    given, weighed = weighted(row)  # the silos the rule gave a weight > 0 (rounds.jsonl: silo_weights)
    kept = row.get("model_kept")
    return (f"[silofl] round {row['round']:>3}/{num_rounds}  train loss {f('train_loss', '.4f')}  "
            f"test error {f('test_error', '.2%')}  max eps spent {f('eps_max', '.3f')}  "
            f"silos {row['answered']}/{row['sampled']}" + (f" ({drops} dropped)" if drops else "")
            + f"  weighted {given}/{weighed}"
            + (f" (kept by {kept.get('rule')}: f={kept.get('f')}, {kept.get('replies')} replies)"
               if isinstance(kept, dict) else "")
            + f"  {row['wall_s']:.2f}s")


def validation_records(strategy: Any, server_test: Any) -> tuple[str, Any, Any] | None:
    """The server's own records run health watches the loss on (app/run_health.py ``Watch``):
    ``server.test-file`` (records no rule saw: the stop decision is all they inform before the
    end), else the rule's trust set (Grad-BANT and FLTrust keep only updates that lower its loss,
    so there it seldom fires); None when the server holds neither."""
    if server_test is not None:
        return f"server.test-file ({len(server_test[1])} records)", server_test[0], server_test[1]
    agg = getattr(strategy.aggregator, "inner", strategy.aggregator)
    trust = getattr(getattr(agg, "impl", None), "trust", None)
    if trust is not None:
        return f"the server's trust set ({len(trust.y)} records)", trust.x.cpu(), trust.y.cpu()
    return None


def validation_loss(model: Any, params: dict[str, Any], records: tuple[str, Any, Any] | None) -> float | None:
    """The mean cross-entropy of ``params`` on ``records`` (None without records)."""
    if records is None:
        return None
    import numpy as np
    import torch

    _, x, y = records
    live = {k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in params.items()}
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(torch.func.functional_call(model, live, (x,)), y))


def query_ledgers(grid: Grid, timeout: float) -> list[dict[str, Any]]:
    """Ask every silo for its public privacy record (for summary.json): at most one entry per
    node asked, from its first reply. Further replies of a node (a transport that delivers one
    reply many times) and replies of nodes not asked are ignored, with one warning per node."""
    nodes = sorted(grid.get_node_ids())
    msgs = [Message(RecordDict(), dst_node_id=n, message_type=wire.LEDGER_QUERY) for n in nodes]
    asked = set(nodes)
    silos: dict[int, dict[str, Any]] = {}
    counts: dict[int, int] = {}
    for reply in grid.send_and_receive(msgs, timeout=timeout):
        node = reply.metadata.src_node_id
        counts[node] = counts.get(node, 0) + 1
        if counts[node] > 1 or node not in asked:
            continue
        if reply.has_error():
            log(WARNING, "ledger query to node %d failed: %s", node, reply.error.reason)
            continue
        try:
            report = wire.read_ledger(reply.content)
            if report.get("role") != wire.ROLE_SHUFFLER:  # the shuffler holds no records and no ledger
                silos[node] = report
        except wire.ReplyError as exc:
            log(WARNING, "ledger reply of node %d dropped: %s", node, exc)
    for node, count in sorted(counts.items()):
        if node not in asked:
            log(WARNING, "ledger query: ignored %d reply(ies) from node %d, which was not asked", count, node)
        elif count > 1:
            log(WARNING, "ledger query: node %d answered %d times; only its first reply is kept", node, count)
    return sorted(silos.values(), key=lambda d: d.get("silo", 0))


def reach(rows: list[dict[str, Any]], accuracy: float) -> tuple[int | None, float | None]:
    """(first round whose test accuracy >= ``accuracy``, G(t) then), or (None, None)."""
    for r in rows:
        te = r.get("test_error")
        if te is not None and not math.isnan(te) and 1 - te >= accuracy:
            return int(r["round"]), float(r["uploads_G"])
    return None, None


def _ledgers_after(grid: Grid, timeout: float, crashed: Exception | None) -> list[dict[str, Any]]:
    """The silos' ledger reports (:func:`query_ledgers`); after rounds that crashed, [] when the
    query fails too (the grid may be gone: the summary then says so)."""
    try:
        return query_ledgers(grid, timeout)
    except Exception as exc:  # noqa: BLE001 - only after a crash, which the run then fails with
        if crashed is None:
            raise
        log(ERROR, "ledger query after the failure: %s", exc)
        return []


@app.main()
def main(grid: Grid, context: Context) -> None:
    t_start = time.perf_counter()
    try:
        s = validate(dict(context.run_config))
        feature_shape, num_classes = dataset_meta(s)
        # your own model is imported and checked for DP here, before round 1 (app/models/custom.py)
        model = build_model(s.model, feature_shape, num_classes, hidden=s.model_hidden,
                            generator=torch_gen(s.seed, "init"), kwargs=s.model_kwargs)
        server_device(s)  # "cuda" without CUDA: one line, before round 1
        server_test = load_server_test(s)  # the server's own test file, checked before round 1
    except ConfigError as exc:
        log(ERROR, "config error: %s", exc)
        raise
    name = run_name(s, context.run_id)
    out = Path(s.outputs_dir) / name
    layout = {k: tuple(v.shape) for k, v in model.named_parameters()}
    initial = {k: v.detach().numpy() for k, v in model.named_parameters()}
    resume_state = None
    if s.resume:  # every bad checkpoint is refused here, with one line, before anything is written
        try:
            resume_state = load_resume_state(s, out, layout)
        except CheckpointError as exc:
            log(ERROR, "cannot resume: %s", exc)
            raise
    recorder = RunRecorder(out, keep=resume_state["rows"] if resume_state is not None else None)

    def on_round(row: dict[str, Any]) -> None:
        recorder.round(row)
        print(progress_line(row, s.num_rounds), flush=True)

    strategy = STRATEGIES[s.algorithm](s, layout, on_round)
    strategy.run_id = context.run_id
    # run health during the run: stop one that cannot learn before it spends every silo's budget
    watch = Watch(s, s.num_rounds, s.stop_unchanged, s.stop_patience)
    val_records = validation_records(strategy, server_test) if s.stop_unchanged and s.stop_patience else None
    if val_records is not None:
        watch.validation_name = val_records[0]
    watch.refusals = strategy.refusal_reasons
    # a resumed run: the rounds already done (the checkpoint's last row may still wait for its evaluation)
    done = [*resume_state["rows"], *([resume_state["pending"]] if resume_state.get("pending") else [])] \
        if resume_state is not None else []
    watch.start(validation_loss(model, initial, val_records), done)
    kept_said: list[int] = []

    def health_check(rnd: int, w: dict[str, Any], row: dict[str, Any]) -> Health | None:
        kept = row.get("model_kept")
        if isinstance(kept, dict) and not kept_said:  # from the first such round, once
            kept_said.append(rnd)
            print(f"[silofl] round {rnd}: {kept_text(kept)}; the rule keeps the model while the replies cannot "
                  "outvote f (docs/byzantine.md#liveness)", flush=True)
        return watch.see(row, validation_loss(model, w, val_records))

    strategy.health_check = health_check
    print(f"[silofl] run {name}: {s.algorithm} on {s.dataset} ({s.num_silos} silos, {s.silos_per_round} per round), "
          f"privacy {s.privacy.mode} eps={s.privacy.epsilon:g} delta={'1/n^2' if s.privacy.delta is None else s.privacy.delta}"
          f" clip={s.privacy.clip:g}; outputs -> {out}", flush=True)
    preprocessing = preprocessing_steps(s, s.privacy.enabled)
    if preprocessing["caveat"]:
        print(f"[silofl] CAVEAT: {preprocessing['caveat']}", flush=True)
    # the silos' ledger witnesses, kept across runs in the outputs-dir (app/privacy/ledger/witness.py)
    grid = ExchangeGrid(grid, s.poll_interval, witnesses=WitnessStore(Path(s.outputs_dir) / WITNESS_FILE))
    if s.transcript:  # audits: keep everything the server receives
        grid = TranscriptGrid(grid, out / "transcript")
    settings_json = _jsonish(s.to_dict())

    def checkpoint(rnd: int, w: dict[str, Any]) -> None:
        save_checkpoint(out / CHECKPOINT_FILE, strategy.state(rnd, w) | {
            "settings": settings_json, "run_config": dict(context.run_config), "run_id": context.run_id,
            "run_name": name,
            "ledger_run_key": s.ledger_run_key or f"run{context.run_id}"})

    stopped: str | None = None
    crashed: Exception | None = None  # an error the rounds raised that is none of the run's own verdicts
    failures_stopped = False  # the first round with a ClientApp failure ended the run (its reason says so)
    try:
        result = strategy.run(grid, initial, num_rounds=s.num_rounds, timeout=s.round_timeout,
                              checkpoint=checkpoint if s.checkpoint else None, resume=resume_state)
    except (TooFewSilos, ClientAppsFailed) as exc:  # write what there is, then fail the run
        log(ERROR, "%s", exc)
        stopped, failures_stopped = str(exc), isinstance(exc, ClientAppsFailed)
        result = None
    except Exception as exc:  # anything else the rounds raised: write what there is, then fail with it
        log(ERROR, "the rounds raised %s: %s", type(exc).__name__, exc)
        stopped, crashed, result = f"{type(exc).__name__}: {exc}", exc, None
    silos = _ledgers_after(grid, s.round_timeout, crashed)
    last_eval = next((r for r in reversed(strategy.rows) if "test_error" in r), {})
    # the run's output: the last iterate, or (output = random) the paper's w_priv ~ Unif{w_1..w_R}
    out_eval = result.metrics if s.output == "random" and result is not None else last_eval
    reasons = []
    if stopped:
        reasons.append(stopped)
    if nothing_trained(strategy.rows):
        refusals = sorted(strategy.refusal_reasons)
        reasons.append(f"nothing trained: no silo gave a valid update in any of the {len(strategy.rows)} round(s)"
                       + (f"; refusals: {'; '.join(refusals[:3])}" if refusals else ""))
    if strategy.client_errors and s.fail_on_client_error and not failures_stopped:
        reasons.append(f"{len(strategy.client_errors)} ClientApp failure(s): {strategy.client_errors[:3]}")
    # did it train? (diverged / no-progress, and the setting most likely to blame); a run that run
    # health stopped early is no-progress with the reason it stopped
    health = strategy.stopped if isinstance(strategy.stopped, Health) else \
        diagnose(strategy.rows, s, num_classes=num_classes, refusals=strategy.refusal_reasons)
    no_progress_fails = health.verdict == NO_PROGRESS and s.fail_on_no_progress and not nothing_trained(strategy.rows)
    if no_progress_fails:
        reasons.append(f"{health.message()} (fail-on-no-progress)")
    elif reasons and strategy.stopped is not None:  # failed anyway (nothing trained): say where it stopped and why
        reasons.append(f"run health {health.message()}")
    failed = bool(reasons)
    if health.blame is not None and not (stopped or nothing_trained(strategy.rows)):
        log(WARNING, "run %s %s: %s", name, health.label.upper(), health.reason)
        log(WARNING, "run %s: most likely %s", name, health.blame.suggestion)
    own_test = server_test_metrics(model, None if result is None else result.model, server_test)
    summary = {
        "status": "failed" if failed else health.status,
        "status_reason": "; ".join(reasons) if reasons else (None if health.blame is None else health.message()),
        "health": health.to_dict(),
        "algorithm": s.algorithm, "dataset": s.dataset, "model": s.model, "rounds": s.num_rounds,
        "rounds_done": len(strategy.rows),
        "stopped_after_round": strategy.stopped_after,
        "rounds_without_update": health.evidence.get("rounds_without_update", 0),
        "rounds_all_rejected": health.evidence.get("rounds_all_rejected", 0),
        "resumed_after_round": None if resume_state is None else int(resume_state["round"]),
        "output": s.output, "output_round": None if result is None else result.round,
        "test_error": out_eval.get("test_error"),
        "test_accuracy": None if out_eval.get("test_error") is None else 1.0 - out_eval["test_error"],
        "train_loss": out_eval.get("train_loss"),
        "grad_mapping_norm_eval": out_eval.get("grad_mapping_norm_eval"),
        "val_error": out_eval.get("val_error"),
        "last_iterate_test_error": last_eval.get("test_error"),
        # first round (and cumulative uploads G(t) then) whose test accuracy reached 60% / 80%
        **{f"{what}_to_{pct}": reach(strategy.rows, pct / 100)[i] for pct in (60, 80)
           for i, what in enumerate(("rounds", "uploads_G"))},
        "evaluation_note": "test error, train loss and the gradient mapping ||G_eta|| (from the silos' full "
                           "training gradients) are evaluation-only statistics the silos report on the final "
                           "model; they are not covered by the DP guarantee of the training releases",
        "wall_s": time.perf_counter() - t_start,
        "run_id": context.run_id, "run_name": name,
        "eps_max_spent": max((d.get("eps_spent", 0.0) for d in silos), default=None),
        "client_errors": strategy.client_errors,
        "unavailable_replies": strategy.unavailable,
        "dropped": {k: sum(r[k] for r in strategy.rows) for k in ("refused", "malformed", "failed", "missing")},
        "config": s.to_dict() | {"run_config": dict(context.run_config)},
        "silos": silos,
        "preprocessing": preprocessing,
        **own_test,  # server.test-file: the output model on the server's own test records
    }
    recorder.summary(summary)
    te = summary["test_error"]
    print(f"[silofl] done in {summary['wall_s']:.1f}s: test error {'-' if te is None else f'{te:.2%}'}, "
          f"max eps spent {summary['eps_max_spent']}"
          f"{'' if preprocessing['covered_by_eps'] else ' (pre-processing NOT covered)'}, dropped replies "
          f"{summary['dropped']}; summary -> {recorder.summary_path}", flush=True)
    if own_test:
        print(f"[silofl] server test set ({own_test['server_test_records']} records of {s.server_test_file}): "
              f"accuracy {own_test['server_test_accuracy']:.2%}", flush=True)
    if failed:
        print(f"[silofl] run FAILED: {summary['status_reason']}", flush=True)
        if crashed is not None:
            raise crashed
        if strategy.client_errors and s.fail_on_client_error:
            raise ClientAppFailure(summary["status_reason"])
        if stopped:
            raise TooFewSilos(summary["status_reason"])
        if no_progress_fails:
            raise NoProgress(summary["status_reason"])
        raise NothingTrained(summary["status_reason"])
    if health.blame is not None:  # loud, and the last [silofl] line the launcher echoes
        print(f"[silofl] run {health.label.upper()}: {health.reason}; most likely {health.blame.suggestion}",
              flush=True)
    log(INFO, "silofl run %s %s", name, summary["status"])  # the ServerApp's last line (app/launch.py)
