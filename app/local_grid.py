"""An in-process Grid that delivers messages straight to the ClientApp (no Flower runtime).

It runs the real ServerApp and ClientApp code (strategies, silos, ledgers, accounting) in one
process without Flower's transport, so tests can inject faulty replies and the reproduction
scripts can run hundreds of small federations (``run_local``); ``flwr run`` (app.launch) is
the way to run one federation on the Flower engine."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

from app.client_app import app as client_app
from app.privacy.row_batcher import RowBatcher

ReplyHook = Callable[[int, Message, Message], Message]


class InProcessGrid:
    """Implements what FederatedOptimizer uses of flwr.serverapp.Grid."""

    def __init__(self, run_config: dict[str, Any], num_nodes: int, state_dir: str, run_id: int = 1,
                 hook: ReplyHook | None = None,
                 node_config: dict[str, Any] | Callable[[int], dict[str, Any]] | None = None,
                 client: ClientApp | None = None, batched: bool = False) -> None:
        """``client``: the ClientApp every node runs (None: silofl's, app/client_app.py).
        ``node_config``: added to every node's config, or a function of the node's index giving
        its own (e.g. each silo's own data-file). ``batched``: answer each exchange's messages
        in turn, each in a thread of its own, and compute their silos' per-record gradients (and
        an open evaluation's model outputs) together, one call per model, point and kind
        (app/privacy/row_batcher.py); the same releases, each silo's own ledger, batch and noise."""
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 0
        self.node_ids = [1000 + i for i in range(num_nodes)]
        extra = node_config if callable(node_config) else (lambda i: node_config or {})
        self.contexts = {
            nid: Context(run_id=run_id, node_id=nid,
                         node_config={"partition-id": i, "num-partitions": num_nodes, "state-dir": state_dir}
                         | extra(i),
                         state=RecordDict(), run_config=dict(run_config))
            for i, nid in enumerate(self.node_ids)
        }
        self.hook = hook
        self.client = client if client is not None else client_app
        self.sent: list[Message] = []
        self.batcher = RowBatcher() if batched else None

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        if self.batcher is not None and len(messages) > 1:
            self.sent.extend(messages)
            answers = self.batcher.run([self._call(msg) for msg in messages])
            return [self._reply(msg, answer) for msg, answer in zip(messages, answers, strict=True)]
        replies = []
        for msg in messages:
            self.sent.append(msg)
            try:
                answer: Message | BaseException = self._call(msg)()
            except Exception as exc:  # noqa: BLE001 - turned into the runtime's Error reply
                answer = exc
            replies.append(self._reply(msg, answer))
        return replies

    def _reply(self, msg: Message, answer: Message | BaseException) -> Message:
        """The reply the server gets: ``answer``, a crash as the Flower runtime reports it, then the hook's."""
        if isinstance(answer, BaseException):
            if not isinstance(answer, Exception):
                raise answer
            answer = Message(Error(code=0, reason=f"ClientApp exception: {answer!r}"), reply_to=msg)
        if self.hook is not None:
            answer = self.hook(msg.metadata.dst_node_id, msg, answer)
        return answer

    def _call(self, msg: Message) -> Callable[[], Message]:
        return lambda: self.client(msg, self.contexts[msg.metadata.dst_node_id])


_RUN_IDS = itertools.count(1)


def simulation_nodes(run_config: dict[str, Any]) -> int:
    """How many nodes a simulation of ``run_config`` needs: one per silo, and in shuffle mode
    the shuffler (the last node, partition-id = num-silos)."""
    from app.config import parse_settings

    return parse_settings(run_config).simulation_nodes()


def run_local(run_config: dict[str, Any], state_dir: str, run_id: int | None = None, hook: ReplyHook | None = None,
              node_config: dict[str, Any] | Callable[[int], dict[str, Any]] | None = None,
              client: ClientApp | None = None, batched: bool = False) -> InProcessGrid:
    """Run the ServerApp's main on an in-process grid with ``run_config`` (merged over the
    defaults by the caller); outputs go where the run config says. ``client``: the ClientApp
    the nodes run (None: silofl's; a user's own, e.g. with clients/private_silo.py).
    ``batched``: the batched simulation path (InProcessGrid)."""
    from flwr.app import Context

    import app.server_app as server_app

    from app.data.schema import with_inline_schema

    run_config = with_inline_schema(run_config)  # as the launcher sends it: the silos never open a path
    run_id = next(_RUN_IDS) if run_id is None else run_id  # a new run id per run, as Flower gives
    grid = InProcessGrid(run_config, simulation_nodes(run_config), state_dir, run_id=run_id, hook=hook,
                         node_config=node_config, client=client, batched=batched)
    try:
        # through the ServerApp object, as Flower calls it: its registered main, not the function by name
        server_app.app(grid, Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(),
                                     run_config=run_config))
    except Exception as exc:  # a failed run: the caller may still want to see what was sent
        exc.grid = grid  # type: ignore[attr-defined]
        raise
    return grid
