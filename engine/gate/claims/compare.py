"""Comparisons of two parsed claims (:mod:`engine.gate.claims.claim`): restatement, partial
address, value changes, another subject or instance, partial negation, more than a time change.
"""

from __future__ import annotations

from functools import lru_cache

from engine.gate.claims import when
from engine.gate.claims.canon import values
from engine.gate.claims.claim import Claim
from engine.gate.overlap import close

__all__ = [
    "beyond_time",
    "adds_beside",
    "changed_kinds",
    "changes_value",
    "coverage",
    "named_apart",
    "negates_part",
    "partial",
    "restates",
    "says_of_another",
    "values_left",
]

_LIGHT = frozenset({"be", "have", "get", "do"})


def coverage(words: frozenset[str], pool: frozenset[str]) -> float:
    """Share of ``words`` found in ``pool`` (typo- and abbreviation-tolerant); 1.0 for no
    words."""
    if not words:
        return 1.0
    return sum(1 for w in words if any(_same_word(w, p) for p in pool)) / len(words)


def _same_word(a: str, b: str) -> bool:
    return close(a, b) or abbreviates(a, b) or abbreviates(b, a)


def abbreviates(short: str, word: str) -> bool:
    """``short`` is a contraction of ``word``: 2-4 letters, the word's first and last letter,
    the rest in order ("st" street, "mgr" manager, "appt" appointment, "wk" week)."""
    if not 2 <= len(short) <= 4 or len(word) < len(short) + 2 or not short.isalpha():
        return False
    if short[0] != word[0] or short[-1] != word[-1]:
        return False
    rest = iter(word[1:-1])
    return all(ch in rest for ch in short[1:-1])


_WEAK = ("num:", "weekday:", "days:", "month:", "ord:")
"""Values too common to identify a claim alone: a bare number ("Route 14"), a weekday, a month,
an ordinal."""


def restates(memory: Claim, fact: Claim, min_coverage: float, count_coverage: float = 0.5) -> bool:
    """The same claim in another format: the fact's typed values are all the memory's
    ("$1,240,000" = "1.24 million dollars"), same polarity, no name swapped, content covered to
    ``min_coverage`` (``count_coverage`` when its only values are counts of a noun)."""
    typed = any(not v.startswith(_WEAK) for v in fact.values)
    if not typed and fact.counts & memory.counts:
        typed, min_coverage = True, max(min_coverage, count_coverage)
    if not typed or not fact.values <= memory.values or fact.negated != memory.negated:
        return False  # a bare number ("Route 14") may be part of a name: too weak alone
    known = memory.content | memory.subject
    if fact.subject and coverage(fact.subject, known) == 0.0:
        return False
    if _swapped(fact.names, known) and _swapped(known, fact.content | fact.subject):
        return False  # a name or qualifier in place of another: a value changed in words
    return coverage(fact.content, known) >= min_coverage


def _swapped(names: frozenset[str], other: frozenset[str]) -> bool:
    return any(coverage(frozenset({n}), other) == 0.0 for n in names)


def partial(memory: Claim, fact: Claim) -> bool:
    """The memory has coordinated predicates and the fact addresses some of them, not all."""
    if len(memory.parts) < 2:
        return False
    said = fact.content | frozenset(fact.predicates)
    touched = 0
    for pred, part in zip(memory.predicates, memory.parts, strict=True):
        if pred in _LIGHT:
            hit = coverage(part, said) > 0.0 if part else False
        else:
            hit = any(close(pred, w) for w in said)
        touched += hit
    return 0 < touched < len(memory.parts)


def values_left(memory: frozenset[str], fact: frozenset[str]) -> int:
    """How many of the memory's values a value-changing fact leaves standing, per kind (months
    and years not counted); 0 when it changes none. "Staging runs v2.3 on 3 nodes in
    eu-north-1" -> "staging is on v2.4" leaves two."""
    if not fact - memory:
        return 0
    left = 0
    for kind in {_kind(v) for v in memory}:
        if kind in ("year", "month"):
            continue
        mine = sum(_kind(v) == kind for v in memory)
        theirs = sum(_kind(v) == kind for v in fact)
        left += max(0, mine - theirs)
    return left


def _kind(value: str) -> str:
    head, _, rest = value.partition(":")
    if head == "days":
        return "weekday"  # a run of weekdays stands where a weekday would
    return f"qty:{rest.partition(':')[0]}" if head == "qty" else head


def changes_value(memory: Claim, fact: Claim) -> bool:
    """The fact is the memory with values of the same kinds changed and nothing else ("... fee
    is £165 a month" after "... is £145 a month")."""
    new, old = fact.values - memory.values, memory.values - fact.values
    if not new or not old or fact.negated != memory.negated:
        return False
    if not {_kind(v) for v in new} <= {_kind(v) for v in old}:
        return False
    if values_left(memory.values, fact.values) > 0:
        return False
    words = fact.subject | fact.content
    return bool(words) and coverage(words, memory.subject | memory.content) == 1.0


def changed_kinds(memory: frozenset[str], fact: frozenset[str]) -> frozenset[str]:
    """Kinds of value (``email``, ``money``, ``qty:g``...) the fact states anew where the memory
    holds another value of that kind."""
    new, old = fact - memory, memory - fact
    return frozenset({_kind(v) for v in new} & {_kind(v) for v in old})


_UNTYPED = frozenset({"num", "weekday", "month", "year", "ord"})


def adds_beside(memory: Claim, fact: Claim) -> bool:
    """The fact states typed values the memory lacks, and changes none of the memory's own
    (outside its subject): another attribute, or more detail ("... 32 GB RAM" beside "...
    runs Windows 11 24H2")."""
    mine = {v for v in memory.values - memory.subject_values if _kind(v) not in _UNTYPED}
    new = {v for v in fact.values - memory.values if _kind(v) not in _UNTYPED}
    if not mine or not new:
        return False
    return not {_kind(v) for v in new} & {_kind(v) for v in mine - fact.values}


_LIGHT_VERBS = frozenset({"be", "have"})


def says_of_another(memory: Claim, fact: Claim) -> bool:
    """The fact says what the memory says, word for word and value for value, of another
    subject ("Mr Oduya's carer on weekdays: Lorna Baptiste" beside "Mrs Oduya's ..."): a
    sibling, never the target. Each word, each value (and no other value of its kind in the
    memory), the verb unless light, and the polarity must be there; the subject side must
    differ."""
    said = fact.said
    if said is None or not (said.words or said.values) or fact.negated != memory.negated:
        return False
    if not said.values <= memory.values:
        return False
    kinds = {_kind(v) for v in said.values}
    if any(_kind(v) in kinds for v in memory.values - said.values):
        return False
    if said.verb and said.verb not in _LIGHT_VERBS and said.verb not in memory.lexicon:
        return False
    if coverage(said.words, memory.lexicon) < 1.0:
        return False
    theirs = memory.said.front if memory.said is not None else frozenset()
    return (
        coverage(said.front, memory.lexicon) < 1.0
        or not said.front_values <= memory.values
        or coverage(theirs, fact.lexicon) < 1.0
    )


def named_apart(memory: Claim, fact: Claim) -> bool:
    """Both texts name a thing by one noun and a number on the subject side, not the same
    number ("Hive 2 has chalkbrood" / "Found chalkbrood in Hive 4"): two things of a kind. A
    number after the verb may be the change ("room 214" -> "room 310") and never counts; nor
    does a text naming the other's number too."""
    for noun in {n for n, _, _ in memory.labels} & {n for n, _, _ in fact.labels}:
        mine = [(num, where) for n, num, where in memory.labels if n == noun]
        theirs = [(num, where) for n, num, where in fact.labels if n == noun]
        if {num for num, _ in mine} & {num for num, _ in theirs}:
            continue
        places = [where for _, where in mine + theirs]
        if "said" not in places and "front" in places:
            return True
    return False


def negates_part(memory: Claim, fact: Claim) -> bool:
    """The fact flips the polarity of some of what the memory lists, not all: one of several
    values of a kind ("no longer works Wednesdays" after "works Mondays and Wednesdays") or
    some members of a coordination. A partial contradiction (review)."""
    if fact.negated == memory.negated:
        return False
    named = fact.values & memory.values
    for kind in {_kind(v) for v in named}:
        if sum(_kind(v) == kind for v in memory.values) > sum(_kind(v) == kind for v in named):
            return True
    members = [m for m in memory.conjuncts if m]
    touched = sum(1 for m in members if m & fact.lexicon)
    return len(members) >= 2 and 0 < touched < len(members)


@lru_cache(maxsize=65536)
def untimed_values(text: str) -> frozenset[str]:
    """The values ``text`` states outside its time qualifier: "as of 1970" says when."""
    return values(when.unqualified(text))


def beyond_time(memory: Claim, fact: Claim) -> bool:
    """With their time qualifiers out, the two differ in values or content words ("As of 2011,
    A lives in Chicago" / "As of 2022, A lives in Tokyo"); False when the time is all that
    changes ("born in 1990" / "born in 1991": the year is the value)."""
    return (
        untimed_values(memory.text) != untimed_values(fact.text) or memory.content != fact.content
    )
