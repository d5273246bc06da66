"""Gate policies and the pure decision rule. No I/O, no models: unit-tested with synthetic scores.

:func:`apply_rule` reads each candidate's :class:`Evidence` and tries its tests in order, the
first that applies wins; the rows, their order and an example of each are
:data:`engine.gate.table.ROWS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from engine.errors import InvalidInput
from engine.gate.names import Reason, Rule, Subject, confident_rule, detailed, partial_rule
from engine.types import Action, Candidate

__all__ = [
    "POLICY_NAMES",
    "REVIEW",
    "REVIEW_UNCERTAIN",
    "SEED",
    "SEED_REVIEW",
    "STRICT",
    "UPDATE_SIGNALS",
    "Evidence",
    "Policy",
    "Verdict",
    "apply_rule",
    "policy_by_name",
]


@dataclass(frozen=True)
class Policy:
    """Thresholds of one gate policy. Every field is a setting, validated on construction."""

    name: str = "strict"
    mode: Literal["replace", "review"] = "replace"
    """``replace``: conflicts are replaced automatically; ``review``: they go to the queue."""
    floor: float = 0.60
    """Candidates below this cosine similarity are never considered."""
    contradiction: float = 0.95
    """Contradiction probability a candidate must exceed to count as a conflict."""
    dated_contradiction: float = 0.80
    """Lower bar for a candidate the fact is dated after (rule ``later_dated``) or that asks
    the fact's question (``Evidence.same_question``)."""
    top_k: int = 20
    """How many similar memories are recalled per fact."""
    duplicate_similarity: float = 0.90
    """At or above this similarity (and with no contradiction) the fact is a duplicate."""
    duplicate_max_contradiction: float = 0.50
    """A near-identical candidate above this contradiction is an update, not a duplicate."""
    value_change_similarity: float = 0.85
    """At or above this similarity, a candidate the fact repeats with values of the same kinds
    changed (£34 -> £39 a month) passes at ``value_change_contradiction``."""
    value_change_contradiction: float = 0.50
    """The bar for such a value change (:func:`engine.gate.claims.changes_value`)."""
    attribute_margin: float = 0.20
    """A losing candidate holding a value of the kind the fact changes, with a frame this much
    nearer the fact's, may be the attribute meant (the card's fee or its limit?): review."""
    ambiguity_margin: float = 0.05
    """Two passing candidates closer than this in similarity are equally plausible targets."""
    dominance_margin: float = 0.06
    """A passing candidate this much less similar than the best non-conflicting one is not the
    fact's subject: nothing is replaced."""
    review_scope: Literal["all", "uncertain"] = "all"
    """Review mode only. ``all``: every conflict is queued. ``uncertain``: a conflict that would
    pass the strict rules at ``auto_floor`` is replaced, and only the rest is queued."""
    auto_floor: float = 0.60
    """Review mode with ``review_scope="uncertain"``: similarity needed to replace unattended."""
    lexical: bool = True
    """Use lexical containment (duplicates) and claim counting (partial contradictions)."""
    claims: bool = True
    """Parse claims with spaCy (subjects, frames, values, time order)."""
    restate_coverage: float = 0.0
    """Share of the fact's content words the memory must hold for equal values to make a
    restatement (0: equal canonical values suffice; :func:`engine.gate.claims.restates`)."""
    partial_values: int = 2
    """A memory of which a value-changing fact leaves at least this many values standing is a
    partial contradiction: review, never replace (0: off)."""
    evidence: bool = True
    """Replace unattended only with positive evidence of one attribute of one subject
    (:meth:`Evidence.proven`); without it strict adds and review-uncertain queues."""
    attribute_similarity: float = 0.10
    """Frame similarity that counts as one attribute (belongs to the embedder)."""
    judge: bool = True
    """Let the judge fitted for the served models (:mod:`engine.gate.judge`) skip an add as a
    duplicate or hold back a replacement; it never replaces where the rule did not."""
    judge_duplicate: float = 0.80
    """Duplicate probability at or above which the judge skips a fact the rule would add."""
    judge_veto: float = 0.0
    """Update probability below which the judge turns a replacement away (0: no veto)."""
    explicit_change: bool = True
    """A fact naming the old value its candidate holds, same subject ("changed from A to B",
    :mod:`engine.gate.claims.change`), is an update at any contradiction, never vetoed."""
    time_order: bool = True
    """Time qualifiers (:mod:`engine.gate.claims.when`): a fact dated after a candidate of its
    subject and attribute updates it at ``dated_contradiction``, never vetoed; a target the fact
    is dated before is never replaced (``older_than_target``)."""
    duplicates: bool = True
    """Skip a fact as a duplicate of its nearly identical closest candidate."""
    dominance: bool = True
    """Add a fact whose passing candidate is ``dominance_margin`` less similar than the best
    non-conflicting one."""
    model_bars: bool = True
    """A named policy takes the served models' thresholds (:mod:`engine.gate.thresholds`) and
    the judge's bars. Off (the seed policies): its own figures, on every model."""
    episodic_ttl_s: float | None = None
    """Default time to live of an episodic memory, in seconds (None: never); a fact's own
    ``expires_at`` / ``ttl_s`` wins."""
    semantic_ttl_s: float | None = None
    """Default time to live of a semantic memory, in seconds (None: never)."""
    procedural_ttl_s: float | None = None
    """Default time to live of a procedural memory, in seconds (None: never)."""

    def ttl_for(self, kind: str) -> float | None:
        """The default TTL of memories of ``kind`` (None: they never expire)."""
        value: float | None = getattr(self, f"{kind}_ttl_s", None)
        return value

    def __post_init__(self) -> None:
        unit = """attribute_similarity floor contradiction dated_contradiction auto_floor
        duplicate_similarity duplicate_max_contradiction value_change_similarity
        value_change_contradiction restate_coverage attribute_margin judge_duplicate
        judge_veto""".split()
        for name in unit:
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
                raise InvalidInput(f"policy {self.name}: {name} must be in [0, 1], got {value!r}")
        for name in ("ambiguity_margin", "dominance_margin"):
            if not 0.0 <= getattr(self, name) <= 0.5:
                raise InvalidInput(f"policy {self.name}: {name} must be in [0, 0.5]")
        if not isinstance(self.partial_values, int) or not 0 <= self.partial_values <= 20:
            raise InvalidInput(f"policy {self.name}: partial_values must be an int in [0, 20]")
        for name in ("episodic_ttl_s", "semantic_ttl_s", "procedural_ttl_s"):
            ttl = getattr(self, name)
            if ttl is not None and (
                not isinstance(ttl, int | float) or not 0 < float(ttl) <= 3.2e9
            ):
                raise InvalidInput(f"policy {self.name}: {name} must be in (0, 3.2e9] or None")
        if not 1 <= self.top_k <= 200:
            raise InvalidInput(f"policy {self.name}: top_k must be in [1, 200], got {self.top_k}")
        if self.review_scope not in ("all", "uncertain"):
            raise InvalidInput(f"policy {self.name}: review_scope must be 'all' or 'uncertain'")
        if self.mode not in ("replace", "review"):
            raise InvalidInput(f"policy {self.name}: mode must be 'replace' or 'review'")

    def with_overrides(self, overrides: dict[str, Any] | None) -> Policy:
        """A copy with per-request overrides, each validated; unknown names are refused."""
        if not overrides:
            return self
        known = {f.name for f in fields(self)} - {"name", "mode", "model_bars"}
        unknown = set(overrides) - known
        if unknown:
            raise InvalidInput(f"unknown policy override(s): {sorted(unknown)}")
        return replace(self, **overrides)


STRICT = Policy()
REVIEW = Policy(name="review", mode="review", floor=0.45, review_scope="all")
"""Floor 0.45, every conflict is queued, nothing replaced unattended."""
REVIEW_UNCERTAIN = Policy(
    name="review-uncertain", mode="review", floor=0.45, review_scope="uncertain"
)
"""Confident conflicts (those strict would replace at ``auto_floor``) are replaced; only the
uncertain ones are queued."""
SEED = Policy(
    name="seed", floor=0.60, contradiction=0.95, ambiguity_margin=0.0, partial_values=0,
    lexical=False, claims=False, evidence=False, judge=False, time_order=False,
    explicit_change=False, duplicates=False, dominance=False, model_bars=False,
)  # fmt: skip
"""The seed's plain rule, exactly: of the candidates at or above 0.60, the single most similar
one whose contradiction exceeds 0.95 is replaced; everything else is added."""
SEED_REVIEW = replace(SEED, name="seed-review", mode="review", floor=0.45, review_scope="all")
"""The seed's review variant: floor 0.45, every conflict the seed rule finds is queued."""
_POLICIES = {
    "strict": STRICT,
    "review": REVIEW,
    "review-uncertain": REVIEW_UNCERTAIN,
    "seed": SEED,
    "seed-review": SEED_REVIEW,
}
POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


def policy_by_name(name: str) -> Policy:
    try:
        return _POLICIES[name]
    except KeyError:
        choices = ", ".join(POLICY_NAMES)
        raise InvalidInput(f"unknown policy {name!r}: choose one of {choices}") from None


@dataclass(frozen=True)
class Evidence:
    """What the gate measured about one candidate."""

    memory_id: str
    text: str
    similarity: float
    contradiction: float | None = None
    entailment: float | None = None
    """P(memory entails new fact), when the model has an entailment label."""
    reverse_entailment: float | None = None
    """P(new fact entails memory), when measured."""
    key: str | None = None
    """The memory's fixed key (``Fact.key``), reported, never weighed."""
    mismatch: str = ""
    """About something else: ``other_subject``, ``other_instance`` ("Hive 2" and "Hive 4") or
    ``other_question`` (:mod:`engine.gate.claims.qa`)."""
    contained: bool = False
    """The memory already says everything the new fact says (same polarity)."""
    partial: bool = False
    """The memory packs several claims and the new fact leaves some of them standing."""
    restated: bool = False
    """The new fact states the memory's values again, in another format (a duplicate)."""
    changed_kinds: frozenset[str] = frozenset()
    """Kinds of value the fact would change in this memory."""
    value_change: bool = False
    """The fact is the memory with values of the same kinds changed and nothing else."""
    new_values: bool = False
    """The fact states a canonical value the memory does not: never a duplicate nor contained."""
    beside: bool = False
    """The fact adds typed values beside the memory's and changes none of them."""
    subject: str = ""
    """How the subjects relate (:class:`engine.gate.names.Subject`; empty when not measured)."""
    attribute: float | None = None
    """Similarity of the two frames (subject and values out); None when not measured."""
    same_question: bool = False
    """Both are "question? answer" with the same question (:mod:`engine.gate.claims.qa`)."""
    changed_from: bool = False
    """The fact names this candidate's value as the one it changes (``claims.change``)."""
    dated: str = ""
    """``later`` / ``earlier``: the fact's time is after / before the memory's and the two
    differ in more than that (:func:`engine.gate.claims.when.order`)."""

    def signal(self, policy: Policy) -> str:
        """The positive update signal this candidate carries under ``policy``
        (``explicit_change``, ``later_dated``), or empty. Never for another subject."""
        if self.subject in (Subject.DISJOINT, Subject.APART) or self.mismatch:
            return ""
        if policy.explicit_change and self.changed_from:
            return Rule.EXPLICIT_CHANGE
        if (
            policy.time_order
            and self.dated == "later"
            and self.subject == Subject.SHARED
            and self.attribute is not None
            and self.attribute >= policy.attribute_similarity
        ):
            return Rule.LATER_DATED
        return ""

    def proven(self, policy: Policy) -> str:
        """Empty when the evidence shows the same attribute of the same subject (an update
        signal, or subjects not disjoint and frames alike), else why not."""
        if self.subject == Subject.APART:
            return "subject_apart"
        if self.signal(policy):
            return ""
        if self.beside:
            return "values_beside"
        if self.subject == Subject.DISJOINT:
            return "subject_disjoint"
        if self.attribute is None:
            return "attribute_unmeasured"
        if self.attribute < policy.attribute_similarity:
            return f"attribute:{self.attribute:.2f}<{policy.attribute_similarity:.2f}"
        return ""


@dataclass(frozen=True)
class Verdict:
    action: Action
    target_id: str | None
    rule: str
    candidates: tuple[Candidate, ...]


def apply_rule(evidence: Sequence[Evidence], policy: Policy) -> Verdict:
    """Apply the policy to the candidates' evidence (any order)."""
    ranked = sorted(evidence, key=lambda e: -e.similarity)
    reasons: dict[str, tuple[bool, str]] = {}
    above = []
    for ev in ranked:
        if ev.similarity < policy.floor:
            reasons[ev.memory_id] = (False, Reason.BELOW_FLOOR)
        else:
            above.append(ev)

    def out(action: Action, target: str | None, rule: str) -> Verdict:
        cands = tuple(
            Candidate(
                memory_id=ev.memory_id,
                text=ev.text,
                similarity=float(ev.similarity),
                contradiction=None if ev.contradiction is None else float(ev.contradiction),
                entailment=None if ev.entailment is None else float(ev.entailment),
                key=ev.key,
                passed=reasons.get(ev.memory_id, (False, ""))[0],
                reason=str(reasons.get(ev.memory_id, (False, Reason.NOT_REACHED))[1]),
                attribute=None if ev.attribute is None else float(ev.attribute),
            )
            for ev in ranked
        )
        return Verdict(action, target, str(rule), cands)  # plain strings in records

    if not above:
        return out("add", None, Rule.NO_CANDIDATE_ABOVE_FLOOR)

    top = above[0]
    if policy.duplicates and _is_duplicate(top, policy) and not top.signal(policy):
        reasons[top.memory_id] = (False, Reason.DUPLICATE)
        return out("skip", top.memory_id, Rule.DUPLICATE)
    container = next((ev for ev in above if ev.contained), None)
    if container is not None:
        reasons[container.memory_id] = (False, Reason.CONTAINS_NEW_FACT)
        return out("skip", container.memory_id, Rule.CONTAINED)
    restater = next((ev for ev in above if ev.restated), None)
    if restater is not None:
        reasons[restater.memory_id] = (False, Reason.SAME_VALUES)
        return out("skip", restater.memory_id, Rule.RESTATED)

    passing: list[Evidence] = []
    for ev in above:
        bar = policy.contradiction
        if ev.value_change and ev.similarity >= policy.value_change_similarity:
            bar = min(bar, policy.value_change_contradiction)
        signal = ev.signal(policy)
        if signal == Rule.LATER_DATED or ev.same_question:  # the same question re-answered
            bar = min(bar, policy.dated_contradiction)
        elif signal == Rule.EXPLICIT_CHANGE:
            bar = 0.0  # the fact names the old value: no contradiction score is needed
        if ev.mismatch:
            reasons[ev.memory_id] = (False, detailed(Reason.MISMATCH, ev.mismatch))
        elif ev.contradiction is None or ev.contradiction <= bar:
            reasons[ev.memory_id] = (False, Reason.LOW_CONTRADICTION)
        else:
            reasons[ev.memory_id] = (True, signal or Rule.CONTRADICTION)
            passing.append(ev)

    if not passing:
        return out("add", None, Rule.NO_CONFLICT)
    best = passing[0]
    if policy.time_order and best.dated == "earlier":  # history arriving late: kept beside
        reasons[best.memory_id] = (False, Reason.OLDER_THAN_TARGET)
        return out("add", None, Rule.OLDER_THAN_TARGET)
    for rival in (ev for ev in passing if ev is not best):
        if abs(best.similarity - rival.similarity) < policy.ambiguity_margin:
            reasons[rival.memory_id] = (True, Reason.AMBIGUOUS)
            return out("review", best.memory_id, Rule.AMBIGUOUS_TARGET)
    for rival in (ev for ev in above if ev is not best):
        if (
            best.changed_kinds & rival.changed_kinds
            and rival.subject not in (Subject.DISJOINT, Subject.APART)
            and rival.attribute is not None
            and rival.attribute - (best.attribute or 0.0) >= policy.attribute_margin
        ):  # the fact changes a value of the same kind in a memory whose frame is nearer it
            reasons[rival.memory_id] = (True, Reason.NEARER_ATTRIBUTE)
            return out("review", best.memory_id, Rule.ATTRIBUTE_RIVAL)
    closest = above[0]
    if (
        policy.dominance
        and closest is not best
        and closest.similarity - best.similarity >= policy.dominance_margin
    ):
        reasons[best.memory_id] = (False, detailed(Reason.DOMINATED_BY, closest.memory_id))
        return out("add", None, Rule.DOMINATED)
    rule = best.signal(policy) or Rule.CONTRADICTION
    if best.partial:
        return out("review", best.memory_id, partial_rule(rule))
    unproven = best.proven(policy) if policy.evidence else ""
    if policy.mode == "review":
        confident = best.similarity >= policy.auto_floor
        if policy.review_scope == "uncertain" and confident and not unproven:
            return out("replace", best.memory_id, confident_rule(rule))
        return out("review", best.memory_id, rule)
    if unproven:
        reasons[best.memory_id] = (False, detailed(Reason.UNPROVEN, unproven))
        return out("add", None, Rule.UNPROVEN)
    return out("replace", best.memory_id, rule)


UPDATE_SIGNALS = frozenset({Rule.EXPLICIT_CHANGE, Rule.LATER_DATED})
"""Rules whose target carries positive evidence of an update (:meth:`Evidence.signal`): the
judge neither vetoes nor dequeues them."""


def _is_duplicate(ev: Evidence, policy: Policy) -> bool:
    if ev.similarity < policy.duplicate_similarity or ev.mismatch:
        return False
    if ev.new_values:  # another amount, date or id: an update or a sibling, whatever the wording
        return False
    if ev.contradiction is not None and ev.contradiction > policy.duplicate_max_contradiction:
        return False
    if ev.entailment is not None and ev.reverse_entailment is not None:
        return ev.entailment > 0.5 and ev.reverse_entailment > 0.5
    return True
