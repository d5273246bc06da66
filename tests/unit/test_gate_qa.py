"""Memories shaped "question? answer" (engine.gate.claims.qa) and how the gate weighs them."""

from __future__ import annotations

import pytest

from engine.gate.claims.qa import question, same_question


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (
            "How do I reset the router? Hold the button for ten seconds.",
            "How do I reset the router?",
        ),
        (
            "How many titles do the Knicks have as of 1973? two.",
            "How many titles do the Knicks have as of 1973?",
        ),
        ("The user lives in Denver.", None),
        ("Why? Because.", "Why?"),
        ("Is it on? Yes? No.", None),  # two questions: not one question and its answer
        ("How do I reset the router?", None),  # no answer
    ],
)
def test_question(text: str, want: str | None) -> None:
    assert question(text) == want


def test_same_question_reads_the_question_without_its_time() -> None:
    a = "How many titles do the Knicks have as of 1970? one."
    assert same_question(a, "How many titles do the Knicks have as of 1973? two.") is True
    assert same_question(a, "How many titles do the Celtics have as of 1973? eleven.") is False
    assert same_question(a, "The Knicks have two titles.") is None
    assert (
        same_question(
            "How do I reset the router? Hold the button.", "How do I reset the modem? Unplug it."
        )
        is False
    )
