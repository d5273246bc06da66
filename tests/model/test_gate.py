"""The gate over the real models (MiniLM fp32, the offline contradiction model), a real store."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine.errors import Conflict, InvalidInput, NotFound
from engine.gate.gate import Gate
from engine.types import Fact

pytestmark = pytest.mark.model

NS = "acme/customer-1"
SEED = [
    "The customer's office is in Denver.",
    "The customer prefers email over phone calls.",
    "The customer's account manager is Priya Raman.",
]


@pytest.fixture
def gate(make_gate: Callable[..., Gate]) -> Gate:
    g = make_gate()
    g.ingest([Fact(NS, t) for t in SEED])
    return g


def active_texts(g: Gate, ns: str = NS) -> set[str]:
    rowids, _ = g.store.iter_active_embeddings(ns)
    return {r.text for r in g.store.texts_for_rowids(ns, [int(x) for x in rowids]).values()}


def test_update_replaces_the_stale_memory_and_keeps_a_pointer(gate: Gate) -> None:
    d = gate.triage(
        [Fact(NS, "The customer's office is in Chicago.")], "strict", apply=True
    ).decisions[0]
    assert d.action == "replace"
    old = gate.get(NS, d.target_id or "")
    new = gate.get(NS, d.memory_id or "")
    assert old is not None and new is not None
    assert old.text == SEED[0] and old.status == "superseded" and old.superseded_by == new.id
    assert new.supersedes == old.id and new.status == "active"
    assert new.scores["contradiction"] > 0.95
    assert "The customer's office is in Chicago." in active_texts(gate)
    assert SEED[0] not in active_texts(gate)
    # the index follows the store: recall finds the new memory, not the old one
    hits = gate.recall(NS, "Where is the customer's office?", k=3)
    assert [m.text for m, _ in hits][0] == "The customer's office is in Chicago."
    assert all(m.status == "active" for m, _ in hits)


def test_unrelated_fact_is_added(gate: Gate) -> None:
    d = gate.triage([Fact(NS, "The customer is learning to play the cello.")], "strict").decisions[
        0
    ]
    assert d.action == "add" and d.target_id is None
    assert all(c.passed is False for c in d.candidates)


def test_dry_run_writes_nothing(gate: Gate) -> None:
    before = gate.store.events(NS)
    d = gate.triage([Fact(NS, "The customer's office is in Chicago.")], "strict").decisions[0]
    assert d.action == "replace" and d.memory_id is not None
    assert gate.store.events(NS) == before
    assert SEED[0] in active_texts(gate)


def test_restatement_is_skipped_as_a_duplicate(gate: Gate) -> None:
    d = gate.triage(
        [Fact(NS, "The customer's office is in Denver.")], "strict", apply=True
    ).decisions[0]
    assert d.action == "skip"
    assert gate.get(NS, d.target_id or "") is not None
    assert len(active_texts(gate)) == len(SEED)


def test_sibling_is_never_replaced(make_gate: Callable[..., Gate]) -> None:
    g = make_gate()
    g.ingest([Fact("u/trip", "Outbound flight: LH 400 on 2 May, seat 14A.")])
    d = g.triage(
        [Fact("u/trip", "Return flight: LH 401 on 16 May, seat 22C.")], "strict"
    ).decisions[0]
    assert d.action != "replace"


def test_episodic_is_appended_and_never_a_candidate(gate: Gate) -> None:
    ep = Fact(NS, "The customer called about the office move.", kind="episodic")
    d1 = gate.triage([ep], "strict", apply=True).decisions[0]
    assert (d1.action, d1.rule) == ("add", "episodic")
    d2 = gate.triage(
        [Fact(NS, "The customer did not call about the office move.")], "strict"
    ).decisions[0]
    assert d1.memory_id not in {c.memory_id for c in d2.candidates}


def test_keyed_fact_replaces_by_key_without_the_model(make_gate: Callable[..., Gate]) -> None:
    g = make_gate()
    first = g.triage([Fact("t/1", "Plan: Pro", key="plan")], "strict", apply=True).decisions[0]
    same = g.triage([Fact("t/1", "plan:  pro", key="plan")], "strict", apply=True).decisions[0]
    new = g.triage([Fact("t/1", "Plan: Enterprise", key="plan")], "strict", apply=True).decisions[0]
    assert (first.action, same.action, new.action) == ("add", "skip", "replace")
    assert new.target_id == first.memory_id and new.rule == "keyed"
    assert [m.text for m in g.history("t/1", new.memory_id or "")] == [
        "Plan: Pro",
        "Plan: Enterprise",
    ]


def test_in_batch_updates_chain_in_order(make_gate: Callable[..., Gate]) -> None:
    g = make_gate()
    g.ingest([Fact("t/2", "Timezone: Europe/Berlin", key="timezone")])
    batch = [
        Fact("t/2", "Timezone: America/Chicago", key="timezone"),
        Fact("t/2", "Timezone: Asia/Tokyo", key="timezone"),
    ]
    a, b = g.triage(batch, "strict", apply=True).decisions
    assert a.action == b.action == "replace"
    assert b.target_id == a.memory_id
    chain = g.history("t/2", b.memory_id or "")
    assert [m.text for m in chain] == [
        "Timezone: Europe/Berlin",
        "Timezone: America/Chicago",
        "Timezone: Asia/Tokyo",
    ]
    assert [m.status for m in chain] == ["superseded", "superseded", "active"]


def test_in_batch_free_text_sees_earlier_facts(make_gate: Callable[..., Gate]) -> None:
    g = make_gate()
    batch = [
        Fact("t/3", "The customer's office is in Denver."),
        Fact("t/3", "The customer's office is in Denver."),
    ]
    a, b = g.triage(batch, "strict", apply=True).decisions
    assert (a.action, b.action) == ("add", "skip")
    assert b.target_id == a.memory_id


def test_undo_restores_the_superseded_memory(gate: Gate) -> None:
    d = gate.triage(
        [Fact(NS, "The customer's office is in Chicago.")], "strict", apply=True
    ).decisions[0]
    restored, undone = gate.undo(NS, d.memory_id or "")
    assert (
        restored.text == SEED[0] and restored.status == "active" and restored.superseded_by is None
    )
    assert undone.status == "undone"
    assert SEED[0] in active_texts(gate)
    assert "The customer's office is in Chicago." not in active_texts(gate)
    assert [e.type for e in gate.store.events(NS)][-1] == "undo"
    with pytest.raises(Conflict):
        gate.undo(NS, d.memory_id or "")
    plain = gate.triage(
        [Fact(NS, "The customer is learning to play the cello.")], "strict", apply=True
    )
    with pytest.raises(Conflict):
        gate.undo(NS, plain.decisions[0].memory_id or "")


def test_idempotent_retry_returns_the_first_result(gate: Gate) -> None:
    fact = Fact(NS, "The customer's office is in Chicago.", idempotency_key="req-1")
    first = gate.triage([fact], "strict", apply=True).decisions[0]
    events = len(gate.store.events(NS))
    again = gate.triage([fact], "strict", apply=True).decisions[0]
    assert again.replayed and (again.action, again.memory_id) == (first.action, first.memory_id)
    assert len(gate.store.events(NS)) == events


def test_a_replay_in_a_batch_of_new_facts_takes_no_part_in_its_chains(
    make_gate: Callable[..., Gate],
) -> None:
    # A Write retried after a lost answer can share a gate batch with new facts (the server
    # merges concurrent requests). The replay must answer its recorded result and never be
    # decided afresh: here it would have replaced "Team" under a new id that its replayed
    # commit never stores, and "Enterprise" would then target that id (Conflict).
    g = make_gate()
    ns = "t/replay"
    pro = Fact(ns, "Plan: Pro", key="plan", idempotency_key="req-1")
    first = g.triage([pro], "strict", apply=True).decisions[0]
    team = g.triage([Fact(ns, "Plan: Team", key="plan")], "strict", apply=True).decisions[0]
    assert (first.action, team.action) == ("add", "replace")

    dry = g.triage([pro], "strict").decisions[0]
    assert dry.replayed and (dry.action, dry.memory_id) == ("add", first.memory_id)

    events = len(g.store.events(ns))
    a, b = g.triage([pro, Fact(ns, "Plan: Enterprise", key="plan")], "strict", apply=True).decisions
    assert a.replayed and (a.action, a.memory_id, a.rule) == ("add", first.memory_id, "replayed")
    assert not b.replayed and (b.action, b.target_id) == ("replace", team.memory_id)
    chain = g.history(ns, b.memory_id or "")
    assert [m.text for m in chain] == ["Plan: Pro", "Plan: Team", "Plan: Enterprise"]
    assert [m.status for m in chain] == ["superseded", "superseded", "active"]
    assert len(g.store.events(ns)) == events + 1  # the replay logged nothing


def test_a_key_repeated_within_a_batch_replays_its_first_fact(
    make_gate: Callable[..., Gate],
) -> None:
    g = make_gate()
    ns = "t/replay-batch"
    batch = [
        Fact(ns, "Plan: Basic", key="plan", idempotency_key="req-7"),
        Fact(ns, "Plan: Gold", key="plan", idempotency_key="req-7"),  # a client bug: same key
        Fact(ns, "Plan: Platinum", key="plan"),
    ]
    a, b, c = g.triage(batch, "strict", apply=True).decisions
    assert (a.action, a.replayed) == ("add", False)
    assert b.replayed and (b.action, b.memory_id) == ("add", a.memory_id)
    assert (c.action, c.target_id) == ("replace", a.memory_id)
    assert [m.text for m in g.history(ns, c.memory_id or "")] == ["Plan: Basic", "Plan: Platinum"]


def test_review_policy_queues_and_resolves(make_gate: Callable[..., Gate]) -> None:
    g = make_gate()
    g.ingest([Fact("t/4", "The customer's office is in Denver.")])
    conflict = Fact("t/4", "The customer's office is in Chicago.")
    d = g.triage([conflict], "review", apply=True, overrides={"review_scope": "all"}).decisions[0]
    assert d.action == "review" and d.review_id
    assert "The customer's office is in Denver." in active_texts(g, "t/4")
    [item] = g.list_review("t/4")
    res = g.resolve_review("t/4", item.id, "accept")
    assert res.memory_id and active_texts(g, "t/4") == {"The customer's office is in Chicago."}
    with pytest.raises(Conflict):
        g.resolve_review("t/4", item.id, "reject")
    d2 = g.triage(
        [Fact("t/4", "The customer's office is in Boston.")],
        "review",
        apply=True,
        overrides={"review_scope": "all"},
    ).decisions[0]
    g.resolve_review("t/4", d2.review_id or "", "keep_both")
    assert "The customer's office is in Boston." in active_texts(g, "t/4")
    d3 = g.triage(
        [Fact("t/4", "The customer's office is in Austin.")],
        "review",
        apply=True,
        overrides={"review_scope": "all"},
    ).decisions[0]
    g.resolve_review("t/4", d3.review_id or "", "reject")
    assert "The customer's office is in Austin." not in active_texts(g, "t/4")


def test_reopen_rebuilds_the_index_from_the_store(make_gate: Callable[..., Gate]) -> None:
    g = make_gate("reopen.db")
    g.ingest([Fact("t/5", t) for t in SEED])
    g.triage([Fact("t/5", "The customer's office is in Chicago.")], "strict", apply=True)
    g.store.close()
    g2 = make_gate("reopen.db")
    hits = g2.recall("t/5", "customer office city", k=5)
    assert {m.text for m, _ in hits} == {"The customer's office is in Chicago.", *SEED[1:]}
    d = g2.triage([Fact("t/5", "The customer's office is in Chicago.")], "strict").decisions[0]
    assert d.action == "skip"


def test_namespaces_are_isolated(gate: Gate) -> None:
    d = gate.triage(
        [Fact("other/tenant", "The customer's office is in Chicago.")], "strict"
    ).decisions[0]
    assert d.action == "add" and d.candidates == ()
    some_id = gate.recall(NS, "office", k=1)[0][0].id
    assert gate.get("other/tenant", some_id) is None
    with pytest.raises(NotFound):
        gate.forget("other/tenant", some_id)


def test_forget_erases_and_leaves_the_index(gate: Gate) -> None:
    mem = gate.recall(NS, "account manager", k=1)[0][0]
    gate.forget(NS, mem.id)
    forgotten = gate.get(NS, mem.id)
    assert forgotten is not None and forgotten.status == "forgotten" and forgotten.text == ""
    assert mem.id not in {m.id for m, _ in gate.recall(NS, "account manager", k=5)}


@pytest.mark.parametrize(
    "fact",
    [
        Fact(NS, ""),
        Fact(NS, "   "),
        Fact(NS, "x" * 9000),
        Fact(NS, "ok", kind="opinion"),  # type: ignore[arg-type]
        Fact("", "ok"),
        Fact("bad namespace!", "ok"),
        Fact(NS, "nul\x00byte"),
    ],
)
def test_bad_input_is_refused_before_any_work(gate: Gate, fact: Fact) -> None:
    before = gate.store.events(NS)
    with pytest.raises(InvalidInput):
        gate.triage(
            [Fact(NS, "The customer is learning to play the cello."), fact], "strict", apply=True
        )
    assert gate.store.events(NS) == before  # the valid fact in the batch was not written either


def test_overrides_are_validated(gate: Gate) -> None:
    with pytest.raises(InvalidInput):
        gate.triage([Fact(NS, "x y z")], "strict", overrides={"floor": 2.0})
    with pytest.raises(InvalidInput):
        gate.triage([Fact(NS, "x y z")], "lenient")


def test_decisions_report_scores_for_every_candidate(gate: Gate) -> None:
    d = gate.triage([Fact(NS, "The customer's office is in Chicago.")], "strict").decisions[0]
    assert d.candidates and all(-1.0 <= c.similarity <= 1.0 for c in d.candidates)
    scored = [c for c in d.candidates if c.contradiction is not None]
    assert scored and all(0.0 <= (c.contradiction or 0) <= 1.0 for c in scored)
    sims = [c.similarity for c in d.candidates]
    assert sims == sorted(sims, reverse=True)
    assert np.isfinite(sims).all()


def test_review_policy_queues_every_conflict_by_default(make_gate: Callable[..., Gate]) -> None:
    """The seed's review policy: even a confident conflict is queued, nothing replaced."""
    g = make_gate()
    g.ingest([Fact("t/rv", "The customer's office is in Denver.")])
    d = g.triage([Fact("t/rv", "The customer's office is in Chicago.")], "review").decisions[0]
    assert d.action == "review" and d.target_id is not None
    confident = g.triage(
        [Fact("t/rv", "The customer's office is in Chicago.")], "review-uncertain"
    ).decisions[0]
    assert confident.action == "replace" and confident.target_id == d.target_id


@pytest.mark.parametrize(
    ("stored", "incoming"),
    [
        (
            "Lorenzo's commute is 12 km each way.",
            "Lorenzo's commute is twelve kilometres each way.",
        ),
        ("Parisa's lease ends on 31/08/2026.", "Parisa's lease runs until August 31, 2026."),
    ],
)
def test_a_value_in_another_format_is_a_duplicate_not_an_update(
    make_gate: Callable[..., Gate], stored: str, incoming: str
) -> None:
    g = make_gate()
    (kept,) = g.ingest([Fact("t/fmt", stored), Fact("t/fmt", "Lorenzo cycles on Sundays.")])[:1]
    d = g.triage([Fact("t/fmt", incoming)], "strict").decisions[0]
    assert (d.action, d.target_id) == ("skip", kept.memory_id)
    assert d.rule in ("restated", "duplicate", "contained")


def test_seed_replaces_the_closest_contradicted_memory_even_a_lookalike(
    make_gate: Callable[..., Gate],
) -> None:
    """The seed's plain rule on the real models: the most similar memory over the bar is
    replaced, another subject's included (strict keeps it); every candidate reports its
    scores, and no mechanism's evidence (frames) is measured."""
    g = make_gate()
    g.ingest([Fact(NS, "As of 2019, Jacopo Guarnieri plays for Groupama-FDJ.")])
    fact = Fact(NS, "As of 2022, Marc Sarreau plays for Groupama-FDJ.")
    strict = g.triage([fact], "strict").decisions[0]
    seed = g.triage([fact], "seed").decisions[0]
    assert strict.action == "add"
    best = seed.candidates[0]
    assert best.contradiction is not None and best.attribute is None
    assert best.similarity >= 0.60 and best.contradiction > 0.95  # 0.69 and 0.99 measured
    assert (seed.action, seed.target_id, seed.rule) == ("replace", best.memory_id, "contradiction")
    assert strict.candidates[0].reason == "unproven:subject_disjoint"


def test_a_later_dated_update_passes_and_an_earlier_one_is_kept_as_history(
    make_gate: Callable[..., Gate],
) -> None:
    g = make_gate()
    g.ingest([Fact(NS, "As of 2011, Anna Berg lives in Chicago.")])
    signals = {"time_order": True}
    later = Fact(NS, "As of 2022, Anna Berg lives in Tokyo.")
    d = g.triage([later], "strict", overrides=signals).decisions[0]
    assert (d.action, d.rule) == ("replace", "later_dated")
    h = make_gate("other.db")
    h.ingest([Fact(NS, "As of 2022, Anna Berg lives in Tokyo.")])
    older = Fact(NS, "As of 2011, Anna Berg lives in Chicago.")
    d = h.triage([older], "strict", overrides=signals).decisions[0]
    # never replacing the later memory: kept beside it. With the attribute keys retired (issue
    # 31) this pair's contradiction (0.85 measured) no longer clears a key's lower bar, so the
    # rule is no_conflict; a passing earlier-dated target is added as older_than_target
    assert d.action == "add" and d.target_id is None
    assert d.rule in ("older_than_target", "no_conflict")
    lookalike = Fact(NS, "As of 2022, Paul Kerr lives in Tokyo.")
    assert g.triage([lookalike], "strict", overrides=signals).decisions[0].action == "add"
