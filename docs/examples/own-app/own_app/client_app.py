"""The user's ClientApp: each hospital's own records under silofl's record-level ISRL-DP."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from clients.private_silo import PrivateSilo, SketchMod
from own_app.task import BATCH, CLIP, EPSILON, ROUNDS, SPIDER_Q, Net, silo_records


def records(context: Context):
    return silo_records(int(context.node_config["partition-id"]))


silo = PrivateSilo(Net, records, epsilon=EPSILON, clip=CLIP, batch_size=BATCH, rounds=ROUNDS,
                   algorithm="spider", options={"spider.q": SPIDER_Q})
app = ClientApp(mods=[SketchMod(), silo.policy_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    return silo.release(msg, context)


@app.query("ledger")
def ledger(msg: Message, context: Context) -> Message:
    return silo.ledger(msg, context)
