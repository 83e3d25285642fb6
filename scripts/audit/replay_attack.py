"""The cross-run replay attack on shuffle DP (issue 24 #1), before and after the fix, measured.

The attack. Run 1 sums the sealed contributions of N silos (count-on N, the research default:
each silo adds (1 + headroom)/N of the noise trials m its epsilon needs, counting on the others
for the rest). In a new run the server relays run 1's exchange context with every blob except
silo 0's; if the shuffler sums them again, T1 - T2 is silo 0's counts exactly: its K records'
levels plus only its own K b noise trials, an "isolated release" with ~(1 + headroom)/N of the
noise its claim was calibrated for.

Part 1 (mechanics, real code, seeded): N silos encode with ``encode_counts`` and seal with
``envelope.seal``. BEFORE: the shuffler of main at 8646705 (``git show 8646705:clients/shuffler.py``,
loaded beside today's modules, with that commit's per-run file of aggregated exchanges
``shuffler-seen-run<id>.json``) aggregates run 1, then the replay in run 2. AFTER: today's
``clients.shuffler.Shuffler`` (one state file, ``run_id`` from Flower) in run 1, then the replay
in run 2 and in a restarted shuffler of run 1: the refusal messages.

Part 2 (privacy of the isolated release, real mechanism): the claim is the exact binomial
accountant's epsilon of the whole exchange (m_total = N K b trials); the isolated release has
K b trials, its exact epsilon from the same accountant; and an empirical lower bound from
``app.privacy.audit.audit_shuffle`` on the isolated release (count_on = 1 with silo 0's trials:
the real ``encode_counts`` and ``debias``, 95% Clopper-Pearson, threshold on a separate split).
For comparison the same audit of the full exchange (all N silos' noise, fewer trials: N encodes
per trial).

Usage:
    python -m scripts.audit.replay_attack [--silos 12] [--K 50] [--dim 4] [--epsilon 1 3] \
        [--trials 20000] [--full-trials 4000] [--seed 0] [--headroom 0.1]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

from app import wire
from app.privacy import binomial
from app.privacy.audit import audit_shuffle, neighbours
from app.privacy.contribution import Contribution
from app.privacy.envelope import StaticKeys, seal
from app.privacy.shuffle import ShuffleCode, auto_levels, encode_counts, trials_per_record

BEFORE = "8646705"
ROOT = Path(__file__).resolve().parents[2]


def old_shuffler_module() -> types.ModuleType | None:
    """clients/shuffler.py as of ``BEFORE`` (imports only modules that still exist), or None
    when git or the commit is not available."""
    try:
        src = subprocess.run(["git", "show", f"{BEFORE}:clients/shuffler.py"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    mod = types.ModuleType("shuffler_8646705")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, f"{BEFORE}:clients/shuffler.py", "exec"), mod.__dict__)
    return mod


def sealed_exchange(n: int, K: int, d: int, b: int, m: int, code: ShuffleCode, shuffler: StaticKeys,
                    context: bytes, seed: int, bind: bool) -> tuple[list[bytes], list[np.ndarray]]:
    """N silos' sealed contributions for ``context`` (silo i's records from audit.neighbours,
    seed + i), and their counts."""
    blobs, counts = [], []
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(n)]
    for i in range(n):
        rows, _ = neighbours(K, d, code.bound, seed + i)
        c = encode_counts(rows, code, b, rngs[i])
        contrib = Contribution(records=K, trials=K * b, required_trials=m, levels=code.levels, counts=c,
                               binding=Contribution.bind(context, 0) if bind else b"")
        sender = StaticKeys.generate()
        blobs.append(seal(shuffler.public, sender, contrib.encode(), context))
        counts.append(c)
    return blobs, counts


def mechanics(n: int, K: int, d: int, b: int, m: int, code: ShuffleCode, seed: int) -> list[tuple[str, str]]:
    """Part 1: (case, outcome) rows."""
    from clients.shuffler import ShuffleRefused, Shuffler

    ctx1 = wire.shuffle_context(1, 1, 1, "grad")
    rows: list[tuple[str, str]] = []
    keys = StaticKeys.generate()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        old = old_shuffler_module()
        if old is None:
            rows.append((f"before ({BEFORE})", "git show unavailable: skipped"))
        else:
            blobs, counts = sealed_exchange(n, K, d, b, m, code, keys, ctx1, seed, bind=False)
            run1 = old.Shuffler(keys, None, seen_path=state / "old" / "shuffler-seen-run1.json")
            (state / "old").mkdir()
            t1 = run1.aggregate(blobs, ctx1, d, code.levels)
            run2 = old.Shuffler(keys, None, seen_path=state / "old" / "shuffler-seen-run2.json")
            try:
                t2 = run2.aggregate(blobs[1:], ctx1, d, code.levels)
                same = np.array_equal(t1.totals - t2.totals, counts[0])
                rows.append((f"before ({BEFORE}): run 2 replays run 1's context without silo 0",
                             f"summed {t2.accepted} of {n - 1}; T1 - T2 == silo 0's counts: {same}; "
                             f"trials {t1.trials} - {t2.trials} = {t1.trials - t2.trials} (= K b = {K * b})"))
            except old.ShuffleRefused as exc:
                rows.append((f"before ({BEFORE})", f"refused: {exc}"))
        blobs, _ = sealed_exchange(n, K, d, b, m, code, keys, ctx1, seed, bind=True)
        seen = state / "new" / "shuffler-seen.json"
        seen.parent.mkdir()
        t1 = Shuffler(keys, None, seen, run_id=1).aggregate(blobs, ctx1, d, code.levels, p=code.p)
        rows.append(("after: run 1", f"summed {t1.accepted} of {n}"))
        for what, run_id in (("after: run 2 replays run 1's context without silo 0", 2),
                             ("after: run 1's shuffler restarted, same replay", 1)):
            try:
                r = Shuffler(keys, None, seen, run_id=run_id).aggregate(blobs[1:], ctx1, d, code.levels, p=code.p)
                rows.append((what, f"SUMMED {r.accepted}: the fix does not hold"))
            except ShuffleRefused as exc:
                rows.append((what, f"refused: \"{exc}\""))
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--silos", type=int, default=12, help="N silos in the exchange, count-on N")
    ap.add_argument("--K", type=int, default=50, help="records per silo")
    ap.add_argument("--dim", type=int, default=4)
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 3.0], help="each silo's target epsilon")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--p", type=float, default=0.25)
    ap.add_argument("--headroom", type=float, default=0.1, help="shuffle.headroom (the default 10%%)")
    ap.add_argument("--trials", type=int, default=20000, help="held-out audit trials per side, isolated release")
    ap.add_argument("--full-trials", type=int, default=4000, help="the same for the full exchange (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    n, K, d = a.silos, a.K, a.dim
    g = auto_levels(d)
    code = ShuffleCode(bound=1.0, levels=g, p=a.p)
    print(f"N = {n} silos, count-on {n}, headroom {a.headroom:g}, K = {K} records each, d = {d}, g = {g}, "
          f"p = {a.p:g}, delta = {a.delta:g}, seed {a.seed}\n")

    m = binomial.calibrate_trials(a.epsilon[0], a.delta, a.p, g, d, 1)
    b = trials_per_record(m, n, K, a.headroom)
    print("Part 1: the replay against the shuffler code (eps target "
          f"{a.epsilon[0]:g}: m = {m}, b = {b} per record)\n")
    for case, outcome in mechanics(n, K, d, b, m, code, a.seed):
        print(f"- {case}: {outcome}")

    print("\nPart 2: epsilon of the isolated release (silo 0's K b trials) against the claim "
          f"(the exchange's N K b trials); audit: 95% Clopper-Pearson lower bound\n")
    print("| target eps | m needed | b per record | trials: exchange / isolated | eps claimed (exchange) "
          "| exact eps, isolated | audit trials | TP | FP | eps_lower isolated | eps_lower exchange (trials) |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|")
    out = []
    for eps in a.epsilon:
        t0 = time.perf_counter()
        m = binomial.calibrate_trials(eps, a.delta, a.p, g, d, 1)
        b = trials_per_record(m, n, K, a.headroom)
        claimed = binomial.binomial_epsilon(trials=n * K * b, p=a.p, levels=g, dim=d, count=1, delta=a.delta)
        exact = binomial.binomial_epsilon(trials=K * b, p=a.p, levels=g, dim=d, count=1, delta=a.delta)
        iso = audit_shuffle(m=K * b, g=g, p=a.p, K=K, d=d, count_on=1, delta=a.delta, trials=a.trials, seed=a.seed)
        full = None
        if a.full_trials:
            full = audit_shuffle(m=n * K * b, g=g, p=a.p, K=K, d=d, count_on=n, delta=a.delta,
                                 trials=a.full_trials, seed=a.seed)
            assert full.params["b"] == b
        row = {"epsilon_target": eps, "m": m, "b": b, "trials_exchange": n * K * b, "trials_isolated": K * b,
               "eps_claimed": claimed, "eps_isolated_exact": exact, "audit_isolated": dataclasses.asdict(iso),
               "audit_exchange": None if full is None else dataclasses.asdict(full),
               "seconds": time.perf_counter() - t0}
        out.append(row)
        fcol = "-" if full is None else f"{full.eps_lower:.3f} ({full.trials})"
        print(f"| {eps:g} | {m} | {b} | {n * K * b} / {K * b} | {claimed:.3f} | {exact:.3f} | {iso.trials} "
              f"| {iso.tp} | {iso.fp} | {iso.eps_lower:.3f} | {fcol} |")
    print("\nThe isolated release carries (1 + headroom)/N of the noise the claim was calibrated for; "
          "eps_lower > eps claimed shows the claim broken for silo 0 (before the fix); after the fix "
          "the replay is refused, so no isolated release exists.")
    return {"rows": out}


if __name__ == "__main__":
    main()
