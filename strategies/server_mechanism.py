"""The server half of a privacy mechanism: which nodes are silos, what an exchange's instruction
carries for it, and how the silos' releases come back as one exchange's updates.

    DirectReplies   the Gaussian mechanism (ISRL-DP) and no privacy: each silo's release comes
                    back in its own reply, read by the round's ReplyReader
    ShuffleRelay    the binomial shuffle (strategies/shuffle_relay.py): sealed contributions go
                    through the shuffler node, and only the debiased mean comes back
    SecAggRelay     secure aggregation (strategies/secagg_relay.py): masked Skellam encodings,
                    four message rounds an exchange, and only their decoded sum comes back

The silo half of each is in clients/ (the Gaussian release, the binomial encoding); the round
loop (strategies/loop.py) and the node bookkeeping (strategies/nodes.py) ask the mechanism instead
of branching on ``privacy.mode``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from flwr.app import Message

if TYPE_CHECKING:
    from flwr.serverapp import Grid

    from app.algorithms import Phase
    from strategies.replies import ReplyReader, Updates


class ServerMechanism(Protocol):
    """What the round loop asks of a mechanism's server half."""

    #: nodes the mechanism needs besides the silos (the shuffler: 1)
    helper_nodes: int
    #: whether a round's evaluation may ride on the next round's training exchange
    folds_evaluation: bool
    #: whether Flower's own ``Strategy.start`` can drive it (the shuffler relay needs silofl's driver)
    under_flower_start: bool
    #: exchanges run so far (a checkpoint holds it: the shuffle contributions' context binds to it)
    exchanges: int

    def bind(self, layout: Mapping[str, tuple[int, ...]]) -> None: ...

    def silo_nodes(self, nodes: Iterable[int]) -> list[int]: ...

    def silo_count(self, nodes: Iterable[int]) -> int: ...

    def discover(self, grid: Grid, nodes: Iterable[int], timeout: float) -> None: ...

    def open_exchange(self, grid: Grid, rnd: int, phase: Phase, nodes: list[int], timeout: float,
                      run_id: int) -> Any:
        """What the exchange's instructions carry for the mechanism (its ticket), after any
        message rounds it needs first (secure aggregation's keys and shares)."""

    def address(self, messages: list[Message], ticket: Any) -> list[Message]:
        """The exchange's training instructions as the mechanism sends them (secure aggregation:
        only to the silos that shared, each with the payloads sealed to it)."""

    def collect(self, grid: Grid, rnd: int, phase: Phase, ticket: Any, replies: Iterable[Message],
                nodes: list[int], reader: ReplyReader, timeout: float, run_id: int) -> Updates: ...

    def row(self, tally: Updates) -> dict[str, Any]: ...


class DirectReplies:
    """The Gaussian mechanism's server half (and no privacy's): every node is a silo, and each
    silo's release comes back in its own reply (validated, lifted and decoded by the reader)."""

    helper_nodes = 0
    folds_evaluation = True
    under_flower_start = True

    def __init__(self) -> None:
        self.exchanges = 0

    def bind(self, layout: Mapping[str, tuple[int, ...]]) -> None:
        """Nothing to size: the replies carry the releases as they are."""

    def silo_nodes(self, nodes: Iterable[int]) -> list[int]:
        return list(nodes)

    def silo_count(self, nodes: Iterable[int]) -> int:
        return len(list(nodes))

    def discover(self, grid: Grid, nodes: Iterable[int], timeout: float) -> None:
        """No node to find."""

    def open_exchange(self, grid: Grid, rnd: int, phase: Phase, nodes: list[int], timeout: float,
                      run_id: int) -> None:
        return None

    def address(self, messages: list[Message], ticket: Any) -> list[Message]:
        return messages

    def collect(self, grid: Grid, rnd: int, phase: Phase, ticket: Any, replies: Iterable[Message],
                nodes: list[int], reader: ReplyReader, timeout: float, run_id: int) -> Updates:
        """The sampled silos' valid replies, decoded (an invalid one counts as a dropped silo)."""
        return reader.classify(rnd, replies, nodes)

    def row(self, tally: Updates) -> dict[str, Any]:
        return {}


def server_mechanism(settings: Any, client_error: Callable[[Message, str], str]) -> ServerMechanism:
    """The server half of the run's privacy mode (``settings``: the run's parsed Settings)."""
    if settings.privacy.enabled and settings.privacy.mode == "shuffle":
        from strategies.shuffle_relay import ShuffleRelay

        return ShuffleRelay(settings.shuffle, settings.privacy.clip, settings.diff_clip, client_error)
    if settings.privacy.enabled and settings.privacy.mode == "secagg":
        from strategies.secagg_relay import SecAggRelay

        return SecAggRelay(settings.secagg, settings.privacy.clip, settings.diff_clip, settings.seed, client_error)
    return DirectReplies()
