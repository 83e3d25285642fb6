"""silofl's scripts, run as modules from the repository root: ``python -m scripts.bench.startup``."""
