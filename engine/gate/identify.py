"""Step 3b, ``identify``: does each near candidate speak of the fact's attribute?

The positive evidence a replacement needs (issue 12, item 4) from general signals: the subject
relation from spaCy's parse (:func:`engine.gate.claims.frame.subject_relation`), and the
embedder's similarity of the two *frames*, the texts once the shared subject and the values are
taken out (:func:`engine.gate.claims.frame.frame`). "Maya is allergic to peanuts" and "Maya
follows a vegan diet" are similar sentences (same person) with dissimilar frames (two
attributes); "Keiko has lived in Kobe since 2019" and "Keiko lives in Osaka" have nearly equal
frames. Two texts with nothing left but the shared subject and the values ("Stonebridge's
compliance officer is Maud Ellery" / "... is Amos Reyes") speak of one attribute (1.0); when
only one side has words left, the attribute is not measured (None). All frames of a batch go to
the embedder in one call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.gate.claims.frame import frame, shared_subject, subject_relation
from engine.gate.policy import Policy
from engine.gate.ports import Embedder
from engine.gate.probe import Hit, Probe

__all__ = ["identify"]


def identify(probes: Sequence[Probe], embedder: Embedder, policy: Policy) -> int:
    """Fill ``hit.subject`` and ``hit.attribute`` of every checked hit at or above the lowest
    floor; returns the number of frames embedded."""
    if not policy.claims:
        return 0
    low = min(policy.floor, policy.key_match_floor)
    slots: list[tuple[Hit, str, str]] = []
    for probe in probes:
        if not probe.checked:
            continue
        text = probe.nli_text
        for hit in probe.hits:
            if hit.similarity < low:
                continue
            hit.subject = subject_relation(text, hit.ref.text)
            drop = shared_subject(text, hit.ref.text)
            a, b = frame(text, drop), frame(hit.ref.text, drop)
            if a and b:
                slots.append((hit, a, b))
            elif not a and not b:
                hit.attribute = 1.0  # nothing but the shared subject and values: one attribute
    if not slots:
        return 0
    texts = list(dict.fromkeys(t for _, a, b in slots for t in (a, b)))
    vecs = embedder.embed(texts)
    row = {t: vecs[i] for i, t in enumerate(texts)}
    for hit, a, b in slots:
        hit.attribute = float(np.dot(row[a], row[b]))
    return len(texts)
