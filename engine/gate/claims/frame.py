"""The attribute a text speaks of, as words: the text less its shared subject and its values.

"Keiko has lived in Kobe since 2019." and "Keiko lives in Osaka." share the subject Keiko and
leave "live" and "live": one attribute. The embedder judges how close two frames are
(:mod:`engine.gate.evidence`); here only spaCy's parse is read, no word list.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from engine.gate.claims import qa
from engine.gate.claims.claim import claim
from engine.gate.claims.compare import coverage, untimed_values
from engine.gate.claims.nlp import parse
from engine.gate.names import Subject

__all__ = ["frame", "shared_subject", "subject_relation"]

_KEEP_POS = frozenset({"NOUN", "VERB", "ADJ", "PROPN"})


@lru_cache(maxsize=65536)
def _modifiers(text: str) -> frozenset[str]:
    """Nouns of the prepositional phrases inside the subject phrase: "in Denmark" of "the
    median wage in Denmark", "of state" of "the head of state"."""
    out: set[str] = set()
    for tok in parse(text):
        if tok.dep_ not in ("nsubj", "nsubjpass"):
            continue
        for t in tok.subtree:
            if t.dep_ == "pobj" and t.pos_ in ("NOUN", "PROPN") and not t.is_stop:
                out.add(str(t.lemma_).lower())
    return frozenset(out)


def shared_subject(a: str, b: str) -> frozenset[str]:
    """Lemmas both texts' subject phrases hold."""
    return claim(a).subject & claim(b).subject


def subject_relation(a: str, b: str) -> Subject:
    """How the two texts' subjects relate (:class:`engine.gate.names.Subject`): ``apart`` (one
    kind, two values: "unit 3", "unit 4"), ``disjoint`` (two owners, or qualifiers or words
    neither shares: "Paolo's manager", "Ingrid's manager"), ``shared`` or ``unknown``."""
    ca, cb = claim(a), claim(b)
    if not ca.subject or not cb.subject:
        return Subject.UNKNOWN
    # a value of the subject counts only outside the time qualifier: "as of 1970" says when
    # (of a "question? answer", the question's: the answer is the value)
    sa = ca.subject_values & untimed_values(qa.question(a) or a)
    sb = cb.subject_values & untimed_values(qa.question(b) or b)
    if _named_apart(sa, sb):
        return Subject.APART  # Kai's Thursday squad, Kai's Monday squad; unit 3, unit 4
    if ca.owners and cb.owners and not ca.owners & cb.subject and not cb.owners & ca.subject:
        return Subject.DISJOINT  # one attribute of two owners: Grandad's appointment, Grandma's
    wa, wb = ca.subject | ca.content, cb.subject | cb.content
    ma, mb = _modifiers(a), _modifiers(b)  # "the wage in Denmark", "the wage in Iceland"
    qual_a, qual_b = ca.qualifiers | (ma - mb), cb.qualifiers | (mb - ma)
    if _unmatched(qual_a, wb | cb.names) and _unmatched(qual_b, wa | ca.names):
        return Subject.DISJOINT  # the hallway thermostat, the garden office one
    return Subject.SHARED if ca.subject & wb or cb.subject & wa else Subject.DISJOINT


def _unmatched(words: frozenset[str], pool: frozenset[str]) -> bool:
    """``words`` (one subject's qualifiers) are there, and none occurs in ``pool``."""
    return bool(words) and coverage(words, pool) == 0.0


def _named_apart(a: frozenset[str], b: frozenset[str]) -> bool:
    """Both subjects carry a value of one kind, and not the same one."""
    kinds = {v.split(":")[0] for v in a} & {v.split(":")[0] for v in b}
    return any(
        not {v for v in a if v.startswith(k + ":")} & {v for v in b if v.startswith(k + ":")}
        for k in kinds
    )


def _value(tok: Any, subject_ids: set[int]) -> bool:
    if tok.like_num or any(ch.isdigit() for ch in tok.text):
        return True
    return bool(tok.pos_ == "PROPN" and tok.i not in subject_ids)


@lru_cache(maxsize=65536)
def frame(text: str, drop: frozenset[str]) -> str:
    """``text``'s content lemmas (nouns, verbs, adjectives; spaCy's stop words out) less
    ``drop`` (the shared subject) and the values."""
    doc = parse(text)
    subject_ids = {t.i for tok in doc if tok.dep_ in ("nsubj", "nsubjpass") for t in tok.subtree}
    words = [
        str(tok.lemma_).lower()
        for tok in doc
        if tok.pos_ in _KEEP_POS
        and not tok.is_stop
        and not _value(tok, subject_ids)
        and str(tok.lemma_).lower() not in drop
    ]
    return " ".join(words)
