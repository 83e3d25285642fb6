"""Server-side optimisers (flwr.serverapp.strategy.Strategy subclasses)."""

from strategies.base import FederatedOptimizer
from strategies.localsgd import LocalSGD
from strategies.mbsgd import MinibatchSGD
from strategies.spider import FedProxSPIDER

STRATEGIES: dict[str, type[FederatedOptimizer]] = {
    "mbsgd": MinibatchSGD, "localsgd": LocalSGD, "spider": FedProxSPIDER,
}

__all__ = ["STRATEGIES", "FederatedOptimizer", "FedProxSPIDER", "LocalSGD", "MinibatchSGD"]
