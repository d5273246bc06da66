"""``memgate calibrate``: choose a policy's thresholds on a user's own labelled cases.

The sweep. Every setting of the grid (the similarity floor and the contradiction thresholds by
default, and the served judge's veto or queue bar when there is one; any numeric policy field on
request) is a copy of the base policy with those overrides. The cases' memories are stored once
(:func:`engine.tuning.evaluate.stage`), and each setting is one dry-run triage of every
incoming fact.
The models are the expensive part, and they see every text and every pair once: the gate is
given :class:`MemoEmbedder` / :class:`MemoNLI`, which wrap the loaded models and remember each
result. The first setting run is the grid's lowest corner, which asks for the most pairs; every
later setting is re-decided from remembered vectors and probabilities (the same models' outputs;
:attr:`Sweep.model_work` counts what was computed after the first setting, normally nothing).
The gate's decision step itself is not re-entered from cached scores: it is not part of the
gate's public surface, and going through ``triage`` keeps calibrated figures exactly what
``memgate eval`` measures.

The choice (:func:`choose`). Among the settings with at most ``max_wrongful`` wrongful
overwrites (and, for review, at most ``max_needless`` of the adds and skips queued), the one
with the highest update recall (review: updates handled); ties go to fewer wrongful overwrites,
then to the safer setting: higher thresholds (:data:`SAFER` says which way is safer for each
field).

The optimism (:func:`cross_validate`). The cases are dealt into ``k`` folds stratified by
category and expected action; each fold is scored with the setting chosen on the other ``k - 1``
folds. Pooled over the folds, that is the estimate of what the choice is worth on cases it was
not chosen on; the in-sample figures of the chosen setting are always at least as flattering.

Pure except :func:`sweep` (which drives a gate) and :func:`plot` (matplotlib, the bench extra).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidInput
from engine.gate.policy import POLICY_NAMES, Policy
from engine.tuning.evaluate import Staged, decide_cases, stage
from engine.tuning.scoring import review_measures, score

__all__ = [
    "SAFER",
    "CrossValidation",
    "Grid",
    "MemoEmbedder",
    "MemoNLI",
    "OBJECTIVES",
    "Sweep",
    "Trial",
    "choose",
    "cross_validate",
    "default_grid",
    "judge_grid",
    "folds",
    "model_provenance",
    "objective_for",
    "parse_grid",
    "plot",
    "sha256_of",
    "summary",
    "sweep",
    "table",
    "within",
]

SAFER: dict[str, int] = {
    "floor": 1,
    "contradiction": 1,
    "dated_contradiction": 1,
    "auto_floor": 1,
    "value_change_similarity": 1,
    "duplicate_similarity": 1,
    "ambiguity_margin": 1,
    "dominance_margin": -1,
    "partial_values": -1,
    "judge_veto": 1,
}
"""+1: a higher value replaces less (safer); -1: a lower one does (a smaller dominance margin
lets a more similar, non-conflicting memory veto the replacement more often; fewer values left
standing send more multi-value memories to review). A higher ``judge_veto`` holds more
replacements back. Fields not listed count higher as safer."""

_NOT_SWEPT = {"name", "mode"}
DEFAULT_FIELDS = ("floor", "contradiction", "dated_contradiction")
JUDGE_FIELDS = ("judge_veto",)
"""The judge's bars the default grid sweeps when the served models have a judge with update
trees (:func:`judge_grid`): the veto, where the policy replaces. Its duplicate bar is not
swept: no objective here weighs duplicates."""
DEFAULT_MAX_NEEDLESS = 0.10
"""The share of adds and skips a review setting may queue (``--max-needless``): issue 12's
bound on a reviewer's wasted work."""


# -- the grid -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grid:
    """The settings swept: the cartesian product of each field's values (sorted ascending)."""

    fields: tuple[str, ...]
    values: tuple[tuple[float, ...], ...]

    def settings(self) -> list[dict[str, float]]:
        """Every setting, the lowest corner first (it asks the models for the most)."""
        return [
            dict(zip(self.fields, combo, strict=True)) for combo in itertools.product(*self.values)
        ]

    def safety(self, setting: Mapping[str, float]) -> tuple[float, tuple[float, ...]]:
        """Larger is safer: the summed position of each value in its field's range (0 at the
        least safe end, 1 at the safest), then the directed values themselves."""
        total = 0.0
        directed = []
        for name, vals in zip(self.fields, self.values, strict=True):
            sign = SAFER.get(name, 1)
            pos = vals.index(setting[name]) / (len(vals) - 1) if len(vals) > 1 else 0.0
            total += pos if sign > 0 else 1.0 - pos
            directed.append(sign * setting[name])
        return total, tuple(directed)

    def to_json(self) -> dict[str, list[float]]:
        return {n: list(v) for n, v in zip(self.fields, self.values, strict=True)}


def _numeric_fields(base: Policy) -> dict[str, type]:
    out: dict[str, type] = {}
    for f in fields(base):
        value = getattr(base, f.name)
        if f.name in _NOT_SWEPT or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[f.name] = type(value)
    return out


def _values(spec: str, name: str, kind: type) -> list[float]:
    """``a,b,c`` or ``start:stop:step`` (stop included)."""
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if step <= 0 or stop < start:
                raise ValueError
            count = int(math.floor((stop - start) / step + 1e-9)) + 1
            if count > 1000:
                raise InvalidInput(f"--grid {name}: {count} values; at most 1000")
            raw = [start + i * step for i in range(count)]
        else:
            raw = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise InvalidInput(
            f"--grid {name}={spec}: give values as a,b,c or start:stop:step"
        ) from None
    if not raw:
        raise InvalidInput(f"--grid {name}: no values")
    if kind is int:
        if any(v != int(v) for v in raw):
            raise InvalidInput(f"--grid {name}: {name} takes whole numbers")
        return sorted({float(int(v)) for v in raw})
    return sorted({round(v, 6) for v in raw})


def default_grid(base: Policy) -> dict[str, list[float]]:
    """The floor around the base's (-0.10 to +0.10 by 0.05) and the two forward contradiction
    bars over their useful range, each grid holding the base's own value."""
    floors = {round(base.floor + d, 2) for d in (-0.10, -0.05, 0.0, 0.05, 0.10)}
    return {
        "floor": sorted(f for f in floors if 0.0 <= f <= 1.0),
        "contradiction": sorted({0.85, 0.90, 0.95, 0.98, base.contradiction}),
        "dated_contradiction": sorted({0.70, 0.80, 0.90, base.dated_contradiction}),
    }


def judge_grid(base: Policy, judge: Any) -> dict[str, list[float]]:
    """The served judge's bars over their useful range, each holding the base's own value (its
    fitted bar): ``judge_veto`` when ``base`` can replace (strict, review-uncertain). Empty
    without a judge with update trees, or with ``base.judge`` off: then it changes nothing."""
    if judge is None or getattr(judge, "updates", None) is None or not base.judge:
        return {}
    out: dict[str, list[float]] = {}
    if base.mode == "replace" or base.review_scope == "uncertain":
        out["judge_veto"] = sorted({0.0, 0.3, 0.6, base.judge_veto})
    return out


def parse_grid(
    specs: Sequence[str], base: Policy, *, defaults: bool = True, judge: Any = None
) -> Grid:
    """``name=values`` specs over the default grid (a named field replaces its default values;
    other numeric fields are added). Every value is validated like an override. With the
    served ``judge``, the default grid adds its bars (:func:`judge_grid`)."""
    numeric = _numeric_fields(base)
    chosen: dict[str, list[float]] = (
        {**default_grid(base), **judge_grid(base, judge)} if defaults else {}
    )
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip()
        if not sep:
            raise InvalidInput(f"--grid {spec!r}: write name=values, e.g. floor=0.5:0.7:0.05")
        if name not in numeric:
            raise InvalidInput(
                f"--grid {name}: not a numeric policy field (choose from {', '.join(numeric)})"
            )
        chosen[name] = _values(values, name, numeric[name])
    if not chosen:
        raise InvalidInput("the grid is empty: give --grid name=values")
    for name, vals in chosen.items():
        for v in vals:
            base.with_overrides({name: int(v) if numeric[name] is int else v})
    first = (*DEFAULT_FIELDS, *JUDGE_FIELDS)
    order = [n for n in first if n in chosen] + [n for n in chosen if n not in first]
    size = math.prod(len(chosen[n]) for n in order)
    if size > 5000:
        raise InvalidInput(f"the grid has {size} settings; at most 5000")
    return Grid(tuple(order), tuple(tuple(chosen[n]) for n in order))


def _overrides(base: Policy, setting: Mapping[str, float]) -> dict[str, Any]:
    numeric = _numeric_fields(base)
    return {k: int(v) if numeric.get(k) is int else v for k, v in setting.items()}


# -- memoised models ------------------------------------------------------------------------------
class MemoEmbedder:
    """The loaded embedder, remembering each text's vector: a text is embedded once."""

    def __init__(self, embedder: Any) -> None:
        self._inner = embedder
        self.dim = embedder.dim
        self._rows: dict[str, np.ndarray] = {}
        self.computed = 0
        """Texts the wrapped model embedded."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        todo = list(dict.fromkeys(t for t in texts if t not in self._rows))
        if todo:
            for text, row in zip(todo, self._inner.embed(todo), strict=True):
                self._rows[text] = row
            self.computed += len(todo)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._rows[t] for t in texts])


class MemoNLI:
    """The loaded NLI model, remembering each (premise, hypothesis) pair's probabilities."""

    def __init__(self, nli: Any) -> None:
        self._inner = nli
        self.contradiction_index = nli.contradiction_index
        self.entailment_index = nli.entailment_index
        self._rows: dict[tuple[str, str], np.ndarray] = {}
        self.computed = 0
        """Pairs the wrapped model scored."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
        todo = list(dict.fromkeys(p for p in pairs if p not in self._rows))
        if todo:
            for pair, row in zip(todo, self._inner.score(todo), strict=True):
                self._rows[pair] = row
            self.computed += len(todo)
        if not pairs:
            return self._inner.score([])
        return np.stack([self._rows[p] for p in pairs])


# -- the sweep ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trial:
    """One setting's predictions, one per case in the cases' order."""

    setting: dict[str, float]
    predictions: tuple[dict[str, Any], ...]


@dataclass
class Sweep:
    cases: list[dict[str, Any]]
    base: Policy
    grid: Grid
    trials: list[Trial]
    base_trial: Trial
    """The base policy as it is (no overrides), for reference."""
    model_work: dict[str, int] = field(default_factory=dict)
    """Texts embedded and pairs scored by the models, in all and after the first setting."""


def sweep(
    gate: Any,
    cases: Sequence[dict[str, Any]],
    base: Policy,
    grid: Grid,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Sweep:
    """Run every setting of ``grid`` on ``cases`` through ``gate``, whose embedder and NLI
    should be :class:`MemoEmbedder` / :class:`MemoNLI` (then the models see each input once)."""
    staged: Staged = stage(gate, cases, prefix="calibrate")
    settings = grid.settings()
    trials = []
    before: tuple[int, int] = (0, 0)
    for n, setting in enumerate(settings):
        rows = decide_cases(gate, staged, base.with_overrides(_overrides(base, setting)))
        trials.append(Trial(setting, tuple(p for p, _ in rows)))
        if n == 0:
            before = _computed(gate)
        if progress is not None:
            progress(n + 1, len(settings))
    base_trial = Trial({}, tuple(p for p, _ in decide_cases(gate, staged, base)))
    texts, pairs = _computed(gate)
    work = {
        "texts_embedded": texts,
        "pairs_scored": pairs,
        "texts_embedded_after_first_setting": texts - before[0],
        "pairs_scored_after_first_setting": pairs - before[1],
    }
    return Sweep(list(cases), base, grid, trials, base_trial, work)


def _computed(gate: Any) -> tuple[int, int]:
    return (
        int(getattr(gate.embedder, "computed", 0)),
        int(getattr(gate.nli, "computed", 0)),
    )


# -- choosing -------------------------------------------------------------------------------------
def summary(
    cases: Sequence[dict[str, Any]], predictions: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """The figures a setting is judged and shown by."""
    m = score(cases, predictions)
    r = review_measures(cases, predictions)
    return {
        "cases": m["cases"],
        "wrongful_overwrites": m["wrongful_overwrites"],
        "on_trap_cases": m["wrongful_overwrite_breakdown"]["on_trap_cases"],
        "update_recall": m["update_recall"],
        "update_precision": m["update_precision"],
        "duplicate_precision": m["duplicate_precision"],
        "lost_information": m["lost_information"],
        "accuracy": m["accuracy"],
        "review_rate": m["review_rate"],
        "updates_queued_right_target": r["updates_queued_right_target"],
        "updates_handled": m["update_recall"] + r["updates_queued_right_target"],
        "adds_skips_queued": r["adds_skips_queued"],
    }


def _recall(m: Mapping[str, Any], name: str = "update_recall") -> float:
    x = m[name]
    return 0.0 if isinstance(x, float) and math.isnan(x) else float(x)


OBJECTIVES = {
    "update_recall": "update recall (true updates replaced, right target)",
    "updates_handled": "true updates replaced or queued for review with the right target",
}


def objective_for(policy: Policy) -> str:
    """What a setting maximises: update recall for strict; for review, where queueing a true
    update with its target is the intended outcome, the updates handled either way."""
    return "updates_handled" if policy.mode == "review" else "update_recall"


def within(m: Mapping[str, Any], max_wrongful: int, max_needless: float | None = None) -> bool:
    """Whether a setting's figures ``m`` (:func:`summary`) are within the bounds."""
    if m["wrongful_overwrites"] > max_wrongful:
        return False
    return max_needless is None or _recall(m, "adds_skips_queued") <= max_needless + 1e-12


def choose(
    grid: Grid,
    trials: Sequence[Trial],
    cases: Sequence[dict[str, Any]],
    max_wrongful: int = 0,
    subset: Sequence[int] | None = None,
    objective: str = "update_recall",
    max_needless: float | None = None,
) -> int | None:
    """Index of the chosen trial judged on ``cases`` (or their ``subset``), or None when no
    setting is within the bounds there: at most ``max_wrongful`` wrongful overwrites and, when
    given, at most ``max_needless`` of the adds and skips queued for review. Maximises
    ``objective`` (:data:`OBJECTIVES`); ties go to fewer wrongful overwrites, then
    (``updates_handled``) fewer adds and skips queued, then to the safer setting."""
    idx = list(range(len(cases))) if subset is None else list(subset)
    on = [cases[i] for i in idx]
    best: tuple[Any, ...] | None = None
    chosen = None
    for n, trial in enumerate(trials):
        m = summary(on, [trial.predictions[i] for i in idx])
        if not within(m, max_wrongful, max_needless):
            continue
        needless = _recall(m, "adds_skips_queued") if objective == "updates_handled" else 0.0
        key = (
            _recall(m, objective),
            -m["wrongful_overwrites"],
            -needless,
            grid.safety(trial.setting),
        )
        if best is None or key > best:
            best, chosen = key, n
    return chosen


def folds(cases: Sequence[dict[str, Any]], k: int, seed: int = 0) -> list[list[int]]:
    """``k`` folds of case indices, stratified by (category, expected action), reproducible."""
    if not 2 <= k <= len(cases):
        raise InvalidInput(f"--folds must be in [2, {len(cases)}] for {len(cases)} cases, got {k}")
    rng = random.Random(seed)
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, case in enumerate(cases):
        groups[(str(case.get("category")), str(case["expected"]["action"]))].append(i)
    out: list[list[int]] = [[] for _ in range(k)]
    dealt = 0
    for key in sorted(groups):
        members = groups[key]
        rng.shuffle(members)
        for i in members:
            out[dealt % k].append(i)
            dealt += 1
    return [sorted(f) for f in out]


@dataclass(frozen=True)
class CrossValidation:
    k: int
    seed: int
    folds: list[dict[str, Any]]
    """Per fold: cases, the setting chosen on the other folds (``None`` when none met the
    bound there: the safest setting is used), its figures there and on this fold."""
    estimate: dict[str, Any]
    """The figures of the pooled held-out predictions: each case predicted by the setting
    chosen without it."""


def cross_validate(
    grid: Grid,
    trials: Sequence[Trial],
    cases: Sequence[dict[str, Any]],
    max_wrongful: int = 0,
    k: int = 5,
    seed: int = 0,
    objective: str = "update_recall",
    max_needless: float | None = None,
) -> CrossValidation:
    parts = folds(cases, k, seed)
    safest = max(range(len(trials)), key=lambda n: grid.safety(trials[n].setting))
    pooled: list[dict[str, Any] | None] = [None] * len(cases)
    rows = []
    for f, held in enumerate(parts):
        held_set = set(held)
        train = [i for i in range(len(cases)) if i not in held_set]
        # A bound of N overwrites on all cases is N x (k-1)/k on the training folds; keep the
        # user's N (rounding down would forbid what they allowed).
        pick = choose(grid, trials, cases, max_wrongful, train, objective, max_needless)
        use = safest if pick is None else pick
        trial = trials[use]
        for i in held:
            pooled[i] = trial.predictions[i]
        rows.append(
            {
                "fold": f + 1,
                "cases": len(held),
                "setting": dict(trial.setting),
                "met_bound_on_train": pick is not None,
                "train": summary([cases[i] for i in train], [trial.predictions[i] for i in train]),
                "held_out": summary([cases[i] for i in held], [trial.predictions[i] for i in held]),
            }
        )
    preds = [p for p in pooled if p is not None]
    return CrossValidation(k, seed, rows, summary(cases, preds))


# -- reporting ------------------------------------------------------------------------------------
def _f(x: Any) -> str:
    if isinstance(x, float):
        return "-" if math.isnan(x) else f"{x:.3f}"
    return str(x)


def _value(v: float) -> str:
    return f"{v:g}"


def table(
    grid: Grid,
    rows: Sequence[tuple[Mapping[str, float], Mapping[str, Any]]],
    *,
    mark: int | None = None,
    limit: int = 0,
    objective: str = "update_recall",
) -> str:
    """Settings and their figures, the safest-scoring first (fewest wrongful overwrites, then
    the highest ``objective``); ``mark`` (an index into ``rows``) gets a ``*``. Under the
    review objective two more columns: the updates handled and the adds and skips queued."""
    review = objective == "updates_handled"
    heads = [*grid.fields, "wrongful overwrites", "update recall", "accuracy", "review rate"]
    if review:
        heads += ["updates handled", "queued needlessly"]
    order = sorted(
        range(len(rows)),
        key=lambda n: (
            rows[n][1]["wrongful_overwrites"],
            -_recall(rows[n][1], objective),
            _recall(rows[n][1], "adds_skips_queued") if review else 0.0,
            -rows[n][1]["accuracy"],
        ),
    )
    shown = order if limit <= 0 else order[:limit]
    if mark is not None and mark not in shown:
        shown.append(mark)
    cells = [
        [
            ("* " if n == mark else "  ") + _value(rows[n][0][grid.fields[0]]),
            *(_value(rows[n][0][name]) for name in grid.fields[1:]),
            str(rows[n][1]["wrongful_overwrites"]),
            _f(rows[n][1]["update_recall"]),
            _f(rows[n][1]["accuracy"]),
            _f(rows[n][1]["review_rate"]),
            *(
                (_f(rows[n][1]["updates_handled"]), _f(rows[n][1]["adds_skips_queued"]))
                if review
                else ()
            ),
        ]
        for n in shown
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    if len(shown) < len(rows):
        lines.append(f"  ... {len(rows) - len(shown)} more settings (all in the sweep JSON)")
    return "\n".join(lines)


def plot(
    points: Sequence[tuple[Mapping[str, float], Mapping[str, Any]]],
    path: Path,
    *,
    chosen: int | None,
    max_wrongful: int,
    title: str,
    objective: str = "update_recall",
) -> None:
    """Wrongful overwrites against update recall (or ``objective``), one point per setting."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5), layout="constrained")
    xs = [_recall(m, objective) for _, m in points]
    ys = [m["wrongful_overwrites"] for _, m in points]
    acc = [m["accuracy"] for _, m in points]
    dots = ax.scatter(xs, ys, c=acc, cmap="viridis", s=36, alpha=0.75, edgecolors="none")
    fig.colorbar(dots, ax=ax, label="accuracy")
    ax.axhline(max_wrongful + 0.5, color="#c0392b", ls="--", lw=1, label="bound on overwrites")
    if chosen is not None:
        ax.scatter([xs[chosen]], [ys[chosen]], marker="*", s=260, color="#c0392b", label="chosen")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel(f"{objective.replace('_', ' ')} (higher is better)")
    ax.set_ylabel("wrongful overwrites (lower is better)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pyplot() -> Any:
    """matplotlib's pyplot (Agg), or a clear exit naming the extra that provides it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(
            "memgate calibrate: the plot needs matplotlib, from the bench extra "
            "(pip install 'memgate[bench]'); or pass --no-plot"
        ) from None
    return plt


# -- provenance -----------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_provenance(model: Any) -> dict[str, Any]:
    """Name, variant and hashes of a loaded model (its manifest's seal and its graph's)."""
    m = model.manifest
    seal = None
    try:
        raw = json.loads((Path(m.directory) / "manifest.json").read_text(encoding="utf-8"))
        seal = raw.get("manifest_sha256")
    except (OSError, ValueError):
        pass
    return {
        "name": m.name,
        "variant": m.variant,
        "weights": m.weights,
        "manifest_sha256": seal,
        "model_sha256": (m.files.get(m.model_file) or {}).get("sha256"),
    }


def finite(obj: Any) -> Any:
    """``obj`` with NaN floats as None (JSON has no NaN)."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(v) for v in obj]
    return obj


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the command ----------------------------------------------------------------------------------
def add_arguments(p: Any) -> None:
    """``memgate calibrate``'s own flags (the CLI adds the engine flags)."""
    p.add_argument("--cases", required=True, help="labelled cases (JSON Lines, eval format)")
    p.add_argument("--policy", choices=list(POLICY_NAMES), default="strict", help="base policy")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="NAME=VALUES",
        help="a numeric policy field and its values, a,b,c or start:stop:step (repeatable); "
        "replaces that field's default values (default grid: floor base-0.1..base+0.1 by "
        "0.05, contradiction 0.85,0.9,0.95,0.98, dated_contradiction 0.7,0.8,0.9; with a "
        "judge for the served models also judge_veto 0,0.3,0.6 where the policy replaces, "
        "with the judge's own bar)",
    )
    p.add_argument(
        "--only-grid",
        action="store_true",
        help="sweep only the --grid fields (no default grid for the others)",
    )
    p.add_argument(
        "--max-wrongful",
        type=int,
        default=0,
        help="most wrongful overwrites a chosen setting may make on the cases (default 0)",
    )
    p.add_argument(
        "--max-needless",
        type=float,
        default=None,
        metavar="SHARE",
        help="largest share of the adds and skips a chosen setting may queue for review "
        f"(default {DEFAULT_MAX_NEEDLESS:g} for a review policy, no bound for strict)",
    )
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the fold assignment")
    p.add_argument("--out", required=True, help="the policy file to write (JSON)")
    p.add_argument("--plot", help="the PNG to draw (default: next to --out, .png)")
    p.add_argument("--no-plot", action="store_true", help="no PNG (no matplotlib needed)")
    p.add_argument(
        "--show", type=int, default=30, help="rows of the table printed (0: all; default 30)"
    )


def command(args: Any, engine_settings: Any) -> int:
    """Run ``memgate calibrate``: sweep, choose, cross-validate, write the policy file."""
    import sys
    import tempfile

    from engine.app import open_engine
    from engine.gate.gate import Gate
    from engine.gate.policy import policy_by_name
    from engine.tuning.evaluate import is_labelled, load_cases
    from engine.tuning.policy_file import PolicyFile, dump_policy_file

    cases_path = Path(args.cases)
    cases = load_cases(cases_path)
    digest = sha256_of(cases_path)
    if not is_labelled(cases):
        raise InvalidInput(
            f"{cases_path}: calibrate needs labelled cases (category and expected on every "
            "line); `memgate eval` predicts unlabelled ones"
        )
    base = policy_by_name(args.policy)
    grid = parse_grid(args.grid, base, defaults=not args.only_grid)
    if args.max_wrongful < 0:
        raise InvalidInput("--max-wrongful must be at least 0")
    max_needless = args.max_needless
    if max_needless is not None and not 0.0 <= max_needless <= 1.0:
        raise InvalidInput(f"--max-needless must be in [0, 1], got {max_needless}")
    if max_needless is None and base.mode == "review":
        max_needless = DEFAULT_MAX_NEEDLESS
    folds(cases, args.folds, args.seed)  # a bad --folds fails before the models load
    out = Path(args.out)
    plot_path = None if args.no_plot else Path(args.plot) if args.plot else out.with_suffix(".png")
    if plot_path is not None:
        pyplot()  # a missing extra fails now, not after the sweep
        plot_path.parent.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)

    def progress(done: int, total: int) -> None:
        if done == 1 or done == total or done % 10 == 0:
            print(f"  setting {done}/{total}", file=sys.stderr, flush=True)

    with (
        tempfile.TemporaryDirectory() as tmp,
        open_engine(engine_settings, db_path=Path(tmp) / "calibrate.db") as eng,
    ):
        g = eng.gate
        memo = Gate(g.store, g.index, MemoEmbedder(g.embedder), MemoNLI(g.nli), g.settings, g.judge)
        base = g.policy(base.name)  # with these models' thresholds and their judge's bars
        # the served judge's bars join the default grid (validated above without them)
        grid = parse_grid(args.grid, base, defaults=not args.only_grid, judge=g.judge)
        judge = _judge_note(g.judge, base, grid, cases_path.name, digest)
        dims = " x ".join(f"{n} ({len(v)})" for n, v in zip(grid.fields, grid.values, strict=True))
        print(
            f"calibrate {base.name} on {cases_path.name} ({len(cases)} cases): "
            f"{len(grid.settings())} settings of {dims}",
            flush=True,
        )
        result = sweep(memo, cases, base, grid, progress=progress)
        models = {"embedder": model_provenance(g.embedder), "nli": model_provenance(g.nli)}
    work = result.model_work
    print(
        f"models: {models['embedder']['name']}/{models['embedder']['variant']}, "
        f"{models['nli']['name']}/{models['nli']['variant']}; computed {work['texts_embedded']} "
        f"embeddings and {work['pairs_scored']} NLI pairs, of which "
        f"{work['texts_embedded_after_first_setting']} and "
        f"{work['pairs_scored_after_first_setting']} after the first setting "
        "(the others re-decided from remembered model outputs)"
    )
    rows = [(t.setting, summary(cases, t.predictions)) for t in result.trials]
    objective = objective_for(base)
    picked = choose(
        grid,
        result.trials,
        cases,
        args.max_wrongful,
        objective=objective,
        max_needless=max_needless,
    )
    safe = sum(1 for _, m in rows if within(m, args.max_wrongful, max_needless))
    bounds = f"at most {args.max_wrongful} wrongful overwrites"
    if max_needless is not None:
        bounds += f" and at most {max_needless:.0%} of the adds and skips queued"
    print(
        f"\nsafe zone: {safe} of {len(rows)} settings with {bounds} "
        f"(* = chosen: the most {OBJECTIVES[objective]})"
    )
    print(table(grid, rows, mark=picked, limit=args.show, objective=objective))
    base_m = summary(cases, result.base_trial.predictions)
    print(f"\nbase {base.name} as it is: {_line(base_m)}")
    cv = cross_validate(
        grid,
        result.trials,
        cases,
        args.max_wrongful,
        args.folds,
        args.seed,
        objective,
        max_needless,
    )
    report = {
        "cases": {"path": str(cases_path), "sha256": digest, "count": len(cases)},
        "base": base.name,
        "grid": grid.to_json(),
        "max_wrongful_overwrites": args.max_wrongful,
        "max_needless": max_needless,
        "models": models,
        "judge": judge,
        "model_work": work,
        "base_metrics": base_m,
        "settings": [{"setting": s, "metrics": m} for s, m in rows],
        "chosen": None if picked is None else rows[picked][0],
        "cross_validation": {
            "k": cv.k,
            "seed": cv.seed,
            "folds": cv.folds,
            "estimate": cv.estimate,
        },
    }
    if plot_path is not None:
        plot(
            rows,
            plot_path,
            chosen=picked,
            max_wrongful=args.max_wrongful,
            title=f"{base.name} on {cases_path.name}: {len(rows)} settings",
            objective=objective,
        )
    sweep_path = out.with_suffix(".sweep.json")
    if picked is None:
        least = min(m["wrongful_overwrites"] for _, m in rows)
        fewest = min(_recall(m, "adds_skips_queued") for _, m in rows)
        print(
            f"\nno setting has {bounds} (the fewest overwrites: {least}; the smallest share "
            f"queued needlessly: {fewest:.1%}); no policy file written. Widen the grid toward "
            "higher thresholds, or allow more with --max-wrongful / --max-needless.",
            file=sys.stderr,
        )
        _dump(sweep_path, report)
        return 1
    chosen_setting, chosen_m = rows[picked]
    print(f"\nchosen: {_setting(chosen_setting)}: {_line(chosen_m)}")
    print(_cv_text(cv, chosen_m))
    pf = PolicyFile(
        base.name,
        _overrides(base, chosen_setting),
        finite(
            {
                "tool": "memgate calibrate",
                "created": now_utc(),
                "cases": report["cases"],
                "models": models,
                "grid": grid.to_json(),
                "max_wrongful_overwrites": args.max_wrongful,
                "max_needless": max_needless,
                "judge": judge,
                "selection": f"max {objective} with wrongful overwrites <= max"
                + ("" if max_needless is None else " and adds and skips queued <= max_needless")
                + "; ties: fewer wrongful overwrites, then higher thresholds",
                "metrics": chosen_m,
                "cross_validation": {"k": cv.k, "seed": cv.seed, "estimate": cv.estimate},
            }
        ),
    )
    dump_policy_file(out, pf)
    _dump(sweep_path, report)
    print(f"\nwrote {out} ({pf.describe()}); sweep: {sweep_path}")
    if plot_path is not None:
        print(f"plot: {plot_path}")
    return 0


def _judge_note(
    judge: Any, base: Policy, grid: Grid, cases_name: str, digest: str
) -> dict[str, Any] | None:
    """The served judge as the sweep used it (None without one), with warnings: judge bars
    swept with no judge change nothing; a judge fitted on these very cases makes its bars'
    figures here in-sample."""
    import sys

    swept = [n for n in grid.fields if n.startswith("judge_")]
    if judge is None or not base.judge:
        if swept:
            print(
                f"warning: {', '.join(swept)} swept, but no judge decides here (none fitted for "
                "these models, or the policy turns it off): those values change nothing",
                file=sys.stderr,
            )
        return None
    fitted_on = [
        str(s.get("name")) for s in judge.provenance.get("sets", []) if s.get("sha256") == digest
    ]
    if fitted_on:
        print(
            f"warning: the served judge was fitted on these cases ({cases_name}, its set "
            f"{fitted_on[0]}): its figures here are in-sample and flatter it; calibrate on cases "
            "it was not fitted on",
            file=sys.stderr,
        )
    return {
        "seal": judge.seal,
        "bars": {n: getattr(base, n) for n in ("judge_duplicate", *JUDGE_FIELDS)},
        "fitted_on_these_cases": bool(fitted_on),
    }


def _dump(path: Path, obj: Any) -> None:
    from engine.backfill.checkpoint import atomic_write

    atomic_write(path, json.dumps(finite(obj), indent=1, allow_nan=False) + "\n", durable=False)


def _setting(setting: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={_value(v)}" for k, v in setting.items())


def _line(m: Mapping[str, Any]) -> str:
    text = (
        f"wrongful overwrites {m['wrongful_overwrites']} ({m['on_trap_cases']} on traps), "
        f"update recall {_f(m['update_recall'])}, accuracy {_f(m['accuracy'])}, "
        f"review rate {_f(m['review_rate'])}"
    )
    if m.get("review_rate"):  # what a reviewer gets: the updates handled and the needless
        text += (
            f", updates handled {_f(m['updates_handled'])}, adds and skips queued "
            f"{_f(m['adds_skips_queued'])}"
        )
    return text


def _cv_text(cv: CrossValidation, in_sample: Mapping[str, Any]) -> str:
    lines = [
        f"\n{cv.k}-fold cross-validation (chosen on {cv.k - 1} folds, scored on the held-out "
        f"fold; seed {cv.seed}):"
    ]
    for f in cv.folds:
        held = f["held_out"]
        flag = "" if f["met_bound_on_train"] else "  (none met the bound: safest used)"
        queued = (
            f", handled {_f(held['updates_handled'])}, needless {_f(held['adds_skips_queued'])}"
            if held.get("review_rate")
            else ""
        )
        lines.append(
            f"  fold {f['fold']} ({f['cases']} cases): {_setting(f['setting'])} -> "
            f"overwrites {held['wrongful_overwrites']}, recall {_f(held['update_recall'])}, "
            f"accuracy {_f(held['accuracy'])}{queued}{flag}"
        )
    est = cv.estimate
    lines.append(f"  CV estimate: {_line(est)}")

    def gap(name: str) -> str:
        a, b = in_sample[name], est[name]
        if any(isinstance(x, float) and math.isnan(x) for x in (a, b)):
            return "-"
        return f"{a - b:+.3f}"

    lines.append(
        f"  optimism of the in-sample figures: update recall {gap('update_recall')}, accuracy "
        f"{gap('accuracy')}, wrongful overwrites {in_sample['wrongful_overwrites']} in sample "
        f"vs {est['wrongful_overwrites']} held out"
    )
    return "\n".join(lines)
