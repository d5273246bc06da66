"""GatedStore honours LangGraph's TTL and answers as-of searches, on the real models and a
real SQLite store with an injected clock (shared by memgate's store and the adapter)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.store.memory import InMemoryStore

from engine.adapters import LocalEngine
from engine.adapters.langgraph import GatedStore
from engine.gate.gate import Gate
from engine.index import IndexManager
from engine.store import SQLiteStore

pytestmark = pytest.mark.model

NS = ("memories", "alice")


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def setup(models: tuple[Any, Any], tmp_path: Path) -> Any:
    clock = Clock()
    store = SQLiteStore(tmp_path / "lg.db", clock=clock)
    embedder, nli = models
    gate = Gate(store, IndexManager(store.iter_active_embeddings), embedder, nli)
    yield gate, clock
    store.close()


def test_put_ttl_expires_in_memgate_and_in_reads(setup: Any) -> None:
    gate, clock = setup
    lg = GatedStore(InMemoryStore(), LocalEngine(gate), clock=clock)
    assert lg.supports_ttl  # enforced here, though InMemoryStore has no TTL of its own
    lg.put(NS, "otp", {"content": "The one-time passcode is 918273."}, ttl=1.0)  # minutes
    [otp] = lg.decisions
    lg.put(NS, "home", {"content": "Alice lives in Denver."})
    memory = gate.get(lg.memgate_namespace(NS), otp.memory_id)
    assert memory.expires_at == 1060.0
    item = lg.get(NS, "otp")
    assert item is not None and item.value == {"content": "The one-time passcode is 918273."}
    clock.t = 1061.0
    assert lg.get(NS, "otp") is None
    assert [it.key for it in lg.search(NS)] == ["home"]
    assert gate.get(lg.memgate_namespace(NS), otp.memory_id).status == "expired"


def test_default_ttl_from_ttl_config(setup: Any) -> None:
    gate, clock = setup
    lg = GatedStore(
        InMemoryStore(), LocalEngine(gate), clock=clock, ttl_config={"default_ttl": 2.0}
    )
    lg.put(NS, "seat", {"content": "Seat 14C is on hold for Alice."})
    assert gate.get(lg.memgate_namespace(NS), lg.decisions[0].memory_id).expires_at == 1120.0
    lg.put(NS, "home", {"content": "Alice lives in Denver."}, ttl=None)  # explicitly never
    assert gate.get(lg.memgate_namespace(NS), lg.decisions[0].memory_id).expires_at is None
    clock.t = 1200.0
    assert lg.get(NS, "seat") is None and lg.get(NS, "home") is not None


def test_search_as_of(setup: Any) -> None:
    gate, clock = setup
    lg = GatedStore(InMemoryStore(), LocalEngine(gate), clock=clock)
    lg.put(NS, "home", {"content": "Alice lives in Denver.", "source": "chat"})
    clock.t = 2000.0
    lg.put(NS, "home", {"content": "Alice lives in Chicago."})
    assert lg.decisions[0].action == "replace"
    assert [it.value["content"] for it in lg.search(NS, query="Where does Alice live?")] == [
        "Alice lives in Chicago."
    ]
    then = lg.search_as_of(NS, "Where does Alice live?", as_of=1500.0)
    assert [(it.key, it.value) for it in then] == [
        ("home", {"content": "Alice lives in Denver.", "source": "chat"})
    ]
    assert then[0].score is not None and then[0].score > 0.3
    now = lg.search_as_of(NS, "Where does Alice live?", as_of="2026-01-01T00:00:00Z")
    assert [it.value["content"] for it in now] == ["Alice lives in Chicago."]
