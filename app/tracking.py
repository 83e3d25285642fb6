"""Experiment tracking: a run's files (summary.json, rounds.jsonl) logged to MLflow.

    python -m app.tracking outputs/<run>                # one run (a folder with summary.json)
    python -m app.tracking outputs/sweeps/<name>        # every job of a sweep + the report's files
    python -m app.sweep -m ... sweep.tracking=mlflow     # each job as it finishes
    SILOFL_TRACKING=mlflow python -m app.launch ...      # a run when it has ended (and sweeps)

MLflow rather than W&B, because its store is embedded: a local folder (``./mlruns``, or
``MLFLOW_TRACKING_URI`` / ``--uri``, e.g. ``sqlite:///mlflow.db``) with no server, account or
network, which suits machines that cannot reach the internet. It is optional:
``pip install 'silofl[tracking]'`` (mlflow-skinny, enough to log, no UI server). Browsing needs the
full ``mlflow`` package (``pip install mlflow``: with mlflow-skinny ``mlflow ui`` fails, no flask),
and any reader of the file store ``MLFLOW_ALLOW_FILE_STORE=true`` (MLflow 3 refuses it otherwise):
``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri ./mlruns --host 127.0.0.1``.

Bounded: a run (or sweep job) waits for its tracking at most ``SILOFL_TRACKING_TIMEOUT_S`` (30 s);
an http(s) store's requests time out after 10 s, retried once (:data:`HTTP_ENV`); a store that
fails or overruns is skipped for the rest of the process (docs/configuration.md, Tracking).

What is logged, from the files alone (never from memory, so a finished run or a whole sweep can
be logged afterwards): every run-config setting of summary.json (``config.run_config``) as a param; per round (step =
round) the numbers of its rounds.jsonl row (train loss, test error, max ε spent, uploads G(t),
wall time, ...); the final test error / accuracy, max ε spent, each silo's ε spent and wall time
as metrics; the status as a tag (an MLflow run ``FAILED`` unless the run completed);
summary.json, rounds.jsonl and any figures as artifacts. The MLflow run is tagged with the
silofl run name (and the sweep's job id), so logging the same run again is skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from app.results import load_rounds

TRACKERS = ("none", "mlflow")
#: the experiment runs go to when none is named
DEFAULT_EXPERIMENT = "silofl"
#: the tag that names the silofl run an MLflow run holds
RUN_TAG = "silofl.run"
#: MLflow's limit on a param value's length (characters)
PARAM_MAX = 6000


class TrackingError(RuntimeError):
    """The tracker cannot be used (not installed, bad URI)."""


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise TrackingError("tracking = mlflow needs MLflow: pip install 'silofl[tracking]' (or mlflow-skinny)") from None
    return mlflow


#: an http(s) store: MLflow's own defaults (a 120 s timeout per request, 7 retries with backoff
#: factor 2) held every run and every sweep job >= 90 s on a store that refuses connections or
#: never answers. Set (when not set) for an http(s) URI: each request waits at most this long...
HTTP_TIMEOUT_S = 10
#: ... and is retried at most this often, without backoff
HTTP_RETRIES = 1
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(HTTP_TIMEOUT_S), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(HTTP_RETRIES),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0"}
#: the longest a run or a sweep job waits for its tracking (seconds; environment variable)
DEADLINE_ENV = "SILOFL_TRACKING_TIMEOUT_S"
DEFAULT_DEADLINE_S = 30.0


def tracking_uri(uri: str | None = None) -> str:
    """``uri``, else ``MLFLOW_TRACKING_URI``, else the local file store ``./mlruns``. MLflow 3
    keeps its file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is
    true: set here (when not set) for a file store, the embedded default that needs neither a
    server nor a database package; ``sqlite:///mlflow.db`` is the alternative with the full mlflow.
    For an http(s) store, MLflow's request timeout and retries are bounded (:data:`HTTP_ENV`,
    when not set)."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or (Path.cwd() / "mlruns").as_uri()
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    if uri.startswith(("http:", "https:")):
        for key, value in HTTP_ENV.items():
            os.environ.setdefault(key, value)
    return uri


def _finite(value: Any) -> float | None:
    """A metric value: a finite number (bools and "inf" / "nan" strings are not), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def round_metrics(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, float, int]]:
    """(key, value, step = round) for every finite number of every rounds.jsonl row."""
    out = []
    for r in rows:
        step = int(r.get("round", 0))
        for k, v in r.items():
            if k != "round" and (x := _finite(v)) is not None:
                out.append((k, x, step))
    return out


def final_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The run's end: test error / accuracy, train loss, max ε spent, each silo's ε, wall time."""
    out = {f"final_{k}": x for k in ("test_error", "test_accuracy", "train_loss", "val_error")
           if (x := _finite(summary.get(k))) is not None}
    for k in ("eps_max_spent", "wall_s"):
        if (x := _finite(summary.get(k))) is not None:
            out[k] = x
    for i, silo in enumerate(summary.get("silos") or []):
        if (x := _finite(silo.get("eps_spent"))) is not None:
            out[f"eps_spent_silo{silo.get('silo', i)}"] = x
    return out


def params_of(summary: Mapping[str, Any]) -> dict[str, str]:
    """Every setting of the run as MLflow params, under the run-config names users type
    (summary.json's ``config.run_config``; else its ``config``, nested keys joined with dots)."""
    config = summary.get("config") or {}
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Mapping[str, Any]) -> None:
        for k, v in node.items():
            if isinstance(v, Mapping):
                walk(f"{prefix}{k}.", v)
            else:
                flat[f"{prefix}{k}"] = v

    walk("", config.get("run_config") or config)
    return {k: (v if isinstance(v, str) else json.dumps(v))[:PARAM_MAX] for k, v in sorted(flat.items())}


def log_run(run_dir: str | Path, *, experiment: str = DEFAULT_EXPERIMENT, uri: str | None = None,
            tags: Mapping[str, str] | None = None, artifacts: Iterable[str | Path] = ()) -> str | None:
    """Log one finished run (its summary.json and rounds.jsonl) as an MLflow run; returns its
    MLflow run id, or None when a run with this silofl run name is already in the experiment."""
    _mlflow()
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    run_dir = Path(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    rounds = load_rounds(run_dir / "rounds.jsonl") if (run_dir / "rounds.jsonl").exists() else []
    name = str(summary.get("run_name") or run_dir.name)
    client = MlflowClient(tracking_uri(uri))
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
    if client.search_runs([exp_id], filter_string=f"tags.`{RUN_TAG}` = '{name}'", max_results=1):
        return None
    status = str(summary.get("status", "unknown"))
    run = client.create_run(exp_id, run_name=name, tags={RUN_TAG: name, "silofl.status": status, **(tags or {})})
    rid = run.info.run_id
    now = int(time.time() * 1000)
    metrics = [Metric(k, v, now, step) for k, v, step in round_metrics(rounds)]
    last = int(rounds[-1]["round"]) if rounds else 0
    metrics += [Metric(k, v, now, last) for k, v in final_metrics(summary).items()]
    params = [Param(k, v) for k, v in params_of(summary).items()]
    for j in range(0, len(params), 100):  # MLflow's batch limits: 100 params, 1000 metrics
        client.log_batch(rid, params=params[j:j + 100])
    for j in range(0, len(metrics), 1000):
        client.log_batch(rid, metrics=metrics[j:j + 1000])
    client.set_tag(rid, "silofl.rounds", str(len(rounds)))
    for path in [run_dir / "summary.json", run_dir / "rounds.jsonl", *map(Path, artifacts)]:
        if path.exists():
            client.log_artifact(rid, str(path))
    client.set_terminated(rid, status="FINISHED" if status == "completed" else "FAILED")
    return rid


#: environment variable that turns tracking on for `python -m app.launch` runs and sweeps: "mlflow"
TRACKING_ENV = "SILOFL_TRACKING"


#: stores that failed or overran the deadline in this process: later runs skip them at once
_GAVE_UP: dict[str, str] = {}


def deadline_s() -> float:
    """:data:`DEADLINE_ENV` (seconds, > 0), else :data:`DEFAULT_DEADLINE_S`."""
    try:
        value = float(os.environ.get(DEADLINE_ENV, "") or DEFAULT_DEADLINE_S)
    except ValueError:
        return DEFAULT_DEADLINE_S
    return value if value > 0 and math.isfinite(value) else DEFAULT_DEADLINE_S


def track_from_env(run_dir: str | Path, tags: Mapping[str, str] | None = None, *, kind: str | None = None,
                   experiment: str = DEFAULT_EXPERIMENT, uri: str | None = None) -> str | None:
    """Log ``run_dir`` to ``experiment`` when tracking is on: ``kind`` (a sweep's
    ``sweep.tracking``) if given, else ``SILOFL_TRACKING``; store ``uri``, else
    ``MLFLOW_TRACKING_URI``, else ./mlruns. The one tracking hook of app.launch and app.sweep: a
    tracker that fails is one warning line on stderr, never the run's (or the job's) failure.
    Bounded: the logging runs in a daemon thread that the caller waits for at most
    :func:`deadline_s` (``SILOFL_TRACKING_TIMEOUT_S``, default 30 s); a store that overran it or
    failed is skipped at once for the rest of the process (a sweep's later jobs), with one line
    each saying how to log the run afterwards (``python -m app.tracking <folder>``)."""
    import sys
    import threading

    key = TRACKING_ENV if not kind else "sweep.tracking"
    kind = (kind or os.environ.get(TRACKING_ENV, "")).strip().lower() or "none"
    if kind == "none":
        return None
    name = Path(run_dir).name
    later = f"log it afterwards: python -m app.tracking {run_dir}"
    if kind not in TRACKERS:
        print(f"[tracking] {name}: not tracked: TrackingError: {key} = {kind!r}; allowed: {', '.join(TRACKERS)}",
              file=sys.stderr, flush=True)
        return None
    store = tracking_uri(uri)
    if store in _GAVE_UP:
        print(f"[tracking] {name}: not tracked: the store {store} {_GAVE_UP[store]} earlier in this process; {later}",
              file=sys.stderr, flush=True)
        return None
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["rid"] = log_run(run_dir, experiment=experiment, uri=store, tags=tags)
        except BaseException as exc:  # reported by the caller, in its thread
            result["error"] = exc

    wait = deadline_s()
    thread = threading.Thread(target=work, name=f"silofl-tracking-{name}", daemon=True)
    thread.start()
    thread.join(wait)
    if thread.is_alive():  # left behind (a daemon: it never holds the process's exit)
        _GAVE_UP[store] = f"did not finish within {wait:g} s ({DEADLINE_ENV})"
        print(f"[tracking] {name}: not tracked: the store {store} did not finish within {wait:g} s "
              f"({DEADLINE_ENV}); later runs of this process skip it; {later}", file=sys.stderr, flush=True)
        return None
    if "error" in result:
        exc = result["error"]
        if store.startswith(("http:", "https:")):
            _GAVE_UP[store] = f"failed ({type(exc).__name__})"
        print(f"[tracking] {name}: not tracked: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}; {later}",
              file=sys.stderr, flush=True)
        return None
    rid = result.get("rid")
    print(f"[tracking] {name} -> MLflow {store} (run {rid or 'already logged'})", flush=True)
    return rid


def log_sweep(sweep_dir: str | Path, *, experiment: str | None = None, uri: str | None = None) -> list[str]:
    """Log every finished job of a sweep that has its run folder (skipping those logged before),
    and a run ``<name>/report`` with the report's files (results.md, summary.csv, figures) as
    artifacts when app.report has written them. Returns the MLflow run ids logged now."""
    from app.results import complete_csv_rows

    sweep_dir = Path(sweep_dir)
    experiment = experiment or f"{DEFAULT_EXPERIMENT}/{sweep_dir.name}"
    rows = complete_csv_rows(sweep_dir / "results.csv")
    logged = []
    for r in rows:
        recorded = Path(r.get("run_dir") or "")
        for d in (recorded, sweep_dir / "runs" / recorded.name):
            if str(recorded) and (d / "summary.json").exists():
                rid = log_run(d, experiment=experiment, uri=uri, tags={"silofl.job": r.get("job", "")})
                logged += [rid] if rid else []
                break
    files = [p for p in sorted(sweep_dir.iterdir()) if p.suffix in (".md", ".png", ".pdf") or p.name == "summary.csv"]
    if files:
        _mlflow()
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri(uri))
        exp = client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(experiment)
        run = client.create_run(exp_id, run_name=f"{sweep_dir.name}/report", tags={"silofl.sweep": sweep_dir.name})
        for p in files:
            client.log_artifact(run.info.run_id, str(p))
        client.set_terminated(run.info.run_id)
        logged.append(run.info.run_id)
    return logged


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="a run folder (summary.json) or a sweep folder (results.csv)")
    ap.add_argument("--uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else ./mlruns)")
    ap.add_argument("--experiment", default=None, help=f"MLflow experiment (default: {DEFAULT_EXPERIMENT}, "
                    f"or {DEFAULT_EXPERIMENT}/<sweep name>)")
    args = ap.parse_args(argv)
    try:
        if (args.path / "results.csv").exists():
            ids = log_sweep(args.path, experiment=args.experiment, uri=args.uri)
        elif (args.path / "summary.json").exists():
            ids = [i for i in [log_run(args.path, experiment=args.experiment or DEFAULT_EXPERIMENT, uri=args.uri)] if i]
        else:
            print(f"tracking: {args.path} has neither summary.json nor results.csv")
            return 2
    except TrackingError as exc:
        print(f"tracking: {exc}")
        return 2
    print(f"[tracking] logged {len(ids)} MLflow run(s) to {tracking_uri(args.uri)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
