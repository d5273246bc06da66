"""engine.gate.claims.change: the explicit old -> new forms, and holds_old's three conditions
(the memory holds the old value, not already the new one, and the fact's subject)."""

from __future__ import annotations

import pytest

from engine.gate.claims import change


@pytest.mark.parametrize(
    ("fact", "old", "new"),
    [
        ('X\'s status changed from "Improved" to "Excellent".', '"Improved"', '"Excellent"'),
        ("The standup has been moved from Monday to Tuesday.", "Monday", "Tuesday"),
        ("Her plan was upgraded from Basic to Pro", "Basic", "Pro"),
        ("Dana no longer works at Acme, now at Initech.", "works at Acme", "at Initech"),
        ("Dana is no longer vegetarian; she is now vegan.", "vegetarian; she", "vegan"),
        (
            "Location of cup was on the table before, and in the sink afterwards.",
            "on the table",
            "in the sink",
        ),
    ],
)
def test_parse_reads_each_form(fact: str, old: str, new: str) -> None:
    got = change.parse(fact)
    assert got is not None
    assert (got.old, got.new) == (old, new)


@pytest.mark.parametrize(
    "fact",
    [
        "I fly from London to Paris on Friday.",  # a route: no change verb before "from"
        "The shop is open from 9 to 5.",
        "Dana works at Initech.",
        "Dana was at Acme before joining Initech.",  # "before" without "after"
    ],
)
def test_parse_finds_no_change_where_none_is_stated(fact: str) -> None:
    assert change.parse(fact) is None


def test_holds_old_on_the_same_subject_with_the_old_value() -> None:
    assert change.holds_old(
        'X\'s status changed from "Improved" to "Excellent".', "X's status is Improved."
    )
    assert change.holds_old(
        "Location of cup was on the table before and in the sink afterwards.",
        "Location of the cup is on table.",
    )
    assert change.holds_old(
        "The standup has been moved from Monday to Tuesday.", "The standup is on Monday."
    )


def test_never_for_another_subject_with_the_same_value() -> None:
    fact = "Location of cup was on table before and in sink afterwards."
    assert not change.holds_old(fact, "Location of plate is on table.")
    assert not change.holds_old(fact, "Temperature of cup is on table.")  # another attribute
    assert not change.holds_old(
        'X\'s status changed from "Improved" to "Excellent".', "Y's status is Improved."
    )


def test_not_when_the_memory_lacks_the_old_value_or_holds_the_new() -> None:
    fact = "Location of cup was on table before and in sink afterwards."
    assert not change.holds_old(fact, "Location of cup is in cupboard.")
    assert not change.holds_old(fact, "Location of cup is in sink, not on table.")


def test_no_signal_without_a_subject_outside_the_change() -> None:
    # "I" is a stop word: nothing outside the change phrase names the subject
    assert not change.holds_old("I no longer live in Boston, now in Chicago.", "I live in Boston.")
    assert not change.holds_old("Changed from Basic to Pro.", "The plan is Basic.")
    assert not change.holds_old("The memo says it runs from May to June.", "The memo is May.")


def test_content_words_fold_case_articles_possessives_and_punctuation() -> None:
    assert change.content_words("The Cup's location, on a table!") == {"cup", "location", "table"}
