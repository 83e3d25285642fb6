"""The server's own test set (``server.test-file``): the run's output model evaluated on records the
server holds, next to the silos' own test errors (which the silos report).

A server file is checked against the run's ``data.schema`` like a silo's, before round 1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from app.options import ConfigError

if TYPE_CHECKING:
    import torch

    from app.data.options import DataOptions


def load_server_test(data: DataOptions) -> tuple["torch.Tensor", "torch.Tensor"] | None:
    """(x, y) of ``server.test-file``, pre-processed like the server's trust file; None when the
    run names none; ConfigError (one line) when it cannot be read or does not match the schema."""
    if not data.server_test_file:
        return None
    import torch

    from app.data.own_data import server_records
    from app.data.schema import SchemaError

    try:
        x, y = server_records(data, data.server_test_file)
    except SchemaError as exc:
        raise ConfigError(f"server.test-file: {exc}") from None
    return torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y)


def server_test_metrics(model: "torch.nn.Module", params: dict[str, np.ndarray] | None,
                        test: tuple["torch.Tensor", "torch.Tensor"] | None) -> dict[str, Any]:
    """{server_test_error, server_test_accuracy, server_test_records} of ``params`` (the run's
    output) on the server's test set: the share of records whose arg-max logit is not the label;
    {} without a test set or a model."""
    if test is None or params is None:
        return {}
    import torch

    x, y = test
    live = {k: torch.as_tensor(np.asarray(v)) for k, v in params.items()}
    with torch.no_grad():
        logits = torch.func.functional_call(model, live, (x,))
    error = int((logits.argmax(dim=1) != y).sum()) / len(y)  # counted: exact, not a float32 mean
    return {"server_test_error": error, "server_test_accuracy": 1.0 - error, "server_test_records": int(len(y))}
