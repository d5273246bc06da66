"""Claims: value canonicalisation (pure), and parsing/comparison over spaCy's small English
pipeline (a library model package, no ONNX model: the unit tier)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.gate.claims import (
    adds_beside,
    changes_value,
    claim,
    named_apart,
    negates_part,
    partial,
    restates,
    says_of_another,
    values,
    values_left,
)
from engine.gate.claims.compare import abbreviates
from engine.gate.claims.vocab import CURRENCIES, NUMBER_WORDS, UNITS


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("$1,240,000", "1.24 million dollars"),
        ("USD 1,200", "twelve hundred dollars"),
        ("£3,615", "three thousand six hundred and fifteen pounds"),
        ("2,040 people", "two thousand forty people"),
        ("0.75 cubic metres", "750 litres"),
        ("€34 a month", "34 euros a month"),
        ("31/08/2026", "August 31, 2026"),
        ("12 Nov", "12th of November"),
        ("2026-08-31", "31 Aug 2026"),
        ("twelve kilometres", "12 km"),
        ("25mg", "25 milligrams"),
        ("twenty-five percent", "25%"),
        ("8pm", "20:00"),
        ("MSKU 448120-3", "MSKU4481203"),
        ("ISBN 978-0-9552-4411-8", "9780955244118"),
        ("06 12 44 80 19", "0612448019"),
        ("us-east-1", "US-EAST-1"),
        ("3.4 kg", "3400 g"),
        ("1.8 m wide", "180 cm wide"),
        ("90 minutes", "1.5 hours"),
        ("two weeks", "14 days"),
        ("4.850 €", "€4,850.00"),
        ("020 7946 0112", "+44 20 7946 0112"),
        ("INV-2291 (4.850 €)", "invoice INV 2291 for 4850 euros"),
        ("NOREPLY@FLEETWISE.EXAMPLE", "noreply@fleetwise.example."),
        ("a two-year warranty", "24 months"),
        ("https://acme.example/docs/", "https://acme.example/docs"),
        ("mon-fri", "weekdays"),
        ("Monday to Friday", "Mon–Fri"),
        ("at weekends", "the weekend"),
    ],
)
def test_one_value_in_two_formats_has_one_canonical_form(a: str, b: str) -> None:
    assert values(a) and values(a) == values(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("$1,240,000", "£1,240,000"),
        ("12 km", "12 miles"),
        ("31/08/2026", "30 August 2026"),
        ("17:20", "16:40"),
        ("INV-22913", "INV-22914"),
        ("three nodes", "five nodes"),
        ("1.8 m wide", "$1.8m"),
        ("3.4 kg", "3.4 lb"),
        ("020 7946 0112", "020 7946 0113"),
        ("INV-2291", "INV-2219"),
        ("hanna.l@fjordpost.example", "hanna@lindqvist.example"),
        ("10.40.3.61", "10.40.3.27"),
        ("Mon-Fri", "Tue-Sat"),
    ],
)
def test_different_values_differ(a: str, b: str) -> None:
    assert values(a) != values(b)


def test_a_date_that_reads_both_ways_has_both_readings() -> None:
    assert {"date:06-05", "date:05-06"} <= values("05/06/2026")


def test_words_that_are_not_values_yield_nothing() -> None:
    assert values("Maya may call about the new plan.") == frozenset()
    assert values("The sun sat low on Wed evening.") == frozenset()  # lower-case/ambiguous


def test_an_ordinal_is_a_weak_value_not_a_code() -> None:
    assert values("billed on the 4th") == {"ord:4"} and values("12th of November") >= {"month:11"}
    memory, fact = (
        claim("Netstream Premium is billed on the 4th."),
        claim("Netstream Kids is billed on the 4th."),
    )
    assert not restates(memory, fact, 0.0)


def test_weekdays_and_months_named_alone_are_values() -> None:
    assert values("Maya may call on Monday.") == {"weekday:1"}
    assert values("the first Saturday of November") == {"weekday:6", "month:11"}
    assert values("since May") == {"month:05"} and values("Thursdays") == values("Thu.")
    assert values("the first Saturday of November") != values("the first Saturday of October")


def test_an_ipv4_address_and_a_run_of_weekdays_are_one_value_each() -> None:
    assert values("PR-3F-02 IP: 10.40.3.61") == {"id:pr3f02", "ip:10.40.3.61"}
    assert values("VPC 10.0.0.0/16") == {"ip:10.0.0.0/16"}
    assert values("version 1.2.3.999") != {"ip:1.2.3.999"}  # parts above 255: no address
    assert values("open Monday to Thursday") == {"days:1-4"}
    # a run stands where one weekday would: it is one value left standing, not four
    assert values_left(values("weekdays 6-9 pm"), values("Saturday mornings, 8-12")) == 1


def test_abbreviations_count_as_the_word() -> None:
    assert all(abbreviates(s, w) for s, w in [("st", "street"), ("mgr", "manager")])
    assert not any(abbreviates(s, w) for s, w in [("st", "st"), ("prod", "production")])
    assert restates(
        claim("The Maple Street branch closes at 18:00 on weekdays."),
        claim("maple st closes at 6pm mon-fri"),
        0.0,
    )


def test_a_count_of_one_noun_restates_when_the_wording_mostly_agrees() -> None:
    assert claim("Ines has five items on loan.").counts == {"num:5 item"}
    assert claim("Field 7 is put down to grass.").counts == frozenset()  # 7 names the field
    assert restates(
        claim("Round money to two decimal places."),
        claim("Always round amounts to 2 decimal places."),
        0.0,
    )
    assert not restates(  # milk and a mug added: a refinement, not the same claim
        claim("Bev likes tea with two sugars."),
        claim("Bev likes tea with two sugars and a splash of milk, in the blue mug."),
        0.0,
    )


def test_typed_values_beside_the_memory_s_own() -> None:
    assert adds_beside(
        claim("LT-0932 runs Windows 11 24H2."),
        claim("LT-0932 is a Dell Latitude 7440 with 32 GB RAM and a 1 TB SSD."),
    )
    # the fact changes the memory's amount: not beside it
    assert not adds_beside(claim("Rent is $2,200 a month."), claim("Rent is $2,350 from March."))
    # the memory has no typed value of its own: nothing to stand beside
    assert not adds_beside(claim("Halcyon is a sailboat."), claim("Halcyon is 11.6 m long."))


@pytest.mark.parametrize(
    ("memory", "fact"),
    [
        # a note: the label names the subject, the value after the colon is the same
        ("Ms Varga's tutor on Tuesdays: Idris Kalu.", "Mr Varga's tutor on Tuesdays: Idris Kalu."),
        ("Night porter for Block C: Ana Fonseca.", "Day porter for Block C: Ana Fonseca."),
        # one value, said of another weekday's session
        (
            "Choir accompanist on Mondays: Petra Holm.",
            "Choir accompanist on Thursdays: Petra Holm.",
        ),
        # a sentence: verb and object said again of another subject
        ("Ward 6's ward round is at 09:15.", "Ward 8's ward round is at 09:15."),
        ("The east gate closes at 22:00.", "The west gate closes at 22:00."),
    ],
)
def test_the_same_thing_said_of_another_subject(memory: str, fact: str) -> None:
    assert says_of_another(claim(memory), claim(fact))


@pytest.mark.parametrize(
    ("memory", "fact"),
    [
        # what is said changes: an update, not another subject
        ("Lena's loyalty tier: Silver.", "Lena's loyalty tier: Platinum."),
        ("Ward 6's ward round is at 09:15.", "Ward 6's ward round is at 10:00."),
        # a verb that changes what is said of the same things
        (
            "Omar is subscribed to the Fernleaf digest.",
            "Omar unsubscribed from the Fernleaf digest.",
        ),
        # fewer values of one kind: the fact narrows the memory
        ("Ines trains on Mondays and Fridays.", "Ines trains on Mondays."),
        # a short capital is a value ("size M" -> "size L")
        ("Theo wears a size M in jackets.", "Theo wears a size L in jackets."),
        # the polarity flips
        ("The annex lift is working.", "The annex lift is not working."),
        # the same subject too: a restatement, not another subject
        ("The east gate closes at 22:00.", "The east gate closes at 22:00."),
        # no subject to tell apart (an instruction)
        ("Reply in French.", "Reply in French."),
    ],
)
def test_what_is_not_the_same_thing_said_of_another_subject(memory: str, fact: str) -> None:
    assert not says_of_another(claim(memory), claim(fact))


@pytest.mark.parametrize(
    ("memory", "fact", "apart"),
    [
        ("Kiln 3 is fired on Fridays.", "Kiln 5 is fired on Saturdays now.", True),
        ("Tram TR-14 is out of service.", "Tram TR-15 is back in service.", True),
        ("Bay 12 charger: 22 kW.", "Bay 9 charger: 50 kW.", True),
        ("Found a leak on Pump 2.", "Pump 4 has a leak.", True),  # one text does not split
        # neither text splits: where the number stands cannot be told
        ("Kiln 3 fires on Fridays.", "Kiln 5 fires on Saturdays.", False),
        # the number after the verb is what is said: it may be the change
        ("Mira's class meets in room 214.", "Mira's class now meets in room 310.", False),
        ("Pump 2 feeds tank 7.", "Pump 2 feeds tank 9 now.", False),
        # a move from one to the other names both
        ("The spare van is in bay 4.", "The spare van moved from bay 4 to bay 6.", False),
        ("Kiln 3 is fired on Fridays.", "Kiln 3 is fired on Saturdays now.", False),
    ],
)
def test_two_things_of_one_kind_named_apart(memory: str, fact: str, apart: bool) -> None:
    assert named_apart(claim(memory), claim(fact)) is apart


@pytest.mark.parametrize(
    ("memory", "fact", "part"),
    [
        # one of several values of a kind taken back
        ("Noor teaches on Tuesdays and Thursdays.", "Noor no longer teaches on Thursdays.", True),
        # one member of a coordination taken back
        ("The flat is furnished and pet-friendly.", "The flat is no longer pet-friendly.", True),
        # a stored negation made false for one member
        (
            "Rafe doesn't do night shifts or school runs.",
            "Rafe has started doing night shifts.",
            True,
        ),
        # all of it taken back: a plain negation, not a partial one
        ("Noor teaches on Thursdays.", "Noor no longer teaches on Thursdays.", False),
        (
            "The flat is furnished and pet-friendly.",
            "The flat is not furnished or pet-friendly.",
            False,
        ),
        # not negated: another rule's business
        ("Noor teaches on Tuesdays and Thursdays.", "Noor teaches on Thursdays now.", False),
    ],
)
def test_a_negated_fact_that_takes_back_part_of_a_memory(
    memory: str, fact: str, part: bool
) -> None:
    assert negates_part(claim(memory), claim(fact)) is part


def test_claim_splits_what_is_said_from_whom_it_is_said_of() -> None:
    said = claim("Mr Varga's tutor on Tuesdays: Idris Kalu.").said
    assert said is not None and said.verb == ""
    assert {"idris", "kalu"} <= said.words and "tutor" in said.front
    assert said.front_values == {"weekday:2"} and not said.values
    said = claim("Ward 8's ward round is at 09:15.").said
    assert said is not None and said.verb == "be" and said.values == {"time:09:15"}
    assert "ward" in said.front and "8" not in said.words
    assert claim("Reply in French.").said is None  # no subject


def test_vocabulary_tables_are_consistent() -> None:
    assert NUMBER_WORDS["twelve"] == 12 and NUMBER_WORDS["ninety"] == 90
    assert UNITS["kilometres"] == UNITS["km"] == "km"
    assert CURRENCIES["$"] == CURRENCIES["dollars"] == "usd"


def test_claim_reads_subject_negation_and_coordinated_parts() -> None:
    c = claim("Kaito lives in Sendai and works as a civil engineer for Tohoku Rail.")
    assert "kaito" in c.subject and c.predicates == ("live", "work") and len(c.parts) == 2
    assert not c.negated
    assert claim("beatriz doesnt like polyester").negated
    assert claim("Never use exclamation marks.").negated


def test_a_restatement_in_another_format_is_recognised() -> None:
    assert restates(
        claim("Lorenzo's commute is 12 km each way."),
        claim("Lorenzo's commute is twelve kilometres each way."),
        0.0,
    )
    assert restates(
        claim("Parisa's lease ends on 31/08/2026."),
        claim("Parisa's lease runs until August 31, 2026."),
        0.0,
    )


@pytest.mark.parametrize(
    ("memory", "fact"),
    [
        # a qualifier or name in place of another, with the same number: a change
        (
            "Patient's insurance is Pennant Mutual Bronze, member #SHS-220871.",
            "Patient's insurance is Pennant Mutual Gold, member #SHS-220871.",
        ),
        (
            "Walter takes 25 mg of carvedilol in the morning.",
            "Walter's evening carvedilol went up to 25 mg.",
        ),
        # another value, another polarity, another subject
        ("Lorenzo's commute is 12 km each way.", "Lorenzo's commute is 14 km each way."),
        ("The gym is open on 24 December.", "The gym is not open on 24 December."),
        ("Priya's rent is $1,200.", "Tomasz's rent is $1,200."),
        # no values at all: the NLI model and lexical containment decide, not this rule
        ("Cyrus is teetotal.", "Cyrus doesn't drink alcohol."),
    ],
)
def test_what_is_not_a_restatement(memory: str, fact: str) -> None:
    assert not restates(claim(memory), claim(fact), 0.0)


def test_partial_address_of_a_multi_claim_memory() -> None:
    memory = claim("Kaito lives in Sendai and works as a civil engineer for Tohoku Rail.")
    assert partial(memory, claim("Kaito now works for Sendai City's roads department."))
    assert not partial(memory, claim("Kaito lives in Osaka and works for JR West."))
    assert not partial(claim("Kaito lives in Sendai."), claim("Kaito lives in Osaka."))


@pytest.mark.parametrize(
    ("memory", "fact", "left"),
    [
        ("Staging runs v2.3 on 3 nodes in eu-north-1.", "staging is on v2.4 now", 2),
        (
            "Dr Petrov: Tuesday clinic in room 4, Friday clinic in room 9.",
            "Friday clinic: room 2",
            2,
        ),
        ("Flight SA 218 departs 3 March at 11:40.", "Flight SA 218 now departs at 13:10.", 1),
        ("The gateway runs on three nodes in us-east-1.", "The gateway runs on three nodes.", 0),
        ("Rent is £900 a month, due on the 1st.", "Rent is £950 a month.", 1),
    ],
)
def test_values_left_counts_the_memory_values_a_changing_fact_leaves_standing(
    memory: str, fact: str, left: int
) -> None:
    assert values_left(values(memory), values(fact)) == left


@pytest.mark.parametrize(
    ("memory", "fact", "want"),
    [
        (
            "Pemberley's bookkeeping fee is £145 a month.",
            "Pemberley's bookkeeping fee is £165 a month.",
            True,
        ),
        (
            "The lease on unit 5B ends on 2026-08-31.",
            "The unit 5B lease ends September 30th, 2026.",
            True,
        ),
        (
            "Baby Ezra's feed is 150 ml every three hours.",
            "Ezra's feed is 180 ml every three hours.",
            True,
        ),
        # another kind of value, a value left standing, a new word, a negation: not a pure change
        ("The fee is £145 a month.", "The fee is due on 3 May.", False),
        ("Staging runs v2.3 on 3 nodes.", "Staging runs v2.4.", False),
        ("Biscuit eats 180 g a day.", "Pepper eats 150 g a day.", False),
        ("The fee is £145 a month.", "The fee is £145 a month.", False),
    ],
)
def test_changes_value_is_the_same_text_with_values_of_the_same_kind_changed(
    memory: str, fact: str, want: bool
) -> None:
    assert changes_value(claim(memory), claim(fact)) is want


def test_parse_many_memoises_a_batch_in_one_pipe_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.gate.claims import nlp

    real = nlp.pipeline()
    piped = type(real).pipe
    calls: list[list[str]] = []

    def pipe(self: Any, texts: Any, **kwargs: Any) -> Any:
        texts = list(texts)
        calls.append(texts)
        return piped(self, texts, **kwargs)

    monkeypatch.setattr(type(real), "pipe", pipe)
    memo = nlp._Docs(3)
    assert memo.many(["Maya lives in Denver.", "Kai swims.", "Maya lives in Denver."]) == 2
    assert calls == [["Maya lives in Denver.", "Kai swims."]]
    doc = memo("Kai swims.")  # a hit: the batch's Doc, not a new parse
    assert memo.many(["Kai swims.", "The van is blue."]) == 1 and calls[-1] == ["The van is blue."]
    assert memo("Kai swims.") is doc and memo.cache_info()[3] == 3
    alone = real("Maya lives in Denver.")
    batched = memo("Maya lives in Denver.")
    assert [(t.tag_, t.dep_, t.head.i, t.lemma_) for t in batched] == [
        (t.tag_, t.dep_, t.head.i, t.lemma_) for t in alone
    ]
    memo.many(["One.", "Two."])  # over maxsize: the least recently used goes
    assert memo.cache_info()[3] == 3 and "The van is blue." not in memo._docs
    memo.cache_clear()
    assert memo.cache_info() == (0, 0, 3, 0) and memo.cache_parameters()["maxsize"] == 3


def test_a_memoised_parse_does_not_wait_for_another_lanes_spacy_call() -> None:
    """Lanes read parses they have under the memo's lock; only spaCy itself runs one call at a
    time (``nlp._lock``). Here the test holds spaCy's lock, as a lane inside a long
    ``nlp.pipe`` would: a hit still answers, and a miss waits and then parses exactly as
    spaCy alone does."""
    import threading

    from engine.gate.claims import nlp

    memo = nlp._Docs(8)
    memo.many(["Maya lives in Denver."])
    hit: list[Any] = []
    missed: list[Any] = []
    with nlp._lock:
        reader = threading.Thread(target=lambda: hit.append(memo("Maya lives in Denver.")))
        reader.start()
        reader.join(60)
        assert not reader.is_alive() and hit[0] is memo._docs["Maya lives in Denver."]
        parser = threading.Thread(target=lambda: missed.append(memo("Kai swims.")))
        parser.start()
        parser.join(0.2)
        assert not missed  # a miss needs spaCy: it waits for the lock held here
    parser.join(60)
    alone = nlp.pipeline()("Kai swims.")
    assert [(t.tag_, t.dep_, t.head.i, t.lemma_) for t in missed[0]] == [
        (t.tag_, t.dep_, t.head.i, t.lemma_) for t in alone
    ]
    assert memo.cache_info()[:2] == (1, 2) and memo.waited_s > 0 and memo.parsed_s > 0
