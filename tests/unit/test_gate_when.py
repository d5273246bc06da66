"""Time qualifiers (engine.gate.claims.when): every vocabulary example, and the order of two."""

from __future__ import annotations

import pytest

from engine.gate.claims.when import EXAMPLES, MARKERS, NOW_WORDS, Stamp, order, stamp


@pytest.mark.parametrize(("text", "want"), EXAMPLES)
def test_every_example_reads_its_stamp(text: str, want: str | None) -> None:
    got = stamp(text)
    assert (None if got is None else str(got)) == want


def test_every_marker_and_now_word_is_read() -> None:
    for marker in MARKERS:
        assert str(stamp(f"{marker.capitalize()} 2017 the office is in Oslo.")) == "2017", marker
    for word in NOW_WORDS:
        assert stamp(f"The office is {word} in Oslo.") == Stamp(now=True), word


@pytest.mark.parametrize(
    ("fact", "memory", "want"),
    [
        ("As of 2022, A lives in Tokyo.", "As of 2011, A lives in Chicago.", "later"),
        ("As of 2011, A lives in Chicago.", "As of 2022, A lives in Tokyo.", "earlier"),
        ("Since May 2020 Lena works in Bonn.", "Since March 2020 Lena works in Kiel.", "later"),
        ("In 2020 Lena worked in Bonn.", "Since March 2020 Lena works in Kiel.", ""),
        ("A now lives in Tokyo.", "As of 2011, A lives in Chicago.", "later"),
        ("As of 2022, A lives in Tokyo.", "A currently lives in Chicago.", ""),
        ("A lives in Tokyo.", "As of 2011, A lives in Chicago.", ""),
        ("As of 2011, A lives in Tokyo.", "As of 2011, A lives in Chicago.", ""),
    ],
)
def test_order_of_two_statements(fact: str, memory: str, want: str) -> None:
    assert order(stamp(fact), stamp(memory)) == want


@pytest.mark.parametrize(
    ("memory", "fact", "beyond"),
    [
        ("As of 2011, A lives in Chicago.", "As of 2022, A lives in Tokyo.", True),
        ("As of 2019, M plays for Groupama-FDJ.", "As of 2022, M plays for Cofidis.", True),
        ("Ana was born in 1990.", "Ana was born in 1991.", False),
        ("In 2021, the fee was $40.", "In 2022, the fee was $45.", True),
        # a year outside the qualifier is a value, even the qualifier's own year
        (
            "As of 2019, the last title was won in 2019.",
            "As of 2016, the last title was won in 2016.",
            True,
        ),
    ],
)
def test_a_time_is_a_qualifier_only_when_more_than_the_time_differs(
    memory: str, fact: str, beyond: bool
) -> None:
    from engine.gate.claims import claim
    from engine.gate.claims.compare import beyond_time

    assert beyond_time(claim(memory), claim(fact)) is beyond
