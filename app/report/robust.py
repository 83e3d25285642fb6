"""The report of a Byzantine-robust sweep (``algorithm = robust`` rows, e.g.
``experiment=private-robust``): one table per epsilon of the final test accuracy, rows = rule ×
sketch, columns = attack; ``accuracy_vs_epsilon.png``, one panel per attack."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from app.report.cells import epsilon_of, mean_std, unhealthy_count, unhealthy_lines
from app.run_health import FINISHED, UNHEALTHY


# -- Byzantine-robust sweeps (experiment=private-robust) -------------------------------------
#: the table's name of each rule: (aggregator, gradbant.noise-aware) -> label
RULE_LABELS = {("gradbant", True): "Grad-BANT noise-aware", ("gradbant", False): "Grad-BANT (paper)",
               ("fltrust", False): "FLTrust", ("mean", False): "mean", ("krum", False): "Krum",
               ("median", False): "median", ("trimmed-mean", False): "trimmed mean", ("smea", False): "SMEA",
               ("robajol", False): "RobAJoL"}
#: rules whose sweeps state f once for every attack (conf/rule/*.yaml): their label shows it
STATED_F_RULES = ("smea",)
#: the pre-aggregators' names in a label (strategies/preaggregation.py)
PRE_LABELS = {"nnm": "NNM", "bucketing": "Bucketing", "arc": "ARC"}
REFUSED = "refused: honest majority required"


def _true(text: str | None) -> bool:
    return str(text).strip().lower() in ("true", "1", "yes")


def rule_of(row: dict[str, str]) -> str:
    """The rule's label: pre-aggregators first (``NNM∘Krum``, the issue's notation: NNM, then Krum),
    the f the operator stated when a row states one (``(f=3)``), and RobAJoL for a rule run on the
    sketches (``RobAJoL (NNM∘trimmed mean on y, f=4)``)."""
    agg = row.get("aggregator", "")
    label = RULE_LABELS.get((agg, _true(row.get("gradbant.noise-aware")) and agg == "gradbant"), agg)
    pre = [PRE_LABELS.get(p.strip(), p.strip()) for p in str(row.get("pre-aggregators") or "").split(",")
           if p.strip() and p.strip().lower() != "nan"]
    if pre:
        label = "∘".join([*pre, label])
    f = str(row.get("byzantine.f") or "").strip()
    stated = f", f={int(float(f))}" if (pre or agg in STATED_F_RULES) and f not in ("", "-1", "nan") else ""
    if str(row.get("aggregation-space") or "lifted") == "sketch":  # RobAJoL: the rule on the sketches
        return f"RobAJoL ({label} on y{stated})"
    return f"{label} ({stated[2:]})" if stated else label


def attack_of(row: dict[str, str]) -> str:
    kind = row.get("attack.kind") or "none"
    return "none" if kind == "none" else f"{kind} {float(row.get('attack.fraction') or 0):.0%}"


def latest_per_job(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """One row per job (a resumed sweep appends a failed job's rerun): its last finished row,
    else its last row; in the order the jobs first appear."""
    keep: dict[str, dict[str, str]] = {}
    for i, r in enumerate(rows):
        key = r.get("job") or f"row{i}"
        if key not in keep or r["status"] in FINISHED or keep[key]["status"] not in FINISHED:
            keep[key] = r
    return list(keep.values())


def robust_cells(rows: list[dict[str, str]]) -> dict[tuple[float, str, str, str], dict[str, Any]]:
    """(epsilon, rule, sketch, attack) -> {"acc": final test accuracies of the finished jobs,
    "diverged" / "no-progress": how many of those were, "refused": jobs refused for an honest
    majority, "failed": other failed jobs}."""
    out: dict[tuple[float, str, str, str], dict[str, Any]] = defaultdict(
        lambda: {"acc": [], "refused": 0, "failed": 0} | {st: 0 for st in UNHEALTHY})
    for r in latest_per_job(rows):
        cell = out[(epsilon_of(r), rule_of(r), r.get("sketch.kind") or "none", attack_of(r))]
        if r["status"] in FINISHED and r.get("test_accuracy") not in ("", None):
            cell["acc"].append(float(r["test_accuracy"]))
            if r["status"] in UNHEALTHY:
                cell[r["status"]] += 1
        elif r["status"] == "failed" and "honest majority" in (r.get("error") or ""):
            cell["refused"] += 1
        elif r["status"] != "skipped":
            cell["failed"] += 1
    return out


#: the issue's order of the attack columns (others after them, by name)
ATTACK_KINDS = ("none", "label-flip", "sign-flip", "alie", "alie-adaptive", "ipm-adaptive", "mimic")


def _attack_order(a: str) -> tuple[int, str]:
    kind = a.split(" ")[0]
    return (ATTACK_KINDS.index(kind) if kind in ATTACK_KINDS else len(ATTACK_KINDS), a)


def _rule_order(rule: str) -> tuple[int, str]:
    order = list(RULE_LABELS.values())
    base = "RobAJoL" if rule.startswith("RobAJoL") else rule.split(" (f=")[0].split("∘")[-1]
    return (order.index(base) if base in order else len(order), rule)


def _cell_text(cell: dict[str, Any]) -> str:
    acc = cell["acc"]
    if acc:
        m, s = mean_std(acc)
        unhealthy = "".join(f", {cell[st]} {st.replace('-', ' ')}" for st in UNHEALTHY if cell.get(st))
        text = f"{m:.2%} ± {s:.2%} (n={len(acc)}{unhealthy})"
    elif cell["refused"]:
        return REFUSED
    else:
        text = "n/a"
    extra = [f"{cell[k]} {k}" for k in ("refused", "failed") if cell[k]]
    return text + (f" (+{', '.join(extra)})" if extra else "")


def robust_markdown(rows: list[dict[str, str]]) -> str:
    cells = robust_cells(rows)
    eps_all = sorted({k[0] for k in cells})
    attacks = sorted({k[3] for k in cells}, key=_attack_order)
    lines: list[str] = []
    for eps in eps_all:
        title = "ε = ∞ (privacy off)" if math.isinf(eps) else f"ε = {eps:g} (ISRL-DP, each silo)"
        lines += [f"### {title}", "", "| rule | sketch | " + " | ".join(attacks) + " |",
                  "|" + "---|" * (len(attacks) + 2)]
        pairs = sorted({(k[1], k[2]) for k in cells if k[0] == eps}, key=lambda p: (_rule_order(p[0]), p[1] != "none", p[1]))
        for rule, sketch in pairs:
            row_cells = [_cell_text(cells[(eps, rule, sketch, a)]) if (eps, rule, sketch, a) in cells else "n/a"
                         for a in attacks]
            lines.append(f"| {rule} | {sketch} | " + " | ".join(row_cells) + " |")
        lines.append("")
    jobs = latest_per_job(rows)
    refused = sum(c["refused"] for c in cells.values())
    failed = [r for r in jobs if r["status"] == "failed" and "honest majority" not in (r.get("error") or "")]
    lines.append(f"Jobs: {len(jobs)} ({refused} refused for an honest majority, {len(failed)} failed otherwise"
                 f"{unhealthy_count(jobs)}). Final test accuracy, mean ± std over seeds.")
    for r in failed[:10]:
        lines.append(f"- failed job {r['job']} ({rule_of(r)}, {attack_of(r)}, ε={epsilon_of(r):g}): {r['error']}")
    lines += unhealthy_lines(jobs, lambda r: f"{rule_of(r)}, {attack_of(r)}, ε={epsilon_of(r):g}")
    return "\n".join(lines)


def plot_accuracy_vs_epsilon(rows: list[dict[str, str]], path: Path) -> None:
    """One panel per attack; x = epsilon (categorical, ∞ last), one line per rule (mean ± std over
    seeds), solid without a sketch and dashed with one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = robust_cells(rows)
    eps_all = sorted({k[0] for k in cells})
    attacks = sorted({k[3] for k in cells}, key=_attack_order)
    rules = sorted({k[1] for k in cells}, key=_rule_order)
    ncols = min(2, len(attacks))
    nrows = math.ceil(len(attacks) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False, sharey=True)
    for ax, attack in zip(axes.flat, attacks):
        for i, rule in enumerate(rules):
            for sketch in sorted({k[2] for k in cells if k[1] == rule}, key=lambda s: (s != "none", s)):
                xs, ms, ss = [], [], []
                for j, eps in enumerate(eps_all):
                    acc = cells.get((eps, rule, sketch, attack), {"acc": []})["acc"]
                    if acc:
                        m, s = mean_std(acc)
                        xs.append(j), ms.append(m), ss.append(s)
                if xs:
                    ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=3, color=f"C{i % 10}",
                                ls="-" if sketch == "none" else "--",
                                label=rule if sketch == "none" else f"{rule} + {sketch}")
        ax.set_xticks(range(len(eps_all)), ["∞" if math.isinf(e) else f"{e:g}" for e in eps_all])
        ax.set_title(f"attack: {attack}", fontsize=10)
        ax.set_xlabel("ε (each silo, certified)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(attacks):]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(4, len(labels)))
    fig.tight_layout(rect=(0, 0.16 / nrows if handles else 0, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_accuracy_heatmap(rows: list[dict[str, str]], path: Path) -> None:
    """One panel per epsilon, stacked: rows = rule (and sketch), columns = attack, colour and text = the mean
    final test accuracy over seeds (± their std); a refused cell says "refused", an empty one is
    blank. The table of results.md as a picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cells = robust_cells(rows)
    eps_all = sorted({k[0] for k in cells}, key=lambda e: (not math.isinf(e), -e))
    attacks = sorted({k[3] for k in cells}, key=_attack_order)
    pairs = sorted({(k[1], k[2]) for k in cells}, key=lambda p: (_rule_order(p[0]), p[1] != "none", p[1]))
    sketches = {p[1] for p in pairs}
    labels = [rule if len(sketches) == 1 else f"{rule} + {sketch}" for rule, sketch in pairs]
    fig, axes = plt.subplots(len(eps_all), 1, figsize=(1.05 * len(attacks) + 3.6, (0.36 * len(pairs) + 0.9) * len(eps_all)),
                             squeeze=False, sharex=True)
    image = None
    for ax, eps in zip(axes.flat, eps_all):
        grid = np.full((len(pairs), len(attacks)), np.nan)
        for i, (rule, sketch) in enumerate(pairs):
            for j, attack in enumerate(attacks):
                cell = cells.get((eps, rule, sketch, attack))
                if cell is None:
                    continue
                if cell["acc"]:
                    m, s = mean_std(cell["acc"])
                    grid[i, j] = m
                    ax.text(j, i, f"{m:.1%}\n±{s:.1%}", ha="center", va="center", fontsize=6.5,
                            color="white" if m < 0.45 else "black")
                elif cell["refused"]:
                    ax.text(j, i, "refused", ha="center", va="center", fontsize=6.5, color="0.4")
        image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(attacks)), attacks, rotation=30, ha="right", fontsize=7)
        ax.tick_params(axis="x", labelbottom=ax is axes.flat[-1])
        ax.set_yticks(range(len(pairs)), labels, fontsize=7)
        ax.set_title("ε = ∞ (privacy off)" if math.isinf(eps) else f"ε = {eps:g} (each silo)", fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=list(axes.flat), fraction=0.02, pad=0.01, label="test accuracy")
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)
