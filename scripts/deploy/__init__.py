"""Deployment tools (``python -m scripts.deploy.<name>`` from the repository root)."""
