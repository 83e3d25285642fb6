"""Benchmarks (``python -m scripts.bench.<name>`` from the repository root)."""
