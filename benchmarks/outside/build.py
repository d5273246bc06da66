"""Build the outside evaluation sets from public data that nobody on this team wrote.

Every label comes from the source dataset's own annotations; nothing here judges a pair of
sentences. Each source has one converter function, seeded and deterministic:

* :func:`dyknow` reads DyKnow's ``grc_generated.json`` (sislab-unitn/DyKnow, MIT; the facts are
  Wikidata's, CC0): per subject and role, the dataset's own 4 paraphrase templates and every
  holder with Wikidata's start (``S``) and end (``E``) qualifiers.
* :func:`situatedqa` reads SituatedQA's ``raw_data/temp.*.jsonl`` and ``raw_data/geo.*.jsonl``
  (mikejqzhang/SituatedQA): questions whose answer changed at annotated start dates, and
  questions whose answer depends on an annotated location.
* :func:`openpi` reads OpenPI's ``data/gold/{dev,test}/id_answers_metadata.jsonl``
  (allenai/openpi-dataset, MIT): per procedure step, crowd workers' own sentences "<attr> of
  <entity> was <before> before and <after> afterwards" with the four parts annotated; the event
  phrasing with the old value spelled out.

The label rules are written next to each function and in ``benchmarks/data/outside/README.md``.
The sets are for reporting only: nothing may be fitted or tuned on them.

Usage (paths are files of the fetched repositories, at the commits the README names)::

    python benchmarks/outside/build.py dyknow --source grc_generated.json \
        --out benchmarks/data/outside/dyknow.jsonl
    python benchmarks/outside/build.py situatedqa --source SituatedQA/data/raw_data \
        --out benchmarks/data/outside/situatedqa.jsonl
    python benchmarks/outside/build.py openpi --source DIR_OF_{dev,test}.id_answers_metadata.jsonl \
        --out benchmarks/data/outside/openpi.jsonl
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 31
"""One seed for every sampling and shuffling step (issue 31)."""

Date = tuple[int, int, int]
"""(year, month, day); 0 where Wikidata leaves the month or day unknown."""


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _case(
    cid: str,
    category: str,
    memories: Sequence[str],
    incoming: str,
    action: str,
    target_index: int | None,
    notes: str,
    rng: random.Random,
) -> dict[str, Any]:
    """One case; the memory order is shuffled so the target's position carries no signal."""
    order = list(range(len(memories)))
    rng.shuffle(order)
    ids = {old: f"m{new + 1}" for new, old in enumerate(order)}
    mems = [{"id": ids[old], "text": memories[old]} for old in order]
    target = ids[target_index] if target_index is not None else None
    return {
        "id": cid,
        "category": category,
        "memories": mems,
        "incoming": incoming,
        "expected": {"action": action, "target": target},
        "notes": notes,
    }


# --------------------------------------------------------------------------------------------
# DyKnow (Wikidata validity intervals + the dataset's own paraphrase templates)
# --------------------------------------------------------------------------------------------

_DATE = re.compile(r"\+(\d{4})-(\d{2})-(\d{2})")


@dataclass(frozen=True)
class Holder:
    """One answer of a DyKnow slot: who held it, from when, until when (None: open)."""

    name: str
    start: Date
    end: Date | None


@dataclass(frozen=True)
class Slot:
    """One (subject, role) of DyKnow with its templates and holders."""

    group: str
    subject: str
    role: str
    relation: str
    """The role type shared across subjects: the ``generic`` template with the subject cut
    out (``The head of state in {} is``); two slots with one relation and two subjects are
    lookalikes by the dataset's own triples."""
    templates: tuple[tuple[str, str], ...]
    holders: tuple[Holder, ...]


def _date(text: str) -> Date | None:
    m = _DATE.search(text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _holder(answer: str) -> Holder | None:
    parts = [p.strip() for p in answer.split("|")]
    name, start, end = parts[0], None, None
    for p in parts[1:]:
        if p.startswith("S:"):
            start = _date(p)
        elif p.startswith("E:"):
            end = _date(p)
    if not name or start is None:
        return None
    return Holder(name, start, end)


def dyknow_slots(data: dict[str, Any]) -> list[Slot]:
    slots = []
    for group in sorted(data):
        for subject in sorted(data[group]):
            entry = data[group][subject]
            roles = {"": entry} if "questions" in entry else entry
            for role in sorted(roles):
                q = roles[role]["questions"]
                holders = tuple(
                    h for h in (_holder(a) for a in roles[role]["answers"]) if h is not None
                )
                relation = q["generic"].replace(subject, "{}")
                slots.append(
                    Slot(group, subject, role or group, relation, tuple(sorted(q.items())), holders)
                )
    return slots


def _say(template: str, holder: Holder) -> str:
    """``As of <start year>, <template> <holder>.``: the template verbatim, its first letter
    lowered only where it is the article ``The``."""
    t = template[0].lower() + template[1:] if template.startswith("The ") else template
    return f"As of {holder.start[0]}, {t} {holder.name}."


def _tally(same: Sequence[str], look: Sequence[str]) -> str:
    return f" [same-subject distractors: {len(same)}; lookalikes: {len(look)}]"


def _successions(slot: Slot) -> list[tuple[Holder, Holder]]:
    """(old, new) pairs where Wikidata says the old holding ended no later than the new one
    started, the new one is the next to start, and the start years differ."""
    out = []
    by_start = sorted(slot.holders, key=lambda h: h.start)
    for old in by_start:
        if old.end is None:
            continue
        later = [
            h
            for h in by_start
            if h.start >= old.end and h.start[0] > old.start[0] and h.name != old.name
        ]
        if later:
            out.append((old, later[0]))
    return out


def dyknow(data: dict[str, Any], *, per_kind: int = 130, seed: int = SEED) -> list[dict[str, Any]]:
    """Cases from DyKnow. Label rules (all from the dataset's own annotations):

    * ``state_update`` -> replace, target the old fact: same subject and role; the stored holder's
      Wikidata end date is no later than the incoming holder's start date (the next to start),
      and the incoming fact is dated by a later start year.
    * ``earlier_dated`` -> add: the same pair the other way round (the later-dated fact is
      stored, the earlier-dated one arrives late); it is history, not an update.
    * ``duplicate`` -> skip, target the stored fact: the same holder and date rendered by two of
      the dataset's own paraphrase templates of that slot.
    * ``other_relation`` -> add: the store holds the subject's other roles (a country's head of
      government when the head of state arrives), never the incoming role.
    * ``lookalike`` -> add: the store holds the same role of other subjects (prefer ones whose
      holder has the incoming value), never the incoming subject's.

    Every store also holds up to 2 facts of the subject's other roles (same-subject distractors)
    and 2 lookalikes (same relation, other subject), which are never targets.
    """
    rng = random.Random(seed)
    slots = [s for s in dyknow_slots(data) if s.holders]
    by_subject: dict[tuple[str, str], list[Slot]] = {}
    by_relation: dict[str, list[Slot]] = {}
    for s in slots:
        by_subject.setdefault((s.group, s.subject), []).append(s)
        by_relation.setdefault(s.relation, []).append(s)

    def dated(slot: Slot, holder: Holder | None = None) -> str:
        h = holder or rng.choice(slot.holders)
        return _say(rng.choice(slot.templates)[1], h)

    def same_subject(slot: Slot, k: int = 2) -> list[str]:
        others = [o for o in by_subject[(slot.group, slot.subject)] if o.role != slot.role]
        return [dated(o) for o in rng.sample(others, min(k, len(others)))]

    def lookalikes(slot: Slot, value: str, k: int = 2) -> list[str]:
        others = [o for o in by_relation[slot.relation] if o.subject != slot.subject]
        same_value = [o for o in others if any(h.name == value for h in o.holders)]
        rest = [o for o in others if o not in same_value]
        picked = rng.sample(same_value, min(k, len(same_value)))
        picked += rng.sample(rest, min(k - len(picked), len(rest)))
        out = []
        for o in picked:
            hs = [h for h in o.holders if h.name == value] or list(o.holders)
            out.append(dated(o, rng.choice(hs)))
        return out

    cases: list[dict[str, Any]] = []

    pairs = [(s, old, new) for s in slots for old, new in _successions(s)]
    rng.shuffle(pairs)
    for s, old, new in pairs[:per_kind]:
        tpl_old, tpl_new = rng.choice(s.templates)[1], rng.choice(s.templates)[1]
        ss, lk = same_subject(s), lookalikes(s, new.name)
        mems = [_say(tpl_old, old), *ss, *lk]
        note = (
            f"{s.subject} / {s.role}: {old.name} {old.start}-{old.end}"
            f" -> {new.name} from {new.start}{_tally(ss, lk)}"
        )
        cases.append(_case("", "state_update", mems, _say(tpl_new, new), "replace", 0, note, rng))
    rng.shuffle(pairs)
    for s, old, new in pairs[:per_kind]:
        tpl_old, tpl_new = rng.choice(s.templates)[1], rng.choice(s.templates)[1]
        ss, lk = same_subject(s), lookalikes(s, old.name)
        mems = [_say(tpl_new, new), *ss, *lk]
        note = (
            f"{s.subject} / {s.role}: stored {new.name} from {new.start};"
            f" {old.name} {old.start}-{old.end} arrives late{_tally(ss, lk)}"
        )
        cases.append(_case("", "earlier_dated", mems, _say(tpl_old, old), "add", None, note, rng))

    dup = [(s, h) for s in slots if len(s.templates) >= 2 for h in s.holders]
    rng.shuffle(dup)
    for s, h in dup[:per_kind]:
        (_, t1), (_, t2) = rng.sample(s.templates, 2)
        ss, lk = same_subject(s), lookalikes(s, h.name)
        mems = [_say(t1, h), *ss, *lk]
        note = (
            f"{s.subject} / {s.role}: {h.name} from {h.start},"
            f" two of the dataset's templates{_tally(ss, lk)}"
        )
        cases.append(_case("", "duplicate", mems, _say(t2, h), "skip", 0, note, rng))

    multi = [s for s in slots if len(by_subject[(s.group, s.subject)]) >= 2]
    other = [(s, h) for s in multi for h in s.holders]
    rng.shuffle(other)
    for s, h in other[:per_kind]:
        ss, lk = same_subject(s, k=3), lookalikes(s, h.name)
        mems = [*ss, *lk]
        note = f"{s.subject}: the store has other roles only; incoming {s.role}{_tally(ss, lk)}"
        cases.append(_case("", "other_relation", mems, dated(s, h), "add", None, note, rng))

    look = [(s, h) for s in slots for h in s.holders if len(by_relation[s.relation]) >= 3]
    rng.shuffle(look)
    for s, h in look[:per_kind]:
        lk, ss = lookalikes(s, h.name, k=3), same_subject(s, k=1)
        mems = [*lk, *ss]
        note = (
            f"{s.subject} / {s.role}: the store has this role of other subjects only"
            f"{_tally(ss, lk)}"
        )
        cases.append(_case("", "lookalike", mems, dated(s, h), "add", None, note, rng))

    for n, c in enumerate(cases, 1):
        c["id"] = f"dk-{n:04d}"
    return cases


# --------------------------------------------------------------------------------------------
# SituatedQA (annotated answer start dates; annotated locations)
# --------------------------------------------------------------------------------------------


def _sentence(question: str, answer: str) -> str:
    """The dataset's own edited question and its annotated answer, verbatim:
    ``Who is the ceo of x as of 2015? Y.``"""
    q = question.strip().rstrip("?")
    return f"{q[0].upper()}{q[1:]}? {answer.strip().rstrip('.')}."


def _read_jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        with Path(p).open(encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def situatedqa(
    temp: Sequence[dict[str, Any]],
    geo: Sequence[dict[str, Any]],
    *,
    per_kind: int = 150,
    seed: int = SEED,
) -> list[dict[str, Any]]:
    """Cases from SituatedQA. Label rules (all from the dataset's own annotations):

    * ``state_update`` -> replace, target the old fact: one temporal question, two of its
      annotated ``date_type == "start"`` context pairs whose answers differ, the older answer in
      the annotated ``prev_answers`` and the newer in ``cur_answers``; the older is stored.
    * ``earlier_dated`` -> add: the same pair the other way round.
    * ``lookalike`` -> add: one geographic question, the store holds its annotated answers for
      other locations, the incoming fact is its answer for another annotated location.

    Every temporal store also holds 3 other questions' facts as distractors; a geographic store
    holds 2 to 4 other locations of the same question. SituatedQA annotates no subject, so the
    temporal stores have no same-subject distractors.
    """
    rng = random.Random(seed)
    updates = []
    for item in temp:
        if not item.get("timelines") or not item.get("prev_answers") or not item.get("cur_answers"):
            continue
        starts = sorted(
            (p for p in item["context_answer_pairs"] if p.get("date_type") == "start"),
            key=lambda p: p["date"],
        )
        prev = [p for p in starts if p["answers"] and p["answers"][0] in item["prev_answers"]]
        cur = [p for p in starts if p["answers"] and p["answers"][0] in item["cur_answers"]]
        if not prev or not cur:
            continue
        old, new = prev[0], cur[-1]
        if not (old["date"] < new["date"]) or old["answers"][0] == new["answers"][0]:
            continue
        if set(item["prev_answers"]) & set(item["cur_answers"]):
            continue
        updates.append((item, old, new))
    rng.shuffle(updates)

    pool = [
        _sentence(p["edited_question"], p["answers"][0])
        for item in temp
        for p in item["context_answer_pairs"][:1]
        if p.get("answers")
    ]

    def distractors(item: dict[str, Any], k: int = 3) -> list[str]:
        mine = {
            _sentence(p["edited_question"], p["answers"][0])
            for p in item["context_answer_pairs"]
            if p.get("answers")
        }
        out: list[str] = []
        while len(out) < k:
            s = rng.choice(pool)
            if s not in mine and s not in out:
                out.append(s)
        return out

    cases: list[dict[str, Any]] = []
    for item, old, new in updates[:per_kind]:
        mems = [_sentence(old["edited_question"], old["answers"][0]), *distractors(item)]
        inc = _sentence(new["edited_question"], new["answers"][0])
        note = (
            f"{item['question']}: {old['answers'][0]} ({old['date']})"
            f" -> {new['answers'][0]} ({new['date']})"
        )
        cases.append(_case("", "state_update", mems, inc, "replace", 0, note, rng))
    rng.shuffle(updates)
    for item, old, new in updates[:per_kind]:
        mems = [_sentence(new["edited_question"], new["answers"][0]), *distractors(item)]
        inc = _sentence(old["edited_question"], old["answers"][0])
        note = (
            f"{item['question']}: stored {new['answers'][0]} ({new['date']});"
            f" {old['answers'][0]} ({old['date']}) arrives late"
        )
        cases.append(_case("", "earlier_dated", mems, inc, "add", None, note, rng))

    places = []
    for item in geo:
        pairs = [
            p
            for p in item.get("context_answer_pairs", [])
            if p.get("answers") and p.get("location") and p.get("edited_question")
        ]
        locs = {p["location"].lower() for p in pairs}
        answers = {p["answers"][0].lower() for p in pairs}
        if len(pairs) >= 3 and len(locs) == len(pairs):
            places.append((item, pairs, len(answers) == len(pairs)))
    rng.shuffle(places)
    for item, pairs, _distinct in places[:per_kind]:
        inc_pair = rng.choice(pairs)
        rest = [p for p in pairs if p is not inc_pair][:4]
        mems = [_sentence(p["edited_question"], p["answers"][0]) for p in rest]
        where = ", ".join(p["location"] for p in rest)
        note = f"{item['question']}: stored for {where}; incoming {inc_pair['location']}"
        cases.append(
            _case(
                "",
                "lookalike",
                mems,
                _sentence(inc_pair["edited_question"], inc_pair["answers"][0]),
                "add",
                None,
                note,
                rng,
            )
        )

    for n, c in enumerate(cases, 1):
        c["id"] = f"sq-{n:04d}"
    return cases


# --------------------------------------------------------------------------------------------
# OpenPI (annotated entity state changes: entity, attribute, before, after, per step)
# --------------------------------------------------------------------------------------------

_ARTICLE = re.compile(r"\b(the|a|an)\b")


def _norm(text: str) -> str:
    """Case, articles, punctuation and spacing folded; nothing else (no synonyms, no stems)."""
    t = _ARTICLE.sub(" ", text.lower())
    t = re.sub(r"[^\w\s']", " ", t)
    return re.sub(r"\s+", " ", t).strip()


@dataclass(frozen=True)
class Change:
    """One OpenPI answer: in procedure ``url`` at step ``step``, ``attr`` of ``entity`` was
    ``before`` before the step and ``after`` afterwards (``answer`` is the annotator's sentence)."""

    url: str
    step: int
    entity: str
    attr: str
    before: str
    after: str
    answer: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.url, _norm(self.entity), _norm(self.attr))


def openpi_changes(rows: Iterable[dict[str, Any]]) -> list[Change]:
    """The ``answers_metadata`` of OpenPI's ``id_answers_metadata.jsonl`` rows, one
    :class:`Change` per answer with every field filled in; repeated answers kept once."""
    out: dict[tuple[str, int, str], Change] = {}
    for row in rows:
        url, step = row["id"].rsplit("||", 1)
        for a in row.get("answers_metadata", []):
            fields = [str(a.get(k) or "").strip() for k in ("entity", "attr", "before", "after")]
            answer = str(a.get("answer") or "").strip()
            if not all(fields) or not answer or _norm(fields[2]) == _norm(fields[3]):
                continue
            entity, attr, before, after = fields
            out.setdefault(
                (url, int(step), answer),
                Change(url, int(step), entity, attr, before, after, answer),
            )
    return sorted(out.values(), key=lambda c: (c.url, c.step, c.answer))


def _said(c: Change) -> str:
    """The annotator's own sentence, first letter capitalised, ending in one period."""
    a = c.answer.strip().rstrip(".").strip()
    return f"{a[0].upper()}{a[1:]}."


def _state(c: Change) -> str:
    """The state after the step, from the annotation's own fields:
    ``<attr> of <entity> is <after>.``"""
    a = f"{c.attr} of {c.entity} is {c.after}"
    return f"{a[0].upper()}{a[1:]}."


def _words(text: str) -> set[str]:
    return set(_norm(text).split())


def _other_entity(a: str, b: str) -> bool:
    """Two entity names are two subjects only where they share no word and neither, with its
    spaces removed, holds the other ("stretch marks" and "stretchmarks" are one subject)."""
    ja, jb = _norm(a).replace(" ", ""), _norm(b).replace(" ", "")
    return not (_words(a) & _words(b)) and ja not in jb and jb not in ja


def openpi(
    changes: Sequence[Change], *, per_kind: int = 150, seed: int = SEED
) -> list[dict[str, Any]]:
    """Cases from OpenPI. Label rules (all from the dataset's own annotations; names and
    values compared after :func:`_norm` only):

    * ``explicit_update`` -> replace, target the stored state: one procedure, entity and
      attribute; the stored fact is the state after step i (``<attr> of <entity> is <A>.``) and
      the incoming fact is an annotator's own sentence for a later step j whose annotated
      ``before`` is A and whose ``after`` is not: "<attr> of <entity> was A before and B
      afterwards.".
    * ``duplicate`` -> skip, target the stored sentence: two annotators' own sentences for one
      step, entity and attribute with the same ``before`` and the same ``after``.
    * ``restated`` -> skip, target the stored state: the stored fact is annotator 1's state
      after step i (``<attr> of <entity> is <B>.``); the incoming fact is annotator 2's own
      sentence for the same step, entity and attribute, ending in the same ``after`` B (its
      ``before`` may differ): it adds no new state.
    * ``other_attribute`` -> add: the store holds only other attributes of the same entity in
      the procedure (and one lookalike); the incoming attribute has no stored fact.
    * ``lookalike`` -> add: the store holds the same attribute of other entities of the
      procedure (preferring those whose value is the incoming ``before``), never the incoming
      entity's.

    Other entities share no word with the incoming entity and neither name, spaces removed,
    holds the other (so "eraser" and "blackboard eraser", or "stretch marks" and
    "stretchmarks", are never two subjects). A same-subject distractor's value differs from
    the incoming ``before`` and ``after`` (so "moisture of clothes is wet" never stands beside
    "wetness of clothes was wet before ..."). Every update store also holds up to 2
    same-subject distractors and up to 2 lookalikes.
    """
    rng = random.Random(seed)
    by_url: dict[str, list[Change]] = {}
    for c in changes:
        by_url.setdefault(c.url, []).append(c)

    def same_subject(inc: Change, k: int) -> list[str]:
        vals = {_norm(inc.before), _norm(inc.after)}
        pool = {
            _state(o): o
            for o in by_url[inc.url]
            if _norm(o.entity) == _norm(inc.entity)
            and _norm(o.attr) != _norm(inc.attr)
            and _norm(o.after) not in vals
            and _norm(o.before) not in vals
        }
        return rng.sample(sorted(pool), min(k, len(pool)))

    def lookalikes(inc: Change, k: int) -> list[str]:
        others = [
            o
            for o in by_url[inc.url]
            if _norm(o.attr) == _norm(inc.attr) and _other_entity(o.entity, inc.entity)
        ]
        same_value = sorted({_state(o) for o in others if _norm(o.after) == _norm(inc.before)})
        rest = sorted({_state(o) for o in others} - set(same_value))
        picked = rng.sample(same_value, min(k, len(same_value)))
        picked += rng.sample(rest, min(k - len(picked), len(rest)))
        return picked

    cases: list[dict[str, Any]] = []

    by_key: dict[tuple[str, str, str], list[Change]] = {}
    for c in changes:
        by_key.setdefault(c.key, []).append(c)
    updates: dict[tuple[str, str], tuple[Change, Change]] = {}
    for group in by_key.values():
        for old in group:
            for new in group:
                if (
                    new.step > old.step
                    and _norm(new.before) == _norm(old.after)
                    and _norm(new.after) != _norm(old.after)
                ):
                    updates.setdefault((_state(old), _said(new)), (old, new))
    pairs = [updates[k] for k in sorted(updates)]
    rng.shuffle(pairs)
    for old, new in pairs[:per_kind]:
        ss, lk = same_subject(new, 2), lookalikes(new, 2)
        mems = [_state(old), *ss, *lk]
        note = (
            f"{old.url}: {old.attr} of {old.entity} = {old.after!r} after step {old.step};"
            f" step {new.step}: before {new.before!r}, after {new.after!r}{_tally(ss, lk)}"
        )
        cases.append(_case("", "explicit_update", mems, _said(new), "replace", 0, note, rng))

    dups: dict[tuple[str, str], tuple[Change, Change]] = {}
    for group in by_key.values():
        for a in group:
            for b in group:
                if (
                    a.step == b.step
                    and a.answer < b.answer
                    and _said(a) != _said(b)
                    and _norm(a.before) == _norm(b.before)
                    and _norm(a.after) == _norm(b.after)
                ):
                    dups.setdefault((_said(a), _said(b)), (a, b))
    dup_pairs = [dups[k] for k in sorted(dups)]
    rng.shuffle(dup_pairs)
    for a, b in dup_pairs[:per_kind]:
        stored, inc = (a, b) if rng.random() < 0.5 else (b, a)
        ss, lk = same_subject(inc, 2), lookalikes(inc, 2)
        mems = [_said(stored), *ss, *lk]
        note = (
            f"{a.url} step {a.step}: two annotators, {a.attr} of {a.entity}"
            f" {a.before!r} -> {a.after!r}{_tally(ss, lk)}"
        )
        cases.append(_case("", "duplicate", mems, _said(inc), "skip", 0, note, rng))

    restated: dict[tuple[str, str], tuple[Change, Change]] = {}
    for group in by_key.values():
        for a in group:
            for b in group:
                if (
                    a.step == b.step
                    and a.answer != b.answer
                    and _norm(a.after) == _norm(b.after)
                    and _state(a) != _said(b)
                ):
                    restated.setdefault((_state(a), _said(b)), (a, b))
    re_pairs = [restated[k] for k in sorted(restated)]
    rng.shuffle(re_pairs)
    for a, b in re_pairs[:per_kind]:
        ss, lk = same_subject(b, 2), lookalikes(b, 2)
        note = (
            f"{a.url} step {a.step}: {a.attr} of {a.entity} is {a.after!r} after the step"
            f" (annotator 1); annotator 2 says {b.before!r} -> {b.after!r}{_tally(ss, lk)}"
        )
        mems = [_state(a), *ss, *lk]
        cases.append(_case("", "restated", mems, _said(b), "skip", 0, note, rng))

    singles = sorted({c.answer: c for c in changes}.values(), key=lambda c: (c.url, c.answer))
    rng.shuffle(singles)
    n = 0
    for inc in singles:
        if n == per_kind:
            break
        ss, lk = same_subject(inc, 3), lookalikes(inc, 1)
        if not ss:
            continue
        note = (
            f"{inc.url} step {inc.step}: the store has other attributes of {inc.entity} only;"
            f" incoming {inc.attr}{_tally(ss, lk)}"
        )
        cases.append(_case("", "other_attribute", [*ss, *lk], _said(inc), "add", None, note, rng))
        n += 1
    rng.shuffle(singles)
    n = 0
    for inc in singles:
        if n == per_kind:
            break
        lk, ss = lookalikes(inc, 3), same_subject(inc, 1)
        if not lk:
            continue
        same_value = sum(1 for t in lk if _norm(t).endswith(f" is {_norm(inc.before)}"))
        note = (
            f"{inc.url} step {inc.step}: the store has {inc.attr} of other entities only,"
            f" {same_value} with the incoming before value{_tally(ss, lk)}"
        )
        cases.append(_case("", "lookalike", [*lk, *ss], _said(inc), "add", None, note, rng))
        n += 1

    for i, case in enumerate(cases, 1):
        case["id"] = f"pi-{i:04d}"
    return cases


# --------------------------------------------------------------------------------------------


def check(cases: Sequence[dict[str, Any]]) -> None:
    """The format every set keeps: unique ids, valid actions, targets among the memories,
    unique memory texts within a case, the incoming text not stored as it is."""
    ids = [c["id"] for c in cases]
    if len(ids) != len(set(ids)):
        raise ValueError("case ids are not unique")
    for c in cases:
        mids = [m["id"] for m in c["memories"]]
        texts = [m["text"] for m in c["memories"]]
        exp = c["expected"]
        if exp["action"] not in {"replace", "add", "skip", "review"}:
            raise ValueError(f"{c['id']}: bad action {exp['action']}")
        if exp["action"] in {"replace", "skip"} and exp["target"] not in mids:
            raise ValueError(f"{c['id']}: target {exp['target']} not among the memories")
        if exp["action"] == "add" and exp["target"] is not None:
            raise ValueError(f"{c['id']}: add with a target")
        if len(set(mids)) != len(mids) or len(set(texts)) != len(texts):
            raise ValueError(f"{c['id']}: repeated memory")
        if c["incoming"] in texts:
            raise ValueError(f"{c['id']}: incoming stored verbatim")


def counts(cases: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter[str]] = {}
    for c in cases:
        table.setdefault(c["category"], Counter())[c["expected"]["action"]] += 1
    return {k: dict(v) for k, v in sorted(table.items())}


def _dedupe_stores(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop a distractor that repeats another memory's or the incoming text (random picks can
    collide); the target is never dropped."""
    out = []
    for c in cases:
        target = c["expected"]["target"]
        seen = {c["incoming"]}
        mems = []
        for m in c["memories"]:
            if m["text"] in seen and m["id"] != target:
                continue
            seen.add(m["text"])
            mems.append(m)
        if target is None or any(m["id"] == target for m in mems):
            out.append({**c, "memories": mems})
    return out


def write(cases: Sequence[dict[str, Any]], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source_name", choices=["dyknow", "situatedqa", "openpi"])
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.source_name == "dyknow":
        cases = dyknow(json.loads(args.source.read_text(encoding="utf-8")))
        files = [args.source]
    elif args.source_name == "openpi":
        files = sorted(args.source.glob("*.id_answers_metadata.jsonl"))
        cases = openpi(openpi_changes(_read_jsonl(files)))
    else:
        temp = sorted(args.source.glob("temp.*.jsonl"))
        geo = sorted(args.source.glob("geo.*.jsonl"))
        cases = situatedqa(_read_jsonl(temp), _read_jsonl(geo))
        files = temp + geo
    cases = _dedupe_stores(cases)
    check(cases)
    write(cases, args.out)
    print(
        json.dumps(
            {
                "cases": len(cases),
                "counts": counts(cases),
                "sources": {str(p): sha256(p) for p in files},
                "out": {str(args.out): sha256(args.out)},
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
