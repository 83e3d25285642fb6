"""pfl-research's side of scripts/bench/pfl_compare.py: one PyTorch simulation with local Gaussian DP.

Runs under pfl's own interpreter (``/work/pfl-venv/bin/python``; pfl 0.6.0 pins
dp-accounting < 0.6, which silofl's environment cannot hold), so it imports pfl, torch, numpy and
scikit-learn only, never silofl. The bench spawns it as a fresh process and measures its CPU; this
script prints one line ``PFL_RESULT {json}`` (final central test accuracy, the noise it used).

The task, as silofl's side of the bench runs it:

* data: ``digits`` (sklearn ``load_digits``, 1,797 x 64, pixels standardised with the training
  split's mean/std) or ``fashion-mnist`` (the idx files, pixels / 255, PCA to 50 features fitted
  on 10% of the training split); a stratified 80/20 train/test split (digits; Fashion-MNIST keeps
  its own 60,000/10,000), the training records dealt IID to ``--clients`` users (a seeded
  permutation, ``numpy.random.default_rng(seed)``);
* model: MLP d-64-10 (``Linear, ReLU, Linear``), cross-entropy;
* every user in every round (``train_cohort_size`` = users, ``MinimizeReuseUserSampler``), one
  local SGD step (``local_num_steps = 1``) on the user's full data (``--batch 0``) or its first
  ``--batch`` records, local step size ``--lr``; FedAvg with a central SGD step of 1 (the mean
  model difference is applied as is);
* local DP: pfl's ``GaussianMechanism`` as a *local* postprocessor of ``SimulatedBackend``: each
  user's model update (lr x its gradient here, one step) is clipped to l2 norm ``clip`` and gets
  N(0, (z clip)^2) noise per coordinate. The unit of privacy is the user's whole update
  (user-level local DP), not a record. With ``--noise-std s`` (what the bench passes: silofl's
  noise, so both do the same arithmetic) z = s / clip and the mechanism is built directly,
  ``GaussianMechanism(clip, z)``, with no accountant in the process (``--epsilon-only`` prints
  the epsilon pfl's ``PLDPrivacyAccountant`` gives that z over ``rounds`` compositions, every user
  every round, and what that accounting costs); without it, z comes from
  ``GaussianMechanism.from_privacy_accountant(PLDPrivacyAccountant(num_compositions = rounds,
  sampling_probability = 1, mechanism = "gaussian", epsilon, delta), clip)``;
* evaluation: ``CentralEvaluationCallback`` on the test split after every round (R evaluations,
  as silofl's eval-every = 1; pfl's default would evaluate the initial model instead of round 1's).

    /work/pfl-venv/bin/python scripts/bench/pfl_runner.py --dataset digits --clients 100 --rounds 3
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


def _idx(path: Path) -> np.ndarray:
    """An idx file (gzip): big-endian header of ndim sizes after a 4-byte magic, then uint8s."""
    with gzip.open(path, "rb") as fh:
        raw = fh.read()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load(dataset: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) as float32 / int64 arrays (see the module docstring)."""
    if dataset == "digits":
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        bunch = load_digits()
        xtr, xte, ytr, yte = train_test_split(bunch.data, bunch.target, test_size=0.2, random_state=seed,
                                              stratify=bunch.target)
        mean, std = xtr.mean(0), xtr.std(0) + 1e-8
        return ((xtr - mean) / std).astype(np.float32), ytr.astype(np.int64), \
            ((xte - mean) / std).astype(np.float32), yte.astype(np.int64)
    if dataset == "fashion-mnist":
        from sklearn.decomposition import PCA

        d = FASHION_MNIST_DIR
        xtr = _idx(d / "train-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0
        ytr = _idx(d / "train-labels-idx1-ubyte.gz").astype(np.int64)
        xte = _idx(d / "t10k-images-idx3-ubyte.gz").reshape(-1, 784).astype(np.float32) / 255.0
        yte = _idx(d / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
        rng = np.random.default_rng(seed)
        fit = rng.choice(len(xtr), size=len(xtr) // 10, replace=False)
        pca = PCA(50, random_state=seed).fit(xtr[fit])
        return pca.transform(xtr).astype(np.float32), ytr, pca.transform(xte).astype(np.float32), yte
    raise SystemExit(f"unknown dataset {dataset!r}")


def epsilon_of(z: float, rounds: int, delta: float) -> dict:
    """The epsilon pfl's ``PLDPrivacyAccountant`` gives noise multiplier ``z`` over ``rounds``
    compositions at ``delta``, every user every round (sampling probability 1), and its CPU cost."""
    from pfl.privacy import PLDPrivacyAccountant

    c0 = time.process_time()
    acc = PLDPrivacyAccountant(num_compositions=rounds, sampling_probability=1.0, mechanism="gaussian",
                               noise_parameter=z, delta=delta)
    return {"epsilon": acc.epsilon, "delta": delta, "noise_multiplier": z, "accountant_cpu_s": time.process_time() - c0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="digits", choices=("digits", "fashion-mnist"))
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--clip", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=0, help="local batch size; 0 = the user's full data")
    ap.add_argument("--epsilon", type=float, default=3.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--noise-std", type=float, default=0.0,
                    help="the noise's standard deviation per coordinate of a user's update; 0: the "
                         "multiplier pfl's accountant gives for --epsilon (else epsilon is what it gives "
                         "for this noise)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epsilon-only", action="store_true",
                    help="print the epsilon pfl's PLD accountant gives --noise-std over --rounds, and exit")
    args = ap.parse_args()
    if args.epsilon_only:
        print("PFL_EPSILON " + json.dumps(epsilon_of(args.noise_std / args.clip, args.rounds, args.delta)), flush=True)
        return

    t0 = time.perf_counter()
    import torch
    from torch import nn

    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.internal.ops.selector import set_framework_module
    from pfl.internal.ops import pytorch_ops
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel
    from pfl.privacy import GaussianMechanism, PLDPrivacyAccountant

    set_framework_module(pytorch_ops)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # pfl draws its per-user seeds (hence the local DP noise) from numpy's global state
    t_import = time.perf_counter() - t0

    xtr, ytr, xte, yte = load(args.dataset, args.seed)
    users = np.array_split(np.random.default_rng(args.seed).permutation(len(xtr)), args.clients)
    data = {u: [torch.from_numpy(xtr[idx]), torch.from_numpy(ytr[idx])] for u, idx in enumerate(users)}

    class MLP(nn.Module):
        """d-64-10 with the loss and metrics pfl's PyTorchModel calls."""

        def __init__(self, d: int) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(d, 64), nn.ReLU(), nn.Linear(64, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
            self.eval() if eval else self.train()
            return nn.functional.cross_entropy(self(x), y)

        @torch.no_grad()
        def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:
            self.eval() if eval else self.train()
            out = self(x)
            n = len(y)
            return {"loss": Weighted(float(nn.functional.cross_entropy(out, y, reduction="sum")), n),
                    "accuracy": Weighted(float((out.argmax(1) == y).sum()), n)}

    module = MLP(xtr.shape[1])
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    sampler = get_user_sampler("minimize_reuse", list(range(args.clients)))
    train = FederatedDataset.from_slices(data, sampler)
    if args.noise_std > 0:  # the noise given: no accountant in this (timed) process
        z, epsilon = args.noise_std / args.clip, None
        local_dp = GaussianMechanism(clipping_bound=args.clip, relative_noise_stddev=z)
    else:
        accountant = PLDPrivacyAccountant(num_compositions=args.rounds, sampling_probability=1.0,
                                          mechanism="gaussian", epsilon=args.epsilon, delta=args.delta)
        z, epsilon = accountant.cohort_noise_parameter, args.epsilon
        local_dp = GaussianMechanism.from_privacy_accountant(accountant=accountant, clipping_bound=args.clip)
    backend = SimulatedBackend(training_data=train, val_data=train, postprocessors=[local_dp])
    central = Dataset(raw_data=[torch.from_numpy(xte), torch.from_numpy(yte)])
    eval_params = NNEvalHyperParams(local_batch_size=None)
    seen: list[dict] = []

    class Record(CentralEvaluationCallback):
        """Central evaluation after every round, as silofl's eval-every = 1 (pfl's own evaluates the
        initial model and skips the first round's); keeps each round's metrics for the result line."""

        def on_train_begin(self, *, model):
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            stop, metrics = self._eval(model)
            seen.append({str(k): float(getattr(v, "overall_value", v)) for k, v in metrics})
            return stop, metrics

    t_setup = time.perf_counter() - t0
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=args.rounds, evaluation_frequency=1,
                                           train_cohort_size=args.clients, val_cohort_size=None),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=args.lr, local_num_epochs=None,
                                              local_num_steps=1,
                                              local_batch_size=args.batch or None),
        model_eval_params=eval_params,
        callbacks=[Record(central, model_eval_params=eval_params, frequency=1)])
    t_train = time.perf_counter() - t0 - t_setup
    acc = [v for r in seen for k, v in r.items() if k.endswith("accuracy")]
    print("PFL_RESULT " + json.dumps({
        "test_accuracy": acc[-1] if acc else None, "rounds_seen": len(seen),
        "noise_multiplier": z, "clip": args.clip, "epsilon": epsilon, "delta": args.delta, "unit": "a user's update (user-level local DP)",
       
        "noise_std_per_update_coordinate": z * args.clip,
        "train_records": len(xtr), "test_records": len(xte), "features": int(xtr.shape[1]),
        "import_s": t_import, "setup_s": t_setup, "train_s": t_train}), flush=True)


if __name__ == "__main__":
    main()
