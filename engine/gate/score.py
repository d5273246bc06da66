"""Step 6, ``score``: one NLI call over every pair ``relate`` asked for: forward pairs are
(memory, fact), reverse pairs (fact, memory).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.gate.ports import NLI
from engine.gate.probe import Hit, Probe

__all__ = ["score"]


def score(probes: Sequence[Probe], nli: NLI) -> int:
    """Fill every asked-for hit's probabilities; returns the number of pairs scored."""
    ci, ei = nli.contradiction_index, nli.entailment_index
    pairs: list[tuple[str, str]] = []
    slots: list[tuple[Hit, bool]] = []  # (hit, reverse?) per pair
    for probe in probes:
        for hit in probe.hits:
            if hit.forward:
                pairs.append((hit.ref.text, probe.fact.text))
                slots.append((hit, False))
            if hit.reverse:
                pairs.append((probe.fact.text, hit.ref.text))
                slots.append((hit, True))
    probs = nli.score(pairs) if pairs else np.zeros((0, 2), dtype=np.float32)
    for (hit, reverse), row in zip(slots, probs, strict=True):
        e = None if ei is None else float(row[ei])
        if reverse:
            hit.reverse_entailment = e
        else:
            hit.contradiction, hit.entailment = float(row[ci]), e
    return len(pairs)
