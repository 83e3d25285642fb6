"""Privacy audits (``python -m scripts.audit.<name>`` from the repository root)."""
