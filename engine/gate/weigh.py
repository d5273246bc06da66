"""Step 6, ``weigh``: one candidate's measurements as the policy's :class:`Evidence`.

Adds the lexical signals the model misses (the memory already contains the fact; the memory
packs several claims and the fact leaves some standing), computed only where they can matter:
at or above the lowest floor.
"""

from __future__ import annotations

from engine.gate import claims, overlap
from engine.gate.policy import Evidence, Policy
from engine.gate.probe import Hit, Probe

__all__ = ["weigh"]


def weigh(probe: Probe, hit: Hit, policy: Policy, memory_id: str) -> Evidence:
    """``memory_id`` is the hit's id as the decision reports it (an in-batch ref resolved)."""
    ref, rel, fact = hit.ref, hit.relation, probe.fact
    near = policy.lexical and hit.similarity >= min(policy.floor, policy.key_match_floor)
    parsed = near and policy.claims
    old, new = (claims.claim(ref.text), claims.claim(fact.text)) if parsed else (None, None)
    new_values = parsed and bool(claims.values(fact.text) - claims.values(ref.text))
    return Evidence(
        memory_id=memory_id,
        text=ref.text,
        similarity=hit.similarity,
        contradiction=hit.contradiction,
        entailment=hit.entailment,
        reverse_contradiction=hit.reverse_contradiction,
        reverse_entailment=hit.reverse_entailment,
        key=ref.key or ref.inferred_key,
        key_match=bool(rel and rel.key_match),
        key_conflict=bool(rel and rel.key_conflict),
        conflict_reason=rel.reason if rel else "",
        contained=near and not new_values and overlap.contains(ref.text, fact.text),
        partial=near
        and (
            overlap.claims(ref.text, fact.text).partial
            or (old is not None and new is not None and claims.partial(old, new))
            or (
                old is not None
                and new is not None
                and policy.partial_values > 0
                and claims.values_left(old.values, new.values) >= policy.partial_values
            )
        ),
        subject=hit.subject,
        attribute=hit.attribute,
        new_values=new_values,
        changed_kinds=claims.changed_kinds(old.values, new.values)
        if old is not None and new is not None
        else frozenset(),
        value_change=old is not None and new is not None and claims.changes_value(old, new),
        restated=old is not None
        and new is not None
        and claims.restates(old, new, policy.restate_coverage),
    )
