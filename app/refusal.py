"""What a silo says when it refuses, and what it keeps to itself (DESIGN.md section 1).

The server writes the run config and reads every refusal. A refusal whose text came from the
silo's records (a class value, a column's first entry, a count of empty cells, the path of the
silo's file) would release those records with no noise and no ledger row: a server that names a
sensitive column as the label and adds each quoted value to ``classes`` reads the column out,
one refused run a value. So a refusal that follows from the records, or from an error whose text
nobody vetted, carries a **fixed code and a fixed reason**; the detail goes to the node's own
log, and the node's operator reads it there or with ``python -m app.data check`` on the node.

Property (tests/test_refusal_privacy.py): for two record files that differ in one record, the
bytes of a refusal are the same, on every refusal path. Refusals that follow from the request,
the node config or the ledger's totals alone (admission, policy, budget) keep their own one-line
reasons: none of them reads a record (the budget's epsilon depends on n, which replace-one
adjacency keeps). So does a simulation's virtual silo (no own file, no cap, not deployed) whose
public data set's files are missing: it names the data set and the files, never a record.
"""

from __future__ import annotations

from logging import ERROR, WARNING

from flwr.common import log

#: the one reason a silo gives when its records cannot be used for a run (code data-unusable)
DATA_REASON = ("this silo's records cannot be used for this run (they do not fit the run's data.schema, cannot be "
               "read, or exceed the node's data limits); nothing was spent. The detail is in the node's log; its "
               "operator can run `python -m app.data check` on the node (docs/your-data.md)")
#: the one reason a silo gives when its ledger cannot be used (code ledger-unusable)
LEDGER_REASON = ("this silo's privacy ledger cannot be used (unreadable, or it does not match its high-water mark "
                 "or witness); it releases nothing until its operator repairs it (python -m app.ledger verify on "
                 "the node, docs/deployment.md). The detail is in the node's log")
#: the one reason a silo gives when it failed while answering (code silo-error)
INTERNAL_REASON = "this silo failed while answering; the detail is in the node's log"


class PublicError(RuntimeError):
    """An error whose message the silo may send as it is: it names only the node's own
    capabilities or settings (e.g. no CUDA device), never its records or paths."""


def logged(index: object, detail: str, level: int = WARNING) -> None:
    """Write a refusal's detail to the node's own log (never to the server)."""
    log(level, "silo %s refused; detail for this node's operator only: %s", index, detail)


def data_reason(index: object, exc: BaseException) -> str:
    """:data:`DATA_REASON`, after logging ``exc`` (what is wrong with the records) locally."""
    logged(index, f"{type(exc).__name__}: {exc}")
    return DATA_REASON


def ledger_reason(index: object, exc: BaseException) -> str:
    """:data:`LEDGER_REASON`, after logging ``exc`` (it names the ledger's paths) locally."""
    logged(index, f"{type(exc).__name__}: {exc}", ERROR)
    return LEDGER_REASON


def internal_reason(index: object, exc: BaseException) -> str:
    """:data:`INTERNAL_REASON` (or a :class:`PublicError`'s own text), after logging ``exc``
    with its traceback locally."""
    if isinstance(exc, PublicError):
        return str(exc)
    import traceback

    logged(index, "".join(traceback.format_exception(exc)).rstrip(), ERROR)
    return INTERNAL_REASON
