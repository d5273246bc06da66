"""The gate's steps and its orchestration, over the deterministic fake models.

Real SQLite store and real FAISS index on tmp_path; only the two models are fakes, so every score
below is one the test wrote into the fake NLI's table.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.gate.embed import embed
from engine.gate.gate import Gate
from engine.gate.plan import plan
from engine.gate.policy import SEED, STRICT, Policy
from engine.gate.ports import NLI, Embedder, Index, Store
from engine.gate.probe import Hit, Probe, Ref
from engine.gate.relate import relate
from engine.gate.score import score
from engine.index import IndexManager
from engine.runtime.fake import FakeEmbedder, FakeNLI
from engine.store import SQLiteStore
from engine.types import Fact

NS = "acme/customer-1"
OFFICE = "The customer's office is in Denver."
MOVED = "The customer's office is in Chicago."
CONFLICT = {"contradiction": 0.99, "entailment": 0.0}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "memgate.db")
    yield s
    s.close()


def make_gate(store: SQLiteStore, nli: FakeNLI) -> Gate[SQLiteStore, IndexManager]:
    return Gate(store, IndexManager(store.iter_active_embeddings), FakeEmbedder(), nli)


def test_collaborators_satisfy_the_ports(store: SQLiteStore) -> None:
    assert isinstance(FakeEmbedder(), Embedder)
    assert isinstance(FakeNLI(), NLI)
    assert isinstance(store, Store)
    assert isinstance(IndexManager(store.iter_active_embeddings), Index)


def test_fake_embedder_is_deterministic_and_normalised() -> None:
    a, b = FakeEmbedder().embed([OFFICE, OFFICE]), FakeEmbedder().embed([OFFICE])
    assert np.array_equal(a[0], b[0]) and abs(float(a[0] @ a[1]) - 1.0) < 1e-6
    far = FakeEmbedder().embed(["Quarterly tax filing"])[0]
    assert float(a[0] @ far) < 0.5


def test_fake_nli_label_orders() -> None:
    three = FakeNLI(
        {("p", "h"): {"contradiction": 0.9}}, labels=("entailment", "neutral", "contradiction")
    )
    assert three.entailment_index == 0 and three.contradiction_index == 2
    got = three.score([("p", "h"), ("x", "y")])
    assert np.allclose(got, [[0.0, 0.1, 0.9], [0.0, 1.0, 0.0]])
    two = FakeNLI(labels=("not_contradiction", "contradiction"))
    assert two.entailment_index is None and two.score([("a", "b")]).tolist() == [[1.0, 0.0]]


def test_plan_checks_only_free_text_semantic_facts() -> None:
    probes = plan(
        [
            Fact(NS, "Met the customer today.", kind="episodic"),
            Fact(NS, "Plan: Pro", key="plan"),
            Fact(NS, "Maya moved to Porto."),
        ],
        STRICT,
    )
    assert [p.checked for p in probes] == [False, False, True]


def test_embed_makes_one_call_for_the_facts() -> None:
    probes = plan([Fact(NS, OFFICE), Fact(NS, "Maya moved to Porto.")], STRICT)
    embedder = FakeEmbedder()
    vectors = embed(probes, embedder)
    assert embedder.calls == [[OFFICE, "Maya moved to Porto."]]
    assert vectors.shape == (2, embedder.dim)
    assert all(p.vector is not None for p in probes)


def _probe(text: str, *memories: tuple[str, float]) -> Probe:
    probe = plan([Fact(NS, text)], STRICT)[0]
    probe.hits = [Hit(Ref(f"m{n}", t, None, n), s, n) for n, (t, s) in enumerate(memories)]
    return probe


def test_relate_asks_the_model_about_every_candidate_above_the_floor() -> None:
    probe = _probe(
        "The return flight now leaves at 18:05.",
        ("The return flight now leaves at 18:05 sharp.", 0.95),
        ("The outbound flight leaves at 07:10.", 0.7),
        ("The hotel is near the station.", 0.3),
    )
    relate([probe], STRICT, has_entailment=True)
    near, other, far = probe.hits
    assert near.forward and other.forward and not far.forward
    # the reverse direction: the nearly identical closest only, for its duplicate test
    assert near.reverse and not other.reverse and not far.reverse
    fresh = _probe("x", ("y", 0.95))
    relate([fresh], STRICT, has_entailment=False)  # no entailment label: no duplicate pair
    assert fresh.hits[0].forward and not fresh.hits[0].reverse
    relate([fresh], Policy(duplicates=False), has_entailment=True)
    assert not fresh.hits[0].reverse


def test_score_asks_forward_pairs_and_the_duplicate_pair_only() -> None:
    near = "The customer's office is in Denver, Colorado."
    probe = _probe(OFFICE, (near, 0.95), (MOVED, 0.8))
    relate([probe], STRICT, has_entailment=True)
    nli = FakeNLI(
        {(near, OFFICE): {"entailment": 0.9}, (OFFICE, near): {"entailment": 0.8}},
        labels=("entailment", "neutral", "contradiction"),
    )
    assert score([probe], nli) == 3
    assert sorted(nli.calls) == sorted([(near, OFFICE), (OFFICE, near), (MOVED, OFFICE)])
    dup, other = probe.hits
    assert dup.entailment == pytest.approx(0.9) and dup.reverse_entailment == pytest.approx(0.8)
    assert other.contradiction == 0.0 and other.reverse_entailment is None


def test_conflict_replaces_and_reports_rule_and_candidates(store: SQLiteStore) -> None:
    nli = FakeNLI({(OFFICE, MOVED): CONFLICT, (MOVED, OFFICE): CONFLICT})
    gate = make_gate(store, nli)
    (old,) = gate.ingest([Fact(NS, OFFICE)])
    d = gate.triage([Fact(NS, MOVED)], "strict", apply=True).decisions[0]
    assert (d.action, d.target_id) == ("replace", old.memory_id)
    assert d.rule == "contradiction"
    best = d.candidates[0]
    assert best.memory_id == old.memory_id and best.passed
    assert best.contradiction == pytest.approx(0.99)
    stored = gate.get(NS, old.memory_id or "")
    assert stored is not None and stored.status == "superseded"


def test_no_conflict_adds(store: SQLiteStore) -> None:
    gate = make_gate(store, FakeNLI())
    gate.ingest([Fact(NS, OFFICE)])
    d = gate.triage([Fact(NS, "The customer's office has a rooftop garden.")]).decisions[0]
    assert d.action == "add" and d.target_id is None
    assert all(not c.passed for c in d.candidates)


def test_later_fact_of_a_batch_sees_the_earlier_one(store: SQLiteStore) -> None:
    later = "The customer's office is in Boston."
    nli = FakeNLI({(MOVED, later): CONFLICT, (later, MOVED): CONFLICT})
    gate = make_gate(store, nli)
    first, second = gate.triage([Fact(NS, MOVED), Fact(NS, later)], apply=True).decisions
    assert first.action == "add"
    assert (second.action, second.target_id) == ("replace", first.memory_id)
    assert [m.text for m in gate.history(NS, second.memory_id or "")] == [MOVED, later]


def test_keyed_facts_bypass_the_models(store: SQLiteStore) -> None:
    nli = FakeNLI()
    gate = make_gate(store, nli)
    a, b, c = gate.triage(
        [Fact(NS, "Pro", key="plan"), Fact(NS, "pro ", key="plan"), Fact(NS, "Team", key="plan")],
        apply=True,
    ).decisions
    assert [(d.action, d.rule) for d in (a, b, c)] == [
        ("add", "keyed_new"),
        ("skip", "keyed_same"),
        ("replace", "keyed"),
    ]
    assert c.target_id == a.memory_id and nli.calls == []


def test_replay_returns_the_first_result(store: SQLiteStore) -> None:
    gate = make_gate(store, FakeNLI())
    fact = Fact(NS, OFFICE, idempotency_key="k1")
    first = gate.triage([fact], apply=True).decisions[0]
    again = gate.triage([fact], apply=True).decisions[0]
    assert again.replayed and again.memory_id == first.memory_id
    assert store.count_active(NS) == 1


def test_named_policies_take_the_scoring_models_thresholds() -> None:
    from engine.gate.thresholds import MODEL_THRESHOLDS, ModelThresholds, for_model

    assert for_model(STRICT, None) is STRICT and for_model(STRICT, "unknown-model") is STRICT
    MODEL_THRESHOLDS["test-nli"] = ModelThresholds(0.7, 0.6, 0.4)
    try:
        tuned = for_model(STRICT, "test-nli")
        assert (tuned.contradiction, tuned.dated_contradiction) == (0.7, 0.6)
        assert tuned.floor == STRICT.floor and tuned.name == "strict"
    finally:
        del MODEL_THRESHOLDS["test-nli"]


def test_seed_pipeline_runs_none_of_the_mechanisms(store: SQLiteStore) -> None:
    """Under ``seed`` the pipeline asks the model memory -> fact only (no duplicate
    entailment) and parses nothing: the decision is the closest candidate over the bar, the
    sibling (the other flight leg) included, which strict never replaces."""
    fact = "The return flight now leaves at 18:05."
    sibling = "The outbound flight now leaves at 18:05 today."  # 0.85 similar (fake embedder)
    leg = "The return flight leaves at 17:00."  # 0.67
    probe = plan([Fact(NS, fact)], SEED)[0]
    probe.hits = [
        Hit(Ref(f"m{n}", t, None, n), s, n)
        for n, (t, s) in enumerate(((sibling, 0.95), (leg, 0.67)))
    ]
    relate([probe], SEED, has_entailment=True)
    assert all(h.forward and not h.reverse for h in probe.hits)
    table = {(sibling, fact): CONFLICT, (leg, fact): CONFLICT}
    table |= {(fact, sibling): CONFLICT, (fact, leg): CONFLICT}
    nli = FakeNLI(table)
    assert score([probe], nli) == 2 and nli.calls == [(sibling, fact), (leg, fact)]
    gate = make_gate(store, FakeNLI(table))
    (out,), (mine,) = gate.ingest([Fact(NS, sibling)]), gate.ingest([Fact(NS, leg)])
    seed = gate.triage([Fact(NS, fact)], "seed").decisions[0]
    assert (seed.action, seed.target_id, seed.rule, seed.policy) == (
        "replace",
        out.memory_id,
        "contradiction",
        "seed",
    )
    assert [c.attribute for c in seed.candidates] == [None, None]  # nothing identified
    assert [c.reason for c in seed.candidates] == ["contradiction", "contradiction"]
    # strict never replaces the sibling: the parse reads it as said of another subject (the
    # attribute keys that once told the legs apart are retired, issue 31); the leg it names is
    # then dominated by that closer memory, so the fact is added beside both
    strict = gate.triage([Fact(NS, fact)], "strict").decisions[0]
    assert (strict.action, strict.target_id, strict.rule) == ("add", None, "dominated")
    reasons = {c.memory_id: c.reason for c in strict.candidates}
    assert reasons[out.memory_id] == "mismatch:other_subject"
    assert reasons[mine.memory_id] == f"dominated_by:{out.memory_id}"


def test_triage_checks_plain_facts_once_and_takes_checked_ones_as_they_are(
    store: SQLiteStore,
) -> None:
    """A direct caller's facts and policy name are checked and resolved by the gate; facts the
    edge checked (``ValidFacts``) with the policy it resolved are taken as they are: each path
    checks once, never zero times and never twice."""
    from engine.errors import InvalidInput
    from engine.gate.gate import GateSettings
    from engine.types import ValidFacts

    index = IndexManager(store.iter_active_embeddings)
    gate = Gate(store, index, FakeEmbedder(), FakeNLI(), GateSettings(max_text_chars=20))
    long = Fact(NS, "The office moved to a far bigger place.")
    with pytest.raises(InvalidInput, match="the limit is 20"):
        gate.triage([long])
    with pytest.raises(InvalidInput, match="namespace must be"):
        gate.triage([Fact("no spaces", "x")])
    with pytest.raises(InvalidInput, match="unknown policy override"):
        gate.triage([Fact(NS, "x")], overrides={"nope": 1})
    pol = gate.policy("strict", {"top_k": 3})
    assert pol.top_k == 3 and hash(pol) == hash(gate.policy("strict", {"top_k": 3}))
    # the edge's limit was its own (a server's may differ): the gate does not check again
    (d,) = gate.triage(ValidFacts([long]), pol).decisions
    assert d.action == "add" and d.policy == "strict"
