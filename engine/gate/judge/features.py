"""What the judge reads about one candidate, the same at fit time and in the gate: the rule's
evidence and plain comparisons of the two parsed claims and word sequences (no word list).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence

import numpy as np

from engine.gate.claims import Claim, claim
from engine.gate.claims.compare import coverage
from engine.gate.policy import Evidence

__all__ = ["FEATURES", "JUDGED", "features", "judged"]

JUDGED = 3
"""How many of the most similar candidates at or above the floor are judged (a duplicate is
nearly always one of the closest)."""

FEATURES: tuple[str, ...] = (
    "similarity", "below_top", "rank", "above_next", "contradiction_logit", "contradiction_known",
    "other_subject", "other_instance", "contained", "partial", "restated", "value_change",
    "new_values", "beside", "changes_kind", "subject_shared", "subject_disjoint", "subject_apart",
    "attribute", "attribute_known", "fact_words_in_memory", "memory_words_in_fact",
    "fact_values_in_memory", "memory_values_in_fact", "values_only_in_fact",
    "values_only_in_memory", "polarity_differs", "length_ratio", "shared_words", "fact_has_values",
    "memory_parts", "both_split", "front_overlap", "said_overlap", "front_values_differ",
    "said_values_differ", "same_verb", "owners_disjoint", "qualifiers_differ",
    "qualifier_one_sided", "diff_chunks", "first_diff_memory", "first_diff_fact", "diff_ratio",
)  # fmt: skip
"""Column names of :func:`features`, in order. A fitted judge records them; a judge fitted on
other columns is refused at load."""

_EPS = 1e-4


def _logit(p: float | None) -> float:
    if p is None:
        return 0.0
    p = min(max(p, _EPS), 1 - _EPS)
    return math.log(p / (1 - p))


def judged(evidence: Sequence[Evidence], floor: float) -> list[Evidence]:
    """Of the ``JUDGED`` most similar candidates, those at or above ``floor``."""
    return [
        e for e in sorted(evidence, key=lambda e: -e.similarity)[:JUDGED] if e.similarity >= floor
    ]


def _overlap(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard overlap; two empty sets agree (1)."""
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def _tokens(text: str) -> list[str]:
    return text.lower().replace(",", " ").replace(".", " ").split()


def _said(m: Claim, f: Claim) -> list[float]:
    """Both split into subject side and what is said: the overlap of each side (-1: a text does
    not split), front and said values different, the same verb."""
    ms, fs = m.said, f.said
    if ms is None or fs is None:
        return [0.0, -1.0, -1.0, 0.0, 0.0, 0.0]
    return [
        1.0,
        _overlap(ms.front, fs.front),
        _overlap(ms.words, fs.words),
        float(bool(ms.front_values and fs.front_values) and ms.front_values != fs.front_values),
        float(ms.values != fs.values),
        float(ms.verb == fs.verb),
    ]


def _structure(m: Claim, f: Claim) -> list[float]:
    """Where the two texts differ: subject side or what is said (:func:`_said`), owners and
    qualifiers, and the shape of the word-level difference."""
    a, b = _tokens(m.text), _tokens(f.text)
    diff = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    ops = [op for op in diff.get_opcodes() if op[0] != "equal"]
    return [
        *_said(m, f),
        float(bool(m.owners) and bool(f.owners) and not m.owners & f.owners),
        float(bool(m.qualifiers) and bool(f.qualifiers) and m.qualifiers != f.qualifiers),
        float(bool(m.qualifiers) != bool(f.qualifiers)),
        float(len(ops)),
        ops[0][1] / max(1, len(a)) if ops else 1.0,
        ops[0][3] / max(1, len(b)) if ops else 1.0,
        diff.ratio(),
    ]


def _claims(memory: str, fact: str) -> list[float]:
    m, f = claim(memory), claim(fact)
    mw, fw = m.content | m.subject, f.content | f.subject
    return [
        coverage(fw, mw | m.lexicon),
        coverage(mw, fw | f.lexicon),
        float(bool(f.values) and f.values <= m.values),
        float(bool(m.values) and m.values <= f.values),
        float(len(f.values - m.values)),
        float(len(m.values - f.values)),
        float(m.negated != f.negated),
        len(fact.split()) / max(1, len(memory.split())),
        len(m.lexicon & f.lexicon) / max(1, len(m.lexicon | f.lexicon)),
        float(bool(f.values)),
        float(len(m.parts)),
        *_structure(m, f),
    ]


def features(
    evidence: Sequence[Evidence], fact: str, floor: float
) -> tuple[list[Evidence], np.ndarray]:
    """The judged candidates of one fact (most similar first) and their rows of
    :data:`FEATURES`; ``evidence`` is every candidate the rule saw, ``fact`` the fact's text."""
    ranked = sorted(evidence, key=lambda e: -e.similarity)
    chosen = judged(ranked, floor)
    rows = []
    top = ranked[0].similarity if ranked else 0.0
    for i, e in enumerate(chosen):
        # above_next: the gap to the memory ranked just below (the i-th judged is the i-th ranked)
        after = ranked[i + 1].similarity if i + 1 < len(ranked) else 0.0
        rows.append(
            [
                e.similarity,
                e.similarity - top,
                float(i),
                e.similarity - after,
                _logit(e.contradiction),
                float(e.contradiction is not None),
                float(e.mismatch == "other_subject"),
                float(e.mismatch == "other_instance"),
                float(e.contained),
                float(e.partial),
                float(e.restated),
                float(e.value_change),
                float(e.new_values),
                float(e.beside),
                float(bool(e.changed_kinds)),
                float(e.subject == "shared"),
                float(e.subject == "disjoint"),
                float(e.subject == "apart"),
                0.0 if e.attribute is None else e.attribute,
                float(e.attribute is not None),
                *_claims(e.text, fact),
            ]
        )
    return chosen, np.asarray(rows, dtype=np.float64).reshape(len(rows), len(FEATURES))
