"""The per-fact record that the gate's steps fill in (plan, embed, recall, relate, evidence,
score, decide), one field group per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.gate.policy import Evidence
from engine.types import Fact

__all__ = ["Hit", "Probe", "Ref"]


@dataclass(frozen=True, slots=True)
class Ref:
    """A memory the gate can compare against: stored (``rowid`` set) or earlier in this batch
    (``memory_id`` is ``@<index>``, resolved to the id that fact got when it is decided)."""

    memory_id: str
    text: str
    key: str | None
    """The caller's fixed key (``Fact.key``), if any."""
    rowid: int | None = None


@dataclass(slots=True)
class Hit:
    """One candidate of one fact, and what the steps measured about it."""

    ref: Ref
    similarity: float
    rank: int = 0
    """Position among the fact's candidates, most similar first."""
    forward: bool = False
    """``relate``: at or above the floor, so weighed; the model scores (memory -> fact) unless
    ``settle`` takes the pair back (its score cannot change the decision)."""
    reverse: bool = False
    """``relate``: the model scores (fact -> memory) too (the duplicate test)."""
    contradiction: float | None = None
    entailment: float | None = None
    reverse_entailment: float | None = None


@dataclass(slots=True)
class Probe:
    """Everything the gate knows about one incoming fact."""

    index: int
    fact: Fact
    checked: bool
    """A free-text, non-episodic fact without an explicit key: compared against memories."""
    vector: np.ndarray | None = None
    hits: list[Hit] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)
    """``evidence``: one record per hit, in the hits' order."""
