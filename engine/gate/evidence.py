"""Step 5, ``evidence``: each candidate's measurements as one typed
:class:`~engine.gate.policy.Evidence`, built here and nowhere else.

Only the hits at or above the floor (``hit.forward``) are read, from one batch parse: the subject
relation and the embedder's similarity of the two *frames* (:mod:`engine.gate.claims.frame`,
one embedder call per batch), the claim comparisons, overlap and time order. :func:`settle`
takes back the model pairs whose scores cannot change a decision; :func:`scored` adds the
probabilities of the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from engine.gate import claims, overlap
from engine.gate.claims import change, qa, when
from engine.gate.claims.compare import beyond_time, coverage
from engine.gate.claims.frame import frame, shared_subject, subject_relation
from engine.gate.claims.nlp import parse
from engine.gate.policy import Evidence, Policy
from engine.gate.ports import Embedder
from engine.gate.probe import Hit, Probe

__all__ = ["measure", "scored", "settle", "weigh"]


def measure(probes: Sequence[Probe], embedder: Embedder, policy: Policy) -> int:
    """Set every probe's ``evidence`` (one record per hit, in the hits' order); returns the
    number of frames embedded."""
    if policy.claims:  # every text read below, parsed in one batch (memoised for all readers)
        parse.many(
            t
            for probe in probes
            if probe.checked
            for t in (probe.fact.text, *(h.ref.text for h in probe.hits if h.forward))
        )
    subject: dict[tuple[int, int], str] = {}
    attribute: dict[tuple[int, int], float] = {}
    slots: list[tuple[tuple[int, int], str, str]] = []
    for p, probe in enumerate(probes):
        if not (probe.checked and policy.claims):
            continue
        text = probe.fact.text
        for h, hit in enumerate(probe.hits):
            if not hit.forward:
                continue
            memory = hit.ref.text
            subject[p, h] = subject_relation(text, memory)
            drop = shared_subject(text, memory)
            a, b = frame(text, drop), frame(memory, drop)
            if a and b:
                slots.append(((p, h), a, b))
            elif not (a or b) or _named_by_subject(
                text if not a else memory, memory if not a else text
            ):
                attribute[p, h] = 1.0  # nothing but subject and values, or its subject names it
    texts = list(dict.fromkeys(t for _, a, b in slots for t in (a, b)))
    if texts:
        vecs = embedder.embed(texts)
        row = {t: vecs[i] for i, t in enumerate(texts)}
        for at, a, b in slots:
            attribute[at] = float(np.dot(row[a], row[b]))
    for p, probe in enumerate(probes):
        probe.evidence = [
            weigh(probe.fact.text, hit, policy, subject.get((p, h), ""), attribute.get((p, h)))
            for h, hit in enumerate(probe.hits)
        ]
    return len(texts)


def settle(probes: Sequence[Probe], policy: Policy, *, judged: int) -> int:
    """Take back the model pairs whose scores cannot change a decision nor the judge's reading
    (``judged``: how many of the closest candidates it reads); returns how many. A candidate is
    *fixed* when no earlier fact of the batch can replace it. A fixed one that contains or
    restates the fact means a skip: only the closest (fixed) one is scored. One about something
    else (``mismatch``) never passes: not scored when ``judged`` fixed candidates are closer.
    """
    threatened: dict[str, set[str]] = {}  # namespace -> ids an earlier fact may replace
    keys: dict[str, set[str]] = {}  # namespace -> keys of earlier keyed facts
    dropped = 0
    for probe in probes:
        ns = probe.fact.namespace
        mine = [(h, e) for h, e in zip(probe.hits, probe.evidence, strict=True) if h.forward]
        gone, keyed = threatened.setdefault(ns, set()), keys.setdefault(ns, set())
        fixed = [_fixed(h, gone, keyed) for h, _ in mine]
        skip = any(f and (e.contained or e.restated) for f, (_, e) in zip(fixed, mine, strict=True))
        if mine and fixed[0] and skip:
            drop = [h for h, _ in mine[1:]]
        else:  # mismatched ones with ``judged`` fixed ones closer
            drop = [h for i, (h, e) in enumerate(mine) if e.mismatch and sum(fixed[:i]) >= judged]
        for hit in drop:
            dropped += hit.forward + hit.reverse
            hit.forward = hit.reverse = False
        gone.update(h.ref.memory_id for h, _ in mine)
        if probe.fact.key is not None:
            keyed.add(probe.fact.key)
    return dropped


def _fixed(hit: Hit, gone: set[str], keyed: set[str]) -> bool:
    """A stored memory that no earlier fact of the batch can replace."""
    ref = hit.ref
    return ref.rowid is not None and ref.memory_id not in gone and ref.key not in keyed


def scored(probes: Sequence[Probe]) -> None:
    """Put the model's probabilities (:func:`engine.gate.score.score`) into the records."""
    for probe in probes:
        probe.evidence = [
            ev
            if hit.contradiction is None and hit.reverse_entailment is None
            else replace(
                ev,
                contradiction=hit.contradiction,
                entailment=hit.entailment,
                reverse_entailment=hit.reverse_entailment,
            )
            for hit, ev in zip(probe.hits, probe.evidence, strict=True)
        ]


def _named_by_subject(bare: str, other: str) -> bool:
    """``bare`` is nothing but its subject and values, and the other text names every word of
    that subject ("the shop's broadband")."""
    words = claims.claim(bare).subject
    theirs = claims.claim(other)
    return bool(words) and coverage(words, theirs.subject | theirs.content) == 1.0


class _Claims(NamedTuple):
    """What two parsed claims say of each other (all off when not compared)."""

    new_values: bool = False
    partial: bool = False
    changed_kinds: frozenset[str] = frozenset()
    value_change: bool = False
    restated: bool = False
    beside: bool = False
    another: bool = False
    apart: bool = False


def _compare(old: claims.Claim, new: claims.Claim, policy: Policy) -> _Claims:
    return _Claims(
        new_values=bool(new.values - old.values),
        partial=claims.partial(old, new)
        or claims.negates_part(old, new)
        or 0 < policy.partial_values <= claims.values_left(old.values, new.values),
        changed_kinds=claims.changed_kinds(old.values, new.values),
        value_change=claims.changes_value(old, new),
        restated=claims.restates(old, new, policy.restate_coverage),
        beside=claims.adds_beside(old, new),
        another=claims.says_of_another(old, new),
        apart=claims.named_apart(old, new),
    )


def weigh(
    fact: str, hit: Hit, policy: Policy, subject: str = "", attribute: float | None = None
) -> Evidence:
    """One candidate's evidence: ``hit``'s scores, the identified ``subject`` relation and
    ``attribute`` similarity, and the text signals of the memory and ``fact``."""
    ref, near, parsed = hit.ref, policy.lexical and hit.forward, hit.forward and policy.claims
    got = _Claims()
    dated = ""
    if parsed:
        old, new = claims.claim(ref.text), claims.claim(fact)
        got = _compare(old, new, policy) if near else got
        if policy.time_order:  # later / earlier, when both are dated and differ beyond that
            order = when.order(when.stamp(fact), when.stamp(ref.text))
            dated = order if order and beyond_time(old, new) else ""
    asked = qa.same_question(ref.text, fact) if near else None  # None: not both "Q? A."
    return Evidence(
        memory_id=ref.memory_id,
        text=ref.text,
        similarity=hit.similarity,
        contradiction=hit.contradiction,
        entailment=hit.entailment,
        reverse_entailment=hit.reverse_entailment,
        key=ref.key,
        mismatch=_mismatch(got, asked),
        contained=near and not got.new_values and overlap.contains(ref.text, fact),
        partial=near  # a "question? answer" is one claim
        and asked is None
        and (overlap.claims(ref.text, fact).partial or got.partial),
        same_question=bool(asked),
        subject=subject,
        attribute=attribute,
        new_values=got.new_values,
        changed_kinds=got.changed_kinds,
        value_change=got.value_change,
        restated=got.restated,
        beside=got.beside,
        dated=dated,
        changed_from=parsed and policy.explicit_change and change.holds_old(fact, ref.text),
    )


def _mismatch(got: _Claims, asked: bool | None) -> str:
    if got.another:
        return "other_subject"
    if got.apart:
        return "other_instance"
    return "other_question" if asked is False else ""
