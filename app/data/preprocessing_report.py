"""What a run's pre-processing did and whether epsilon covers it (summary.json ``preprocessing``).

Every step that reads records is named with ``covered_by_eps``: true when it reads no silo record
(public ranges, the server's public data, no scaling) or reads them through a release charged to
each silo's ledger (``dp`` in a private run); false for the modes kept to reproduce papers
(``standardize = pooled | local``, ``pca-fit = pooled``) and for ``dp`` without privacy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.data.scaling import PUBLIC_RANGES, UNCOVERED_MODES, resolve_scaling

if TYPE_CHECKING:
    from app.data.options import DataOptions

_HOW = {
    "public": "public ranges (x - lo) / (hi - lo); no record read",
    "server": "mean/std of the server's public sample (disjoint from every silo); no silo record read",
    "dp": "each silo's noisy mean/std of its clipped records (Gaussian, charged to its ledger)",
    "pooled": "mean/std of all silos' pooled training records (no noise)",
    "local": "mean/std of each silo's own records (no noise)",
    "none": "no scaling",
}


def preprocessing_steps(data: DataOptions, private: bool) -> dict[str, Any]:
    """{"steps": [...], "covered_by_eps": all steps covered, "caveat": None or why not} of the run's
    data options; ``private``: the run charges a ledger (``dp`` statistics are covered only then)."""
    own = bool(data.data_schema)  # the silos' own records: scaled as app/data/own_data.py says
    mode = _own_mode(data) if own else resolve_scaling(data.standardize, data.dataset)
    steps: list[dict[str, Any]] = []
    if data.pca:
        steps.append({"step": "pca", "components": data.pca, "fit": data.pca_fit,
                      "how": ("fitted on the server's public sample" if data.pca_fit == "public"
                              else "fitted on all silos' pooled training records"),
                      "covered_by_eps": data.pca_fit == "public"})
    how = _HOW[mode]
    if mode == "public" and data.pca:
        how = "mean/std of the server's public sample after PCA; no silo record read"
    elif mode == "public" and own:
        how = "the public statistics (else ranges) data.schema declares; no silo record read"
    elif mode == "public":
        how += f" {PUBLIC_RANGES.get(data.dataset)}"
    elif mode == "dp":
        how += f", clip {data.preprocess_clip:g}, {data.preprocess_share:g} of epsilon"
    covered = mode not in UNCOVERED_MODES and (mode != "dp" or private)
    steps.append({"step": "scaling", "standardize": data.standardize, "mode": mode, "how": how, "covered_by_eps": covered})
    bad = [st for st in steps if not st["covered_by_eps"]]
    caveat = None
    if bad:
        caveat = ("pre-processing NOT covered by epsilon: " + "; ".join(f"{st['step']}: {st['how']}" for st in bad)
                  + ". The epsilon printed covers the training releases only: not a guarantee for the records "
                  "(kept to reproduce papers; the defaults are covered)")
    return {"steps": steps, "covered_by_eps": not bad, "caveat": caveat}


def _own_mode(data: DataOptions) -> str:
    from app.data.own_data import own_mode, run_schema
    from app.data.schema import SchemaError

    try:
        schema = run_schema(data)
    except SchemaError:  # a schema the ServerApp cannot read: as if nothing public were declared
        schema = None
    return own_mode(data, schema)
