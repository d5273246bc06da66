"""Lexical evidence the NLI model misses, pure and fast: **containment** (every content word of
the fact is in the memory, same polarity), **claims** (a memory packing several claims of which
the fact touches only some: review) and **polarity**. Tokens are spaCy's
(:func:`engine.gate.claims.nlp.words`), normalised here (stems, number words, a stop list).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "Claims",
    "claims",
    "close",
    "content_tokens",
    "contains",
    "coverage",
    "negated",
]

_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+(?:[.,:]\d+)*")
_STOP = frozenset(
    """a an the and or but of to in on at by for with from into onto over under as is are was were
    be been being am has have had do does did this that these those it its it's he she they them
    his her their our we us you your i me my mine there here than then so such very just also
    still now currently usually every each all any some per about around via up out off own
    s will would can could should may might must shall same new old one""".split()
)
_NEG = re.compile(
    r"\b(?:not|no|never|none|nobody|nothing|neither|nor|without|n't|cannot|no longer|"
    r"don't|doesn't|didn't|isn't|aren't|wasn't|weren't|won't|can't|hasn't|haven't)\b|n't\b",
    re.IGNORECASE,
)
_NUMBER_WORDS = {
    w: str(n) for n, w in enumerate("zero one two three four five six seven eight nine".split())
} | {"ten": "10", "eleven": "11", "twelve": "12", "fifteen": "15", "twenty": "20"}
_NUMBER_WORDS |= {"thirty": "30", "forty": "40", "fifty": "50", "hundred": "100"}
_SUFFIXES = ("ing", "ed", "es", "s", "ly", "er")


def _stem(word: str) -> str:
    if word.isdigit() or len(word) <= 3:
        return word
    for suf in _SUFFIXES:
        if word.endswith(suf) and len(word) - len(suf) >= 3:
            return word[: -len(suf)]
    return word


@lru_cache(maxsize=65536)
def content_tokens(text: str) -> tuple[str, ...]:
    """Lower-cased, stemmed content words and numbers of spaCy's tokens, in order, stop words
    and punctuation removed."""
    from engine.gate.claims.nlp import words  # here: claims.compare imports close from us

    joined: list[str] = []  # letters split with no space between ("id" -> "i" "d") are one word
    for token in words(text):
        if joined and joined[-1].isalpha() and token.rstrip().isalpha():
            joined[-1] += token
        else:
            joined.append(token)
    out = []
    for raw in (w for token in joined for w in _WORD.findall(token.replace("’", "'"))):
        w = raw.lower()
        if w.endswith("'s"):
            w = w[:-2]
        w = _NUMBER_WORDS.get(w, w)
        if w in _STOP:
            continue
        out.append(_stem(w))
    return tuple(out)


def close(a: str, b: str) -> bool:
    """Equal, or one edit apart for words of 5+ letters (typos), or a shared 5-letter stem."""
    if a == b:
        return True
    if a.isdigit() or b.isdigit():
        return False
    if len(a) >= 5 and len(b) >= 5 and a[:5] == b[:5] and abs(len(a) - len(b)) <= 3:
        return True
    if min(len(a), len(b)) < 5 or abs(len(a) - len(b)) > 1:
        return False
    # one substitution, insertion, deletion or adjacent transposition
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and a[diff[0]] == b[diff[1]]
            and a[diff[1]] == b[diff[0]]
        )
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    return any(long_[:i] + long_[i + 1 :] == short for i in range(len(long_)))


def _covered(token: str, pool: tuple[str, ...]) -> bool:
    return any(close(token, other) for other in pool)


def coverage(part: str, whole: str) -> float:
    """Share of ``part``'s content tokens found in ``whole`` (1.0 for no content tokens)."""
    tokens = content_tokens(part)
    if not tokens:
        return 1.0
    pool = content_tokens(whole)
    return sum(1 for t in tokens if _covered(t, pool)) / len(tokens)


def negated(text: str) -> bool:
    return bool(_NEG.search(text.replace("’", "'")))


def contains(memory: str, fact: str) -> bool:
    """The memory already says everything ``fact`` says, with the same polarity."""
    return negated(memory) == negated(fact) and coverage(fact, memory) == 1.0


# Claims are separated by list punctuation and coordination; a segment is a claim only if it has a
# lower-case content word (a predicate or common noun), so "71 Kowhai Crescent" or "22 July" are
# parts of a value, not claims of their own.
_SPLIT = re.compile(
    r"\s*(?:;|,(?!\d)\s*(?:and\s+)?|\band\b|\bwith\b(?=[^,;]*\d))\s*", re.IGNORECASE
)
_LOWER_WORD = re.compile(r"\b[a-z][a-z-]*\b")
_UNITS = frozenset("mg kg km ml gb tb mb pm am month week day year hour minute min".split())


@dataclass(frozen=True)
class Claims:
    claims: int
    """Claim-bearing segments of the memory."""
    untouched: int
    """Claims that share no content word with the new fact beyond the memory's subject."""

    @property
    def partial(self) -> bool:
        """The new fact addresses some claims of a multi-claim memory and leaves others standing."""
        return self.claims >= 2 and self.untouched >= 1


def _shape(token: str) -> str:
    return re.sub(r"\d+", "d", token)


def claims(memory: str, fact: str) -> Claims:
    """Count the memory's claims and those the new fact leaves alone. A claim is a segment with
    a lower-case content word, or a value segment holding a number. Sharing the memory's first
    two content words (its subject) or a unit does not address a claim; a number of the same
    shape (17:20 -> 16:40) does."""
    subject = set(content_tokens(memory)[:2])
    fact_tokens = tuple(t for t in content_tokens(fact) if t not in _UNITS)
    fact_shapes = {_shape(t) for t in fact_tokens if any(ch.isdigit() for ch in t)}
    total = untouched = 0
    for seg in _SPLIT.split(memory):
        tokens = content_tokens(seg)
        lower = [t for w in _LOWER_WORD.findall(seg) for t in content_tokens(w) if t not in _UNITS]
        numbers = [t for t in tokens if any(ch.isdigit() for ch in t)]
        if not ((len(tokens) >= 2 and lower) or numbers):
            continue
        total += 1
        rest = [t for t in tokens if t not in subject and t not in _UNITS]
        shared = any(_covered(t, fact_tokens) for t in rest)
        if not lower and numbers and all(_shape(t) in fact_shapes for t in numbers):
            shared = True
        # "Billing address: 71 Kowhai Crescent": the subject and a value. A fact that restates
        # the subject gives that value anew; it does not leave a claim standing.
        if not shared and len(rest) < len(tokens) and rest and not any(t in lower for t in rest):
            shared = any(_covered(t, fact_tokens) for t in tokens if t in subject)
        if not shared:
            untouched += 1
    return Claims(claims=total, untouched=untouched)
