"""Strict means safe: the attribute evidence (:func:`engine.gate.evidence.measure`) and the
rule that needs it.

spaCy parses (claims), the fake embedder stands in for MiniLM; no NLI model."""

from __future__ import annotations

import pytest

from engine.gate.claims.frame import frame, shared_subject, subject_relation
from engine.gate.evidence import _named_by_subject, measure, scored, settle, weigh
from engine.gate.policy import REVIEW, REVIEW_UNCERTAIN, STRICT, Evidence, apply_rule
from engine.gate.probe import Hit, Probe, Ref
from engine.gate.relate import relate
from engine.gate.thresholds import for_embedder
from engine.runtime.fake import FakeEmbedder
from engine.types import Fact


def test_frame_drops_the_shared_subject_the_values_and_function_words() -> None:
    a, b = "Keiko has lived in Kobe since 2019.", "Keiko lives in Osaka."
    drop = shared_subject(a, b)
    assert "keiko" in drop
    assert frame(a, drop) == frame(b, drop) == "live"


def test_frames_of_two_attributes_of_one_subject_differ() -> None:
    a, b = "Maya is allergic to peanuts.", "Maya follows a vegan diet."
    drop = shared_subject(a, b)
    fa, fb = frame(a, drop), frame(b, drop)
    assert fa and fb and not set(fa.split()) & set(fb.split())


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ("Keiko lives in Osaka.", "Keiko has lived in Kobe since 2019.", "shared"),
        # passive and active: the subject of one is the other's object
        (
            "The shared ops account no longer has 2FA turned on.",
            "Two-factor authentication is enabled on the shared ops account.",
            "shared",
        ),
        ("Leo plays the cello.", "Clara lives in Graz.", "disjoint"),
        ("Use metric units.", "Keiko lives in Osaka.", "unknown"),
        # one attribute of two owners, even with the other's name as the value
        (
            "Grandad's GP appointment is at 10:40.",
            "Grandma's GP appointment is at 10:20.",
            "disjoint",
        ),
        ("Paolo Ricci's manager is Sabine Ortiz.", "Ingrid's manager is Paolo Ricci.", "disjoint"),
        # the owner named in the other subject: the same person
        (
            "Safiya's swim lessons moved to Saturdays.",
            "Amina's daughter Safiya has swimming lessons on Sundays.",
            "shared",
        ),
        ("Harlow's marathon PB is 3:36:50.", "Harlow's marathon PB is 3:41:12.", "shared"),
        # a value in the subject names which of several like things it is
        (
            "Unit 3's rent went up to £19,750 a year.",
            "Unit 4's rent is £18,500 a year.",
            "apart",
        ),
        ("PR-3F-02's IP address is 10.40.3.61.", "PR-2F-01's IP address is 10.40.2.19.", "apart"),
        # nouns compounded onto the subject's head, none shared: two like things
        (
            "The garden office thermostat is set to 19°C.",
            "The hallway thermostat is set to 20°C.",
            "disjoint",
        ),
        ("The home policy excess is $1,000.", "The home insurance excess is $500.", "shared"),
        ("Unit 3's rent went up to £19,750 a year.", "Unit 3's rent is £18,500 a year.", "shared"),
        # the year of a time qualifier says when, not which one
        (
            "The club's head coach as of 2019 is Ana Ruiz.",
            "The club's head coach as of 2023 is Bo Lind.",
            "shared",
        ),
        # a prepositional modifier of the subject, different on both sides: two like things
        (
            "The median rent in Leeds is £950 a month.",
            "The median rent in York is £1,100 a month.",
            "disjoint",
        ),
        (
            "The head of state of Norway is Harald V.",
            "The head of government of Norway is Jonas Gahr Støre.",
            "disjoint",
        ),
        # one side's modifiers all named by the other: the same thing, reworded
        (
            "The captain of the Leeds team is Ana.",
            "The current captain of the Leeds team is Bea.",
            "shared",
        ),
        (
            "The rent of the flat in Kobe is ¥90,000.",
            "The rent of the flat in Kobe went up to ¥95,000.",
            "shared",
        ),
    ],
)
def test_subject_relation(a: str, b: str, want: str) -> None:
    assert subject_relation(a, b) == want


def _probe(text: str, *memories: str) -> Probe:
    p = Probe(index=0, fact=Fact(namespace="ns", text=text), checked=True)
    p.hits = [
        Hit(ref=Ref(f"m{i}", m, None, rowid=i), similarity=0.9, rank=i, forward=True)
        for i, m in enumerate(memories)
    ]
    return p


def test_measure_batches_frames_in_one_embedder_call() -> None:
    emb = FakeEmbedder()
    probes = [
        _probe("Keiko lives in Osaka.", "Keiko has lived in Kobe since 2019.", "Keiko likes tea."),
        _probe("Maya is allergic to peanuts.", "Maya follows a vegan diet."),
    ]
    n = measure(probes, emb, STRICT)
    assert len(emb.calls) == 1 and n == len(emb.calls[0])
    same, other = probes[0].evidence
    assert same.attribute == pytest.approx(1.0) and same.subject == "shared"
    assert other.attribute is not None and other.attribute < 0.5
    assert probes[1].evidence[0].attribute is not None and probes[1].evidence[0].attribute < 0.5


def test_only_values_left_is_one_attribute() -> None:
    p = _probe(
        "Stonebridge's compliance officer is Amos Reyes.",
        "Stonebridge's compliance officer is Maud Ellery.",
    )
    measure([p], FakeEmbedder(), STRICT)
    assert p.evidence[0].attribute == 1.0


def test_a_bare_text_whose_subject_the_other_names_speaks_of_one_attribute() -> None:
    # one text is nothing but its subject and values: its subject phrase is the attribute
    shop = "The shop upgraded its broadband to 900 Mbps full fibre."
    assert _named_by_subject("The shop's broadband is 80 Mbps.", shop)
    assert not _named_by_subject("Ingrid's manager is Paolo Ricci.", "Ingrid is an executive.")
    assert not _named_by_subject("Use metric units.", shop)  # no subject: nothing named


def test_hits_not_sent_to_the_model_and_unchecked_facts_are_not_read() -> None:
    p = _probe("Keiko lives in Osaka.", "Keiko has lived in Kobe since 2019.")
    p.hits[0].forward = False  # below the floor, or a sibling: relate did not send it
    q = _probe("Keiko lives in Osaka.", "Keiko has lived in Kobe since 2019.")
    q.checked = False
    emb = FakeEmbedder()
    assert measure([p, q], emb, STRICT) == 0 and emb.calls == []
    assert p.evidence[0].attribute is None and q.evidence[0].subject == ""
    assert p.evidence[0].similarity == 0.9  # every hit has a record, read or not


def test_relate_then_measure_reads_only_the_hits_the_rule_can_weigh() -> None:
    # between the key-match floor and the floor, only a matching key makes a hit weighable
    p = _probe(
        "Keiko lives in Osaka.",
        "Keiko has lived in Kobe since 2019.",
        "Keiko's favourite tea is sencha.",
    )
    p.hits[0].forward = p.hits[1].forward = False
    p.hits[0].similarity, p.hits[1].similarity = 0.9, STRICT.floor - 0.05
    relate([p], STRICT, has_entailment=False)
    assert p.hits[0].forward and not p.hits[1].forward
    emb = FakeEmbedder()
    measure([p], emb, STRICT)
    assert len(emb.calls) == 1  # the fact's frame and the one hit's, in one call
    assert p.evidence[0].attribute is not None and p.evidence[1].attribute is None
    assert p.evidence[1].subject == ""


def test_the_batch_parse_takes_the_fact_and_the_hits_sent_to_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engine.gate.claims import nlp

    seen: list[str] = []
    monkeypatch.setattr(nlp.parse, "many", lambda texts: seen.extend(texts) or 0)
    p = _probe("Keiko lives in Osaka.", "Keiko has lived in Kobe since 2019.", "Keiko likes tea.")
    p.hits[1].forward = False
    measure([p], FakeEmbedder(), STRICT)
    assert seen == [p.fact.text, "Keiko has lived in Kobe since 2019."]


def conflict(**kw: object) -> Evidence:
    return Evidence(
        memory_id="m",
        text="memory",
        similarity=0.9,
        contradiction=0.99,
        **kw,  # type: ignore[arg-type]
    )


def test_strict_adds_without_attribute_evidence() -> None:
    v = apply_rule([conflict(attribute=0.05, subject="shared")], STRICT)
    assert (v.action, v.rule) == ("add", "unproven")
    assert v.candidates[0].reason.startswith("unproven:attribute:0.05<")
    v = apply_rule([conflict(attribute=None)], STRICT)
    assert v.candidates[0].reason == "unproven:attribute_unmeasured"
    v = apply_rule([conflict(attribute=0.9, subject="disjoint")], STRICT)
    assert v.candidates[0].reason == "unproven:subject_disjoint"


def test_subjects_named_apart_by_values_are_never_proven_one_attribute() -> None:
    v = apply_rule([conflict(attribute=1.0, subject="apart")], STRICT)
    assert (v.action, v.candidates[0].reason) == ("add", "unproven:subject_apart")


def test_typed_values_added_beside_the_memory_s_are_not_proven_the_same_attribute() -> None:
    v = apply_rule([conflict(attribute=0.9, subject="shared", beside=True)], STRICT)
    assert (v.action, v.candidates[0].reason) == ("add", "unproven:values_beside")


def test_strict_replaces_with_evidence() -> None:
    v = apply_rule([conflict(attribute=0.9, subject="shared")], STRICT)
    assert v.action == "replace" and v.candidates[0].attribute == pytest.approx(0.9)


def test_review_queues_every_conflict_whatever_the_evidence() -> None:
    assert apply_rule([conflict(attribute=None)], REVIEW).action == "review"
    # review-uncertain replaces unattended only what strict could prove
    assert apply_rule([conflict(attribute=None)], REVIEW_UNCERTAIN).action == "review"
    assert apply_rule([conflict(attribute=0.9)], REVIEW_UNCERTAIN).action == "replace"


def test_evidence_off_restores_the_plain_rule() -> None:
    off = STRICT.with_overrides({"evidence": False})
    assert apply_rule([conflict(attribute=None)], off).action == "replace"


def test_the_bar_belongs_to_the_embedder() -> None:
    assert for_embedder(STRICT, "minilm").attribute_similarity == 0.10
    assert for_embedder(STRICT, "someone-elses-model") is STRICT


def test_a_near_rival_makes_the_target_ambiguous() -> None:
    # "Walter's evening dose went up": the morning dose is a hair more similar as a sentence
    morning = Evidence("am", "am", 0.922, contradiction=0.98, attribute=0.86, subject="shared")
    evening = Evidence("pm", "pm", 0.920, contradiction=0.99, attribute=0.93, subject="shared")
    v = apply_rule([morning, evening], STRICT)
    assert (v.action, v.rule) == ("review", "ambiguous_target")


def test_a_sibling_the_fact_says_the_same_of_is_never_its_target() -> None:
    """``weigh`` reads the texts: the fact says what the memory says, of another subject, so the
    memory is a sibling (mismatch ``other_subject``). Neither strict replaces it nor review
    queues it, however sure the model is; the same texts with a changed value still conflict."""
    p = _probe(
        "Mr Varga's tutor on Tuesdays: Idris Kalu.", "Ms Varga's tutor on Tuesdays: Idris Kalu."
    )
    p.hits[0].contradiction = 0.99
    ev = weigh(p.fact.text, p.hits[0], STRICT, "unknown", 1.0)
    assert ev.mismatch == "other_subject"
    for policy in (STRICT, REVIEW):
        v = apply_rule([ev], policy)
        assert (v.action, v.candidates[0].reason) == ("add", "mismatch:other_subject")
    q = _probe(
        "Ms Varga's tutor on Tuesdays: Nadia Osei.", "Ms Varga's tutor on Tuesdays: Idris Kalu."
    )
    q.hits[0].contradiction = 0.99
    ev = weigh(q.fact.text, q.hits[0], STRICT, "unknown", 1.0)
    assert ev.mismatch == "" and apply_rule([ev], STRICT).action == "replace"


def _stored(text: str, *memories: str, index: int = 0) -> Probe:
    """A probe whose hits are stored memories (rowid set), most similar first, all weighed."""
    p = Probe(index=index, fact=Fact(namespace="ns", text=text), checked=True)
    p.hits = [
        Hit(Ref(f"m{i}", m, None, rowid=i), similarity=0.95 - 0.01 * i, rank=i, forward=True)
        for i, m in enumerate(memories)
    ]
    return p


def test_settle_scores_only_the_closest_when_a_stored_memory_contains_the_fact() -> None:
    p = _stored(
        "The team standup is at 9am.",
        "The team standup is at 10am.",
        "The team standup is at 9am every weekday in room 4.",
        "The team retro is at 4pm.",
    )
    measure([p], FakeEmbedder(), STRICT)
    assert p.evidence[1].contained
    assert settle([p], STRICT, judged=3) == 2
    assert [h.forward for h in p.hits] == [True, False, False]  # the duplicate test's pair stays
    p.hits[0].contradiction = 0.99
    scored([p])
    v = apply_rule(p.evidence, STRICT)
    assert (v.action, v.rule, v.target_id) == ("skip", "contained", "m1")
    assert v.candidates[2].contradiction is None and v.candidates[2].reason == "not_reached"


def test_settle_scores_everything_an_earlier_fact_of_the_batch_may_change() -> None:
    # the earlier fact may replace the containing memory: the later one must have every score
    first = _stored("The standup is at 9am every weekday in room 5.", "Standup at 9am in room 4.")
    later = _stored(
        "The team standup is at 9am.",
        "The team standup is at 10am.",
        "The team standup is at 9am every weekday in room 4.",
        index=1,
    )
    later.hits[1].ref = Ref("m0", later.hits[1].ref.text, None, rowid=0)  # first's candidate
    measure([first, later], FakeEmbedder(), STRICT)
    assert later.evidence[1].contained
    assert settle([first, later], STRICT, judged=3) == 0
    assert all(h.forward for h in later.hits)


def test_settle_leaves_a_mismatched_candidate_unscored_only_beyond_the_judged() -> None:
    p = _stored(
        "Ms Varga's tutor on Tuesdays: Nadia Osei.",
        "Ms Varga's tutor on Tuesdays: Idris Kalu.",
        "Ms Varga's piano teacher is Ana Ruiz.",
        "Mr Varga's tutor on Tuesdays: Nadia Osei.",
    )
    measure([p], FakeEmbedder(), STRICT)
    assert [e.mismatch for e in p.evidence] == ["", "", "other_subject"]
    assert settle([p], STRICT, judged=3) == 0  # the judge reads the three closest
    assert settle([p], STRICT, judged=2) == 1 and not p.hits[2].forward


def test_a_question_and_its_answer_are_one_claim_keyed_by_the_question() -> None:
    """The answer is the value: its year is not a subject value (not ``apart``), the pair is
    not a partial contradiction, and another question is another thing."""
    old = "When did the Lions last win a division title as of 1993? 1993."
    new = "When did the Lions last win a division title as of 1999? 1999."
    assert subject_relation(new, old) != "apart"

    def evidence(memory: str, fact: str):  # type: ignore[no-untyped-def]
        return weigh(fact, Hit(Ref("m", memory, None), 0.9, forward=True), STRICT, "unknown", 1.0)

    same = evidence(old, new)
    assert (same.same_question, same.partial, same.mismatch) == (True, False, "")
    other = evidence(old, "When did the Bears last win a division title as of 1999? 2018.")
    assert other.mismatch == "other_question"
