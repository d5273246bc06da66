"""The gate's decision table: one row per :class:`~engine.gate.names.Rule`, in the order the gate
tries them, each with an example that ``tests/model/test_table_examples.py`` runs through the
real gate. Pure data; the README's "How the gate decides" and docs/gate.md are rendered from
:data:`ROWS` (``python -m engine.cli.tabledoc --write``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.gate.names import Rule
from engine.types import Action, Kind

__all__ = ["ROWS", "Entry", "Example", "Row", "row_for"]


@dataclass(frozen=True)
class Entry:
    """A text an example stores first, or the fact it then sends."""

    text: str
    kind: Kind = "semantic"
    key: str | None = None
    idempotency_key: str | None = None


@dataclass(frozen=True)
class Example:
    """Store ``memories`` (``Gate.ingest``), then triage ``fact`` under ``policy`` (a dry run):
    the decision's action is ``action`` and its rule's head is the row's."""

    memories: tuple[Entry, ...]
    fact: Entry
    action: Action
    policy: str = "strict"
    target: int | None = None
    """Index in ``memories`` of the decision's target, where the example checks it."""
    overrides: Mapping[str, bool | float] = field(default_factory=dict)
    """Per-request policy overrides, for a rule a named policy keeps off."""


@dataclass(frozen=True)
class Row:
    rule: Rule
    when: str
    """The condition, in one line."""
    strict: str
    """What it leads to under ``strict`` (``-``: the rule is not reached there)."""
    review: str
    """What it leads to under ``review``."""
    example: Example | None
    why: str = ""
    """Why a row has no example (it must say, when ``example`` is None)."""


def _m(*texts: str) -> tuple[Entry, ...]:
    return tuple(Entry(t) for t in texts)


ROWS: tuple[Row, ...] = (
    Row(
        Rule.REPLAYED,
        "the fact's idempotency key is already stored: its recorded result, nothing decided",
        "recorded",
        "recorded",
        Example(
            (Entry("Alice lives in Denver.", idempotency_key="w-1"),),
            Entry("Alice lives in Chicago.", idempotency_key="w-1"),
            "add",
        ),
    ),
    Row(
        Rule.EPISODIC,
        "an episode: appended, never a candidate",
        "add",
        "add",
        Example(
            _m("The user asked about refunds."),
            Entry("The user asked about refunds.", kind="episodic"),
            "add",
        ),
    ),
    Row(
        Rule.KEYED_NEW,
        "a keyed fact whose key holds no active memory",
        "add",
        "add",
        Example(
            (Entry("The user is on the Pro plan.", key="plan"),),
            Entry("The user's timezone is CET.", key="timezone"),
            "add",
        ),
    ),
    Row(
        Rule.KEYED_SAME,
        "a keyed fact repeating its key's memory word for word",
        "skip",
        "skip",
        Example(
            (Entry("The user is on the Pro plan.", key="plan"),),
            Entry("The user is on the Pro plan.", key="plan"),
            "skip",
            target=0,
        ),
    ),
    Row(
        Rule.KEYED,
        "a keyed fact: replaces its key's active memory, no model",
        "replace",
        "replace",
        Example(
            (Entry("The user is on the Pro plan.", key="plan"),),
            Entry("The user is on the Team plan.", key="plan"),
            "replace",
            target=0,
        ),
    ),
    Row(
        Rule.NO_CANDIDATE_ABOVE_FLOOR,
        "no memory reaches the similarity floor",
        "add",
        "add",
        Example(
            _m("The customer's office is in Denver."),
            Entry("The customer is learning to play the cello."),
            "add",
        ),
    ),
    Row(
        Rule.DUPLICATE,
        "the closest memory is near-identical, not contradicted, with no new value",
        "skip",
        "skip",
        Example(
            _m("The user is allergic to cats."),
            Entry("The user is very allergic to cats."),
            "skip",
            target=0,
        ),
    ),
    Row(
        Rule.CONTAINED,
        "a memory already says every content word of the fact",
        "skip",
        "skip",
        Example(
            _m("The team standup is at 9am every weekday in room 4."),
            Entry("The team standup is at 9am."),
            "skip",
            target=0,
        ),
    ),
    Row(
        Rule.RESTATED,
        "a memory holds the fact's values in another format",
        "skip",
        "skip",
        Example(
            _m("The dentist appointment is on 2024-03-05."),
            Entry("The dentist appointment is on March 5, 2024."),
            "skip",
            target=0,
        ),
    ),
    Row(
        Rule.NO_CONFLICT,
        "candidates above the floor, none contradicted enough to pass",
        "add",
        "add",
        Example(
            _m("The user enjoys hiking in the mountains."),
            Entry("The user enjoys hiking on weekends."),
            "add",
        ),
    ),
    Row(
        Rule.OLDER_THAN_TARGET,
        "the fact is dated before its target: kept as history, never replacing",
        "add",
        "add",
        Example(
            _m("As of 2024, the CEO of Acme is Dana Lee."),
            Entry("As of 2015, the CEO of Acme is Tom Hart."),
            "add",
        ),
    ),
    Row(
        Rule.AMBIGUOUS_TARGET,
        "another conflicting candidate is about as similar as the target",
        "review",
        "review",
        Example(
            _m("The user drives a red car.", "The user drives a green car."),
            Entry("The user drives a blue car."),
            "review",
        ),
    ),
    Row(
        Rule.ATTRIBUTE_RIVAL,
        "a memory whose frame is nearer the fact holds a value of the kind it changes",
        "review",
        "review",
        Example(
            _m("The card has an annual fee of $95.", "The card has a credit limit of $6,500."),
            Entry("The card's limit is $8,000."),
            "review",
            target=0,
        ),
    ),
    Row(
        Rule.DOMINATED,
        "a memory clearly more similar than the target, which the fact does not contradict",
        "add",
        "add",
        Example(
            _m("The user drives a red car.", "A blue car is the user's dream car."),
            Entry("The user drives a blue car."),
            "add",
        ),
    ),
    Row(
        Rule.PARTIAL_CONTRADICTION,
        "the target packs several claims and the fact changes only some",
        "review",
        "review",
        Example(
            _m("Staging runs v2.3 on 3 nodes in eu-north-1."),
            Entry("Staging is on v2.4."),
            "review",
            target=0,
        ),
    ),
    Row(
        Rule.UNPROVEN,
        "strict, without positive evidence of one attribute of one subject (subjects disjoint...)",
        "add",
        "-",
        Example(
            _m("Grandad's appointment is on Monday."),
            Entry("Grandma's appointment is on Friday."),
            "add",
        ),
    ),
    Row(
        Rule.EXPLICIT_CHANGE,
        "the fact changes a value from the one its target holds, same subject",
        "replace",
        "review",
        Example(
            _m("The ticket's status is Open."),
            Entry("The ticket's status changed from Open to Resolved."),
            "replace",
            target=0,
        ),
    ),
    Row(
        Rule.LATER_DATED,
        "the fact is dated after its target, same subject and attribute",
        "replace",
        "review",
        Example(
            _m("As of 2019, Marc plays for Groupama-FDJ."),
            Entry("As of 2023, Marc plays for Team Jumbo."),
            "replace",
            target=0,
        ),
    ),
    Row(
        Rule.CONTRADICTION,
        "the closest candidate the fact contradicts beyond the policy's bar",
        "replace",
        "review",
        Example(
            _m("The user drives a red car."),
            Entry("The user drives a blue car."),
            "replace",
            target=0,
        ),
    ),
    Row(
        Rule.JUDGED_NOT_UPDATE,
        "the judge doubts the target is being replaced (veto)",
        "add",
        "-",
        Example(
            _m("The gym membership costs $40 a month."),
            Entry("The gym locker costs $5 a month."),
            "add",
        ),
    ),
    Row(
        Rule.JUDGED_DUPLICATE,
        "the rule adds, the judge calls a candidate a restatement (off where fitted to bar 1)",
        "skip",
        "skip",
        Example(
            _m("The user prefers tea over coffee."),
            Entry("The user likes tea more than coffee."),
            "skip",
            target=0,
            overrides={"judge_duplicate": 0.8},
        ),
    ),
)
"""The decision table, in the order the gate tries the rules."""


def row_for(rule: str) -> Row:
    """The row of ``rule`` (a composed rule, ``partial_contradiction:key_match`` or
    ``contradiction+confident``, by its head)."""
    head = rule.partition(":")[0].partition("+")[0]
    for row in ROWS:
        if row.rule == head:
            return row
    raise KeyError(rule)
