"""Overlap's tokens come from spaCy's tokenizer (the gate's one tokeniser), normalised here."""

from __future__ import annotations

from engine.gate import overlap
from engine.gate.claims.nlp import words


def test_words_are_spacy_tokens_that_join_back_to_the_text() -> None:
    text = "Rosa's account id is PC-0048213."
    assert "".join(words(text)) == text
    assert "'s" in [w.strip() for w in words(text)]


def test_letters_the_tokenizer_splits_without_a_space_stay_one_word() -> None:
    # spaCy's exceptions split "id" (as in "I'd") and "cannot"; a content word is still whole
    assert overlap.content_tokens("Rosa's account id is PC-0048213.") == (
        "rosa",
        "account",
        "id",
        "pc",
        "0048213",
    )
    assert overlap.contains("Rosa's account id is PC-0048213.", "Rosa's account ID: PC0048213")


def test_containment_needs_every_content_word_and_the_same_polarity() -> None:
    memory = "The team standup is at 9am every weekday in room 4."
    assert overlap.contains(memory, "The team standup is at 9am.")
    assert not overlap.contains(memory, "The team standup is at 10am.")
    assert not overlap.contains(memory, "The team standup is not at 9am.")


def test_a_fact_touching_some_claims_of_a_packed_memory_is_partial() -> None:
    memory = "Keiko lives in Trieste, teaches piano at the conservatory, and coaches the choir."
    assert overlap.claims(memory, "Keiko teaches violin.").partial
    assert not overlap.claims("Keiko teaches piano.", "Keiko teaches violin.").partial
