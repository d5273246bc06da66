"""Domain types shared by every layer. Pure: no I/O, no heavy imports."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ACTIONS",
    "KINDS",
    "Action",
    "Candidate",
    "Decision",
    "Event",
    "Fact",
    "Kind",
    "Memory",
    "ReviewItem",
    "Status",
    "ValidFacts",
]

Kind = Literal["episodic", "semantic", "procedural"]
KINDS: tuple[str, ...] = ("episodic", "semantic", "procedural")

Action = Literal["add", "replace", "skip", "review"]
ACTIONS: tuple[str, ...] = ("add", "replace", "skip", "review")

# active: recalled and replaceable. superseded: replaced by a newer memory (its superseded_by).
# forgotten: deleted on request (text erased). undone: a replacement that was undone.
# expired: past its expires_at (engine.lifecycle: applied lazily by time, then by the sweep).
# rejected: a reviewed fact that a reviewer discarded (kept for the audit trail only).
Status = Literal["active", "superseded", "forgotten", "undone", "expired"]


@dataclass(frozen=True, slots=True)
class Fact:
    """An incoming memory write, before the gate decided on it."""

    namespace: str
    text: str
    kind: Kind = "semantic"
    key: str | None = None
    """Explicit attribute key (``plan``, ``timezone``): replaces by key with no model."""
    metadata: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    idempotency_key: str | None = None
    """A retried write with the same key returns the first result and stores nothing twice."""
    expires_at: float | None = None
    """Unix time after which the memory is expired: never recalled nor matched again."""
    ttl_s: float | None = None
    """Seconds from the write until it expires (instead of ``expires_at``); without either,
    the policy's default TTL for the fact's kind applies, if any."""


class ValidFacts(tuple[Fact, ...]):
    """Facts checked once, at the edge, by the gate's fact rule
    (:func:`engine.gate.gate.validate_fact`): nothing downstream checks them again.

    Made by whoever ran the rule: the engine core (:meth:`engine.core.Engine.triage`, for the
    server and every in-process caller) hands a batch to ``Gate.triage`` as ``ValidFacts``
    together with the policy it resolved, and the gate takes both as they are; a plain
    sequence of facts is checked by the gate itself (direct library callers). A tuple, so
    every gate wrapper that iterates or counts its facts keeps working.

    ``encoded``: when set, one entry per fact, the embedder's encoding of the fact's text made
    for the batch's token budget (:meth:`engine.runtime.base.TokenModel.encode_items`); the
    gate's embed step hands them to the embedder, which does not tokenise those texts again
    (TEI's queue entries carry their encodings the same way). Opaque here: no tokenizer is
    imported by the pure records."""

    encoded: tuple[Any, ...] | None = None

    @classmethod
    def of(cls, facts: Iterable[Fact], encoded: Sequence[Any] | None) -> ValidFacts:
        """``facts`` with their encodings (one per fact)."""
        made = cls(facts)
        if encoded is not None:
            if len(encoded) != len(made):
                raise ValueError(f"{len(encoded)} encodings for {len(made)} facts")
            made.encoded = tuple(encoded)
        return made

    def pick(self, indexes: Iterable[int]) -> ValidFacts:
        """The facts at ``indexes``, in that order, each with its encoding."""
        at = list(indexes)
        encoded = None if self.encoded is None else [self.encoded[i] for i in at]
        return ValidFacts.of([self[i] for i in at], encoded)


@dataclass(frozen=True, slots=True)
class Memory:
    """A stored memory, as the store returns it."""

    id: str
    namespace: str
    kind: Kind
    text: str
    key: str | None
    metadata: dict[str, Any]
    source: str | None
    created_at: float
    status: Status
    supersedes: str | None
    superseded_by: str | None
    scores: dict[str, Any]
    """Scores of the decision that stored this memory (similarity, contradiction, rule, policy)."""
    inferred_key: str | None = None
    """Attribute key inferred from the text, in memories stored before issue 31 retired the
    attribute keys (a memory stored now has None)."""
    expires_at: float | None = None
    """When it expires (Unix seconds); None: never."""
    inactive_since: float | None = None
    """When it stopped being active (superseded, undone, forgotten or expired); None while
    active (and for memories deactivated before the store recorded it)."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored memory the gate considered for one incoming fact."""

    memory_id: str
    text: str
    similarity: float
    contradiction: float | None = None
    """None when the candidate was below the floor and never scored."""
    entailment: float | None = None
    """Entailment of the new fact by the memory, when the NLI model has that label."""
    key: str | None = None
    passed: bool = False
    """True when this candidate cleared every check for replacement."""
    reason: str = ""
    """Why it did or did not pass (``below_floor``, ``mismatch:other_subject``,
    ``low_contradiction``...)."""
    attribute: float | None = None
    """Similarity of the two frames (subject and values out): the evidence that memory and fact
    speak of one attribute; None when not measured. In-process only (not on the wire)."""
    duplicate: float | None = None
    """The duplicate judge's probability that the fact restates this memory
    (:mod:`engine.gate.judge`); None when not judged. In-process only (not on the wire)."""
    update: float | None = None
    """The judge's probability that the fact updates this memory (is its replacement), read
    when the rule would replace it; None otherwise. In-process only (not on the wire)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What the gate decided for one fact, with the evidence."""

    action: Action
    fact: Fact
    target_id: str | None
    candidates: tuple[Candidate, ...]
    policy: str
    rule: str
    """Which path decided: ``episodic``, ``keyed``, ``duplicate``, ``contradiction``..."""
    hypothesis: str | None = None
    """The normalised text used as NLI hypothesis, in records of gates before issue 31 (the
    normalisation is retired: a decision made now leaves it None)."""
    inferred_key: str | None = None
    """The attribute key inferred from the text, in records of gates before issue 31 (the keys
    are retired: a decision made now leaves it None)."""
    memory_id: str | None = None
    """Id of the memory stored by this decision (apply mode; None for skip and dry runs)."""
    review_id: str | None = None
    replayed: bool = False
    """True when an idempotency key matched and the first result was returned."""

    def scores(self) -> dict[str, Any]:
        """The compact score record stored with the memory and in the event log."""
        best = next((c for c in self.candidates if c.memory_id == self.target_id), None)
        record: dict[str, Any] = {
            "policy": self.policy,
            "rule": self.rule,
            "target": self.target_id,
            "similarity": None if best is None else round(best.similarity, 6),
            "contradiction": None
            if best is None or best.contradiction is None
            else round(best.contradiction, 6),
            "inferred_key": self.inferred_key,
            "hypothesis": self.hypothesis,
        }
        if best is not None and best.duplicate is not None:
            record["duplicate"] = round(best.duplicate, 6)  # the duplicate judge's probability
        if best is not None and best.update is not None:
            record["update"] = round(best.update, 6)  # the judge's update probability
        return record


@dataclass(frozen=True, slots=True)
class Event:
    """One row of the append-only event log."""

    seq: int
    namespace: str
    type: str
    """add, replace, skip, review_queued, review_resolved, forget, undo."""
    memory_id: str | None
    target_id: str | None
    policy: str | None
    scores: dict[str, Any]
    created_at: float


@dataclass(frozen=True, slots=True)
class ReviewItem:
    """A conflict the review policy queued for a human."""

    id: str
    namespace: str
    fact: Fact
    target_id: str | None
    scores: dict[str, Any]
    status: Literal["pending", "accepted", "kept_both", "rejected"]
    created_at: float
    resolved_memory_id: str | None = None
