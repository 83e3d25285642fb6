"""Reproduction runs (``python -m scripts.reproduce.<name>`` from the repository root)."""
