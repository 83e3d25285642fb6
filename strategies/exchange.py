"""What an optimiser's round is made of: the exchanges it asks for and the step it returns.

An optimiser's one hook is a generator of exchanges (strategies/loop.py):

    def exchanges(self, rnd, w):
        updates = yield Exchange(phase, w)     # the sampled silos' valid decoded replies
        ...
        return StepResult(new_w)               # None: the model stays

Whoever drives it (silofl's :meth:`~strategies.loop.FederatedOptimizer.run`, or Flower's own
``Strategy.start`` through ``configure_train``/``aggregate_train``) sends each :class:`Exchange`
to the round's sampled silos and sends their :class:`~strategies.replies.Updates` back in.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from app.algorithms import Phase
from app.sketch.broadcast import RoundSketch
from strategies.replies import Params, ReplyReader, Updates


@dataclass(frozen=True)
class Exchange:
    """One release asked of the round's sampled silos: ``phase`` at point ``at`` (and, for a
    difference, the earlier point ``prev``)."""

    phase: Phase
    at: Params
    prev: Params | None = None


@dataclass
class StepResult:
    """What a step returns: the next model (None: unchanged) and extra entries for the round's row."""

    model: Params | None
    row: dict[str, Any] = field(default_factory=dict)


#: an optimiser's round: yields exchanges, receives their updates, returns the step
Round = Generator[Exchange, Updates, StepResult]


@dataclass
class RoundContext:
    """One round's sampled silos, sketch and reply reader, and what its exchanges brought."""

    rnd: int
    nodes: list[int]
    spec: RoundSketch | None
    reader: ReplyReader
    exchanges: list[Updates] = field(default_factory=list)
    sent: int = 0
    floats: float = 0  # an int unless a relay counts fractions (as before)


class MultiExchangeRound(RuntimeError):
    """A round that asks more than one exchange cannot run under Flower's own ``Strategy.start``
    (one train exchange per round): run it with silofl's driver."""
