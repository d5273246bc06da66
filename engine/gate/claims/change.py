"""Explicit old -> new values: a fact that names the value it replaces ("X's status changed
from Improved to Excellent", "no longer in Boston, now in Chicago", "was on table before and in
sink afterwards"), and whether a memory holds that old value of the same subject. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CHANGE_VERBS", "STOP_WORDS", "Change", "content_words", "holds_old", "parse"]

CHANGE_VERBS: tuple[str, ...] = (
    "change", "changed", "changes", "changing", "switch", "switched", "switches", "switching",
    "move", "moved", "moves", "moving", "go", "goes", "going", "gone", "went", "shift", "shifted",
    "shifts", "shifting", "turn", "turned", "turns", "turning", "upgrade", "upgraded", "upgrades",
    "upgrading", "downgrade", "downgraded", "downgrades", "downgrading", "increase", "increased",
    "increases", "increasing", "decrease", "decreased", "decreases", "decreasing", "rise", "rose",
    "risen", "rises", "rising", "fall", "fell", "fallen", "falls", "falling", "drop", "dropped",
    "drops", "dropping", "grow", "grew", "grown", "grows", "growing", "reduce", "reduced",
    "reduces", "reducing", "raise", "raised", "raises", "raising", "lower", "lowered", "lowers",
    "lowering", "update", "updated", "updates", "updating", "relocate", "relocated", "relocates",
    "relocating", "transfer", "transferred", "transfers", "transferring", "convert", "converted",
    "converts", "converting",
)  # fmt: skip
"""Verbs that, right before "from A to B", make it a change of value (not a route)."""

STOP_WORDS: frozenset[str] = frozenset(
    {
        "a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "by", "and", "or",
        "is", "are", "am", "was", "were", "be", "been", "being", "has", "have", "had",
        "it", "its", "this", "that", "i", "my", "me", "we", "our", "you", "your",
        "he", "his", "she", "her", "they", "their", "s", "now", "then", "still",
    }
)  # fmt: skip
"""Words that say nothing of a subject or a value; folded away before words are compared."""

_AUX = r"(?:(?:has|have|had|was|were|is|are|got|been|be)\s+)*"
_VERB = "|".join(sorted(CHANGE_VERBS, key=len, reverse=True))
_END = r"(?=\s*(?:[.;!?]|$))"
_FROM_TO = re.compile(
    rf"\b{_AUX}(?:{_VERB})\s+from\s+(?P<old>.+?)\s+(?:to|into)\s+(?P<new>.+?){_END}", re.I
)
_NO_LONGER = re.compile(
    rf"\bno\s+longer\s+(?P<old>.+?)\s*(?:[,;]\s*|\s+)(?:but\s+|and\s+)?"
    rf"(?:(?:is|are|am)\s+)?now\s+(?P<new>.+?){_END}",
    re.I,
)
_BEFORE_AFTER = re.compile(
    rf"\b(?:was|were)\s+(?P<old>.+?)\s+before\s*,?\s+(?:and\s+)?(?:is\s+|are\s+)?"
    rf"(?P<new>.+?)\s+after(?:wards?)?{_END}",
    re.I,
)
_PATTERNS = (_FROM_TO, _NO_LONGER, _BEFORE_AFTER)
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Change:
    """An explicit change in a fact: the ``old`` value, the ``new`` value, and the ``rest`` of
    the fact outside the change phrase (its subject and attribute)."""

    old: str
    new: str
    rest: str


def content_words(text: str) -> frozenset[str]:
    """Lowercased words, with the possessive "'s", punctuation and :data:`STOP_WORDS` folded."""
    t = re.sub(r"['’]s\b", " ", text.lower())
    return frozenset(w for w in _WORD.findall(t) if w not in STOP_WORDS)


def parse(fact: str) -> Change | None:
    """The first explicit change the fact states, or None."""
    for pattern in _PATTERNS:
        m = pattern.search(fact)
        if m is not None:
            rest = f"{fact[: m.start()]} {fact[m.end() :]}"
            return Change(m.group("old").strip(), m.group("new").strip(), rest.strip())
    return None


def holds_old(fact: str, memory: str) -> bool:
    """The fact states an explicit change whose old value's words are all the memory's, the new
    value's not all, and whose other content words (subject, attribute) are all the memory's:
    a lookalike with the same value and another subject never gets it."""
    change = parse(fact)
    if change is None:
        return False
    mem = content_words(memory)
    old, new, rest = (content_words(x) for x in (change.old, change.new, change.rest))
    if not old or not new or not rest or old == new:
        return False
    return old <= mem and not new <= mem and rest <= mem
