"""One text as a claim, read from spaCy's parse: who it is about (the root predicate's
``nsubj``/``nsubjpass`` phrase), what it says, which values, polarity, how many parts (the root
and the verbs coordinated with it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from engine.gate.claims.canon import FORMAT_WORDS, values
from engine.gate.claims.nlp import parse

__all__ = ["Claim", "Said", "claim"]

_CONTENT_POS = frozenset({"NOUN", "PROPN", "VERB", "ADJ", "ADV", "NUM"})
_NEGATORS = frozenset({"no", "not", "never", "none", "nobody", "nothing", "without", "n't"})


@dataclass(frozen=True, slots=True)
class Claim:
    text: str
    subject: frozenset[str]
    """Lemmas of the subject phrase (empty for a subjectless instruction)."""
    content: frozenset[str]
    """Lemmas of content words, values and subject excluded."""
    values: frozenset[str]
    """Canonical values (:func:`engine.gate.claims.canon.values`)."""
    negated: bool
    parts: tuple[frozenset[str], ...]
    """Content lemmas of each coordinated predicate (one entry for a simple sentence)."""
    predicates: tuple[str, ...]
    """Lemma of each part's predicate, in order."""
    subject_values: frozenset[str]
    """Canonical values inside the subject phrase ("Kai's Thursday squad": weekday 4)."""
    owners: frozenset[str]
    """Lemmas of the subject's possessors, pronouns out ("Paolo Ricci's manager": paolo, ricci)."""
    qualifiers: frozenset[str]
    """Lemmas of the nouns compounded onto the subject's head ("the hallway thermostat")."""
    counts: frozenset[str]
    """Numbers before the noun they count, as ``<canonical number> <noun lemma>`` ("five items"
    and "5 items": ``num:5 item``)."""
    names: frozenset[str]
    """Content lemmas that name or qualify (proper nouns, possessors, adjectives, noun
    modifiers), subject included: where a value changed in words shows ("Gold" for "Bronze")."""
    said: Said | None
    """What the text says of its subject (None when it cannot be told apart)."""
    lexicon: frozenset[str]
    """Every word of the text, lower-cased, and its lemma."""
    conjuncts: tuple[frozenset[str], ...]
    """Content lemmas of each member of the text's first coordination ("is diabetic and on
    insulin": diabetic / insulin): what a fact may negate some of."""
    labels: frozenset[tuple[str, str, str]]
    """Things named by a noun and a number ("Hive 4", "MUG-13") as (noun lemma, number, where):
    ``front`` (the subject side), ``said`` (after the verb or colon) or ``unknown``."""


@dataclass(frozen=True, slots=True)
class Said:
    """A text split into who it is about (``front``) and what it says of them (``words``,
    ``values``, ``verb``; a ``label: value`` note has no verb)."""

    front: frozenset[str]
    front_values: frozenset[str]
    words: frozenset[str]
    values: frozenset[str]
    verb: str
    edge: int
    """Index of the token where what is said begins: the note's colon, or the root verb."""


_ARTICLES = frozenset({"a", "an", "the"})


def _said_word(tok: Any) -> bool:
    """A word that carries meaning when comparing what two texts say: content words (stop words
    included), determiners other than articles, spelt ordinals and short capitals ("XL")."""
    if _is_content(tok):
        return True
    if tok.pos_ in ("NOUN", "PROPN", "VERB", "ADJ") and tok.is_alpha:
        return tok.lower_ not in FORMAT_WORDS
    if tok.dep_ in ("det", "predet") and tok.lower_ not in _ARTICLES:
        return True
    if tok.pos_ == "ADJ" and tok.like_num and tok.is_alpha:
        return True
    return bool(tok.is_upper and tok.is_alpha and len(tok.text) <= 3 and tok.text != "I")


def _said(doc: Any) -> Said | None:
    colon = next((t.i for t in doc if t.text == ":"), None)
    root_i = -1
    if colon is not None:  # a note, "label: value"
        edge, verb, rest = colon, "", [t for t in doc if t.i > colon]
    else:
        roots = [t for t in doc if t.dep_ == "ROOT"]
        if len(roots) != 1 or roots[0].pos_ not in ("VERB", "AUX"):
            return None
        root = roots[0]
        subj = {t.i for c in root.children if c.dep_ in ("nsubj", "nsubjpass") for t in c.subtree}
        if not subj:
            return None
        edge = root_i = root.i
        verb = _lemma(root)
        rest = [t for t in doc if t.i not in subj and t.i != root_i]
    if not rest:
        return None
    said_ids = {t.i for t in rest}
    front = [t for t in doc if t.i not in said_ids and t.i != root_i]

    def words(toks: list[Any]) -> frozenset[str]:
        return frozenset(_lemma(t) if _is_content(t) else t.lower_ for t in toks if _said_word(t))

    def text(toks: list[Any]) -> str:
        return "".join(t.text_with_ws for t in toks)

    return Said(words(front), values(text(front)), words(rest), values(text(rest)), verb, edge)


_HYPHEN_LABEL = re.compile(r"([A-Za-z]{2,})-(\d{1,5}[A-Za-z]?)")
_LABEL_NUMBER = re.compile(r"\d{1,5}[A-Za-z]?")


def _labels(doc: Any, said: Said | None) -> frozenset[tuple[str, str, str]]:
    """A noun and the number after it, hyphenated or not; see :attr:`Claim.labels`."""
    out = set()
    for tok in doc:
        hyphen = _HYPHEN_LABEL.fullmatch(tok.text)
        if hyphen:
            noun, number = hyphen.group(1).lower(), hyphen.group(2).lower()
        elif (
            tok.is_alpha
            and not tok.is_stop
            and tok.lower_ not in FORMAT_WORDS
            and tok.i + 1 < len(doc)
            and _LABEL_NUMBER.fullmatch(doc[tok.i + 1].text)
        ):
            noun, number = _lemma(tok), doc[tok.i + 1].text.lower()
        else:
            continue
        where = "unknown" if said is None else "front" if tok.i < said.edge else "said"
        out.add((noun, number, where))
    return frozenset(out)


def _conjuncts(doc: Any) -> tuple[frozenset[str], ...]:
    first = next((t for t in doc if t.dep_ == "conj"), None)
    if first is None:
        return ()
    members, todo = [first.head], [first.head]
    while todo:
        for child in todo.pop().children:
            if child.dep_ == "conj":
                members.append(child)
                todo.append(child)
    out = []
    for m in members:
        inner = {t.i for o in members if o is not m and m.is_ancestor(o) for t in o.subtree}
        inner |= {  # the subject is shared by the members, not a member's own
            t.i for c in m.children if c.dep_ in ("nsubj", "nsubjpass") for t in c.subtree
        }
        out.append(frozenset(_lemma(t) for t in m.subtree if t.i not in inner and _is_content(t)))
    return tuple(out)


def _lemma(tok: Any) -> str:
    return str(tok.lemma_).lower()


def _is_content(tok: Any) -> bool:
    return (
        tok.pos_ in _CONTENT_POS
        and not tok.is_stop
        and not tok.like_num
        and tok.lower_ not in FORMAT_WORDS
        and any(ch.isalpha() for ch in tok.text)
        and not any(ch.isdigit() for ch in tok.text)  # identifiers are values
    )


@lru_cache(maxsize=65536)
def claim(text: str) -> Claim:
    doc = parse(text)
    roots = [t for t in doc if t.dep_ == "ROOT"]
    preds: list[Any] = []
    for root in roots:
        preds.append(root)
        preds.extend(
            t
            for t in root.subtree
            if t.dep_ == "conj" and t.pos_ in ("VERB", "AUX") and t.head in preds
        )
    subject: set[str] = set()
    owners: set[str] = set()
    subject_values: set[str] = set()
    qualifiers: set[str] = set()
    for pred in preds:
        for child in pred.children:
            if child.dep_ in ("nsubj", "nsubjpass"):
                subject.update(_lemma(t) for t in child.subtree if _is_content(t))
                span = doc[child.left_edge.i : child.right_edge.i + 1]
                subject_values.update(values(span.text))
                for mod in child.children:
                    if mod.dep_ == "compound" and mod.pos_ in ("NOUN", "PROPN"):
                        qualifiers.update(_lemma(t) for t in mod.subtree if _is_content(t))
                for poss in (t for t in child.subtree if t.dep_ == "poss" and t.pos_ != "PRON"):
                    owners.update(_lemma(t) for t in poss.subtree if t.pos_ != "PART")
    negated = any(t.dep_ == "neg" or t.lower_ in _NEGATORS for t in doc)
    content = frozenset(_lemma(t) for t in doc if _is_content(t)) - subject
    parts = []
    pred_ids = {p.i for p in preds}
    for pred in preds:
        own = [
            t
            for t in pred.subtree
            if not any(
                a.i in pred_ids and a.i != pred.i
                for a in [t, *t.ancestors]
                if a.i > pred.i or a is t
            )
        ]
        parts.append(frozenset(_lemma(t) for t in own if _is_content(t)) - subject)
    return Claim(
        text=text,
        subject=frozenset(subject),
        content=content,
        values=values(text),
        negated=negated,
        parts=tuple(parts),
        predicates=tuple(_lemma(p) for p in preds),
        owners=frozenset(owners),
        qualifiers=frozenset(qualifiers),
        counts=frozenset(
            f"{value} {_lemma(t.head)}"
            for t in doc
            if t.dep_ == "nummod" and t.head.pos_ == "NOUN" and t.i < t.head.i
            for value in values(t.text)
        ),
        subject_values=frozenset(subject_values),
        names=frozenset(
            _lemma(t)
            for t in doc
            if (_is_content(t) or t.dep_ == "poss" and t.pos_ != "PRON")
            and (t.pos_ in ("PROPN", "ADJ") or t.dep_ in ("compound", "amod", "nmod", "poss"))
        ),
        said=(said := _said(doc)),
        labels=_labels(doc, said),
        conjuncts=_conjuncts(doc),
        lexicon=frozenset(w for t in doc for w in (t.lower_, _lemma(t))),
    )
