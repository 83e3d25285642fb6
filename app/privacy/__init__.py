"""Silo-side privacy: per-sample gradients, clipping, the Gaussian mechanism, accounting and
the silo's ledger. Nothing here trusts the server."""
