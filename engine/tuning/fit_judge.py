"""``memgate models judge``: fit the judge (duplicates, updates) for the served models.

1. **Capture.** Every case's memories are stored and its fact triaged as a dry run under the
   review policy, as ``memgate eval`` runs it, with a recording judge in the gate: it keeps the
   evidence the rule saw for each fact and changes nothing. Review's floor (0.45) is the lowest
   of the named policies, so every candidate any policy judges has its model scores.
2. **Rows.** Each case's judged candidates (:func:`engine.gate.judge.features.features`) with
   two labels: "this memory is the one the fact duplicates" (expected ``skip`` with it as
   target) and "this memory is the one the fact updates" (expected ``replace`` with it as
   target).
3. **Cross-validation.** Each labelled set in turn is scored by trees fitted on the others
   (leave one set out, as each set has its own author and wording; with fewer than three sets,
   five folds of cases), for each label. The out-of-fold probabilities are the judge's figures
   on wording it was not fitted on.
4. **Bars.** Strict's rule verdicts are replayed over the same evidence (the rule is pure) and
   amended with the out-of-fold probabilities. The duplicate bar: of the grid's bars that
   skip no more new facts and updates than the rule alone (lost information), the one with
   the most correct decisions. The veto bar, with it: the one with the most correct
   decisions less ``OVERWRITE_COST`` for each wrongful overwrite (a wrongful overwrite is worse
   than a missed update). See :func:`choose_bars`. Review's measures (updates queued with the
   right target, adds and skips queued) by the rule alone and with the duplicate bar are
   recorded beside them. The figures of the rule alone and with the judge at those bars are
   the cross-validated estimate, recorded in the judge file and printed. (The bars are chosen
   on the same out-of-fold probabilities they are scored with: two numbers, a small optimism;
   ``benchmarks/cv_judge.py`` chooses them without the set it scores.)
5. **Fit** both models on every case and write the sealed judge file for these models
   (:mod:`engine.gate.judge.store`).

Without ``--cases`` the labelled sets of this checkout are used: ``benchmarks/data``'s
heldout, heldout2 ... heldout16 (nothing outside the repository is read).
heldout17 to heldout24 are never among them, nor accepted by ``--cases``: they are the held-out
measuring sticks. (heldout11 to heldout16 were, until each had been looked at; adding them to
the eleven sets changed the judge's leave-one-set-out figures by a few decisions in 4,315:
``benchmarks/data/README.md``.)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidInput
from engine.gate.judge import Judge, amended, with_bars
from engine.gate.judge.features import features
from engine.gate.policy import REVIEW, Evidence, Policy, Verdict
from engine.gate.policy import apply_rule as rule
from engine.runtime.cpu import cpu
from engine.tuning.boost import BoostSettings, fit
from engine.tuning.calibrate import finite, sha256_of
from engine.tuning.evaluate import Staged, decide_cases, is_labelled, load_cases, stage
from engine.tuning.scoring import review_measures, score

__all__ = [
    "BAR_GRID",
    "OVERWRITE_COST",
    "Captured",
    "Fitted",
    "capture",
    "choose_bars",
    "command",
    "default_sets",
    "figures",
    "fit_judge",
    "labelled_rows",
    "out_of_fold",
    "replay",
    "rule_verdicts",
]

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data"
TRAINING_SETS = ("heldout", *(f"heldout{n}" for n in range(2, 17)))
"""The checkout's labelled sets a judge is fitted on by default (``benchmarks/data``)."""
HELD_OUT = tuple(f"heldout{n}" for n in range(17, 25))
"""Sets never fitted on: the gate's measuring sticks (``benchmarks/data/README.md``)."""

BAR_GRID: dict[str, tuple[float, ...]] = {
    "duplicate_bar": tuple(round(0.3 + 0.05 * i, 2) for i in range(14)),
    "veto_bar": (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7),
}
OVERWRITE_COST = 3
"""What one wrongful overwrite costs, in correct decisions, when the veto bar is chosen: the
bar maximises correct decisions less this many for each wrongful overwrite. A missed update
leaves a stale fact beside the new one, which a reader can notice; an overwrite hides the true
one. Over the ten read sets' out-of-fold figures (nested: bar chosen without the scored set)
a cost of 2 held back 5 of 49 wrongful overwrites for 22 correct decisions, 3 held back 16 for
43, 4 held back 21 for 58."""


def default_sets() -> list[Path]:
    """The checkout's training sets (``benchmarks/data``): nothing outside the repository, so
    the judge a user fits is the one CI fits."""
    return [DATA / f"{name}.jsonl" for name in TRAINING_SETS if (DATA / f"{name}.jsonl").is_file()]


@dataclass(frozen=True)
class Captured:
    """One labelled case as the rule saw it."""

    case: dict[str, Any]
    group: str
    """The labelled set it came from (a fold of the cross-validation)."""
    fact: str
    evidence: tuple[Evidence, ...]
    owners: dict[str, str]
    """Store memory id -> the case's memory id."""


class _Recorder:
    """A judge that remembers what the rule saw and changes nothing."""

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[Evidence, ...], str]] = []

    def policy(self, policy: Policy) -> Policy:
        return policy

    def amend(
        self, verdict: Verdict, evidence: Sequence[Evidence], fact: str, policy: Policy
    ) -> Verdict:
        self.seen.append((tuple(evidence), fact))
        return verdict


def capture(gate: Any, sets: Sequence[tuple[str, list[dict[str, Any]]]]) -> list[Captured]:
    """Stage and triage every case (dry run, review policy) through a copy of ``gate`` with a
    recording judge; one set at a time (a store commit has a size limit)."""
    from engine.gate.gate import Gate

    out: list[Captured] = []
    for name, cases in sets:
        recorder = _Recorder()
        g = Gate(gate.store, gate.index, gate.embedder, gate.nli, gate.settings, judge=recorder)
        staged: Staged = stage(g, cases, prefix=f"judge-{len(out)}")
        decide_cases(g, staged, REVIEW.name)
        if len(recorder.seen) != len(cases):
            raise InvalidInput(
                f"{name}: {len(recorder.seen)} facts reached the rule of {len(cases)}"
            )
        for case, (evidence, fact) in zip(cases, recorder.seen, strict=True):
            out.append(Captured(case, name, fact, evidence, staged.owners))
    return out


Rows = tuple[list[list[str]], np.ndarray, dict[str, np.ndarray]]
"""Judged memory ids per case, the stacked feature rows, and their labels by name."""


def labelled_rows(items: Sequence[Captured], floor: float) -> Rows:
    """Judged memory ids per case, the stacked feature rows, and their labels: ``duplicate``
    (the fact restates this memory) and ``update`` (the fact replaces it)."""
    ids, xs = [], []
    labels: dict[str, list[float]] = {"duplicate": [], "update": []}
    for it in items:
        chosen, x = features(it.evidence, it.fact, floor)
        expected = it.case["expected"]
        ids.append([e.memory_id for e in chosen])
        xs.append(x)
        for e in chosen:
            mine = it.owners.get(e.memory_id) == expected["target"]
            labels["duplicate"].append(float(expected["action"] == "skip" and mine))
            labels["update"].append(float(expected["action"] == "replace" and mine))
    x = np.vstack(xs) if xs else np.zeros((0, 0))
    return ids, x, {k: np.asarray(v) for k, v in labels.items()}


def _folds(items: Sequence[Captured]) -> list[list[int]]:
    groups = list(dict.fromkeys(it.group for it in items))
    if len(groups) >= 3:
        return [[i for i, it in enumerate(items) if it.group == g] for g in groups]
    return [list(range(k, len(items), 5)) for k in range(5)]


def out_of_fold(
    items: Sequence[Captured],
    rows: Rows,
    settings: BoostSettings,
    log: Callable[[str], None],
    label: str = "duplicate",
) -> list[dict[str, float]]:
    """Per case, memory id -> probability of ``label`` (``duplicate`` or ``update``) from trees
    fitted without its fold; ``rows`` are the items' :func:`labelled_rows` (computed once for
    both labels)."""
    ids, x, labels = rows
    y = labels[label]
    case_of = np.repeat(np.arange(len(items)), [len(i) for i in ids])
    probs = np.zeros(len(y))
    folds = _folds(items)
    for n, fold in enumerate(folds, 1):
        held = np.isin(case_of, fold)
        if held.any() and (~held).any() and y[~held].any():
            probs[held] = fit(x[~held], y[~held], settings).probability(x[held])
        log(f"  {label} fold {n}/{len(folds)}: {int(held.sum())} candidates scored")
    out, k = [], 0
    for memory_ids in ids:
        out.append({m: float(probs[k + j]) for j, m in enumerate(memory_ids)})
        k += len(memory_ids)
    return out


def rule_verdicts(items: Sequence[Captured], policy: Policy) -> list[Verdict]:
    """The rule's verdict on each captured case under ``policy``. The judge's bars play no part
    in it, so a sweep over them computes it once and hands it to :func:`replay`."""
    return [rule(it.evidence, policy) for it in items]


def replay(
    items: Sequence[Captured],
    policy: Policy,
    judged: Sequence[dict[str, float]] | None,
    updates: Sequence[dict[str, float]] | None = None,
    verdicts: Sequence[Verdict] | None = None,
) -> list[dict[str, Any]]:
    """``policy``'s decisions over captured evidence: the rule's (``verdicts``, when already
    computed for a policy that differs from this one in the judge's bars at most), amended with
    the judged duplicate (and update) probabilities when given, as the gate amends them."""
    if verdicts is None:
        verdicts = rule_verdicts(items, policy)
    preds = []
    for n, (it, v) in enumerate(zip(items, verdicts, strict=True)):
        if judged is not None:
            # the judge reads the candidates at or above this policy's floor
            floor_ids = {e.memory_id for e in it.evidence if e.similarity >= policy.floor}
            dup = {m: p for m, p in judged[n].items() if m in floor_ids}
            upd = {m: p for m, p in updates[n].items() if m in floor_ids} if updates else None
            v = amended(v, dup, policy, upd)
        target = it.owners.get(v.target_id) if v.target_id else None
        preds.append(
            {
                "id": it.case["id"],
                "action": v.action,
                "target": target if v.action != "add" else None,
            }
        )
    return preds


def figures(items: Sequence[Captured], preds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    m = finite(score([it.case for it in items], list(preds)))  # NaN (no skip at all): None
    keys = (
        "cases",
        "wrongful_overwrites",
        "update_recall",
        "duplicate_precision",
        "duplicate_recall",
        "lost_information",
        "accuracy",
    )
    return {k: m[k] for k in keys}


def _correct(m: dict[str, Any]) -> int:
    return round(m["accuracy"] * m["cases"])


def choose_bars(
    items: Sequence[Captured],
    policy: Policy,
    judged: Sequence[dict[str, float]],
    updates: Sequence[dict[str, float]] | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The bars of :data:`BAR_GRID` for ``policy``'s rule amended with ``judged`` (duplicate)
    and ``updates`` (update) probabilities over ``items``. Duplicate bar: the most correct
    decisions among the bars that lose no more information than the rule alone (facts skipped
    that were new or updates: a stored duplicate can be noticed and removed, a skipped fact is
    gone); ties to less lost information, then fewer changes. Then the veto
    bar (0 without ``updates``): the most correct decisions less :data:`OVERWRITE_COST` per
    wrongful overwrite; ties to the lower bar. Returns the bars and their figures."""
    base = rule_verdicts(items, policy)
    alone = figures(items, replay(items, policy, None, verdicts=base))
    best: tuple[tuple[float, ...], dict[str, float], dict[str, Any]] | None = None
    for dup in BAR_GRID["duplicate_bar"]:
        pol = replace(policy, judge_duplicate=dup)
        m = figures(items, replay(items, pol, judged, verdicts=base))
        if m["lost_information"] > alone["lost_information"]:
            continue
        key = (_correct(m), -m["lost_information"], dup)
        if best is None or key > best[0]:
            best = (key, {"duplicate_bar": dup, "veto_bar": 0.0}, m)
    if best is None:  # every bar loses more than the rule: the judge only reports
        bars, chosen = {"duplicate_bar": 1.0, "veto_bar": 0.0}, alone
    else:
        bars, chosen = best[1], best[2]
    if updates is None:
        return bars, chosen
    top: tuple[tuple[float, ...], float, dict[str, Any]] | None = None
    for veto in BAR_GRID["veto_bar"]:
        pol = with_bars(policy, {**bars, "veto_bar": veto})
        m = figures(items, replay(items, pol, judged, updates, base))
        net = (_correct(m) - OVERWRITE_COST * m["wrongful_overwrites"], -veto)
        if top is None or net > top[0]:
            top = (net, veto, m)
    assert top is not None
    return {**bars, "veto_bar": top[1]}, top[2]


def review_figures(
    items: Sequence[Captured],
    review: Policy,
    judged: Sequence[dict[str, float]],
    bars: dict[str, float],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Review's measures over ``items`` by the rule alone and with the judge's duplicate bar
    (``bars``): updates queued with the right target, adds and skips queued. Recorded beside
    strict's figures; no bar is chosen on them."""
    cases = [it.case for it in items]

    def measures(preds: list[dict[str, Any]]) -> dict[str, Any]:
        return {**figures(items, preds), **review_measures(cases, preds)}

    base = rule_verdicts(items, review)
    alone = measures(replay(items, review, None, verdicts=base))
    pol = with_bars(review, {"duplicate_bar": bars["duplicate_bar"]})
    return alone, measures(replay(items, pol, judged, verdicts=base))


@dataclass(frozen=True)
class Fitted:
    judge: Judge
    rule_alone: dict[str, Any]
    """Strict's figures by the rule alone over the training cases."""
    with_judge: dict[str, Any]
    """Strict's figures with the judge, cross-validated (out-of-fold probabilities)."""


def fit_judge(
    items: Sequence[Captured],
    strict: Policy,
    review: Policy,
    models: dict[str, Any],
    sets: Sequence[dict[str, Any]],
    settings: BoostSettings | None = None,
    log: Callable[[str], None] = lambda line: None,
    *,
    given: bool = False,
) -> Fitted:
    """Cross-validate, choose the bars, and fit on every case (steps 2-5 of the module).
    ``given``: the sets were the user's own (``--cases``), not this checkout's."""
    settings = settings or BoostSettings()
    floor = REVIEW.floor
    log(f"cross-validating over {len({it.group for it in items})} sets ({len(items)} cases)")
    rows = labelled_rows(items, floor)
    _, x, labels = rows
    y, yu = labels["duplicate"], labels["update"]
    if not y.any():
        raise InvalidInput("the cases hold no duplicate (expected skip) to learn from")
    judged = out_of_fold(items, rows, settings, log)
    updates = out_of_fold(items, rows, settings, log, "update") if yu.any() else None
    bars, with_judge = choose_bars(items, strict, judged, updates)
    alone = figures(items, replay(items, strict, None))
    review_alone, review_judged = review_figures(items, review, judged, bars)
    trees = fit(x, y, settings)
    update_trees = fit(x, yu, settings) if updates is not None else None
    provenance = {
        "fitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "sets": list(sets),
        "sets_given": given,
        "rows": int(len(y)),
        "duplicates": int(y.sum()),
        "updates": int(yu.sum()),
        "overwrite_cost": OVERWRITE_COST,
        "floor": floor,
        "settings": settings.__dict__,
        "gate_code": gate_code(),
        "cpu": cpu()[0],
        "isa": list(cpu()[1]),
        "bar_grid": {k: list(v) for k, v in BAR_GRID.items()},
        "cross_validation": {
            "folds": "leave one set out" if len({it.group for it in items}) >= 3 else "5 folds",
            "strict_rule_alone": alone,
            "strict_with_judge": with_judge,
            "review_rule_alone": review_alone,
            "review_with_judge": review_judged,
        },
    }
    judge = Judge(
        trees,
        bars["duplicate_bar"],
        models,
        provenance,
        updates=update_trees,
        veto_bar=bars["veto_bar"] if update_trees is not None else 0.0,
    )
    return Fitted(judge, alone, with_judge)


def gate_code() -> str:
    """sha256 of the code whose measurements the judge learns from: every ``.py`` file under
    ``engine/gate`` and ``engine/tuning``, by relative path and content. A judge fitted by
    other code read other features (or the same ones computed otherwise), so a plain
    ``memgate models judge`` refits it."""
    import hashlib

    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in ("gate", "tuning"):
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _up_to_date(
    path: Path,
    models: dict[str, Any],
    sets: list[dict[str, Any]],
    settings: BoostSettings,
    *,
    given: bool,
) -> str:
    """Why the judge at ``path`` needs no fit ("" when it does): it was fitted with these
    models and settings, on this CPU's instruction sets, by this gate code (:func:`gate_code`)
    and on ``sets``; or, when these are the checkout's sets (not ``given``), on sets a user
    gave, which a plain ``memgate models judge`` (``make models``) keeps wherever and by
    whichever code they were fitted (saying so when the code was other)."""
    from engine.errors import ModelError
    from engine.gate.judge.store import fitted_elsewhere, load_judge

    if not path.is_file():
        return ""
    try:
        judge = load_judge(path)
    except ModelError:
        return ""
    p = judge.provenance
    same = (
        dict(judge.models) == models
        and p.get("settings") == settings.__dict__
        and p.get("bar_grid") == {k: list(v) for k, v in BAR_GRID.items()}
        and p.get("overwrite_cost") == OVERWRITE_COST
    )
    if not same:
        return ""
    if not p.get("sets_given") and fitted_elsewhere(p):
        return ""  # fitted with another CPU's kernels (int8 scores differ a little): refit here
    same_code = p.get("gate_code") == gate_code()
    if not given and p.get("sets_given"):
        names = ", ".join(str(s.get("name")) for s in p.get("sets", []))
        other = "" if same_code else " by other gate code (refit it: --cases on your sets)"
        return f"fitted on your own sets ({names}){other}: kept; --force refits on this checkout's"
    if not same_code:
        return ""
    return "the same models, sets, settings and gate code" if p.get("sets") == sets else ""


def _line(m: dict[str, Any]) -> str:
    def f(x: Any, digits: int) -> str:
        return "-" if x is None else f"{x:.{digits}f}"

    return (
        f"wrongful overwrites {m['wrongful_overwrites']}, update recall "
        f"{f(m['update_recall'], 3)}, duplicates P/R {f(m['duplicate_precision'], 2)}/"
        f"{f(m['duplicate_recall'], 2)}, lost information {m['lost_information']}, accuracy "
        f"{f(m['accuracy'], 3)}"
    )


def command(args: Any, engine_settings: Any) -> int:
    """Run ``memgate models judge``."""
    from dataclasses import replace as dc_replace

    from engine.app import open_engine
    from engine.gate.gate import policy_for
    from engine.gate.judge.store import judge_path, model_identity, save_judge

    given = bool(args.cases)
    paths = [Path(p) for p in args.cases] if given else default_sets()
    if not paths:
        raise InvalidInput("no labelled sets found: give --cases FILE.jsonl ...")
    sets: list[tuple[str, list[dict[str, Any]]]] = []
    described: list[dict[str, Any]] = []
    for path in paths:
        if path.stem in HELD_OUT:
            raise InvalidInput(f"{path}: held out (benchmarks/data/README.md), never fitted on")
        cases = load_cases(path)
        if not is_labelled(cases):
            raise InvalidInput(f"{path}: the judge needs labelled cases (category and expected)")
        if path.stem in dict(sets):
            raise InvalidInput(f"{path}: two sets named {path.stem}")
        sets.append((path.stem, cases))
        described.append({"name": path.stem, "sha256": sha256_of(path), "cases": len(cases)})
    log = (lambda line: print(line, flush=True)) if not args.quiet else (lambda line: None)
    boost = BoostSettings(trees=args.trees)
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_engine(
            dc_replace(engine_settings, judge=False), db_path=Path(tmp) / "judge.db"
        ) as eng,
    ):
        g = eng.gate
        models = {"embedder": model_identity(g.embedder), "nli": model_identity(g.nli)}
        path = judge_path(engine_settings.cache_dir, models["embedder"], models["nli"])
        why = "" if args.force else _up_to_date(path, models, described, boost, given=given)
        if why:
            log(f"{path} is up to date ({why}); --force refits it")
            return 0
        log(
            f"capturing {sum(len(c) for _, c in sets)} cases of {len(sets)} sets with "
            f"{models['embedder']['name']}/{models['embedder']['variant']} + "
            f"{models['nli']['name']}/{models['nli']['variant']}"
        )
        items = capture(g, sets)
        strict = dc_replace(policy_for("strict", g.nli, g.embedder), judge=True)
        review = dc_replace(policy_for("review", g.nli, g.embedder), judge=True)
    log(f"captured in {time.perf_counter() - start:.0f} s")
    fitted = fit_judge(items, strict, review, models, described, boost, log, given=given)
    save_judge(path, fitted.judge)
    j = fitted.judge
    log(f"strict, rule alone:            {_line(fitted.rule_alone)}")
    log(f"strict, with the judge (CV):   {_line(fitted.with_judge)}")
    cv = j.provenance["cross_validation"]
    for label, m in (
        ("rule alone", cv["review_rule_alone"]),
        ("with the judge (CV)", cv["review_with_judge"]),
    ):
        log(
            f"review, {label}: updates queued with the right target "
            f"{m['updates_queued_right_target']:.3f}, adds and skips queued "
            f"{m['adds_skips_queued']:.3f}"
        )
    log(f"bars: duplicate {j.duplicate_bar:.2f}, veto {j.veto_bar:.2f}")
    log(f"wrote {path} in {time.perf_counter() - start:.0f} s")
    if args.json:
        bars = {"duplicate": j.duplicate_bar, "veto": j.veto_bar}
        print(json.dumps({"path": str(path), "bars": bars, **j.provenance}), file=sys.stdout)
    return 0
