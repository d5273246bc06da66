"""Step 3b, ``identify``: does each near candidate speak of the fact's attribute?

The positive evidence a replacement needs (issue 12, item 4) from general signals: the subject
relation from spaCy's parse (:func:`engine.gate.claims.frame.subject_relation`), and the
embedder's similarity of the two *frames*, the texts once the shared subject and the values are
taken out (:func:`engine.gate.claims.frame.frame`). "Maya is allergic to peanuts" and "Maya
follows a vegan diet" are similar sentences (same person) with dissimilar frames (two
attributes); "Keiko has lived in Kobe since 2019" and "Keiko lives in Osaka" have nearly equal
frames. Two texts with nothing left but the shared subject and the values ("Stonebridge's
compliance officer is Maud Ellery" / "... is Amos Reyes") speak of one attribute (1.0); so do
two texts of which one is nothing but its subject and values and the other names every word of
that subject ("The shop's broadband is 80 Mbps" / "The shop upgraded its broadband to 900
Mbps"). Otherwise, when only one side has words left, the attribute is not measured (None).
All frames of a batch go to the embedder in one call, and all its texts to the parser in one
(after ``relate``).

Only the hits the decision can weigh are read: those ``relate`` sends to the model
(``hit.forward``: at or above the floor, or with a matching attribute key above the key-match
floor, and not a sibling). The rule reads ``subject`` and ``attribute`` of no other hit, so
every decision is the same as when all near hits were read; the others report ``attribute``
None (not measured). In bench_gate's N = 1,000 scenario this cut the frames embedded per fact
from 11.0 to 1.9.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.gate.claims import claim
from engine.gate.claims.compare import coverage
from engine.gate.claims.frame import frame, shared_subject, subject_relation
from engine.gate.claims.nlp import parse
from engine.gate.policy import Policy
from engine.gate.ports import Embedder
from engine.gate.probe import Hit, Probe

__all__ = ["identify"]


def _named_by_subject(bare: str, other: str) -> bool:
    """``bare`` is nothing but its subject and values, and the other text names every word of
    that subject: the subject phrase is the attribute ("the shop's broadband"), and the other
    text speaks of it."""
    words = claim(bare).subject
    theirs = claim(other)
    return bool(words) and coverage(words, theirs.subject | theirs.content) == 1.0


def identify(probes: Sequence[Probe], embedder: Embedder, policy: Policy) -> int:
    """Fill ``hit.subject`` and ``hit.attribute`` of every checked fact's hits that ``relate``
    sends to the model (``hit.forward``); returns the number of frames embedded."""
    if not policy.claims:
        return 0
    # every text read here and in weigh, parsed in one batch (memoised for both); relate
    # parses nothing, so it can run first
    parse.many(
        t
        for probe in probes
        if probe.checked
        for t in (probe.fact.text, *(h.ref.text for h in probe.hits if h.forward))
    )
    slots: list[tuple[Hit, str, str]] = []
    for probe in probes:
        if not probe.checked:
            continue
        text = probe.fact.text
        for hit in probe.hits:
            if not hit.forward:
                continue
            hit.subject = subject_relation(text, hit.ref.text)
            drop = shared_subject(text, hit.ref.text)
            a, b = frame(text, drop), frame(hit.ref.text, drop)
            if a and b:
                slots.append((hit, a, b))
            elif not a and not b:
                hit.attribute = 1.0  # nothing but the shared subject and values: one attribute
            elif _named_by_subject(
                text if not a else hit.ref.text, hit.ref.text if not a else text
            ):
                hit.attribute = 1.0  # "The shop's broadband is 80 Mbps": its subject names it
    if not slots:
        return 0
    texts = list(dict.fromkeys(t for _, a, b in slots for t in (a, b)))
    vecs = embedder.embed(texts)
    row = {t: vecs[i] for i, t in enumerate(texts)}
    for hit, a, b in slots:
        hit.attribute = float(np.dot(row[a], row[b]))
    return len(texts)
