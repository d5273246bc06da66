"""Step 6, ``weigh``: one candidate's measurements as the policy's :class:`Evidence`.

Adds the lexical signals the model misses (the memory already contains the fact; the memory
packs several claims and the fact leaves some standing; the fact restates, changes or adds to
the memory's canonical values; the fact says what the memory says, of another subject; the
two name two things of one kind, "Hive 2" and "Hive 4"),
computed only where they can matter: for the hits ``relate`` sends to the model
(``hit.forward``), which are exactly the candidates the rule weighs (above the floor).
"""

from __future__ import annotations

from typing import NamedTuple

from engine.gate import claims, overlap
from engine.gate.claims import change, qa, when
from engine.gate.claims.compare import beyond_time
from engine.gate.policy import Evidence, Policy
from engine.gate.probe import Hit, Probe

__all__ = ["weigh"]


class _Claims(NamedTuple):
    """What the two parsed claims say about each other (all off when not parsed)."""

    new_values: bool = False
    partial: bool = False
    changed_kinds: frozenset[str] = frozenset()
    value_change: bool = False
    restated: bool = False
    beside: bool = False
    another: bool = False
    apart: bool = False


def _compare(memory: str, fact: str, policy: Policy) -> _Claims:
    old, new = claims.claim(memory), claims.claim(fact)
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


def _dated(memory: str, fact: str) -> str:
    """``later`` / ``earlier`` when both are dated and say more than their times differ."""
    got = when.order(when.stamp(fact), when.stamp(memory))
    return got if got and beyond_time(claims.claim(memory), claims.claim(fact)) else ""


def _mismatch(got: _Claims, asked: bool | None) -> str:
    if got.another:
        return "other_subject"
    if got.apart:
        return "other_instance"
    return "other_question" if asked is False else ""


def weigh(probe: Probe, hit: Hit, policy: Policy, memory_id: str) -> Evidence:
    """``memory_id`` is the hit's id as the decision reports it (an in-batch ref resolved)."""
    ref, fact = hit.ref, probe.fact
    near = policy.lexical and hit.forward
    got = _compare(ref.text, fact.text, policy) if near and policy.claims else _Claims()
    parsed = hit.forward and policy.claims  # the signals read the parse (identify's too)
    dated = _dated(ref.text, fact.text) if parsed and policy.time_order else ""
    asked = qa.same_question(ref.text, fact.text) if near else None  # None: not both Q? A.
    return Evidence(
        memory_id=memory_id,
        text=ref.text,
        similarity=hit.similarity,
        contradiction=hit.contradiction,
        entailment=hit.entailment,
        reverse_entailment=hit.reverse_entailment,
        key=ref.key,
        mismatch=_mismatch(got, asked),
        contained=near and not got.new_values and overlap.contains(ref.text, fact.text),
        partial=near  # a "question? answer" is one claim
        and asked is None
        and (overlap.claims(ref.text, fact.text).partial or got.partial),
        same_question=bool(asked),
        subject=hit.subject,
        attribute=hit.attribute,
        new_values=got.new_values,
        changed_kinds=got.changed_kinds,
        value_change=got.value_change,
        restated=got.restated,
        beside=got.beside,
        dated=dated,
        changed_from=parsed and policy.explicit_change and change.holds_old(fact.text, ref.text),
    )
