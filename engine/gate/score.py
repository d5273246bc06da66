"""Step 5, ``score``: one NLI call over every pair ``relate`` asked for, then verification.

Forward pairs are (memory, fact's normalised text); reverse pairs are (fact, memory). A candidate
that conflicts forward is scored the other way round as well: a real update contradicts both
ways; a refinement or restatement ("studying law" <- "second year of law at Leiden") does not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.gate.policy import Policy
from engine.gate.ports import NLI
from engine.gate.probe import Hit, Probe

__all__ = ["score"]


def score(probes: Sequence[Probe], nli: NLI, policy: Policy) -> int:
    """Fill every asked-for hit's probabilities; returns the number of pairs scored."""
    ci, ei = nli.contradiction_index, nli.entailment_index
    pairs: list[tuple[str, str]] = []
    slots: list[tuple[Hit, bool]] = []  # (hit, reverse?) per pair
    for probe in probes:
        for hit in probe.hits:
            if hit.forward:
                pairs.append((hit.ref.text, probe.nli_text))
                slots.append((hit, False))
            if hit.reverse:
                pairs.append((probe.fact.text, hit.ref.text))
                slots.append((hit, True))
    _fill(slots, _run(nli, pairs), ci, ei)
    total = len(pairs)
    if policy.verify_reverse:
        bar = min(policy.contradiction, policy.key_match_contradiction)
        more: list[tuple[str, str]] = []
        verify: list[tuple[Hit, bool]] = []
        for probe in probes:
            for hit in probe.hits:
                if (
                    hit.forward
                    and not hit.reverse
                    and hit.contradiction is not None
                    and hit.contradiction > bar
                ):
                    hit.reverse = True
                    more.append((probe.fact.text, hit.ref.text))
                    verify.append((hit, True))
        _fill(verify, _run(nli, more), ci, ei)
        total += len(more)
    return total


def _run(nli: NLI, pairs: list[tuple[str, str]]) -> np.ndarray:
    return nli.score(pairs) if pairs else np.zeros((0, 2), dtype=np.float32)


def _fill(slots: list[tuple[Hit, bool]], probs: np.ndarray, ci: int, ei: int | None) -> None:
    for (hit, reverse), row in zip(slots, probs, strict=True):
        c = float(row[ci])
        e = None if ei is None else float(row[ei])
        if reverse:
            hit.reverse_contradiction, hit.reverse_entailment = c, e
        else:
            hit.contradiction, hit.entailment = c, e
