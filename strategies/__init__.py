"""Server-side optimisers (flwr.serverapp.strategy.Strategy subclasses)."""

from strategies.base import FederatedOptimizer
from strategies.localsgd import LocalSGD
from strategies.mbsgd import MinibatchSGD
from strategies.spider import FedProxSPIDER
from strategies.svrg import FedProxSVRG

STRATEGIES: dict[str, type[FederatedOptimizer]] = {
    "mbsgd": MinibatchSGD, "localsgd": LocalSGD, "spider": FedProxSPIDER, "svrg": FedProxSVRG,
}

__all__ = ["STRATEGIES", "FederatedOptimizer", "FedProxSPIDER", "FedProxSVRG", "LocalSGD", "MinibatchSGD"]
