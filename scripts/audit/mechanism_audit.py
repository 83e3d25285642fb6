"""Empirical privacy audit of the two release mechanisms themselves (app/privacy/audit.py).

For each mechanism and each target epsilon, the mechanism is calibrated by the project's own
accountant to claim that epsilon for ONE release at delta (Gaussian: the noise multiplier from
``calibrate_noise_multiplier``; shuffle DP: the exchange's noise trials from
``binomial.calibrate_trials``), then run ``--trials`` times on a silo dataset D and as often on a
neighbour D' (one canary record, +L e_1 in D and -L e_1 in D'), plus a calibration split of
extra trials to choose the threshold of the test "canary coordinate > t means D".

What the columns mean. TP: the test's hits among the held-out trials on D; FP: its false alarms
among those on D'. eps_lower is a 95% (1 - alpha) confidence LOWER bound on the true epsilon of
the release, from the Clopper-Pearson bounds on TPR and FPR:

    eps_lower = max( ln((TPR_lo - delta) / FPR_hi), ln((1 - FPR_hi - delta) / (1 - TPR_lo)) ).

A sound mechanism must show eps_lower <= eps_claimed (the bound fails with probability at most
5%); eps_lower > eps_claimed would show the mechanism or its accounting broken. eps_lower well
below eps_claimed is expected and proves nothing: a finite number of trials cannot certify
large epsilons (with T trials and no errors at all the bound is only about ln(T / 3.7)), and
one canary and one threshold test need not be the worst case (for shuffle DP with d > 1 the
accountant's L2 sensitivity is g + sqrt(d), the canary's shift g).

Usage:
    python -m scripts.audit.mechanism_audit [--trials 4000] [--seed 0] \
        [--mechanisms gaussian shuffle] [--epsilon 1 2 4] [--dim 4] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from app.privacy.accounting import PlannedRelease, calibrate_noise_multiplier
from app.privacy.audit import AuditResult, audit_gaussian, audit_shuffle


def params_text(r: AuditResult) -> str:
    p = r.params
    if r.mechanism == "gaussian":
        return f"z={p['z']:.3f} K={p['K']} d={p['d']} L={p['L']:g}"
    return (f"m={p['m_total']} (b={p['b']}) g={p['g']} p={p['p']:g} K={p['K']} d={p['d']} "
            f"silos={p['count_on']}")


def table(rows: list[AuditResult]) -> str:
    lines = ["| mechanism | params | trials | TP | FP | eps_lower | eps_claimed | seconds |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.mechanism} | {params_text(r)} | {r.trials} | {r.tp} | {r.fp} | {r.eps_lower:.3f} "
                     f"| {r.eps_claimed:.3f} | {r.params.get('seconds', 0):.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[AuditResult]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=4000, help="held-out trials per dataset (D and D')")
    ap.add_argument("--calibration", type=int, default=None,
                    help="extra trials per dataset to choose the threshold (default max(50, trials // 5))")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mechanisms", nargs="+", choices=("gaussian", "shuffle"), default=["gaussian", "shuffle"])
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 2.0, 4.0], help="claimed epsilons to calibrate to")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--K", type=int, default=50, help="records per silo (one release of K rows, unsampled)")
    ap.add_argument("--dim", type=int, nargs="+", default=[4], help="release dimensions d")
    ap.add_argument("--clip", type=float, default=1.0, help="the clip L (shuffle bound R = L)")
    ap.add_argument("--levels", type=int, default=None, help="shuffle levels g (default auto_levels(d))")
    ap.add_argument("--p", type=float, default=0.25, help="shuffle noise bits' probability")
    ap.add_argument("--count-on", type=int, default=4, help="silos in the shuffle exchange (target included)")
    ap.add_argument("--alpha", type=float, default=0.05, help="1 - confidence of eps_lower")
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    a = ap.parse_args(argv)

    rows: list[AuditResult] = []
    for mech in a.mechanisms:
        for d in a.dim:
            for eps in a.epsilon:
                t0 = time.perf_counter()
                if mech == "gaussian":
                    z = calibrate_noise_multiplier([PlannedRelease("grad", a.K, a.K, 1)], eps, a.delta)
                    r = audit_gaussian(z, a.K, d, a.clip, a.delta, a.trials, a.seed, alpha=a.alpha,
                                       calibration=a.calibration)
                else:
                    r = audit_shuffle(eps, g=a.levels, p=a.p, K=a.K, d=d, L=a.clip, count_on=a.count_on,
                                      delta=a.delta, trials=a.trials, seed=a.seed, alpha=a.alpha,
                                      calibration=a.calibration)
                r.params["epsilon_target"] = eps
                r.params["seconds"] = time.perf_counter() - t0
                rows.append(r)
    print(f"delta = {a.delta:g}; eps_lower: {100 * (1 - a.alpha):g}% Clopper-Pearson lower bound "
          f"(sound: eps_lower <= eps_claimed)\n")
    print(table(rows))
    broken = [r for r in rows if not r.sound]
    print(f"\n{len(rows) - len(broken)}/{len(rows)} claims consistent with the audit"
          + ("" if not broken else f"; VIOLATED: {', '.join(f'{r.mechanism} eps={r.eps_claimed:.2f}' for r in broken)}"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([r.as_dict() for r in rows], f, indent=2, default=_jsonable)
    return rows


def _jsonable(x: Any) -> Any:
    return float(x) if hasattr(x, "__float__") else str(x)


if __name__ == "__main__":
    main()
