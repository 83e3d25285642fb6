"""What a node knows of its own process, before any run config: whether it is a deployed
``flwr-clientapp`` process, and where its state (ledgers, keys, marks) lives. Standard library
only: the ClientApp's import stays light (app/client_app.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def deployed_process() -> bool:
    """Whether this ClientApp runs in a Flower ``flwr-clientapp`` process, i.e. on a SuperNode
    of a real deployment (Flower's simulation runs ClientApps in its own engine's workers, and
    the in-process grid in whatever process imports it)."""
    return bool(sys.argv) and os.path.basename(sys.argv[0]).removesuffix(".exe") == "flwr-clientapp"


def state_dir(node: Mapping[str, Any]) -> Path:
    """The node's state directory: node config ``state-dir``, else ``$FLWR_HOME/silofl-state``."""
    if "state-dir" in node:
        return Path(str(node["state-dir"]))
    home = os.environ.get("FLWR_HOME")  # (Path.home() only without it: it reads the user database)
    return (Path(home) if home is not None else Path.home() / ".flwr") / "silofl-state"
