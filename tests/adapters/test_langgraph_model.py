"""GatedStore on the real models: a compiled StateGraph and LangMem's memory tool.

The examples are ones today's gate decides as the adapter requires (engine/gate/ is being
rewritten in parallel; if a rewrite decides them differently, these tests say so)."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langmem import create_manage_memory_tool, create_memory_store_manager

from engine.adapters import LocalEngine
from engine.adapters.langgraph import GatedStore, GateStoreSettings, PutDecision

pytestmark = pytest.mark.model

NS = ("memories", "alice")


class State(TypedDict):
    fact: str
    key: str


def _remember(state: State, *, store: BaseStore) -> dict[str, Any]:
    store.put(NS, state["key"], {"content": state["fact"]})
    return {}


def test_state_graph_denver_then_austin(real_engine: LocalEngine) -> None:
    seen: list[PutDecision] = []
    store = GatedStore(InMemoryStore(), real_engine, on_decision=seen.append)
    builder = StateGraph(State)
    builder.add_node("remember", _remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    graph = builder.compile(store=store)

    graph.invoke({"fact": "Alice lives in Denver.", "key": "home-1"})
    graph.invoke({"fact": "Alice moved to Austin.", "key": "home-2"})

    assert [d.action for d in seen] == ["add", "replace"]
    found = store.search(NS)
    assert [it.value["content"] for it in found] == ["Alice moved to Austin."]
    assert store.get(NS, "home-1") is None
    assert seen[1].removed_key == "home-1" and seen[1].target_id == seen[0].memory_id

    chain = store.history(NS, "home-2")
    assert [(m.text, m.status) for m in chain] == [
        ("Alice lives in Denver.", "superseded"),
        ("Alice moved to Austin.", "active"),
    ]

    restored = store.undo(NS, "home-2")
    assert (restored.restored_key, restored.removed_key) == ("home-1", "home-2")
    assert [it.value["content"] for it in store.search(NS)] == ["Alice lives in Denver."]
    assert store.get(NS, "home-2") is None
    assert real_engine.get(store.memgate_namespace(NS), seen[0].memory_id).status == "active"


def _tool_call(tool: Any, **args: Any) -> str:
    return str(tool.invoke(args))


def test_langmem_tool_create_update_and_refused_sibling_overwrite(
    real_engine: LocalEngine,
) -> None:
    store = GatedStore(InMemoryStore(), real_engine)
    tool = create_manage_memory_tool(namespace=NS, store=store)

    out = _tool_call(tool, content="The outbound flight is on Monday.", action="create")
    outbound = out.rsplit(" ", 1)[1]
    assert store.decisions[0].action == "add"

    # A real change of the same memory: replaced in place.
    _tool_call(tool, content="The outbound flight is on Tuesday.", action="update", id=outbound)
    d = store.decisions[0]
    assert (d.action, d.stored_key, d.refused_overwrite) == ("replace", outbound, False)
    assert store.get(NS, outbound).value == {"content": "The outbound flight is on Tuesday."}

    # An "update" of the outbound memory with a sibling fact: the outbound flight stays.
    _tool_call(tool, content="The return flight is on Friday.", action="update", id=outbound)
    d = store.decisions[0]
    assert d.action == "add" and d.refused_overwrite
    assert d.stored_key is not None and d.stored_key != outbound
    assert store.get(NS, outbound).value == {"content": "The outbound flight is on Tuesday."}
    assert store.get(NS, d.stored_key).value == {"content": "The return flight is on Friday."}
    assert sorted(it.value["content"] for it in store.search(NS)) == [
        "The outbound flight is on Tuesday.",
        "The return flight is on Friday.",
    ]

    # Delete through the tool is a forget in memgate too.
    forgotten = store.memory_id(NS, outbound)
    _tool_call(tool, action="delete", id=outbound)
    assert store.get(NS, outbound) is None
    assert real_engine.get(store.memgate_namespace(NS), forgotten).status == "forgotten"


class _ScriptedChatModel(GenericFakeChatModel):
    """A chat model that answers from a script of messages (no LLM); tools are accepted and
    ignored, as the scripted answers already hold the tool calls."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def _remember_call(text: str) -> AIMessage:
    call = {"name": "Memory", "args": {"content": text}, "id": f"call-{abs(hash(text))}"}
    return AIMessage(content="", tool_calls=[call])


def test_langmem_store_manager_writes_through_the_gate(real_engine: LocalEngine) -> None:
    store = GatedStore(InMemoryStore(), real_engine)
    model = _ScriptedChatModel(
        messages=iter(
            [
                _remember_call("Alice lives in Denver."),
                _remember_call("Alice moved to Austin."),
            ]
        )
    )
    manager = create_memory_store_manager(model, namespace=NS, store=store)
    manager.invoke({"messages": [{"role": "user", "content": "I live in Denver."}]})
    assert [d.action for d in store.decisions] == ["add"]
    manager.invoke({"messages": [{"role": "user", "content": "I moved to Austin."}]})
    [d] = store.decisions
    assert d.action == "replace" and d.decision is not None
    assert d.decision.fact.text == "Alice moved to Austin."
    assert [it.value["content"]["content"] for it in store.search(NS)] == ["Alice moved to Austin."]


def test_review_policy_queues_then_accept_writes(real_engine: LocalEngine) -> None:
    settings = GateStoreSettings(policy="review", overrides=(("review_scope", "all"),))
    store = GatedStore(InMemoryStore(), real_engine, settings=settings)
    store.put(NS, "home", {"content": "Alice lives in Denver."})
    store.put(NS, "move", {"content": "Alice moved to Austin."})
    d = store.decisions[0]
    assert d.action == "review" and d.stored_key is None
    assert store.get(NS, "move") is None
    [item] = store.list_review(NS)
    out = store.resolve_review(NS, item.id, "accept")
    assert out.action == "replace" and out.removed_key == "home"
    assert [it.value["content"] for it in store.search(NS)] == ["Alice moved to Austin."]


def test_over_a_memgate_server(make_gate: Any) -> None:
    """The same store over ``memgate serve`` (in-process gRPC server on 127.0.0.1, port 0)."""
    from engine.server.codegen import ensure

    ensure()
    from engine.client import MemgateClient
    from engine.server import ServerSettings, ServerThread

    server = ServerThread(make_gate(), ServerSettings(port=0, max_queue_delay_s=None))
    server.start()
    try:
        with MemgateClient(server.target) as client:
            store = GatedStore(InMemoryStore(), client)
            store.put(NS, "home-1", {"content": "Alice lives in Denver."})
            store.put(NS, "home-2", {"content": "Alice moved to Austin."})
            assert store.decisions[0].action == "replace"
            assert [it.key for it in store.search(NS)] == ["home-2"]
            chain = store.history(NS, "home-2")
            assert [m.status for m in chain] == ["superseded", "active"]
            assert store.undo(NS, "home-2").restored_key == "home-1"
            store.delete(NS, "home-1")
            assert store.search(NS) == []
            assert client.get(store.memgate_namespace(NS), chain[0].id).status == "forgotten"
    finally:
        server.stop(grace=0)
