"""The user's ServerApp: FedProx-SPIDER with noise-aware Grad-BANT, built from constructor
arguments alone, run by Flower's own Strategy.start with a server-side evaluation."""

import torch
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from app.data.federated import TrustSet
from own_app.task import BATCH, CLIP, EPSILON, SILOS, SPIDER_Q, Net, server_records, silo_sizes
from strategies.aggregators import GradBANT
from strategies.spider import FedProxSPIDER

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rounds, lr = int(context.run_config["num-server-rounds"]), float(context.run_config["server-lr"])
    trust_x, trust_y, test_x, test_y = server_records()
    rule = GradBANT(beta=0.5, trust=TrustSet(trust_x, trust_y), model=Net(), noise_aware=True,
                    silo_records=silo_sizes())
    strategy = FedProxSPIDER(lr=lr, q=SPIDER_Q, num_rounds=rounds, num_silos=SILOS, silos_per_round=SILOS,
                             batch_size=BATCH, privacy_epsilon=EPSILON, privacy_clip=CLIP, eval_every=0,
                             aggregator=rule)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            accuracy = (model(test_x).argmax(dim=1) == test_y).float().mean().item()
        return MetricRecord({"accuracy": accuracy})

    torch.manual_seed(0)  # the initial model
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds,
                            evaluate_fn=evaluate)
    for row in strategy.rows:
        weights = {node: round(w, 2) for node, w in sorted(row["silo_weights"].items())}
        print(f"round {row['round']} ({'anchor' if row['round'] % SPIDER_Q == 1 else 'difference'}): "
              f"answered {row['answered']}, Grad-BANT weights {weights}")
    for rnd, metrics in sorted(result.evaluate_metrics_serverapp.items()):
        print(f"round {rnd}: server test accuracy {metrics['accuracy']:.3f}")
