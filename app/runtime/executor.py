"""A long-lived task executor for one SuperNode: every ClientApp task runs in this one process.

Flower 1.42's SuperExec starts a new ``flwr-clientapp`` process for every message a SuperNode
gets (train, evaluate, each query): a Python start, Flower's imports and the app's imports each
time, and no state kept from one message to the next. A SuperNode started with
``--isolation process`` starts no SuperExec of its own and waits for an external one on its
Runtime API (``127.0.0.1:<--port>``). This module is that external executor, for silofl only:

    flower-supernode --isolation process --port 9094 ... --node-config "$NODE" &
    python -m app.runtime.executor --runtime-api 127.0.0.1:9094 --node-config "$NODE"

It asks the Runtime API for a ClientApp task every ``--poll`` seconds (Flower's own protocol:
``AcquireTask``, then the task's token), and runs the task here: it pulls the message and the
context, answers it with silofl's node runtime (``app/node_runtime.py``: the silo, its ledger,
calibration and PowerSGD state, imported once and kept in memory across messages and runs; a
deployed node, so the safe policy defaults hold), and pushes the reply and the task's status,
exactly as ``flwr-clientapp`` does.

Security: the code that handles the silo's records is the operator's installed silofl, not the
app bundle the server shipped with the run; a task of any other app (another FAB id) is
answered with an error, never run. The node's policy comes from ``--node-config`` (the same
string as the SuperNode's): the context the Runtime API hands over must carry the same node
config, or the task is refused.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from logging import ERROR, INFO, WARNING
from typing import Any

#: the app id this executor serves ("<publisher>/<name>" from pyproject's [tool.flwr.app])
APP_ID = "silofl/silofl"


def _app_id() -> str:
    """``publisher/name`` of the installed silofl app (pyproject), for checking a task's FAB id."""
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        data = tomllib.loads(pyproject.read_text())
        publisher = data["tool"]["flwr"]["app"]["publisher"]
        return f"{publisher}/{data['project']['name']}"
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return APP_ID


class Executor:
    """Acquire ClientApp tasks from one SuperNode's Runtime API and run them in this process."""

    def __init__(self, runtime_api: str, node_config: dict[str, Any], poll_s: float = 0.02,
                 app_id: str | None = None) -> None:
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient

        self.runtime_api = runtime_api
        self.node_config = dict(node_config)
        self.poll_s = float(poll_s)
        self.app_id = app_id or _app_id()
        self.stopping = threading.Event()
        self.served = 0
        self.client = RuntimeHttpClient.from_server_address(
            server_address=runtime_api, insecure=True, root_certificates=None,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
            retry_invoker=make_simple_http_retry_invoker())

    def warm_up(self) -> None:
        """Import the silo stack now (torch, the node runtime), not on the first message."""
        import app.node_runtime

        self.runtime = app.node_runtime

    def acquire(self) -> tuple[str, Any] | None:
        from flwr.supercore.constant import TaskType
        from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611

        res = self.client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP],
                                                         agentapp_fab_hashes=[]))
        if res.HasField("task") and res.token:
            return res.token, res.task
        return None

    def run_task(self, token: str) -> None:
        """One task, as ``flwr-clientapp`` runs it (pull input, run, push reply and status),
        minus the process start, the FAB installation and the app import."""
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode, SubStatus
        from flwr.common import log
        from flwr.supercore.heartbeat import HeartbeatSender, make_task_heartbeat_fn_http
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
        from flwr.supercore.retry import make_simple_http_retry_invoker
        from flwr.supercore.runtime import RuntimeHttpClient
        from flwr.supernode.runtime.run_clientapp import pull_task_input, push_message, push_task_output

        client = RuntimeHttpClient.from_server_address(
            server_address=self.runtime_api, insecure=True, root_certificates=None,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
                          RuntimeTokenHttpInterceptor(token)],
            retry_invoker=make_simple_http_retry_invoker())
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        message = context = reply = None
        status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        t0 = time.perf_counter()
        try:
            heartbeat.start()
            message, context, run, _fab = pull_task_input(client)
            if run.fab_id != self.app_id:
                raise PermissionError(f"this node runs only {self.app_id}; the run's app is {run.fab_id!r}")
            if dict(context.node_config) != self.node_config:
                raise PermissionError("the node config the SuperNode passed differs from this executor's "
                                      "(--node-config): start both with the same string")
            content = self.runtime.handle(message.metadata.message_type, message.content, context, deployed=True)
            reply = Message(content, reply_to=message)
            status, details = SubStatus.COMPLETED, ""
        except Exception as exc:  # what flwr-clientapp does: an error reply, the task marked failed
            reason = f"{type(exc)}:<'{exc}'>"
            log(ERROR, "ClientApp raised an exception: %s", reason)
            details = reason
            if message is not None:
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=message)
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
            except Exception as exc:  # noqa: BLE001 - the SuperNode's task expiry handles it
                log(ERROR, "failed to push the reply: %s", exc)
            push_task_output(client=client, context=context, sub_status=status, details=details)
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()
        self.served += 1
        kind = message.metadata.message_type if message is not None else "?"
        run_id = message.metadata.run_id if message is not None else "?"
        print(f"[silofl-executor] run {run_id} {kind} {1000 * (time.perf_counter() - t0):.0f} ms "
              f"({status})", flush=True)

    def serve(self) -> None:
        from flwr.common import log

        log(INFO, "silofl executor serving %s for the SuperNode at %s (poll %.3f s)", self.app_id,
            self.runtime_api, self.poll_s)
        while not self.stopping.is_set():
            try:
                got = self.acquire()
            except Exception as exc:  # the SuperNode is restarting: keep trying
                log(WARNING, "runtime API at %s: %s", self.runtime_api, exc)
                self.stopping.wait(1.0)
                continue
            if got is None:
                self.stopping.wait(self.poll_s)
                continue
            self.run_task(got[0])
        self.client.close()


def main(argv: list[str] | None = None) -> int:
    from flwr.common.config import parse_config_args

    ap = argparse.ArgumentParser(prog="python -m app.runtime.executor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-api", default="127.0.0.1:9094",
                    help="the SuperNode's Runtime API (flower-supernode --isolation process --port PORT)")
    ap.add_argument("--node-config", default="", help="the SuperNode's --node-config string, verbatim")
    ap.add_argument("--poll", type=float, default=0.02, help="seconds between two task requests when idle")
    args = ap.parse_args(argv)
    if not 0.001 <= args.poll <= 60:
        print(f"--poll {args.poll} is out of range; allowed: [0.001, 60]", file=sys.stderr)
        return 2
    node_config = parse_config_args([args.node_config]) if args.node_config.strip() else {}
    executor = Executor(args.runtime_api, node_config, args.poll)
    executor.warm_up()
    print(f"[silofl-executor] ready: {args.runtime_api}, partition-id {node_config.get('partition-id', '-')}",
          flush=True)

    def stop(_sig: int, _frame: Any) -> None:
        executor.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    executor.serve()
    print(f"[silofl-executor] stopped after {executor.served} task(s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
