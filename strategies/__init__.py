"""Server-side optimisers (flwr.serverapp.strategy.Strategy subclasses)."""

from strategies.base import FederatedOptimizer
from strategies.gradbant import ByzantineRobust
from strategies.localsgd import LocalSGD
from strategies.mbsgd import MinibatchSGD
from strategies.proxsgd import NoisyProxSGD
from strategies.spider import FedProxSPIDER
from strategies.spider_alt import FedSPIDERAlt
from strategies.svrg import FedProxPLSVRG, FedProxSVRG

STRATEGIES: dict[str, type[FederatedOptimizer]] = {
    "mbsgd": MinibatchSGD, "localsgd": LocalSGD, "proxsgd": NoisyProxSGD, "spider": FedProxSPIDER,
    "spider-alt": FedSPIDERAlt, "svrg": FedProxSVRG, "plsvrg": FedProxPLSVRG, "gradbant": ByzantineRobust,
}

__all__ = ["STRATEGIES", "ByzantineRobust", "FederatedOptimizer", "FedProxPLSVRG", "FedProxSPIDER", "FedProxSVRG", "FedSPIDERAlt",
           "LocalSGD", "MinibatchSGD", "NoisyProxSGD"]
