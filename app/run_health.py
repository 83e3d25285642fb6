"""Did a run that ran to its end train? Divergence and no-progress, diagnosed from its
rounds.jsonl rows, with the setting most likely to blame (a hint from simple fixed rules, never a
proof). Pure: no Flower, no torch; the ServerApp calls :func:`diagnose` at the end of a run and
writes the result to summary.json (``status``, ``health``); docs/configuration.md#run-health.

Verdicts, in this order (the first that holds):

``diverged``
    * a value went non-finite: a round's train loss is NaN or inf, a silo's evaluation reported a
      non-finite loss (row key ``non_finite_evaluations``), a silo refused to send its update
      because it came out non-finite (``non_finite_updates``), or the server step would have left
      a non-finite model and was skipped (``step_skipped``); or
    * the train loss grew by an order of magnitude: the last finite train loss is at least
      :data:`DIVERGENCE_FACTOR` (10) times the smallest finite train loss of the run's earlier
      rounds **and** at least ln C, the loss of predicting each of the C classes with probability
      1/C (so a small loss that bounces, 0.001 -> 0.02, is not a divergence).
``no-progress``
    the model was left unchanged in at least :data:`NO_PROGRESS_FRACTION` (half) of the rounds:
    no silo gave a valid update (``answered`` = 0), the aggregator gave every answering silo
    weight 0 (``silo_weights``: e.g. every Grad-BANT score 0), or the step was skipped.
``healthy``
    otherwise (summary.json status ``completed``).

The train loss is the evaluation's ``train_loss`` (the silos' mean loss on their training
splits, on the round's model); a run without evaluation (eval-every = 0) uses the batch loss the
silos report without privacy (``train_loss_private_batch``, finite values only: it is NaN when
privacy is on, because a private silo does not report it). What the rows say comes from the
silos' replies, so a Byzantine silo can set the verdict off: it is a hint for the person who
chose the settings, not a security check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: the last train loss is at least this many times the run's smallest (and >= ln C): diverged
DIVERGENCE_FACTOR = 10.0
#: the model was left unchanged in at least this share of the rounds: no progress
NO_PROGRESS_FRACTION = 0.5
#: a run whose best model's validation loss is this much (relative) below the untrained one's has
#: learned: when its model then stays for stop-unchanged rounds it stops early as completed
LEARNED_MARGIN = 0.05

HEALTHY, DIVERGED, NO_PROGRESS = "healthy", "diverged", "no-progress"
#: summary.json statuses of a run that ran to its end, so that its numbers are results (a sweep
#: keeps them, tables show them): healthy ("completed") or one of the two unhealthy verdicts
FINISHED = ("completed", DIVERGED, NO_PROGRESS)
#: the statuses of a run that finished but did not train well (the launcher exits 3)
UNHEALTHY = (DIVERGED, NO_PROGRESS)


@dataclass(frozen=True)
class Blame:
    """The run-config key most likely to blame, its value in the run, and what to try."""

    setting: str
    value: Any
    suggestion: str


@dataclass(frozen=True)
class Health:
    """A run's verdict (:data:`HEALTHY`, :data:`DIVERGED` or :data:`NO_PROGRESS`), what was seen,
    the setting most likely to blame (None when healthy) and the numbers behind it."""

    verdict: str
    reason: str
    blame: Blame | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """summary.json's ``status`` for a run that was not stopped by an error."""
        return "completed" if self.verdict == HEALTHY else self.verdict

    @property
    def label(self) -> str:
        """The verdict in words: "healthy", "diverged", "no progress"."""
        return self.verdict.replace("-", " ")

    def message(self) -> str:
        """One line: the verdict, what was seen and, when unhealthy, the most likely cause."""
        text = f"{self.label}: {self.reason}"
        return text if self.blame is None else f"{text}; most likely {self.blame.suggestion}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: Any) -> float | None:
    """A row's number (rounds.jsonl writes non-finite floats as "nan", "inf", "-inf"), or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _g(x: float) -> str:
    """A value the way a user types it (lr=5, not lr=5.0)."""
    return f"{x:g}" if isinstance(x, float) else str(x)


def _try(x: float) -> str:
    """A suggested value, to two significant digits (lr=0.05, gradbant.smoothness=1.7)."""
    return f"{float(f'{x:.2g}'):g}"


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _rounds_text(rounds: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in rounds[:5])
    return shown + (f" and {len(rounds) - 5} more" if len(rounds) > 5 else "")


def weighted(row: Mapping[str, Any]) -> tuple[int, int]:
    """(silos the aggregator gave a weight > 0, silos it weighed) in round ``row``: from the row's
    ``silo_weights`` (every rule but the mean records each silo's weight there); the mean gives
    each answering silo 1/m, so (answered, answered)."""
    weights = row.get("silo_weights")
    if isinstance(weights, Mapping):
        return sum((_num(a) or 0.0) > 0 for a in weights.values()), len(weights)
    answered = int(_num(row.get("answered")) or 0)
    return answered, answered


def kept_text(kept: Mapping[str, Any]) -> str:
    """An honest-majority rule's ``model_kept`` entry in words."""
    return (f"aggregator={kept.get('rule')} kept the model: {kept.get('replies')} replies cannot outvote "
            f"byzantine.f={kept.get('f')} ({kept.get('reason')})")


def _unchanged(row: Mapping[str, Any]) -> str | None:
    """Why round ``row`` left the model where it was: "no-update", "kept" (an honest-majority
    rule could not act on the replies: ``model_kept``), "all-rejected", "step-skipped", or None
    (it moved, as far as the row says)."""
    if "answered" in row and int(_num(row["answered"]) or 0) == 0:
        return "no-update"
    if isinstance(row.get("model_kept"), Mapping):
        return "kept"
    weights = row.get("silo_weights")
    if isinstance(weights, Mapping) and not any((_num(a) or 0.0) > 0 for a in weights.values()):
        return "all-rejected"
    if row.get("step_skipped"):
        return "step-skipped"
    return None


def _spent_for_nothing(row: Mapping[str, Any]) -> bool:
    """Round ``row``'s silos spent budget and the model stayed: they answered and the rule gave
    every one weight 0 or kept the model, or (shuffle DP) they recorded and sent their encodings
    and the shuffler refused the sum."""
    why = _unchanged(row)
    return why in ("all-rejected", "kept") or (why == "no-update" and bool(row.get("shuffle_refused")))


def first_kept(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first round in which an honest-majority rule kept the model: its ``model_kept`` entry
    with the round, or None."""
    for r in rows:
        kept = r.get("model_kept")
        if isinstance(kept, Mapping):
            return {"round": int(_num(r.get("round")) or 0), **kept}
    return None


def _kept_suggestion(kept: Mapping[str, Any]) -> str:
    return (f"from round {kept['round']} {kept_text(kept)}: silent (or dropped) silos leave fewer replies than "
            f"the rule needs to outvote f; keeping the model is the safe choice (docs/byzantine.md#liveness), so "
            "check why silos did not answer, or state a smaller byzantine.f, or use aggregator=gradbant (no "
            "honest majority needed)")


def unchanged_reason(unchanged: int, n: int, counts: Mapping[str, int]) -> str:
    """The model was left unchanged in ``unchanged`` of ``n`` rounds, by cause, in words."""
    parts = [f"{counts['all-rejected']} in which the aggregator gave every answering silo weight 0"]
    if counts.get("kept"):
        parts.append(f"{counts['kept']} in which an honest-majority rule kept the model")
    parts.append(f"{counts['no-update']} with no valid reply")
    return f"the model was left unchanged in {unchanged} of the {n} round(s) ({', '.join(parts)})"


def diagnose(rows: Sequence[Mapping[str, Any]], s: Any, num_classes: int | None = None,
             refusals: Iterable[str] = ()) -> Health:
    """The verdict on a run from its round rows and its settings ``s`` (built by the ServerApp), with the
    setting most likely to blame. ``num_classes``: C for the ln C floor of the growth rule
    (None: no floor); ``refusals``: the distinct reasons silos gave for refusing ("code: reason"),
    for a run whose rounds had no valid update."""
    refusals = sorted(refusals)
    if not rows:
        return Health(HEALTHY, "no rounds were run")
    n = len(rows)
    key = "train_loss" if any("train_loss" in r for r in rows) else "train_loss_private_batch"
    finite: list[tuple[int, float]] = []
    non_finite: list[int] = []
    for r in rows:
        rnd = int(_num(r.get("round")) or 0)
        loss = _num(r.get(key))
        bad_loss = key == "train_loss" and loss is not None and not math.isfinite(loss)
        if bad_loss or (_num(r.get("non_finite_evaluations")) or 0) > 0 or (_num(r.get("non_finite_updates")) or 0) > 0 \
                or r.get("step_skipped"):
            non_finite.append(rnd)
        if loss is not None and math.isfinite(loss):
            finite.append((rnd, loss))
    why_unchanged = [_unchanged(r) for r in rows]
    counts = {k: why_unchanged.count(k) for k in ("no-update", "kept", "all-rejected", "step-skipped")}
    unchanged = n - why_unchanged.count(None)
    evidence: dict[str, Any] = {
        "rounds": n, "loss_key": key,
        "rounds_unchanged": unchanged, "rounds_without_update": counts["no-update"],
        "rounds_all_rejected": counts["all-rejected"], "rounds_step_skipped": counts["step-skipped"],
        "non_finite_rounds": non_finite,
    }
    kept = first_kept(rows)
    if kept is not None:
        evidence |= {"rounds_model_kept": counts["kept"], "model_kept_first": kept}
    shuffler = _shuffler_refusals(rows)
    if shuffler:
        evidence["rounds_shuffle_refused"] = len(shuffler)
    growth = None
    if finite:
        last_rnd, last = finite[-1]
        earlier = finite[:-1] or finite
        min_rnd, low = min(earlier, key=lambda t: t[1])
        floor = math.log(num_classes) if num_classes and num_classes > 1 else 0.0
        evidence |= {"train_loss_first": finite[0][1], "train_loss_min": low, "train_loss_min_round": min_rnd,
                     "train_loss_last": last, "train_loss_last_round": last_rnd, "loss_floor_ln_c": floor}
        if last > low >= 0 and last >= DIVERGENCE_FACTOR * low and last >= floor:
            growth = (min_rnd, low, last_rnd, last)
            evidence["growth"] = last / low if low > 0 else math.inf
    if non_finite or growth is not None:
        seen = []
        if growth is not None:
            min_rnd, low, last_rnd, last = growth
            seen.append(f"the train loss grew from {low:.4g} (round {min_rnd}) to {last:.4g} (round {last_rnd})")
        if non_finite:
            seen.append(f"values went non-finite in round(s) {_rounds_text(non_finite)}")
        return Health(DIVERGED, " and ".join(seen), _blame_divergence(s), evidence)
    if unchanged >= NO_PROGRESS_FRACTION * n:
        reason = unchanged_reason(unchanged, n, counts)
        return Health(NO_PROGRESS, reason, _blame_no_progress(s, counts, refusals, rows, shuffler), evidence)
    return Health(HEALTHY, f"the model moved in {n - unchanged} of the {n} round(s)"
                  + (f" and the train loss went from {finite[0][1]:.4g} to {finite[-1][1]:.4g}" if finite else ""),
                  None, evidence)


def _shuffler_refusals(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """(round, reason) of every round whose sum the shuffler refused."""
    return [(int(_num(r.get("round")) or 0), str(r["shuffle_refused"])) for r in rows if r.get("shuffle_refused")]


def _attacked(s: Any) -> bool:
    from app.algorithms import get_algorithm

    return get_algorithm(s.algorithm).rule_step and s.attack.kind != "none" and s.attack.fraction > 0


def _rule(s: Any) -> str:
    """The run's aggregation rule (``auto`` resolved, ``Settings.aggregation_rule``)."""
    return s.aggregation_rule()


def _blame_divergence(s: Any) -> Blame:
    """A growing or non-finite loss: a non-robust rule averaging in attackers, else the step size."""
    agg = _rule(s)
    if _attacked(s) and agg != "gradbant":
        return Blame("aggregator", agg, f"aggregator={agg} let the attack (attack.kind={s.attack.kind} at "
                     f"attack.fraction={_g(s.attack.fraction)}) steer the model; try aggregator=gradbant")
    why = []
    if not s.privacy.enabled:
        why.append("privacy is off, so no clipping bounds the gradients")
    else:
        why.append(f"each step moves up to lr x (privacy.clip={_g(s.privacy.clip)} + the DP noise)")
    if s.local_steps > 1:
        why.append(f"local-steps={s.local_steps} takes that many steps of this size per round")
    return Blame("lr", s.lr, f"lr={_g(s.lr)} is too large ({'; '.join(why)}); try lr={_try(s.lr / 10)}")


def _blame_no_progress(s: Any, counts: Mapping[str, int], refusals: Sequence[str],
                       rows: Sequence[Mapping[str, Any]], shuffler: Sequence[tuple[int, str]] = ()) -> Blame:
    """The aggregator rejecting everything (Grad-BANT: the smoothness, the DP noise, the sketch,
    the batch noise), the silos not answering (their refusals), or the shuffler refusing the sums
    (rows' ``shuffle_refused``: its reason)."""
    if counts.get("kept", 0) and counts["kept"] >= max(counts["all-rejected"], counts["no-update"]):
        kept = first_kept(rows)
        assert kept is not None
        return Blame("byzantine.f", kept["f"], _kept_suggestion(kept))
    if counts["all-rejected"] >= counts["no-update"]:
        agg = _rule(s)
        if agg == "gradbant":
            return _blame_gradbant(s, rows)
        if agg == "fltrust" and s.privacy.enabled:
            return Blame("aggregator", agg, "aggregator=fltrust gives ReLU(cos) = 0 to every message nearly "
                         "orthogonal to the trust-set gradient, as DP-noised messages are; try aggregator=gradbant "
                         "with gradbant.noise-aware=true")
        return Blame("aggregator", agg, f"aggregator={agg} gave every message weight 0: no message points along "
                     "the server's reference; check the trust set (trust.size, trust.shift) and the attack")
    budget = [r for r in refusals if r.startswith("budget-exceeded")]
    planned = s.privacy.planned_rounds
    if budget and planned and planned < s.num_rounds:
        return Blame("privacy.planned-rounds", planned,
                     f"the silos calibrated their noise for privacy.planned-rounds={planned} of num-rounds="
                     f"{s.num_rounds}, and their budget ran out; try privacy.planned-rounds={s.num_rounds} (or 0: "
                     "num-rounds)")
    if budget:
        return Blame("privacy.epsilon", s.privacy.epsilon,
                     f"the silos' privacy budget ran out ({_short(budget[0])}); lower num-rounds={s.num_rounds} or "
                     f"raise privacy.epsilon={_g(s.privacy.epsilon)} (and the silos' epsilon-cap)")
    if shuffler and len(shuffler) * 2 >= counts["no-update"]:
        return _blame_shuffler(s, shuffler)
    if refusals:
        return Blame("silos", None, f"the silos refused the work: {_short(refusals[0])}")
    return Blame("round-timeout", s.round_timeout,
                 f"no valid reply came (silos dropped, failed or sent malformed replies; see the log); "
                 f"check the silo nodes or raise round-timeout={_g(s.round_timeout)}")


def _blame_shuffler(s: Any, shuffler: Sequence[tuple[int, str]]) -> Blame:
    """The shuffler refused the sums: its reason, and what to change when it is the privacy check
    (the silos' calibrations count on more noise trials than the sum holds: count-on > 1 with
    silos of different sizes, amplification above all)."""
    rounds = [r for r, _ in shuffler]
    reason = shuffler[-1][1]
    count_on = s.shuffle.count_on or s.silos_per_round
    head = f"the shuffler refused the sum in round(s) {_rounds_text(rounds)}: {_short(reason)}"
    if "calibration" in reason and count_on > 1:
        return Blame("shuffle.count-on", s.shuffle.count_on,
                     f"{head}; the silos' requirements differ more than shuffle.headroom="
                     f"{_g(s.shuffle.headroom)} covers: try shuffle.count-on=1 (each silo adds all its noise) "
                     f"or shuffle.amplification=none")
    return Blame("shuffler", None, f"{head}; see the shuffler's log")


def _smoothness(s: Any, rows: Sequence[Mapping[str, Any]]) -> tuple[float | None, str]:
    """Grad-BANT's L: the setting, or with ``gradbant.smoothness = auto`` the median of the rows'
    per-round ``gradbant_smoothness`` (None when no row has one); and how to name it."""
    smooth = s.robust.gradbant_smoothness
    if smooth != "auto":
        return float(smooth), f"gradbant.smoothness={_g(float(smooth))}"
    seen = sorted(v for r in rows if (v := _num(r.get("gradbant_smoothness"))) is not None and math.isfinite(v))
    if not seen:
        return None, "gradbant.smoothness=auto"
    median = seen[len(seen) // 2]
    return median, f"gradbant.smoothness=auto (median L {_try(median)})"


def _blame_gradbant(s: Any, rows: Sequence[Mapping[str, Any]]) -> Blame:
    """Every Grad-BANT score theta_i = [<g0, u_i> - (L gamma / 2) max(||u_i||^2 - c, 0)]_+ was 0:
    the penalty's factor L gamma, else what inflates ||u||^2 beyond <g0, u> (DP noise, the
    sketch's lift, minibatch sampling noise), which the noise-aware score subtracts."""
    from app.sketch_settings import NOISE_AWARE_SKETCH_KINDS

    smooth, named = _smoothness(s, rows)
    noise_aware = s.robust.gradbant_noise_aware
    can_be_aware = (not noise_aware and s.privacy.mode in ("isrl", "off")
                    and s.sketch.kind in NOISE_AWARE_SKETCH_KINDS)
    aware = "gradbant.noise-aware=true (it subtracts that noise's expected energy)"
    if smooth is not None and smooth * s.lr >= 2:
        return Blame("gradbant.smoothness", s.robust.gradbant_smoothness,
                     f"{named} x lr={_g(s.lr)} = {_try(smooth * s.lr)} >= 2: the norm penalty outweighs the "
                     "alignment even for a message equal to the trust-set gradient, so every score is 0; try "
                     f"gradbant.smoothness={_try(0.5 / s.lr)}")
    if s.privacy.enabled and not noise_aware:
        if can_be_aware:
            return Blame("gradbant.noise-aware", False,
                         f"the DP noise (privacy.mode={s.privacy.mode}, privacy.epsilon={_g(s.privacy.epsilon)}) "
                         f"inflates every message's norm, so the paper's score gives every silo 0; try {aware}")
        return Blame("gradbant.smoothness", s.robust.gradbant_smoothness,
                     f"the DP noise (privacy.mode={s.privacy.mode}) inflates every message's norm past the penalty "
                     f"{named} allows; try a smaller gradbant.smoothness")
    if s.privacy.enabled and noise_aware:  # issue 35: the allowance subtracts the noise's mean, not its spread
        return Blame("privacy.epsilon", s.privacy.epsilon,
                     f"the DP noise (privacy.mode={s.privacy.mode}, privacy.epsilon={_g(s.privacy.epsilon)}) is most "
                     "of every message: noise-aware Grad-BANT subtracts its expected energy, but its spread still "
                     "outweighs the alignment (small silos: sigma is calibrated to clip/K; see the launcher's "
                     "pre-flight, sigma*sqrt(d)/clip > 1); try docs/your-data.md#small-silos (full batches, fewer "
                     "rounds, a smaller model) or a larger privacy.epsilon, not a smaller gradbant.smoothness")
    if s.sketch.kind != "none" and not noise_aware:
        return Blame("sketch.ratio", s.sketch.ratio,
                     f"the sketch's lift (sketch.kind={s.sketch.kind}, sketch.ratio={_g(s.sketch.ratio)}) "
                     "multiplies every message's squared norm by about n/k; try "
                     + (f"{aware} or " if can_be_aware else "") + "a larger sketch.ratio")
    if s.batch_size and s.local_steps == 1 and not noise_aware:
        return Blame("batch-size", s.batch_size,
                     f"batch-size={s.batch_size} with local-steps=1: each message is one minibatch gradient whose "
                     "sampling noise inflates its norm; try " + (f"{aware}, " if can_be_aware else "")
                     + f"batch-size={4 * s.batch_size} or local-steps > 1")
    return Blame("gradbant.smoothness", s.robust.gradbant_smoothness,
                 "no message aligned with the trust-set gradient by more than its norm penalty; try a smaller "
                 + (f"gradbant.smoothness (e.g. {_try(smooth / 10)})" if smooth is not None else "gradbant.smoothness")
                 + ", or check the trust set (trust.size, trust.shift)")


# -- during the run: stop a run that cannot learn ---------------------------------------------
@dataclass
class Watch:
    """Run health during the run (the ServerApp feeds it every round, strategies/loop.py stops the
    run on what :meth:`see` returns), so that a run that cannot learn does not spend the rest of
    every silo's budget. It stops after round r < R (``num_rounds``) with a ``no-progress``
    :class:`Health` when the first of these holds (docs/configuration.md#run-health):

    * ``stop_unchanged`` (k) consecutive rounds in which silos answered (and spent) but the
      model stayed: the aggregator gave every answering silo weight 0, an honest-majority rule
      kept the model (``model_kept``), or (shuffle DP) the shuffler refused the sum of the
      encodings the silos had recorded and sent (``shuffle_refused``); any other round with no
      valid reply (nothing spent) neither counts nor breaks the streak;
    * the model was left unchanged (diagnose's count) in at least :data:`NO_PROGRESS_FRACTION`
      of the R planned rounds already: the run would end ``no-progress`` whatever the other
      rounds do (these two stop only on a round whose silos answered and whose model stayed,
      never on refusals or dropped replies alone, which spend nothing, nor on a run that shows
      signs of divergence, left to the end-of-run verdict);
    * ``stop_patience`` (P) >= 1 rounds have passed and none of the last P rounds' models has a
      loss on the server's own validation records (``validation`` in :meth:`see`: the trust
      set, else ``server.test-file``) below the untrained model's (:meth:`start`).

    When one of the first two fires after the run has learned (:meth:`learned`: some model's loss
    on the server's validation records is :data:`LEARNED_MARGIN` below the untrained model's), the
    run has stalled, not failed: it stops early as ``completed`` (a healthy verdict whose evidence
    says ``stopped_early``), and the silos keep the rest of their budget.

    ``stop_unchanged = 0`` turns all three off; ``stop_patience = 0`` the third alone. It watches
    runs under silofl's driver (``FederatedOptimizer.run``, what the ServerApp uses); a strategy
    run under Flower's own ``Strategy.start`` is not watched."""

    s: Any
    num_rounds: int
    stop_unchanged: int
    stop_patience: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    validation_start: float | None = None
    validation: list[tuple[int, float]] = field(default_factory=list)
    #: what the validation records are, in words (for the reason)
    validation_name: str = "the server's validation records"
    streak: list[int] = field(default_factory=list)
    #: the distinct reasons silos gave for refusing (the ServerApp passes the strategy's set)
    refusals: Iterable[str] = ()

    def start(self, loss: float | None, rows: Sequence[Mapping[str, Any]] = ()) -> None:
        """The untrained model's validation loss (None: the server holds no validation records)
        and, for a resumed run, the rounds already done."""
        self.validation_start = loss if loss is not None and math.isfinite(loss) else None
        for row in rows:
            self._count(dict(row))

    def _count(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if _spent_for_nothing(row):
            self.streak.append(int(_num(row.get("round")) or 0))
        elif _unchanged(row) != "no-update":
            self.streak = []

    def learned(self) -> tuple[float, tuple[int, float]] | None:
        """(the untrained loss, (round, loss) of the best model so far) when some model of this
        run has a validation loss at least :data:`LEARNED_MARGIN` below the untrained model's; None
        when it has not, or the server holds no validation records."""
        if self.validation_start is None or not self.validation:
            return None
        best = min(self.validation, key=lambda t: t[1])
        return (self.validation_start, best) if best[1] < (1 - LEARNED_MARGIN) * self.validation_start else None

    def see(self, row: Mapping[str, Any], validation: float | None = None) -> Health | None:
        """Round ``row`` (its model's validation loss, when the server holds records): a
        ``no-progress`` :class:`Health` when the run should stop now, else None."""
        self._count(dict(row))
        rnd = int(_num(row.get("round")) or len(self.rows))
        if validation is not None and math.isfinite(validation):
            self.validation.append((rnd, float(validation)))
        if not self.stop_unchanged or rnd >= self.num_rounds:
            return None
        why = [_unchanged(r) for r in self.rows]
        counts = {k: why.count(k) for k in ("no-update", "kept", "all-rejected", "step-skipped")}
        unchanged = len(why) - why.count(None)
        evidence: dict[str, Any] = {"stopped_after_round": rnd, "rounds_planned": self.num_rounds, "rounds": len(self.rows),
                                    "rounds_unchanged": unchanged, "rounds_without_update": counts["no-update"],
                                    "rounds_all_rejected": counts["all-rejected"], "rounds_model_kept": counts["kept"]}
        if self.validation_start is not None:
            evidence |= {"validation_loss_untrained": self.validation_start,
                         "validation_loss": [v for _, v in self.validation]}
        seen, validation_stop = None, False
        # the first two rules stop only on a round that spent budget for nothing (silos answered,
        # the model stayed): refusals and dropped replies spend nothing, and a run that shows signs
        # of divergence is left to the end-of-run verdict
        wasted = _spent_for_nothing(row) and diagnose(self.rows, self.s).verdict != DIVERGED
        if wasted and len(self.streak) >= self.stop_unchanged:
            recent = [_unchanged(r) for r in self.rows if int(_num(r.get("round")) or 0) in self.streak]
            cause = ("the shuffler refused every sum" if "no-update" in recent else
                     "an honest-majority rule kept the model" if "kept" in recent else
                     "the aggregator gave every answering silo weight 0")
            seen = (f"the model stayed in {len(self.streak)} consecutive round(s) ({_rounds_text(self.streak)}) "
                    f"although silos answered and spent their budget on it ({cause}; "
                    f"stop-unchanged={self.stop_unchanged})")
        elif wasted and unchanged >= NO_PROGRESS_FRACTION * self.num_rounds:
            seen = (f"{unchanged_reason(unchanged, len(self.rows), counts)}, at least half of the "
                    f"num-rounds={self.num_rounds} planned: the run would end no-progress whatever the other rounds do")
        if seen is None and self.stop_patience and self.validation_start is not None \
                and len(self.validation) >= self.stop_patience:
            last = self.validation[-self.stop_patience:]
            best_rnd, best = min(last, key=lambda t: t[1])
            if best >= self.validation_start:
                validation_stop = True
                seen = (f"no model of the last {self.stop_patience} round(s) has a loss on {self.validation_name} "
                        f"below the untrained model's ({self.validation_start:.4g}; the best, round {best_rnd}: "
                        f"{best:.4g}; stop-patience={self.stop_patience})")
        if seen is None:
            return None
        learned = self.learned()
        if learned is not None and not validation_stop:  # it learned, then stalled: keep the rest of the budget
            untrained, (best_rnd, best) = learned
            return Health(HEALTHY, f"stopped early after round {rnd} of {self.num_rounds}: {seen}; the model had "
                          f"already improved on {self.validation_name} (loss {untrained:.4g} untrained, {best:.4g} "
                          f"at round {best_rnd}), so the run ends with what it learned and the silos keep the rest "
                          "of their budget", None, evidence | {"stopped_early": True})
        reason = f"stopped after round {rnd} of {self.num_rounds}: {seen}"
        blame = _blame_no_learning(self.s) if validation_stop else \
            _blame_no_progress(self.s, counts, sorted(self.refusals), self.rows, _shuffler_refusals(self.rows))
        return Health(NO_PROGRESS, reason, blame, evidence)


def _blame_no_learning(s: Any) -> Blame:
    """The model moved but did not get better on the server's records: under privacy the noise
    (each silo's sigma against its signal, the pre-flight's numbers), else the step size."""
    if s.privacy.enabled:
        return Blame("privacy.epsilon", s.privacy.epsilon,
                     f"the DP noise at privacy.epsilon={_g(s.privacy.epsilon)} over num-rounds={s.num_rounds} "
                     f"drowns the silos' signal (batch-size={s.batch_size or 'full'}; see the launcher's pre-flight "
                     "noise-to-signal lines); try the small-silo recipe of docs/your-data.md#small-silos (full "
                     "batches, fewer rounds, aggregator=mean when no silo is suspect)")
    return Blame("lr", s.lr, f"lr={_g(s.lr)} does not lower the loss on the server's records; try lr={_try(s.lr / 10)}")
