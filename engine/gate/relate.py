"""Step 4, ``relate``: how each candidate relates to the fact's attribute, and what to score.

A candidate at or above the lowest floor gets an attribute :class:`~engine.gate.keys.Relation`
(same attribute, sibling, or unknown). A sibling is never replaced, so the model is not asked
about it; any other candidate above the floor (or with a matching attribute above the key-match
floor) is scored memory -> fact. The most similar candidate, when it is nearly identical, is
also scored fact -> memory, where the model has an entailment label: a duplicate must entail
both ways.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.gate import keys as keymod
from engine.gate import overlap
from engine.gate.policy import Policy
from engine.gate.probe import Hit, Probe

__all__ = ["relate"]


def relate(probes: Sequence[Probe], policy: Policy, *, has_entailment: bool) -> None:
    low = min(policy.floor, policy.key_match_floor)
    for probe in probes:
        for hit in probe.hits:
            if hit.similarity < low:
                continue
            hit.relation = _relation(probe, hit, policy) if policy.keys else None
            rel = hit.relation
            if rel is not None and rel.key_conflict:
                continue
            if hit.similarity < policy.floor and not (rel is not None and rel.key_match):
                continue
            hit.forward = True
            hit.reverse = (  # for the duplicate test only: both ways must entail
                policy.duplicates
                and hit.rank == 0
                and hit.similarity >= policy.duplicate_similarity
                and has_entailment
            )


def _relation(probe: Probe, hit: Hit, policy: Policy) -> keymod.Relation:
    fact, ref = probe.fact, hit.ref
    rel = keymod.compare_keys(fact.text, ref.text, fact.key, ref.key)
    if rel.key_match or rel.key_conflict:
        return rel
    if (
        not rel.key_match
        and hit.similarity >= policy.value_change_similarity
        and policy.lexical
        and overlap.value_change(ref.text, fact.text)
    ):
        return keymod.Relation(key_match=True, key_conflict=False, reason="value_change")
    return rel
