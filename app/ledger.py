"""The operator's tools for a silo's privacy ledger (docs/privacy.md, "When the ledger does not verify").

    python -m app.ledger verify PATH... [--mark-dir DIR] [--key-file F] [--witness-dir DIR]   OK, or the reason
    python -m app.ledger show PATH... [--mark-dir DIR] [--key-file F] [--witness-dir DIR]  every release, epsilon
    python -m app.ledger adopt LEDGER --reason TEXT [--accept-loss] [--mark-dir DIR] [--key-file F] [--witness-dir DIR]

PATH is a ledger file or a node's state dir (every ``ledger-*.json`` in it, and every ledger its
marks record, present or not). ``--mark-dir``, ``--key-file``, ``--witness-dir``: the node
config's ``ledger-mark-dir`` (default ``<the ledger's dir>/ledger-marks``), ``ledger-key-file``
(default ``<the ledger's dir>/ledger.key``) and ``ledger-witness-dir`` (default: the mark dir).
``verify`` and ``show`` change nothing (they check the ledger against its chain, its mark and the
witness kept on the node); ``adopt`` writes the operator's decision into the ledger's chain
(app/privacy/ledger/adoption.py: :func:`adopt`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from app.privacy.ledger import MARK_DIR, Inspection, LedgerError, inspect, mark_path_for
from app.privacy.ledger.adoption import adopt
from app.privacy.ledger.witness import key_path_for, read_key, read_witness_file, witness_path_for

_NOTES = {"ok": "the mark agrees",
          "migrate": "a ledger from before hash chaining: adopted as it is on the next open",
          "roll-forward": "the mark is behind the file (an interrupted write): moved forward on the next open",
          "mark": "its mark is written on the next open (an interrupted creation or adoption)",
          "drop-torn": "a torn last line (an interrupted append, not in the mark) is dropped on the next open"}


def ledgers(path: Path, mark_dir: Path | None) -> list[Path]:
    """The ledger files ``path`` names: itself, or a state dir's ``ledger-*.json`` and the
    ledgers named by the marks in its mark dir (so a deleted ledger is still checked)."""
    if not path.is_dir():
        return [path]
    found = {p for p in path.glob("ledger-*.json")}
    marks = Path(mark_dir) if mark_dir else path / MARK_DIR
    found |= {path / m.name[:-len(".mark")] for m in marks.glob("ledger-*.json.mark")}
    return sorted(found)


def _inspect(ledger: Path, mark_dir: Path | None, key_file: Path | None = None,
             witness_dir: Path | None = None) -> Inspection:
    """The node's view of ``ledger``: its chain (with the node's key), its mark, the witness kept on the node."""
    mark_path = mark_path_for(ledger, mark_dir)
    try:
        key = read_key(key_path_for(ledger, key_file))
    except ValueError as exc:
        insp = Inspection(ledger, mark_path)
        insp.problem, insp.action = str(exc), "refuse"
        return insp
    witness = read_witness_file(witness_path_for(mark_path, witness_dir))
    return inspect(ledger, mark_path, key=key, witnesses=[witness] if witness else [])


def verify_line(ledger: Path, mark_dir: Path | None, key_file: Path | None = None,
                witness_dir: Path | None = None) -> tuple[bool, str]:
    return _verdict(ledger, _inspect(ledger, mark_dir, key_file, witness_dir))


def _verdict(ledger: Path, insp: Inspection) -> tuple[bool, str]:
    """(ok, the one line ``verify`` prints) for ``ledger`` as ``insp`` (``inspect``) found it."""
    if insp.problem is not None:
        return False, insp.problem
    if insp.action == "create":
        return False, (f"no ledger at {ledger} (and no mark with history at {insp.mark_path}): nothing to verify; "
                       "check the path and --mark-dir")
    eps = insp.eps()
    return True, (f"OK {ledger}: {len(insp.releases)} releases, epsilon {_f(eps)} of {insp.epsilon_budget:g} "
                  f"(delta {insp.delta:.3g}); {_NOTES[insp.action]}")


def show(ledger: Path, mark_dir: Path | None, key_file: Path | None = None, witness_dir: Path | None = None) -> bool:
    insp = _inspect(ledger, mark_dir, key_file, witness_dir)
    ok, line = _verdict(ledger, insp)
    if insp.exists and insp.version:
        print(f"{ledger}: version {insp.version}" + (f", id {insp.id}" if insp.id else "")
              + f", budget epsilon {insp.epsilon_budget:g} at delta {insp.delta:.3g}")
        if insp.calibration:
            print(f"  calibration: noise multiplier {insp.calibration.get('noise_multiplier')}")
        for r in insp.releases:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(r.get("time", 0))))
            extra = f" trials={r['trials']} levels={r['levels']}" if r.get("mechanism") == "binomial" else ""
            print(f"  seq {r.get('seq')}: round {r.get('round')} {r['kind']} x{r.get('count', 1)} n={r['n']} "
                  f"K={r['batch']} z={r['noise_multiplier']:.6g}{extra} {when}Z")
        for a in insp.adoptions:
            m = a.get("mark") or {}
            print(f"  adopted {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(float(a.get('time', 0))))}Z: "
                  f"{a.get('reason')}" + (f" (the mark had recorded {m.get('releases')} releases, epsilon "
                                          f"{_f(m.get('eps_spent'))})" if m else ""))
        print(f"  {len(insp.releases)} releases, epsilon spent {_f(insp.eps())}")
    print(line)
    return ok


def _f(eps: object) -> str:
    return "?" if eps is None else f"{float(eps):.4f}"


def _node_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mark-dir", type=Path, default=None, help="the node config's ledger-mark-dir")
    p.add_argument("--key-file", type=Path, default=None, help="the node config's ledger-key-file")
    p.add_argument("--witness-dir", type=Path, default=None, help="the node config's ledger-witness-dir")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.ledger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("verify", "check each ledger against its chain and its high-water mark"),
                       ("show", "print each ledger's releases and epsilon spent")):
        p = sub.add_parser(name, help=text)
        p.add_argument("paths", nargs="+", type=Path, help="ledger files or state dirs")
        _node_options(p)
    p = sub.add_parser("adopt", help="make a ledger that does not verify the silo's record again, recorded in it")
    p.add_argument("ledger", type=Path)
    p.add_argument("--reason", required=True, help="why (written into the ledger), e.g. 'restored from backup of ...'")
    p.add_argument("--accept-loss", action="store_true",
                   help="adopt a ledger that its mark or witness cannot vouch for (spending may be forgotten)")
    _node_options(p)
    args = parser.parse_args(argv)
    if args.command == "adopt":
        try:
            print(adopt(args.ledger, args.mark_dir, reason=args.reason, accept_loss=args.accept_loss,
                        key_file=args.key_file, witness_dir=args.witness_dir))
        except LedgerError as exc:
            print(f"not adopted: {exc}", file=sys.stderr)
            return 1
        return 0
    paths = [f for p in args.paths for f in ledgers(p, args.mark_dir)]
    if not paths:
        print(f"no ledger-*.json in {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 1
    ok = True
    for f in paths:
        if args.command == "verify":
            good, line = verify_line(f, args.mark_dir, args.key_file, args.witness_dir)
            print(line)
        else:
            good = show(f, args.mark_dir, args.key_file, args.witness_dir)
        ok &= good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
