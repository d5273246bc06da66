"""Siblings are told apart from updates by subject, qualifier and instance cues in the text."""

from __future__ import annotations

import pytest

from engine.gate import keys as keys_module
from engine.gate.keys import FAMILIES, AttributeKey, Relation, compare_keys, infer_key


def test_public_api() -> None:
    assert set(keys_module.__all__) == {
        "FAMILIES",
        "AttributeKey",
        "Family",
        "Relation",
        "infer_key",
        "compare_keys",
    }


def test_key_renders_subject_attribute_and_qualifiers() -> None:
    key = AttributeKey("priya", "flight", frozenset({"direction:return"}))
    assert str(key) == "priya/flight[direction:return]"
    assert str(AttributeKey(None, "plan")) == "*/plan"


def test_families_are_mutually_exclusive_tables() -> None:
    names = [family.name for family in FAMILIES]
    assert len(names) == len(set(names))
    for family in FAMILIES:
        assert len(family.values) >= 2, family.name
        assert family.loose <= {t for ts in family.values.values() for t in ts}, family.name


# --- explicit keys always win ---------------------------------------------------------------------


def test_equal_explicit_keys_match_even_for_sibling_looking_text() -> None:
    relation = compare_keys(
        "The return leg is on 9 May.", "The outbound leg is on 2 May.", "trip", "Trip"
    )
    assert relation == Relation(True, False, "explicit:equal")


def test_different_explicit_keys_conflict_even_for_identical_text() -> None:
    relation = compare_keys("Plan: Team.", "Plan: Team.", "plan", "billing_plan")
    assert relation.key_conflict and not relation.key_match
    assert relation.reason == "explicit:plan!=billing_plan"


def test_one_explicit_key_is_compared_with_the_inferred_attribute() -> None:
    assert compare_keys(
        "Orla is on the Scale plan now.", "Orla is on the Solo plan.", "plan"
    ).key_match
    assert not compare_keys(
        "Orla has 12 seats.", "Orla is on the Solo plan.", None, "plan"
    ).key_match


# --- inference ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Maya lives in Denver, Colorado.", "maya/home_city"),
        ("Koji relocated to Sapporo.", "koji/home_city"),
        ("Fenna's billing address is 3 Dyke Rd, Hove.", "fenna/address[address:billing]"),
        ("Staging runs PostgreSQL 14.", "staging/postgresql_version[environment:staging]"),
        ("The customer's manager prefers phone calls.", "customer.manager/contact_channel"),
        ("Wren's older brother studies in Galway.", "wren.brother/*"),
        ("Lumen Labs is on the Growth plan.", "lumen_labs/plan"),
    ],
)
def test_infer_key(text: str, expected: str) -> None:
    key = infer_key(text)
    subject, attribute = expected.split("/")
    if attribute == "*":
        assert key is None or str(key).startswith(subject + "/")
    else:
        assert str(key) == expected


def test_no_key_without_an_attribute() -> None:
    assert infer_key("Thanks!") is None


# --- siblings: key_conflict must hold -------------------------------------------------------------

SIBLINGS = [
    # direction
    (
        "Priya's return flight was moved to 9 March.",
        "Priya's outbound flight is on 2 March at 07:40.",
        "qualifier:return!=outbound",
    ),
    ("Return train: 18:04 from York.", "Outbound train: 07:12 to York.", "qualifier:"),
    ("The inbound transfer is at 14:00.", "The outbound transfer is at 09:00.", "qualifier:"),
    # address roles
    (
        "Shipping address is now 12 Harbour Lane, Cork.",
        "Billing address: 3 Main St, Cork.",
        "qualifier:shipping!=billing",
    ),
    (
        "Jonas changed his delivery address to 8 Elm Road.",
        "Jonas's billing address is 21 Birch Way.",
        "qualifier:",
    ),
    ("Dev's work address is 1 Canal St.", "Dev's home address is 14 Ash St.", "qualifier:"),
    # phone and e-mail roles
    (
        "Amira's work number is now 020 7946 0011.",
        "Amira's home phone is 020 7946 0958.",
        "qualifier:work!=personal",
    ),
    (
        "Amira's mobile changed to 07700 900123.",
        "Amira's landline is 020 7946 0958.",
        "qualifier:mobile!=landline",
    ),
    (
        "Amira's work mobile is 07700 900777.",
        "Amira's personal mobile is 07700 900123.",
        "qualifier:",
    ),
    (
        "Zara's personal email is zara@mail.example.",
        "Zara's work email is z.ali@corp.example.",
        "qualifier:",
    ),
    # the customer vs the customer's manager / assistant / executive
    (
        "The customer's manager prefers phone calls.",
        "The customer prefers email.",
        "subject:customer.manager!=customer",
    ),
    (
        "The client's assistant books all meetings now.",
        "The client books meetings himself.",
        "subject:",
    ),
    ("Her manager wants weekly reports.", "The customer wants monthly reports.", "subject:"),
    ("The client's CFO approved the budget.", "The client approved the budget.", "subject:"),
    # one person vs another (health facts stay with their person)
    ("Tomas's wife is allergic to shellfish.", "Tomas is allergic to penicillin.", "subject:"),
    (
        "Tomas is now allergic to latex as well.",
        "Tomas's daughter is allergic to latex.",
        "subject:",
    ),
    ("Mina's son is allergic to eggs.", "Mina's daughter is allergic to peanuts.", "subject:"),
    ("Hana's birthday is 3 May.", "Ivo's birthday is 3 May.", "subject:hana!=ivo"),
    ("Olu's brother is moving to Lagos.", "Olu lives in Abuja.", "subject:"),
    # one child vs another
    ("Noah started at Oakridge High.", "Lily goes to Oakridge Primary.", "subject:noah!=lily"),
    ("Grace's son Max now plays rugby.", "Grace's son Theo plays football.", "subject:"),
    (
        "Ben's eldest goes to Hillview School.",
        "Ben's youngest goes to Maple Primary.",
        "qualifier:elder!=younger",
    ),
    ("Jun's older sister lives in Busan.", "Jun's younger sister lives in Seoul.", "qualifier:"),
    # staging vs production
    (
        "Production now runs PostgreSQL 16.",
        "Staging runs PostgreSQL 14.",
        "qualifier:production!=staging",
    ),
    ("We upgraded staging to PostgreSQL 16.", "Production runs PostgreSQL 14.", "qualifier:"),
    ("The prod cluster has 12 nodes now.", "The staging cluster has 4 nodes.", "qualifier:"),
    ("The production Redis runs version 7.", "The staging Redis runs version 6.2.", "qualifier:"),
    # a second / another instance
    (
        "Lumen Labs opened a second office in Porto.",
        "Lumen Labs' office is in Lisbon.",
        "instance:second",
    ),
    ("Marek bought another car, a used Skoda.", "Marek drives a Volvo estate.", "instance:another"),
    ("Kofi opened another restaurant in Kumasi.", "Kofi's restaurant is in Accra.", "instance:"),
    (
        "Tomás has an additional phone number: 555-0199.",
        "Tomás's phone number is 555-0142.",
        "instance:additional",
    ),
    # primary vs secondary, left vs right, floors, platforms, meals
    (
        "The backup contact for Orion is now Dana.",
        "Orion's primary contact is Lee.",
        "qualifier:secondary!=primary",
    ),
    (
        "Omar's left hip replacement is scheduled for May.",
        "Omar's right hip was replaced in 2020.",
        "qualifier:left!=right",
    ),
    (
        "Anna's right eye prescription is -2.5.",
        "Anna's left eye prescription is -2.0.",
        "qualifier:",
    ),
    (
        "The ground-floor unit is rented for £700.",
        "The upstairs unit is rented for £800.",
        "qualifier:downstairs!=upstairs",
    ),
    ("The Android app is now on 4.2.0.", "The iOS app is on 4.1.3.", "qualifier:android!=ios"),
    ("The Andorid build targets API 34.", "The iOS build targets iOS 17.", "qualifier:"),
    (
        "Gita now takes 20 mg of omeprazole before dinner.",
        "Gita takes omeprazole 20 mg before breakfast.",
        "qualifier:dinner!=breakfast",
    ),
    ("The lunch shift starts at 11.", "The dinner shift starts at 5.", "qualifier:"),
    # departments, account types, identifiers, group vs regional arm, lessons, garments
    (
        "Our sales rep at Vantor is now Jo Park.",
        "Our support rep at Vantor is Kim Lee.",
        "qualifier:sales!=support",
    ),
    (
        "Opened a joint savings account with Coastal Bank.",
        "Has a checking account with Coastal Bank.",
        "qualifier:savings!=checking",
    ),
    ("The savings account ends in 0519.", "The checking account ends in 0442.", "qualifier:"),
    (
        "Order #B-1182 arrives Tuesday.",
        "Order #B-1175 arrives Monday.",
        "qualifier:#b-1182!=#b-1175",
    ),
    (
        "Tessellate UK's head office moved to Bristol.",
        "Tessellate's group head office is in Ghent.",
        "qualifier:local!=group",
    ),
    ("Ama's yoga class moved to 7 pm.", "Ama's spin class is at 6 pm.", "qualifier:yoga!=spin"),
    ("Emre wears a size 44 in boots.", "Emre's shirt size is XL.", "qualifier:shoe!=top"),
    # directions after the noun, compass points, named branches, numbered units, pets
    ("Paulo's flight back is on the 21st.", "Paulo's outbound flight is on the 5th.", "qualifier:"),
    ("Paulo's return flight is on the 21st.", "Paulo's flight out is on the 5th.", "qualifier:"),
    ("The east wing ward has 20 beds.", "The west wing ward has 24 beds.", "qualifier:east!=west"),
    ("The Leeds office closes at 6.", "The York office closes at 5.", "subject:"),
    (
        "Flat 2's boiler was serviced in May.",
        "Flat 4's boiler was serviced in January.",
        "qualifier:flat 2!=flat 4",
    ),
    (
        "Ruth's dog Pip is due for vaccines in May.",
        "Ruth's dog Mabel had vaccines in March.",
        "subject:",
    ),
    ("Ruth's cat is on a special diet.", "Ruth's dog is on a special diet.", "subject:"),
]


@pytest.mark.parametrize(("new", "old", "reason"), SIBLINGS, ids=[s[0][:40] for s in SIBLINGS])
def test_siblings_conflict(new: str, old: str, reason: str) -> None:
    relation = compare_keys(new, old)
    assert relation.key_conflict, relation
    assert not relation.key_match
    assert relation.reason.startswith(reason), relation.reason


# --- updates: no conflict (and a key match where the attribute is clear) --------------------------

UPDATES = [
    ("Maya moved to Austin last month.", "Maya lives in Denver, Colorado.", True),
    ("Hiroshi now lives in Osaka.", "Hiroshi Tanaka lives in Kyoto.", True),
    ("Acme is now on the Enterprise plan.", "Acme Corp is on the Pro plan.", True),
    ("Acme added 15 seats, so they have 60 now.", "Acme has 45 seats.", True),
    ("Priya's return flight was moved to 9 March.", "Priya's return flight is on 8 March.", True),
    (
        "Jonas changed his delivery address to 8 Elm Road.",
        "Jonas's delivery address is 4 Oak Close.",
        True,
    ),
    ("Amira's mobile changed to 07700 900123.", "Amira's mobile number is 07700 900456.", True),
    ("The iOS app is now on 4.2.0.", "The iOS app is on 4.1.3.", True),
    ("Hana Kim's birthday is 3 May.", "Hana's birthday is 5 May.", True),
    ("Leo's appointment moved to Friday.", "Leo's dental appointment is on Tuesday at 3 pm.", True),
    ("The patient's GP is now Dr. Osei.", "Patient's GP is Dr. Albright.", True),
    ("Chen's mobile is now 0412 555 019.", "Chen's mobile: 0412 555 871.", True),
    (
        "Our main contact at Duna is now Eva Horvath.",
        "Our main contact at Duna is Peter Nagy.",
        True,
    ),
    (
        "Fenwick's billing contact changed to ap@fenwick.example.",
        "Fenwick's billing contact is Rob Hale.",
        True,
    ),
    (
        "We upgraded the staging database from PostgreSQL 14 to 16.",
        "Staging runs PostgreSQL 14.",
        False,
    ),
    ("The staging database moved to PostgreSQL 16.", "Staging runs PostgreSQL 14.", False),
    ("Rohan was promoted to lead designer.", "Rohan is a designer at Fluxly.", False),
    ("Rohan no longer works at Fluxly.", "Rohan is a designer at Fluxly.", False),
    ("Pia's rent went up to £1,250.", "Pia pays £1,100 rent.", False),
    ("The team lunch moved to Friday.", "The team lunch is on Thursdays.", False),
    ("Zoe works from the office on Mondays now.", "Zoe works from home on Mondays.", False),
    (
        "Kai's emergency contact is now his brother Sam.",
        "Kai's emergency contact is his mother.",
        False,
    ),
    ("Max now plays rugby.", "Grace's son Max plays football.", False),
    ("Ava now attends Greenfield Nursery.", "Tilda's daughter Ava attends Little Acorns.", False),
    (
        "Tilda's daughter Ava now attends Greenfield Nursery.",
        "Tilda's daughter Ava attends Little Acorns.",
        False,
    ),
    ("Noah's school is now Oakridge High.", "Noah goes to Elm Primary.", False),
    ("Marek switched to another bank.", "Marek banks with Nordea.", False),
    ("The second office moved to Leeds.", "The second office is in York.", False),
    (
        "The outbound flight was rebooked to 06:50.",
        "Outbound flight: 2 Aug, 09:15, TK 1984.",
        False,
    ),
    ("Release 3.2 was deployed to production.", "Release 3.1 is deployed to staging.", False),
    ("Sam moved from the sales team to support.", "Sam works on the sales team.", False),
    ("Production was migrated from MySQL to PostgreSQL.", "Production runs MySQL 8.", False),
    ("Emre's shoe size is now 44.", "Emre wears size 43 shoes.", False),
    ("Upstairs tenant is now the Okafor family.", "The upstairs tenant is Ms. Lin.", False),
    ("Layla quit smoking in January.", "Layla smokes about ten a day.", False),
    ("Cormac is our new IT lead.", "Stonebridge's IT lead is Cormac Dunne.", False),
    ("Redfern has a new owner, Kit Farrow.", "Redfern's owner is Felix Brandt.", False),
    ("Respond in Spanish from now on.", "Respond in French.", False),
    ("Customer now prefers SMS.", "The customer prefers email for updates.", False),
    ("Maya now works on the support team.", "Maya works on the sales team.", False),
    ("Maya is now on the support team.", "Maya is on the sales team.", False),
    ("Tyrone's daughter moved to Leeds.", "Tyrone's daughter lives in York.", True),
    ("Aditi's husband Raj now works at Infosys.", "Raj works at Wipro.", False),
    (
        "Jasper's team moved him to the Berlin office.",
        "Jasper works from the Munich office.",
        False,
    ),
    ("The Leeds office now opens at 8.", "The Leeds office opens at 9.", False),
    (
        "The Brackwood tenant moved to eu-west-2.",
        "The Brackwood Energy tenant is in eu-west-1.",
        False,
    ),
    ("The Kowalskis moved to Gdansk.", "The Kowalski family lives in Krakow.", False),
    ("Mum now lives with Aunt Rosa in Porto.", "Mum lives in Lisbon.", False),
    (
        "Winona's primary care doctor is now Dr. Ruiz.",
        "Winona's primary care doctor is Dr. Chan.",
        False,
    ),
    ("Ingrid's west London flat is now let.", "Ingrid's flat in west London is empty.", False),
]


@pytest.mark.parametrize(("new", "old", "match"), UPDATES, ids=[u[0][:40] for u in UPDATES])
def test_updates_do_not_conflict(new: str, old: str, match: bool) -> None:
    relation = compare_keys(new, old)
    assert not relation.key_conflict, relation
    if match:
        assert relation.key_match, relation


# --- negatives ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("new", "old"),
    [
        ("The office is in downtown Denver, on 16th Street.", "The office is in Denver."),
        ("Sol's clinic is in Leith, above the pharmacy.", "Sol's clinic is in Edinburgh."),
        ("Ines uses a blue inhaler, two puffs at night.", "Ines uses an inhaler."),
        ("The warehouse has a second loading bay.", "The warehouse has a second loading bay."),
        ("Piers's dog is a four-year-old spaniel called Moss.", "Piers has a dog."),
    ],
)
def test_refinements_and_restatements_do_not_conflict(new: str, old: str) -> None:
    assert not compare_keys(new, old).key_conflict


@pytest.mark.parametrize(
    ("new", "old"),
    [
        ("Maya plays the cello.", "Maya lives in Denver."),
        ("Acme has 60 seats.", "Acme is on the Pro plan."),
        ("Lior's dentist is Dr. Kaur.", "Lior's birthday is 2 June."),
    ],
)
def test_unrelated_attributes_do_not_match(new: str, old: str) -> None:
    relation = compare_keys(new, old)
    assert not relation.key_match
    assert not relation.key_conflict


def test_capitalised_sentence_openers_are_not_people() -> None:
    # "Best" and "Rent" open the sentence; neither is a person to set against Tobias or Pia.
    assert not compare_keys(
        "Best time to call Tobias is after 10.", "Tobias prefers calls."
    ).key_conflict
    assert not compare_keys("Rent is now £1,200.", "Pia's rent is £1,100.").key_conflict


def test_a_subject_named_as_the_old_value_is_not_a_sibling() -> None:
    relation = compare_keys(
        "Ruairi is the new site lead.", "Brightwater's site lead is Ruairi Byrne."
    )
    assert not relation.key_conflict


def test_relate_is_symmetric_in_siblinghood_for_named_people() -> None:
    assert compare_keys(
        "Leo's swim class is on Tuesdays.", "Ada's swim class is on Mondays."
    ).key_conflict
    assert compare_keys(
        "Ada's swim class is on Mondays.", "Leo's swim class is on Tuesdays."
    ).key_conflict


@pytest.mark.parametrize(
    ("new", "old"),
    [
        ("As of Monday, Route 14 got moved to the Drammen hub.", "Route 9 runs through Drammen."),
        ("Bay 3 is closed for resurfacing until June.", "Bay 7 is closed on Sundays."),
        ("Line 2 now stops at the airport.", "Line 5 stops at the airport."),
    ],
)
def test_numbered_subjects_of_one_kind_are_siblings(new: str, old: str) -> None:
    rel = compare_keys(new, old)
    assert rel.key_conflict and (rel.reason.startswith(("instance:", "qualifier:")))


def test_a_number_in_the_value_is_not_a_sibling() -> None:
    rel = compare_keys(
        "Yusuf's thesis defence will be held in Room B312.", "Yusuf's defence is in Room B214."
    )
    assert not rel.key_conflict


def test_flying_back_is_the_return_leg() -> None:
    rel = compare_keys(
        "Keanu flies back from Lima on 18 March.", "Keanu flies out to Lima on 2 March."
    )
    assert rel.key_conflict and "return" in rel.reason
