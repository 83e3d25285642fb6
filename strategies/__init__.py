"""Server-side optimisers (flwr.serverapp.strategy.Strategy subclasses)."""

from strategies.base import FederatedOptimizer
from strategies.localsgd import LocalSGD
from strategies.mbsgd import MinibatchSGD

STRATEGIES: dict[str, type[FederatedOptimizer]] = {"mbsgd": MinibatchSGD, "localsgd": LocalSGD}

__all__ = ["STRATEGIES", "FederatedOptimizer", "LocalSGD", "MinibatchSGD"]
