"""What amplification by the shuffler's silo sampling buys (app/privacy/silo_sampling.py), on the
digits preset in shuffle mode with count-on 1, at the SAME noise (each silo calibrates its trials
for ``--eps`` without silo sampling, as it always does):

    python -m scripts.bench.silo_sampling [--rounds 5] [--keep 5 3] [--eps 3]

Runs on the in-process grid (real ServerApp, silos, shuffler node; keys pinned): one run where
the shuffler sums all 10 silos, then one per M in ``--keep`` where it keeps a random M of 10 and
the silos' node configs trust it. Prints per run the largest eps a silo's ledger certifies after
the rounds and the test error; then the eps of the first run's releases re-accounted at other q.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _run(root: Path, cfg: dict, node: dict) -> dict:
    from app.launch import merged_run_config
    from app.local_grid import run_local
    from app.privacy.envelope import StaticKeys

    state = root / "state"
    keys = [StaticKeys.load_or_create(state / f"shuffle-sender-silo{i}.key") for i in range(cfg["num-silos"])]
    shuffler = StaticKeys.load_or_create(state / "shuffler.key")
    node = node | {"shuffler-public-key": shuffler.public_hex, "silo-keys": ",".join(k.public_hex for k in keys)}
    run_local(merged_run_config([]) | cfg | {"outputs-dir": str(root / "out"), "run-name": "r"}, str(state), run_id=1,
              node_config=node)
    return json.loads((root / "out" / "r" / "summary.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--keep", type=int, nargs="*", default=[5, 3])
    ap.add_argument("--eps", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from app.privacy.accounting import Release, epsilon_spent

    base = {"dataset": "digits", "privacy.mode": "shuffle", "shuffle.count-on": 1, "num-rounds": args.rounds,
            "privacy.epsilon": args.eps, "seed": args.seed, "algorithm": "mbsgd", "num-silos": 10,
            "silos-per-round": 10}
    print("| shuffler keeps | claimed q | max eps spent | test error |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(10, _run(Path(tmp) / "all", base, {}))]
        for m in args.keep:
            runs.append((m, _run(Path(tmp) / f"m{m}", base | {"shuffle.silo-sample": m},
                                 {"shuffle-silo-sample": m, "shuffle-trust-silo-sampling": True})))
        for m, s in runs:
            q = s["silos"][0]["shuffle"]["silo_sampling"]["q"]
            print(f"| {m} of 10 | {q:.3g} | {max(x['eps_spent'] for x in s['silos']):.4f} | {s['test_error']:.4f} |",
                  flush=True)
        silo = max(runs[0][1]["silos"], key=lambda x: x["eps_spent"])
        releases = [Release(r["kind"], r["n"], r["batch"], r["noise_multiplier"], r["count"], False, "binomial",
                            r["trials"], r["levels"], r["p"], r["dim"]) for r in silo["releases"]]
        print(f"\nsilo {silo['silo']}'s {sum(r.count for r in releases)} releases (trials {releases[0].trials:,}, "
              f"g = {releases[0].levels}, d = {releases[0].dim}), delta = {silo['delta']:.3g}, re-accounted at q:")
        for q in (1.0, 0.7, 0.5, 0.3, 0.2, 0.1):
            rs = [Release(**{**r.__dict__, "silo_sampling": q}) for r in releases]
            print(f"  q = {q:<4g} eps = {epsilon_spent(rs, silo['delta']):.4f}", flush=True)


if __name__ == "__main__":
    main()
