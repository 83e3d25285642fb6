"""No-op ClientApp: numpy only; answers a train message with the arrays it got plus a little
noise, an evaluate message with two metrics."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    rng = np.random.default_rng()
    arrays = msg.content.array_records["arrays"].to_numpy_ndarrays()
    update = [a + rng.normal(0.0, 1e-3, a.shape).astype(a.dtype) for a in arrays]
    return Message(RecordDict({"update": ArrayRecord(update), "metrics": MetricRecord({"eps-spent": 0.0})}),
                   reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return Message(RecordDict({"metrics": MetricRecord({"test-errors": 0.0, "test-count": 1.0})}), reply_to=msg)
