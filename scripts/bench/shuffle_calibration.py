"""Per-silo time of shuffle DP's noise calibration (issue 24: "calibration <= 1 s per silo").

Each silo of a shuffle-mode run calibrates its noise trials once, in ``Silo._calibrate``:
``calibrate_trial_scale(plan, epsilon, delta = 1/n^2, p, levels, dim)`` with the exact binomial
accountant (app/privacy/binomial.py). This script rebuilds every silo's inputs exactly as the
silo does (run config -> settings -> silo sizes -> release plan; d from the model) and times the
calibrations one after another in one process, as a simulation runs them:

    python -m scripts.bench.shuffle_calibration                      # digits, 10 silos, eps 3
    python -m scripts.bench.shuffle_calibration --set batch-size=32 --eps 0.75 3
    python -m scripts.bench.shuffle_calibration --cold               # every cache cleared per silo

``--cold`` clears the accountant's caches before each silo (a silo in its own process); the
default keeps them (a simulation's silos share one process). It prints one line per silo (n,
delta, trials, seconds) and the mean and max seconds per silo.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def silo_inputs(overrides: dict) -> list[dict]:
    """Every silo's calibration inputs, as ``clients/silo.py``'s ``Silo._calibrate`` builds them."""
    from app.algorithms import get_algorithm
    from app.algorithms.base import release_plan
    from app.config import parse_settings, resolve_presets
    from app.data.federated import silo_splits
    from app.launch import merged_run_config
    from app.models.zoo import build_model
    from app.privacy.accounting import PlannedRelease

    cfg = merged_run_config([]) | {"dataset": "digits", "privacy.mode": "shuffle"} | overrides
    s = parse_settings(resolve_presets(cfg))
    _, splits, _, num_classes = silo_splits(s)
    out = []
    for index, (train, _) in enumerate(splits):
        n = len(train)
        feature_shape = (64,) if s.dataset == "digits" else None
        model = build_model(s.model, feature_shape, num_classes, hidden=s.model_hidden)
        dim = sum(p.numel() for p in model.parameters())
        plan = release_plan(get_algorithm(s.algorithm), s, n, s.privacy.clip, 0, 1.0)
        planned = [PlannedRelease(r.phase, n, r.batch, r.count, r.weight, r.disjoint) for r in plan]
        out.append({"silo": index, "n": n, "planned": planned, "epsilon": s.privacy.epsilon,
                    "delta": s.delta_for(n), "p": s.shuffle.p, "levels": s.shuffle.levels_for(dim), "dim": dim,
                    "settings": s})
    return out


def clear_caches() -> None:
    from app.privacy import accounting, binomial

    for mod in (accounting, binomial):
        for name in dir(mod):
            fn = getattr(mod, name)
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", nargs="*", default=[], help="run-config overrides KEY=VALUE (TOML values)")
    ap.add_argument("--eps", type=float, nargs="*", default=None, help="epsilons (default: the run config's)")
    ap.add_argument("--cold", action="store_true", help="clear the accountant's caches before each silo")
    ap.add_argument("--amplification", default=None, help="shuffle.amplification, where the code has it")
    args = ap.parse_args()
    import tomllib

    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = tomllib.loads(f"v = {value}")["v"]
    from app.privacy.accounting import calibrate_trial_scale

    silos = silo_inputs(overrides)
    times = []
    for eps in args.eps or [silos[0]["epsilon"]]:
        for si in silos:
            if args.cold:
                clear_caches()
            kwargs = dict(p=si["p"], levels=si["levels"], dim=si["dim"])
            if args.amplification is not None:
                kwargs["amplification"] = args.amplification
            t0 = time.perf_counter()
            trials = calibrate_trial_scale(si["planned"], eps, si["delta"], **kwargs)
            dt = time.perf_counter() - t0
            times.append(dt)
            plan = [(str(r.kind), r.batch, r.count) for r in si["planned"]]
            print(f"eps={eps:g} silo {si['silo']}: n={si['n']} delta={si['delta']:.3g} d={si['dim']} "
                  f"g={si['levels']} plan={plan} trials={trials}  {dt:.3f} s", flush=True)
    print(f"per silo: mean {sum(times) / len(times):.3f} s, max {max(times):.3f} s, total {sum(times):.1f} s "
          f"({len(times)} calibrations, {'cold' if args.cold else 'shared'} caches)")


if __name__ == "__main__":
    main()
