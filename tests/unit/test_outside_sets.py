"""The outside sets of issue 31 (benchmarks/data/outside/): each set's sha256 is the one in its
README section, every case is well formed, and the converter's label rules do what the README
says on small inputs (standard library only, no model)."""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ROOT / "benchmarks" / "data" / "outside"

# set stem, id prefix, sha256 (as in its README section), committed
SETS = [
    ("dyknow", "dk", "2af59ff7797a244021595d028e5a3588157b50b107a99f83433247f250937912", True),
    ("situatedqa", "sq", "7cbac7b46ce62cbfcf0f4e7088e5508c0cf358be3ea77f1af7f472b6900343a2", False),
    ("openpi", "pi", "05362e1d8a7e6a7b01a51d0f47fc72629c2997fa4a1850585293adfe392e421a", True),
]
ACTIONS = {"replace", "add", "skip", "review"}


def _build() -> ModuleType:
    name = "outside_build"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "benchmarks" / "outside" / "build.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _path(stem: str, committed: bool) -> Path:
    path = OUTSIDE / f"{stem}.jsonl"
    if not path.exists():
        if committed:
            pytest.fail(f"{path} is committed and missing")
        pytest.skip(f"{path.name} is built locally (see benchmarks/data/outside/README.md)")
    return path


def _section(stem: str) -> str:
    text = (OUTSIDE / "README.md").read_text(encoding="utf-8")
    start = text.index(f"## {stem}.jsonl")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


@pytest.mark.parametrize(("stem", "prefix", "sha256", "committed"), SETS, ids=[s[0] for s in SETS])
def test_sha256_is_the_one_in_its_readme_section(
    stem: str, prefix: str, sha256: str, committed: bool
) -> None:
    assert sha256 in _section(stem)
    path = _path(stem, committed)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == sha256


@pytest.mark.parametrize(("stem", "prefix", "sha256", "committed"), SETS, ids=[s[0] for s in SETS])
def test_cases_are_well_formed(stem: str, prefix: str, sha256: str, committed: bool) -> None:
    cases = [json.loads(x) for x in _path(stem, committed).read_text("utf-8").splitlines() if x]
    ids = [c["id"] for c in cases]
    assert len(ids) == len(set(ids))
    assert all(i.startswith(f"{prefix}-") for i in ids)
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for c in cases:
        mids = [m["id"] for m in c["memories"]]
        texts = [m["text"] for m in c["memories"]]
        action, target = c["expected"]["action"], c["expected"]["target"]
        assert action in ACTIONS, c["id"]
        assert c["memories"] and len(set(mids)) == len(mids), c["id"]
        assert len(set(texts)) == len(texts) and c["incoming"] not in texts, c["id"]
        if action in {"replace", "skip"}:
            assert target in mids, c["id"]
        if action == "add":
            assert target is None, c["id"]
        table[c["category"]][action] += 1
    # the category table of the README section is the file's
    section = _section(stem)
    for category, row in table.items():
        cells = [str(sum(row.values()))] + [
            str(row[a]) if row[a] else "" for a in ("replace", "add", "skip")
        ]
        assert f"| {category} | {' | '.join(cells)} |" in section


def test_dyknow_label_rules_on_a_small_slot() -> None:
    b = _build()
    templates = {
        "generic": "The head of state in Xland is",
        "contextualized": "The King of Xland is",
    }
    other = {
        "generic": "The head of government in Xland is",
        "contextualized": "The PM of Xland is",
    }
    look = {"generic": "The head of state in Yland is", "contextualized": "The King of Yland is"}
    data = {
        "countries": {
            "Xland": {
                "King of Xland": {
                    "questions": templates,
                    "answers": [
                        "Ann |S: +1990-01-01T00:00:00Z |E: +2000-05-01T00:00:00Z",
                        "Bob |S: +2000-05-01T00:00:00Z |E: +2010-01-01T00:00:00Z",
                        "Cid |S: +2010-01-01T00:00:00Z",
                        # start month unknown, so not provably after Bob's end: never a successor
                        "Fay |S: +2010-00-00T00:00:00Z",
                        "Dee |S: +2005-00-00T00:00:00Z",  # overlaps Bob: no succession from Bob
                    ],
                },
                "PM of Xland": {"questions": other, "answers": ["Eve |S: +1995-00-00T00:00:00Z"]},
            },
            "Zland": {
                "King of Zland": {
                    "questions": {k: v.replace("Yland", "Zland") for k, v in look.items()},
                    "answers": ["Gus |S: +1980-00-00T00:00:00Z"],
                }
            },
            "Yland": {
                "King of Yland": {"questions": look, "answers": ["Bob |S: +1999-00-00T00:00:00Z"]}
            },
        }
    }
    slots = {s.role: s for s in b.dyknow_slots(data)}
    king = slots["King of Xland"]
    assert king.relation == slots["King of Yland"].relation == "The head of state in {} is"
    pairs = {(o.name, n.name) for o, n in b._successions(king)}
    # Ann ended when Bob started; Bob ended 2010 and the next to start after that is Cid
    assert pairs == {("Ann", "Bob"), ("Bob", "Cid")}

    cases = b.dyknow(data, per_kind=10)
    b.check(cases)
    for c in cases:
        texts = {m["id"]: m["text"] for m in c["memories"]}
        exp = c["expected"]
        if c["category"] == "state_update":
            assert exp["action"] == "replace"
            old = texts[exp["target"]]
            assert int(old[6:10]) < int(c["incoming"][6:10])  # "As of YYYY, ..."
            assert "Xland" in old and "Xland" in c["incoming"]
        elif c["category"] == "earlier_dated":
            assert exp == {"action": "add", "target": None}
            assert all(
                int(t[6:10]) > int(c["incoming"][6:10])
                for t in texts.values()
                if "King of Xland" in t or "state in Xland" in t
            )
        elif c["category"] == "duplicate":
            kept = texts[exp["target"]]
            assert exp["action"] == "skip" and kept != c["incoming"]
            assert kept.split(" is ")[-1] == c["incoming"].split(" is ")[-1]
        elif c["category"] == "lookalike":
            assert exp["action"] == "add"
            # no stored fact of the incoming slot
            subject = next(x for x in ("Xland", "Yland", "Zland") if x in c["incoming"])
            same_slot = [
                t for t in texts.values() if subject in t and ("King" in t or "state" in t)
            ]
            assert not same_slot
    assert {c["category"] for c in cases} >= {
        "state_update",
        "earlier_dated",
        "duplicate",
        "lookalike",
    }
    assert b.dyknow(data, per_kind=10) == cases  # seeded: the same input builds the same set


def test_situatedqa_label_rules_on_a_small_question() -> None:
    b = _build()
    temp = [
        {
            "question": "who leads q",
            "timelines": [{}],
            "prev_answers": ["Ann"],
            "cur_answers": ["Bob"],
            "context_answer_pairs": [
                {
                    "edited_question": "who leads q as of 2001",
                    "answers": ["Ann"],
                    "date": "2001",
                    "date_type": "start",
                },
                {
                    "edited_question": "who leads q as of 2019",
                    "answers": ["Bob"],
                    "date": "2019",
                    "date_type": "start",
                },
                {
                    "edited_question": "who leads q as of 2021",
                    "answers": ["Bob"],
                    "date": "2021",
                    "date_type": "sampled_year",
                },
            ],
        },
        *[
            {
                "question": f"filler {n}",
                "timelines": None,
                "context_answer_pairs": [
                    {
                        "edited_question": f"filler {n} as of 2020",
                        "answers": [str(n)],
                        "date": "2020",
                        "date_type": "orig",
                    }
                ],
            }
            for n in range(6)
        ],
    ]
    geo = [
        {
            "question": "what is the capital",
            "context_answer_pairs": [
                {"location": "A", "answers": ["a"], "edited_question": "what is the capital of A"},
                {"location": "B", "answers": ["b"], "edited_question": "what is the capital of B"},
                {"location": "C", "answers": ["c"], "edited_question": "what is the capital of C"},
            ],
        }
    ]
    cases = b.situatedqa(temp, geo, per_kind=5)
    b.check(cases)
    by = {c["category"]: c for c in cases}
    up = by["state_update"]
    assert up["incoming"] == "Who leads q as of 2019? Bob."
    assert {m["id"]: m["text"] for m in up["memories"]}[
        up["expected"]["target"]
    ] == "Who leads q as of 2001? Ann."
    late = by["earlier_dated"]
    assert (
        late["incoming"] == "Who leads q as of 2001? Ann." and late["expected"]["action"] == "add"
    )
    look = by["lookalike"]
    assert look["expected"] == {"action": "add", "target": None}
    assert len(look["memories"]) == 2


def _pi(step: int, entity: str, attr: str, before: str, after: str, answer: str) -> dict:
    return {
        "_step": step,
        "entity": entity,
        "attr": attr,
        "before": before,
        "after": after,
        "answer": answer,
        "modality": "without_image",
    }


def test_openpi_label_rules_on_a_small_procedure() -> None:
    b = _build()
    answers = [
        _pi(
            1,
            "cup",
            "location",
            "on shelf",
            "on table",
            "location of cup was on shelf before and on table afterwards",
        ),
        # a second annotator, same step, same before and after: a duplicate
        _pi(
            1,
            "the cup",
            "location",
            "on the shelf",
            "on the table",
            "location of the cup was on the shelf before, and on the table afterwards.",
        ),
        # a third annotator, same step and after, another before: restated
        _pi(
            1,
            "cup",
            "location",
            "in cupboard",
            "on table",
            "location of cup was in cupboard before and on table afterwards",
        ),
        # step 2 starts where step 1 ended: the explicit update
        _pi(
            2,
            "cup",
            "location",
            "on table",
            "in sink",
            "location of cup was on table before and in sink afterwards",
        ),
        # step 2 from a value no step ended in: never an update
        _pi(
            2,
            "cup",
            "location",
            "on counter",
            "in drawer",
            "location of cup was on counter before and in drawer afterwards",
        ),
        _pi(
            2,
            "cup",
            "temperature",
            "cold",
            "hot",
            "temperature of cup was cold before and hot afterwards",
        ),
        _pi(2, "cup", "wetness", "dry", "wet", "wetness of cup was dry before and wet afterwards"),
        _pi(
            2,
            "cup",
            "moisture",
            "dry",
            "damp",
            "moisture of cup was dry before and damp afterwards",
        ),
        _pi(
            2,
            "cup",
            "cleanness",
            "dirty",
            "clean",
            "cleanness of cup was dirty before and clean afterwards",
        ),
        # another entity of the procedure whose value is the update's old value: a lookalike
        _pi(
            1,
            "plate",
            "location",
            "in sink",
            "on table",
            "location of plate was in sink before and on table afterwards",
        ),
        # shares a word with "cup": never a lookalike of the cup
        _pi(
            1,
            "coffee cup",
            "location",
            "in box",
            "on table",
            "location of coffee cup was in box before and on table afterwards",
        ),
        _pi(
            1,
            "spoon",
            "location",
            "in drawer",
            "in cup",
            "location of spoon was in drawer before and in cup afterwards",
        ),
        # no change annotated: dropped
        _pi(
            2,
            "plate",
            "shape",
            "round",
            "round",
            "shape of plate was round before and round afterwards",
        ),
    ]
    rows: dict[int, list[dict]] = collections.defaultdict(list)
    for a in answers:
        rows[a.pop("_step")].append(a)
    changes = b.openpi_changes(
        [{"id": f"www.x/Wash-a-Cup||{k}", "answers_metadata": v} for k, v in sorted(rows.items())]
    )
    assert len(changes) == len(answers) - 1
    cases = b.openpi(changes, per_kind=20)
    b.check(cases)
    by: dict[str, list[dict]] = collections.defaultdict(list)
    for c in cases:
        by[c["category"]].append(c)

    def target(c: dict) -> str:
        return {m["id"]: m["text"] for m in c["memories"]}[c["expected"]["target"]]

    ups = by["explicit_update"]
    # two stored wordings of the step-1 state (two annotators), one incoming step-2 sentence
    assert {target(c) for c in ups} == {
        "Location of cup is on table.",
        "Location of the cup is on the table.",
    }
    for up in ups:
        assert up["expected"]["action"] == "replace"
        assert up["incoming"] == "Location of cup was on table before and in sink afterwards."
        texts = {m["text"] for m in up["memories"]}
        assert "Location of plate is on table." in texts  # the lookalike with the old value
        assert not any("coffee cup" in t for t in texts)
    (dup,) = by["duplicate"]
    assert dup["expected"]["action"] == "skip"
    assert {target(dup), dup["incoming"]} == {
        "Location of cup was on shelf before and on table afterwards.",
        "Location of the cup was on the shelf before, and on the table afterwards.",
    }
    restated = by["restated"]
    assert restated and all(c["expected"]["action"] == "skip" for c in restated)
    for c in restated:  # the stored state is the value the incoming sentence ends in
        assert b._norm(target(c)).endswith(" is on table")
        assert b._norm(c["incoming"]).endswith("on table afterwards")
    for c in by["lookalike"] + by["other_attribute"]:
        assert c["expected"] == {"action": "add", "target": None}
        head = c["incoming"].split(" was ")[0]  # "<Attr> of <entity>"
        assert not any(m["text"].startswith(head + " is ") for m in c["memories"]), c
    for c in by["other_attribute"]:
        # same-subject distractors never share the incoming before or after value
        inc = c["incoming"].lower()
        for m in c["memories"]:
            value = m["text"].lower().split(" is ", 1)[1].rstrip(".")
            if " of cup is " in m["text"].lower():
                assert f"was {value} before" not in inc and f"and {value} afterwards" not in inc
    wet = [c for c in cases if c["incoming"].startswith("Wetness of cup")]
    assert wet and all(
        not any(m["text"].startswith("Moisture of cup") for m in c["memories"]) for c in wet
    )
    assert b.openpi(changes, per_kind=20) == cases  # seeded: the same input builds the same set


def test_openpi_two_names_are_two_subjects_only_when_nothing_is_shared() -> None:
    b = _build()
    assert b._other_entity("plate", "cup")
    assert not b._other_entity("eraser", "the blackboard eraser")  # a shared word
    assert not b._other_entity("stretch marks", "Stretchmarks")  # one name, spaced two ways
    assert not b._other_entity("The Cup", "cup.")


def test_check_refuses_a_target_outside_the_store() -> None:
    b = _build()
    bad = {
        "id": "x-1",
        "category": "state_update",
        "memories": [{"id": "m1", "text": "a"}],
        "incoming": "b",
        "expected": {"action": "replace", "target": "m2"},
    }
    with pytest.raises(ValueError, match="not among the memories"):
        b.check([bad])
