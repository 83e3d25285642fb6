"""Per-silo time of shuffle DP's noise calibration (issue 24: "calibration <= 1 s per silo").

Each silo of a shuffle-mode run calibrates its noise trials once, in ``Silo._calibrate`` (its
mechanism's ``scale``, clients/silo_shuffle.py):
``calibrate_trial_scale(plan, epsilon, delta = 1/n^2, p, levels, dim)`` with the exact binomial
accountant (app/privacy/binomial/). This script rebuilds every silo's inputs exactly as the
silo does (run config -> settings -> silo sizes -> release plan; d from the model) and times the
calibrations one after another in one process, as a simulation runs them:

    python -m scripts.bench.shuffle_calibration                      # digits, 10 silos, eps 3
    python -m scripts.bench.shuffle_calibration --set batch-size=32 --eps 0.75 3
    python -m scripts.bench.shuffle_calibration --cold               # every cache cleared per silo
    python -m scripts.bench.shuffle_calibration --suite [a b c]      # the issue-24 table, cold caches

``--suite``: (a) the 10 digits silos (eps 3, full batches), (b) 25 distinct plans (n from 1,035
to 2,872 as in the Dirichlet Fashion-MNIST run of docs/results.md, K in {64, 32}, d in {3394,
1000}, 25 rounds, eps 0.75; ``--stride s``: every s-th plan only), (c) the Fashion-MNIST pairs
plan (n = 1,792, K = 64, 25 rounds, d = 3394) and digits K = 32 at eps 0.75 and 1.5; (b) and (c)
both unamplified and amplified. Every calibration starts from cold caches (a silo in its own
process); "cpu s" is the process's CPU time (what an idle core would take), "wall s" the elapsed time.

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
    _, splits, _, num_classes = silo_splits(s, s.seed, s.robust.trust_size)
    out = []
    for index, (train, _) in enumerate(splits):
        n = len(train)
        feature_shape = (64,) if s.dataset == "digits" else None
        model = build_model(s.model, feature_shape, num_classes, hidden=s.model_hidden)
        dim = sum(p.numel() for p in model.parameters())
        plan = release_plan(get_algorithm(s.algorithm), s.algorithm_options(), n, s.privacy.clip, 0, 1.0)
        planned = [PlannedRelease(r.phase, n, r.batch, r.count, r.weight, r.disjoint) for r in plan]
        out.append({"silo": index, "n": n, "planned": planned, "epsilon": s.privacy.epsilon,
                    "delta": s.delta_for(n), "p": s.shuffle.p, "levels": s.shuffle.levels_for(dim), "dim": dim,
                    "settings": s})
    return out


def clear_caches() -> None:
    """Every lru cache of every loaded app.privacy module (a silo in its own process)."""
    import sys

    from app.privacy import accounting, binomial  # noqa: F401  (loaded)

    for mod in [m for k, m in list(sys.modules.items()) if k.startswith("app.privacy") and m is not None]:
        for name in dir(mod):
            fn = getattr(mod, name)
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()


def suite_rows(parts: list[str], stride: int = 1) -> list[tuple]:
    """(set, label, plan, epsilon, delta, p, g, d, amplification) of the ``--suite`` table."""
    from app.privacy.accounting import PlannedRelease
    from app.privacy.shuffle import auto_levels

    rows = []
    if "a" in parts:
        for si in silo_inputs({}):
            rows.append(("a digits", f"silo {si['silo']} n={si['n']}", tuple(si["planned"]), 3.0, si["delta"],
                         si["p"], si["levels"], si["dim"], "none"))
    if "b" in parts:
        for i in range(0, 25, stride):
            n = 1035 + round(i * (2872 - 1035) / 24)
            k, d = (64, 32)[i % 2], (3394, 3394, 1000)[i % 3]
            for amp in ("none", "sampling"):
                rows.append((f"b 25 plans {amp}", f"n={n} K={k} d={d}", (PlannedRelease("grad", n, k, 25),), 0.75,
                             1.0 / n ** 2, 0.25, auto_levels(d), d, amp))
    if "c" in parts:
        for name, n, k, rounds, d in (("fmnist-pairs", 1792, 64, 25, 3394), ("digits K=32", 142, 32, 15, 4810)):
            for eps in (0.75, 1.5):
                for amp in ("none", "sampling"):
                    rows.append((f"c small eps {amp}", f"{name} eps={eps:g}", (PlannedRelease("grad", n, k, rounds),),
                                 eps, 1.0 / n ** 2, 0.25, auto_levels(d), d, amp))
    return rows


def run_suite(parts: list[str], stride: int = 1) -> None:
    """Time every row of :func:`suite_rows` from cold caches; one line each, then a summary per set."""
    from app.privacy.accounting import calibrate_trial_scale

    by_set: dict[str, list[float]] = {}
    by_wall: dict[str, list[float]] = {}
    for set_, label, plan, eps, delta, p, g, d, amp in suite_rows(parts, stride):
        clear_caches()
        t0, c0 = time.perf_counter(), time.process_time()
        trials = calibrate_trial_scale(list(plan), eps, delta, p=p, levels=g, dim=d, amplification=amp)
        dt, ct = time.perf_counter() - t0, time.process_time() - c0
        by_set.setdefault(set_, []).append(ct)
        by_wall.setdefault(set_, []).append(dt)
        print(f"{set_} | {label} | eps={eps:g} g={g} | trials={trials} | cpu {ct:.3f} s | wall {dt:.3f} s "
              f"| load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    print("| set | calibrations | mean cpu s/silo | max cpu s/silo | max wall s/silo |")
    print("|---|---|---|---|---|")
    for set_, ts in by_set.items():
        print(f"| {set_} | {len(ts)} | {sum(ts) / len(ts):.2f} | {max(ts):.2f} | {max(by_wall[set_]):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", nargs="*", default=[], help="run-config overrides KEY=VALUE (TOML values)")
    ap.add_argument("--eps", type=float, nargs="*", default=None, help="epsilons (default: the run config's)")
    ap.add_argument("--cold", action="store_true", help="clear the accountant's caches before each silo")
    ap.add_argument("--amplification", default=None, help="shuffle.amplification, where the code has it")
    ap.add_argument("--suite", nargs="*", default=None, help="the issue-24 table: sets a, b, c (default all)")
    ap.add_argument("--stride", type=int, default=1, help="--suite b: every s-th of the 25 plans")
    args = ap.parse_args()
    if args.suite is not None:
        run_suite(args.suite or ["a", "b", "c"], args.stride)
        return
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
