"""Score write-gate predictions against labelled cases: the metrics of the shared eval README.

A case is ``{"id", "category", "memories", "incoming", "expected": {"action", "target"},
"notes"}``; a prediction is ``{"id", "action", "target"}``. Let the label be (a*, t*) and the
prediction (a, t). A case without a prediction, or with an action that is not one of
replace / add / skip / review, counts as the action ``missing``: wrong, never an overwrite.
When several predictions share an id, the last one counts.

:func:`score` returns the figures under the names the shared ``score.py`` uses (``memgate eval
--json`` prints them; a test runs both scorers on the same predictions). :func:`review_measures`
adds the three figures the review policy is judged by. :func:`update_reach` measures what the
models leave the rules to work with: how many true updates have their target above the floor and
scored as contradicted at all. Pure: no I/O, no models.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACTIONS",
    "REACH_STEPS",
    "Seen",
    "format_scores",
    "headline",
    "review_measures",
    "score",
    "update_reach",
]

ACTIONS = ("replace", "add", "skip", "review")
_MISSING = "missing"


def _rate(part: int, whole: int) -> float:
    return part / whole if whole else math.nan


@dataclass(frozen=True)
class _Row:
    """One case: its label, the prediction, and whether it is a ``[trap]`` lookalike."""

    category: str
    expected: str
    expected_target: str | None
    action: str
    target: str | None
    trap: bool

    @property
    def right_replace(self) -> bool:
        return (
            self.action == "replace"
            and self.expected == "replace"
            and self.target == self.expected_target
        )

    @property
    def correct(self) -> bool:
        # replace and skip name a memory, which must be the right one; add and review do not
        if self.expected in ("replace", "skip"):
            return self.action == self.expected and self.target == self.expected_target
        return self.action == self.expected


def _rows(
    cases: Sequence[Mapping[str, Any]], predictions: Iterable[Mapping[str, Any]]
) -> list[_Row]:
    latest: dict[Any, tuple[str, str | None]] = {}
    for p in predictions:
        action = p.get("action")
        latest[p["id"]] = (action if action in ACTIONS else _MISSING, p.get("target"))
    rows = []
    for case in cases:
        action, target = latest.get(case["id"], (_MISSING, None))
        rows.append(
            _Row(
                category=case["category"],
                expected=case["expected"]["action"],
                expected_target=case["expected"]["target"],
                action=action,
                target=target,
                trap=(case.get("notes") or "").startswith("[trap]"),
            )
        )
    return rows


def score(
    cases: Sequence[Mapping[str, Any]], predictions: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """Every figure of the shared eval README for ``predictions`` on labelled ``cases``.

    Ratios with an empty denominator are NaN (no predicted skips: duplicate precision is
    undefined, not 0 or 1)."""
    rows = _rows(cases, predictions)
    expected = Counter(r.expected for r in rows)
    predicted = Counter(r.action for r in rows)
    overwrites = [r for r in rows if r.action == "replace" and not r.right_replace]
    on = Counter(r.expected for r in overwrites)
    right_replaces = sum(r.right_replace for r in rows)
    skip_hits = [r for r in rows if r.action == "skip" and r.expected == "skip"]
    add_hits = sum(r.action == "add" and r.expected == "add" for r in rows)
    review_hits = sum(r.action == "review" and r.expected == "review" for r in rows)
    missed = sum(r.expected == "replace" and r.action in ("add", "skip") for r in rows)
    by_category: dict[str, list[int]] = {}
    for r in rows:
        tally = by_category.setdefault(r.category, [0, 0])
        tally[0] += r.correct
        tally[1] += 1
    pairs = Counter((r.expected, r.action) for r in rows)
    n = len(rows)
    return {
        "cases": n,
        "accuracy": _rate(sum(r.correct for r in rows), n),
        "wrongful_overwrites": len(overwrites),
        "wrongful_overwrite_rate": _rate(len(overwrites), n),
        "wrongful_overwrite_breakdown": {
            "wrong_target_on_expected_replace": on["replace"],
            "on_expected_add": on["add"],
            "on_expected_skip": on["skip"],
            "on_expected_review": on["review"],
            "on_trap_cases": sum(r.trap for r in overwrites),
        },
        "trap_cases": sum(r.trap for r in rows),
        "update_recall": _rate(right_replaces, expected["replace"]),
        "update_precision": _rate(right_replaces, predicted["replace"]),
        "missed_updates": missed,
        "missed_update_rate": _rate(missed, expected["replace"]),
        "deferred_updates": sum(r.expected == "replace" and r.action == "review" for r in rows),
        "duplicate_precision": _rate(len(skip_hits), predicted["skip"]),
        "duplicate_recall": _rate(len(skip_hits), expected["skip"]),
        "duplicate_target_accuracy": _rate(
            sum(r.target == r.expected_target for r in skip_hits), len(skip_hits)
        ),
        "lost_information": sum(
            r.action == "skip" and r.expected in ("add", "replace") for r in rows
        ),
        "duplicates_stored": sum(r.action == "add" and r.expected == "skip" for r in rows),
        "add_precision": _rate(add_hits, predicted["add"]),
        "add_recall": _rate(add_hits, expected["add"]),
        "review_rate": _rate(predicted["review"], n),
        "review_precision": _rate(review_hits, predicted["review"]),
        "review_recall": _rate(review_hits, expected["review"]),
        "missing_predictions": predicted[_MISSING],
        "accuracy_by_category": {c: _rate(*by_category[c]) for c in sorted(by_category)},
        "confusion_expected_x_predicted": {f"{e}->{a}": pairs[(e, a)] for e, a in sorted(pairs)},
    }


def review_measures(
    cases: Sequence[Mapping[str, Any]], predictions: Iterable[Mapping[str, Any]]
) -> dict[str, Any]:
    """The review policy's three measures (issue 12, item 5): wrongful overwrites; the share of
    true updates queued for review with the right target (a human sees the right memory); the
    share of expected adds and skips queued needlessly (work for nothing)."""
    rows = _rows(cases, predictions)
    updates = [r for r in rows if r.expected == "replace"]
    plain = [r for r in rows if r.expected in ("add", "skip")]
    return {
        "wrongful_overwrites": sum(r.action == "replace" and not r.right_replace for r in rows),
        "updates_queued_right_target": _rate(
            sum(r.action == "review" and r.target == r.expected_target for r in updates),
            len(updates),
        ),
        "adds_skips_queued": _rate(sum(r.action == "review" for r in plain), len(plain)),
    }


REACH_STEPS = (
    "target_recalled",
    "target_above_floor",
    "target_scored",
    "target_contradicted",
    "plain_rule",
    "target_within_reach",
)
"""The shares :func:`update_reach` reports, in its order."""


@dataclass(frozen=True)
class Seen:
    """One candidate as the gate saw it, named by the case's own memory id (``m1``...)."""

    memory: str | None
    similarity: float
    contradiction: float | None
    """None when the gate did not score it (below the floor, or a sibling it never asked)."""


def update_reach(
    cases: Sequence[Mapping[str, Any]],
    seen: Mapping[Any, Sequence[Seen]],
    *,
    floor: float,
    contradiction: float,
    lowest_floor: float | None = None,
    lowest_bar: float | None = None,
) -> dict[str, Any]:
    """How far the models let the rules go on the true updates (expected ``replace``).

    Each share is of the true updates; each of the first four steps needs the one before it:

    * ``target_recalled``: the target is among the recalled candidates;
    * ``target_above_floor``: at or above the similarity ``floor``;
    * ``target_scored``: the NLI model was asked about it;
    * ``target_contradicted``: its contradiction exceeds ``contradiction``: what the seed's
      floor and bar admit;
    * ``plain_rule``: the target is the most similar candidate above the floor whose
      contradiction exceeds the bar, which is all the seed's plain rule asks;
    * ``target_within_reach``: scored, at or above ``lowest_floor`` and over ``lowest_bar``,
      the least any rule of the policy accepts with extra evidence (a matching attribute key
      from 0.40, a changed value at 0.50). No rule of the policy replaces more: an upper bound
      on its update recall with these models.

    ``seen`` maps a case id to its candidates; a case missing from it recalled nothing."""
    lowest_floor = floor if lowest_floor is None else min(floor, lowest_floor)
    lowest_bar = contradiction if lowest_bar is None else min(contradiction, lowest_bar)
    updates = [c for c in cases if c["expected"]["action"] == "replace"]
    counts: Counter[str] = Counter()
    for case in updates:
        cands = seen.get(case["id"], ())
        target = next((s for s in cands if s.memory == case["expected"]["target"]), None)
        if target is None:
            continue
        counts["target_recalled"] += 1
        scored = target.contradiction
        if scored is not None and target.similarity >= lowest_floor and scored > lowest_bar:
            counts["target_within_reach"] += 1
        if target.similarity < floor:
            continue
        counts["target_above_floor"] += 1
        if scored is None:
            continue
        counts["target_scored"] += 1
        if scored <= contradiction:
            continue
        counts["target_contradicted"] += 1
        conflicts = [
            s
            for s in cands
            if s.similarity >= floor
            and s.contradiction is not None
            and s.contradiction > contradiction
        ]
        if max(conflicts, key=lambda s: s.similarity) is target:
            counts["plain_rule"] += 1
    out: dict[str, Any] = {"updates": len(updates)}
    out.update({k: _rate(counts[k], len(updates)) for k in REACH_STEPS})
    out["bars"] = {
        "floor": floor,
        "contradiction": contradiction,
        "lowest_floor": lowest_floor,
        "lowest_bar": lowest_bar,
    }
    return out


def headline(m: Mapping[str, Any]) -> str:
    """One line: the README's headline order."""
    wo = m["wrongful_overwrite_breakdown"]
    return (
        f"wrongful overwrites {m['wrongful_overwrites']} ({wo['on_trap_cases']} on traps), "
        f"update recall {m['update_recall']:.3f}, duplicate precision "
        f"{m['duplicate_precision']:.3f}, lost {m['lost_information']}, "
        f"accuracy {m['accuracy']:.3f} ({m['cases']} cases)"
    )


def format_scores(m: Mapping[str, Any], review: Mapping[str, Any] | None = None) -> str:
    """The figures as aligned ``name value`` lines (nested dicts indented)."""

    def cell(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = []
    sections: list[tuple[str, Mapping[str, Any]]] = [("", m)]
    if review is not None:
        sections.append(("review measures", review))
    for title, block in sections:
        if title:
            lines.append(f"{title}:")
        indent = "  " if title else ""
        for k, v in block.items():
            if isinstance(v, Mapping):
                lines.append(f"{indent}{k}:")
                lines += [f"{indent}  {kk:36s} {cell(vv)}" for kk, vv in v.items()]
            else:
                lines.append(f"{indent}{k:38s} {cell(v)}")
    return "\n".join(lines)
