"""CPU cost of the WBCD MB-SGD grid against the authors' code (issue 14), and of its two
privacy hot spots: noise calibration and the ledger's durable writes.

The grid is the paper's: 2 label-split silos, MB-SGD, epsilon in {0.75, 3, 18} x lr {0.1, 0.316,
1} x clip {0.5, 2} x seeds {0, 1, 2}, 25 rounds: 54 runs, 6 noise calibrations (3 epsilons x 2
silo sizes; z does not depend on lr, clip or seed). The authors' code runs it in 36.9 s CPU
(recorded; ``AUTHORS_CPU_S``); the target is at most half of that.

    python -m scripts.bench.calibration_grid grid          # the 54 runs through isrl_compare.py
    python -m scripts.bench.calibration_grid calibration --reference   # 6 calibrations, new vs old
    python -m scripts.bench.calibration_grid ledger --silos 100 --rounds 25

``grid`` runs ``scripts/reproduce/isrl_compare.py``'s ``main`` in this process with a fresh
temporary ``--out`` (so nothing is skipped as already done), and reports CPU time (user + sys of
this process and its children, ``resource.getrusage``: for the whole command, imports included,
which is what the verdict uses, and for the grid alone), wall time, the load average, and the
CPU spent (``time.thread_time`` of the calling thread) in noise calibration, in the RDP curves
(``accounting._rdp_one``, which the calibration's certification and the ledger's epsilon share;
dp-accounting's full curves and single-order checks where the code has them; nested calls are
counted in each), and in the ledger's calls (open, record_release, set_calibration, spent), per
run and per release. ``--compare CSV`` checks that every run's validation and test errors and
epsilon spent equal those of an earlier runs.csv (e.g. one written before a change).

``calibration`` times the grid's 6 calibrations from cold caches (``--reference``: also the
bisection with dp-accounting at every step, ``accounting.calibrate_reference``, the algorithm
before the vectorised search; or ``_calibrate`` itself where that function does not exist), and
checks that both give the same multipliers.

``ledger`` times ``--silos`` ledgers x ``--rounds`` releases each (one ``record_release`` and
one ``spent`` per release, as a silo does per round) in a temporary directory on the same file
system as ``--dir`` (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import os
import resource
import shutil
import tempfile
import time

START_WALL = time.time()  # noqa: E402  (the whole command's wall clock starts here)
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

#: the authors' code on the same grid, CPU seconds (issue 14)
AUTHORS_CPU_S = 36.9
TARGET_RATIO = 0.5
GRID_ARGS = ["--setup", "wbcd", "--algorithms", "mbsgd", "--eps", "0.75", "3", "18", "--lr", "0.1", "0.316", "1",
             "--clip", "0.5", "2", "--seeds", "0", "1", "2"]
#: the grid's silos: WBCD split by label into 2 silos, 20% of each held out for validation
GRID_SILO_SIZES = (136, 229)
GRID_BATCH, GRID_ROUNDS, GRID_EPSILONS = 64, 25, (0.75, 3.0, 18.0)


def cpu_s() -> float:
    """User + system CPU seconds of this process and its waited-for children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class Meter:
    """Calls and calling-thread CPU seconds of wrapped functions, by label."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._depth = 0

    def wrap(self, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu[label] = self.cpu.get(label, 0.0) + time.thread_time() - t0
                self.calls[label] = self.calls.get(label, 0) + 1

        return timed


@contextlib.contextmanager
def patched(obj: Any, name: str, new: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, new)
    try:
        yield
    finally:
        setattr(obj, name, old)


def run_grid(args: argparse.Namespace) -> None:
    import scripts.reproduce.isrl_compare as isrl_compare  # noqa: E402  (imports torch, flwr)
    from app.privacy import accounting
    from app.privacy.ledger import PrivacyLedger

    meter = Meter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(accounting, "_calibrate", meter.wrap("calibration", accounting._calibrate)))
        for name, label in [("_rdp_one", "rdp curves (_rdp_one)"), ("_rdp_one_accountant", "dp-accounting full curves"),
                            ("_rdp_at_order", "dp-accounting 1-order checks")]:
            if hasattr(accounting, name):  # the code before the fast curves has _rdp_one only (dp-accounting)
                stack.enter_context(patched(accounting, name, meter.wrap(label, getattr(accounting, name))))
        for name in ("record_release", "set_calibration", "spent"):
            stack.enter_context(patched(PrivacyLedger, name, meter.wrap(f"ledger.{name}", getattr(PrivacyLedger, name))))
        stack.enter_context(patched(PrivacyLedger, "open",
                                    classmethod(meter.wrap("ledger.open", PrivacyLedger.open.__func__))))
        out = args.out or Path(tempfile.mkdtemp(prefix="calibration-grid-"))
        if args.out and (out / "runs.csv").exists():
            raise SystemExit(f"{out / 'runs.csv'} exists: the grid would skip its runs; pass a fresh --out")
        load0 = os.getloadavg()
        c0, w0 = cpu_s(), time.perf_counter()
        with contextlib.redirect_stdout(open(os.devnull, "w")) if args.quiet else contextlib.nullcontext():
            isrl_compare.main(GRID_ARGS + ["--out", str(out)])
        cpu, wall = cpu_s() - c0, time.perf_counter() - w0
        load1 = os.getloadavg()
    with (out / "runs.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    runs = len(rows)
    ledger_cpu = sum(v for k, v in meter.cpu.items() if k.startswith("ledger."))
    releases = meter.calls.get("ledger.record_release", 0)
    print(f"grid: {runs} runs ({sum(r['status'] == 'completed' for r in rows)} completed)"
          + (f", out {out}" if args.out else ""))
    total, total_wall = cpu_s(), time.time() - START_WALL
    print(f"  CPU {total:.1f} s for the whole command (self + children, user + sys, imports included), wall "
          f"{total_wall:.1f} s; the grid alone {cpu:.1f} s CPU, {wall:.1f} s wall; load average {load0[0]:.2f} -> "
          f"{load1[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    for label in sorted(meter.cpu):
        print(f"  {label:32s} {meter.cpu[label]:7.2f} s CPU in {meter.calls[label]:5d} calls "
              f"({100 * meter.cpu[label] / cpu:4.1f}% of the grid)")
    print(f"  ledger: {ledger_cpu / max(runs, 1) * 1e3:.1f} ms CPU per run, "
          f"{ledger_cpu / max(releases, 1) * 1e3:.2f} ms per release (all ledger calls / record_release calls)")
    rest = cpu - meter.cpu.get("calibration", 0.0) - ledger_cpu
    print(f"  the rest (training, evaluation, strategy, imports): {rest:.1f} s, {rest / max(runs, 1):.3f} s per run")
    ratio = total / AUTHORS_CPU_S
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"
    print(f"  vs the authors' code ({AUTHORS_CPU_S} s CPU): {ratio:.2f}x for the whole command "
          f"({cpu / AUTHORS_CPU_S:.2f}x for the grid alone); <= {TARGET_RATIO}x target: {verdict}")
    if args.compare:
        compare(rows, args.compare)
    if args.out is None:
        shutil.rmtree(out, ignore_errors=True)


def compare(rows: list[dict[str, str]], reference: Path) -> None:
    """Every run's errors and epsilon equal the reference runs.csv's (same grid point and seed)."""
    key = ("algorithm", "epsilon", "lr", "clip", "seed")
    with reference.open() as fh:
        ref = {tuple(r[k] for k in key): r for r in csv.DictReader(fh)}
    fields = ("status", "val_error", "test_error", "grad_mapping_norm", "eps_max_spent")
    diffs = [(k, f, r[f], ref[k][f]) for r in rows if (k := tuple(r[c] for c in key)) in ref for f in fields
             if r[f] != ref[k][f]]
    missing = [tuple(r[c] for c in key) for r in rows if tuple(r[c] for c in key) not in ref]
    print(f"  compared with {reference}: {len(rows) - len(missing)} runs, {len(diffs)} differing values, "
          f"{len(missing)} runs not in the reference")
    for d in diffs[:10]:
        print(f"    {d}")


def grid_plans() -> list[tuple[Any, float, float]]:
    from app.privacy.accounting import PlannedRelease

    return [((PlannedRelease("grad", n, GRID_BATCH, GRID_ROUNDS),), eps, 1.0 / n**2)
            for eps in GRID_EPSILONS for n in GRID_SILO_SIZES]


def run_calibration(args: argparse.Namespace) -> None:
    from app.privacy import accounting

    def clear() -> None:
        for fn in ("_calibrate", "_epsilon", "_rdp_one"):
            getattr(accounting, fn).cache_clear()

    old = getattr(accounting, "calibrate_reference", None)
    if old is None:  # the code before the vectorised search: _calibrate was the bisection
        old = accounting._calibrate.__wrapped__
        print("(no calibrate_reference here: this is the old code; 'new' below is its _calibrate)")
    results: dict[str, list[float]] = {}
    for label, fn in [("new", accounting.calibrate_noise_multiplier)] + ([("reference", old)] if args.reference else []):
        clear()
        zs, t_cpu, t_wall = [], time.process_time(), time.perf_counter()
        for plan, eps, delta in grid_plans():
            zs.append(fn(plan, eps, delta) if label == "new" else fn(plan, eps, delta, 1e-3))
        t_cpu, t_wall = time.process_time() - t_cpu, time.perf_counter() - t_wall
        results[label] = zs
        print(f"{label:9s}: 6 calibrations in {t_cpu:.2f} s CPU ({t_wall:.2f} s wall), "
              f"z = {', '.join(f'{z:.6g}' for z in zs)}")
    if "reference" in results:
        same = results["new"] == results["reference"]
        print(f"same multipliers as the reference: {'yes' if same else 'NO'}")
    # the certified epsilon of each answer (dp-accounting), and tightness
    for (plan, eps, delta), z in zip(grid_plans(), results["new"]):
        spent = accounting.epsilon_spent([r.at(z) for r in plan], delta)
        print(f"  n={plan[0].n} eps={eps:g}: z={z:.6f} spends {spent:.6f} <= {eps}: {spent <= eps}")


def run_ledger(args: argparse.Namespace) -> None:
    from app.privacy.accounting import Release
    from app.privacy.ledger import PrivacyLedger

    n, batch, z = 229, 64, 4.160164640959711  # the grid's larger silo at epsilon 3
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        budget = 100.0  # room for every release; the accounting is the same as under a tight budget
        ledgers = [PrivacyLedger.open(Path(tmp) / f"ledger-silo{i}.json", budget, 1 / n**2) for i in range(args.silos)]
        for lg in ledgers:
            lg.set_calibration({"key": {"n": n}, "noise_multiplier": z, "block_seed": 0})
        warm = PrivacyLedger.open(Path(tmp) / "warm.json", budget, 1 / n**2)
        for rnd in range(args.rounds + 1):  # warm the accountant's caches (the same for every silo)
            warm.record_release([Release("grad", n, batch, z)], round_=rnd)
        c0, w0 = time.process_time(), time.perf_counter()
        for rnd in range(1, args.rounds + 1):
            for lg in ledgers:
                lg.record_release([Release("grad", n, batch, z)], round_=rnd)
                lg.spent()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        size = sum(os.path.getsize(Path(tmp) / f"ledger-silo{i}.json") for i in range(args.silos))
    total = args.silos * args.rounds
    print(f"ledger: {args.silos} silos x {args.rounds} rounds = {total} releases (record_release + spent each)")
    print(f"  {cpu:.2f} s CPU, {wall:.2f} s wall: {cpu / total * 1e3:.3f} ms CPU, {wall / total * 1e3:.3f} ms wall "
          f"per release; files {size / args.silos / 1024:.1f} KiB each at the end")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("grid", help="the 54-run WBCD MB-SGD grid through isrl_compare.py")
    g.add_argument("--compare", type=Path, default=None, help="a runs.csv to compare every run's results with")
    g.add_argument("--quiet", action="store_true", help="hide the runs' console output")
    g.add_argument("--out", type=Path, default=None, help="keep runs.csv and table.md here (default: a temporary "
                   "directory, removed at the end)")
    c = sub.add_parser("calibration", help="the grid's 6 calibrations")
    c.add_argument("--reference", action="store_true", help="also time the old bisection (dp-accounting every step)")
    lg = sub.add_parser("ledger", help="per-release cost of the ledger")
    lg.add_argument("--silos", type=int, default=100)
    lg.add_argument("--rounds", type=int, default=25)
    lg.add_argument("--dir", default=None, help="where to put the ledgers (file system matters: fsync)")
    args = ap.parse_args(argv)
    {"grid": run_grid, "calibration": run_calibration, "ledger": run_ledger}[args.mode](args)


if __name__ == "__main__":
    main()
