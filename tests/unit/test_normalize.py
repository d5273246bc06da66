"""Change events are rewritten into the state they leave behind; plain states are left alone."""

from __future__ import annotations

import pytest

from engine.gate import normalize as normalize_module
from engine.gate.normalize import RULES, Normalized, normalize


def test_public_api() -> None:
    assert set(normalize_module.__all__) == {"RULES", "Normalized", "Rule", "normalize"}


@pytest.mark.parametrize("rule", RULES, ids=[rule.name for rule in RULES])
def test_every_rule_example(rule: normalize_module.Rule) -> None:
    text, hypothesis = rule.example
    result = normalize(text)
    assert result.rule == rule.name
    assert result.hypothesis == hypothesis
    assert result.is_change


def test_rule_table_is_well_formed() -> None:
    names = [rule.name for rule in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert rule.cues, rule.name
        assert all(cue == cue.lower() and " " not in cue for cue in rule.cues), rule.name


@pytest.mark.parametrize(
    ("text", "rule", "hypothesis"),
    [
        # moved / relocated: a person or company now based somewhere else
        (
            "Juniper relocated to Halifax after the wedding.",
            "moved_to_place",
            "Juniper is based in Halifax.",
        ),
        (
            "Teodor has moved to a new flat in Bergen.",
            "moved_to_place",
            "Teodor is based in Bergen.",
        ),
        (
            "The studio relocated from Bristol to Cardiff.",
            "from_to",
            "The studio is now in Cardiff, not in Bristol.",
        ),
        # switched / migrated / upgraded / downgraded, with and without "from"
        (
            "The data team switched from Airflow to Dagster in the spring.",
            "from_to",
            "The data team is now on Dagster, not on Airflow.",
        ),
        (
            "Migrated the billing service from Node 18 to 20 yesterday.",
            "from_to",
            "The billing service is now on Node 20, not on Node 18.",
        ),
        ("Quaywise downgraded to the Lite plan.", "change_to", "Quaywise is now on the Lite plan."),
        (
            "Ravi upgraded his laptop to Windows 11.",
            "change_to",
            "Ravi's laptop is now on Windows 11.",
        ),
        # changed to / rescheduled / raised: a new value for a named attribute
        (
            "Beth's pickup time changed to 5:45 pm.",
            "change_to",
            "Beth's pickup time is now 5:45 pm.",
        ),
        (
            "The weekly sync was pushed back to Thursdays.",
            "change_to",
            "The weekly sync is now Thursdays.",
        ),
        (
            "Imogen's landlord raised the rent to £1,480.",
            "change_to",
            "Imogen's rent is now £1,480.",
        ),
        (
            "The customer changed delivery slot to evenings.",
            "change_to",
            "The customer's delivery slot is now evenings.",
        ),
        # renewed / extended
        (
            "Tarik renewed his gym pass until the end of 2026.",
            "renewed_until",
            "Tarik's gym pass is valid until the end of 2026.",
        ),
        (
            "The lease was extended to March 2028.",
            "renewed_until",
            "The lease is valid until March 2028.",
        ),
        # promoted / became / hired
        ("Wen was promoted to head of data.", "became", "Wen is now head of data."),
        (
            "Pascale became the clinic's practice manager.",
            "became",
            "Pascale is now the clinic's practice manager.",
        ),
        (
            "Lindqvist Bakery hired a new accountant, Ole Berg.",
            "hired_role",
            "Lindqvist Bakery's accountant is now Ole Berg.",
        ),
        # replaced / swapped
        (
            "Our team replaced Trello with Notion.",
            "replaced_with",
            "Our team now uses Notion, not Trello.",
        ),
        (
            "Clem traded in her scooter for an e-bike.",
            "swapped_for",
            "Clem now has an e-bike, not Clem's scooter.",
        ),
        # started / joined
        (
            "Dorota started at Kestrel Analytics in June.",
            "started",
            "Dorota now works at Kestrel Analytics.",
        ),
        (
            "Amadou joined Redwing Health as a pharmacist.",
            "joined",
            "Amadou is now with Redwing Health as a pharmacist.",
        ),
    ],
)
def test_event_families_become_states(text: str, rule: str, hypothesis: str) -> None:
    result = normalize(text)
    assert (result.rule, result.hypothesis) == (rule, hypothesis)
    assert result.is_change


@pytest.mark.parametrize(
    ("text", "rule", "hypothesis"),
    [
        (
            "Greta used to teach piano, but now she runs a bakery.",
            "used_to",
            "Greta does not teach piano anymore.",
        ),
        ("Our office used to be in Leeds.", "used_to", "Our office is no longer in Leeds."),
        (
            "Ansel no longer coaches the under-9s.",
            "no_longer",
            "Ansel no longer coaches the under-9s.",
        ),
        ("Rui doesn't eat dairy anymore.", "no_longer", "Rui doesn't eat dairy anymore."),
        (
            "Priscilla cancelled her newspaper subscription.",
            "cancelled",
            "Priscilla no longer has a newspaper subscription.",
        ),
        (
            "The tenant opted out of paper statements.",
            "opted_out",
            "The tenant is no longer subscribed to paper statements.",
        ),
        (
            "Henrik stopped drinking coffee.",
            "stopped_doing",
            "Henrik is no longer drinking coffee.",
        ),
        (
            "Sunniva quit Alder & Finch last spring.",
            "quit_employer",
            "Sunniva no longer works at Alder & Finch.",
        ),
        ("Mateus came off warfarin in May.", "stopped_taking", "Mateus is no longer on warfarin."),
    ],
)
def test_retractions_are_negated(text: str, rule: str, hypothesis: str) -> None:
    result = normalize(text)
    assert (result.rule, result.hypothesis) == (rule, hypothesis)
    assert result.is_change and result.negated


@pytest.mark.parametrize(
    "text",
    [
        "Noor's account is now on the Team tier.",
        "The shuttle now leaves from Gate 4.",
        "Ilona is back at the Oslo office.",
    ],
)
def test_now_statements_are_changes_kept_verbatim(text: str) -> None:
    result = normalize(text)
    assert result.rule == "now_state"
    assert result.hypothesis == text
    assert result.is_change and not result.negated


def test_values_are_reported() -> None:
    result = normalize("We moved the analytics cluster from MariaDB 10 to 11 last weekend.")
    assert result.old_value == "MariaDB 10"
    assert result.new_value == "MariaDB 11"
    assert normalize("Sigrun's dentist appointment moved to 4 July.").new_value == "4 July"


@pytest.mark.parametrize(
    "text",
    [
        "Marguerite lives in Rouen.",
        "The staging cluster runs Kafka 3.6.",
        "Ptolemy prefers calls after lunch.",
        "Valdis went to Riga for the weekend.",
        "Keep replies under three paragraphs.",
        "Jolene is used to working weekends.",
        "The deposit is used to cover damages.",
        "Osric set a reminder to water the plants.",
        "Ferdinand started in March.",
        "Go to the pharmacy on Fridays.",
        "",
    ],
)
def test_plain_states_and_look_alike_phrases_are_untouched(text: str) -> None:
    assert normalize(text) == Normalized(hypothesis=text)


def test_result_is_frozen() -> None:
    result = normalize("Maren moved to Tromsø.")
    with pytest.raises(AttributeError):
        result.hypothesis = "x"  # type: ignore[misc]
