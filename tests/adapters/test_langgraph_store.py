"""GatedStore's own rules, on scripted engines (no models): what each decision does to the
inner store, text extraction, episodic and ungated items, errors, callbacks, failures."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from typing import Any

import pytest
from _passthrough import PassThroughEngine, ScriptedEngine
from hypothesis import given
from hypothesis import strategies as st
from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore

from engine.adapters._common import decode_labels, encode_labels
from engine.adapters.langgraph import GatedStore, GateStoreSettings, PutDecision
from engine.errors import InvalidInput

NS = ("memories", "alice")
MEMGATE_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,127}$")  # engine/gate/gate.py


@given(
    st.lists(
        st.text(min_size=1, max_size=8).filter(lambda s: "." not in s), min_size=1, max_size=4
    ).map(tuple)
)
def test_namespace_mapping_is_reversible_and_valid(labels: tuple[str, ...]) -> None:
    try:
        name = encode_labels("lg", labels)
    except InvalidInput as exc:
        assert "allows 128" in str(exc)
        return
    assert MEMGATE_NAMESPACE.match(name)
    assert decode_labels("lg", name) == labels


def test_namespace_mapping_examples_and_errors() -> None:
    assert encode_labels("lg", ("memories", "alice smith")) == "lg/memories/alice.20smith"
    assert encode_labels("lg", ("a/b", "é")) == "lg/a.2Fb/.C3.A9"
    with pytest.raises(InvalidInput, match="prefix"):
        encode_labels("-bad", ("x",))
    with pytest.raises(InvalidInput, match="128"):
        encode_labels("lg", ("x" * 130,))
    with pytest.raises(InvalidInput, match="not made under prefix"):
        decode_labels("lg", "other/x")


def _store(**settings: Any) -> tuple[GatedStore, ScriptedEngine]:
    engine = ScriptedEngine()
    return GatedStore(InMemoryStore(), engine, settings=GateStoreSettings(**settings)), engine


def _contents(store: BaseStore) -> dict[str, Any]:
    return {it.key: it.value for it in store.search(NS, limit=100)}


def test_each_decision_on_the_inner_store() -> None:
    store, engine = _store()
    engine.script = [("add", None), ("add", None)]
    store.put(NS, "home", {"content": "lives in Denver"})
    store.put(NS, "pet", {"content": "has a cat"})
    home_id = store.memory_id(NS, "home")
    assert home_id is not None and store.key_of(NS, home_id) == "home"

    engine.script = [("skip", home_id)]
    store.put(NS, "again", {"content": "lives in Denver"})
    assert store.decisions[0].stored_key is None and "again" not in _contents(store)

    engine.script = [("review", home_id)]
    store.put(NS, "maybe", {"content": "lives in Boulder"})
    assert store.decisions[0].action == "review" and "maybe" not in _contents(store)

    # A replace under a new key removes the superseded item, found through its memory id.
    engine.script = [("replace", home_id)]
    store.put(NS, "move", {"content": "moved to Austin"})
    d = store.decisions[0]
    assert (d.stored_key, d.removed_key, d.refused_overwrite) == ("move", "home", False)
    assert _contents(store) == {
        "pet": {"content": "has a cat"},
        "move": {"content": "moved to Austin"},
    }

    # An add over a key holding another memory leaves that memory where it is.
    engine.script = [("add", None)]
    store.put(NS, "pet", {"content": "works at Acme"})
    d = store.decisions[0]
    assert d.refused_overwrite and d.stored_key is not None and d.stored_key.startswith("pet~")
    assert _contents(store)["pet"] == {"content": "has a cat"}
    assert _contents(store)[d.stored_key] == {"content": "works at Acme"}

    # A replace of another memory through a taken key: written beside, the target removed.
    move_id = store.memory_id(NS, "move")
    engine.script = [("replace", move_id)]
    store.put(NS, "pet", {"content": "moved to Dallas"})
    d = store.decisions[0]
    assert d.refused_overwrite and d.removed_key == "move" and d.stored_key != "pet"
    assert "move" not in _contents(store) and _contents(store)["pet"] == {"content": "has a cat"}


def test_forget_deletes_in_both() -> None:
    store, engine = _store()
    engine.script = [("add", None)]
    store.put(NS, "home", {"content": "lives in Denver"})
    memory_id = store.memory_id(NS, "home")
    store.delete(NS, "home")
    assert store.get(NS, "home") is None
    assert (store.memgate_namespace(NS), memory_id) not in engine.memories
    assert store.decisions[0].action == "forget" and store.decisions[0].memory_id == memory_id


def test_text_fields_structured_content_and_json_fallback() -> None:
    store, engine = _store(text_fields=("summary", "content"))
    engine.script = [("add", None)] * 4
    store.batch(
        [
            PutOp(NS, "a", {"summary": "s", "content": "c"}),
            PutOp(NS, "b", {"content": {"subject": "user", "city": "Austin"}}),
            PutOp(NS, "c", {"city": "Austin", "n": 1}),
            PutOp(NS, "d", {"kind": "Memory", "content": {"content": "LangMem's record"}}),
        ]
    )
    texts = [d.decision.fact.text for d in store.decisions if d.decision]
    assert texts == [
        "s",
        '{"city": "Austin", "subject": "user"}',
        '{"city": "Austin", "n": 1}',
        "LangMem's record",
    ]


@pytest.mark.parametrize("value", [{"content": "  "}, {"content": 3}, {}])
def test_no_usable_text_is_an_error_and_nothing_is_written(value: dict[str, Any]) -> None:
    store, engine = _store()
    engine.script = [("add", None)]
    with pytest.raises(InvalidInput, match="no usable text"):
        store.batch([PutOp(NS, "ok", {"content": "fine"}), PutOp(NS, "bad", value)])
    assert _contents(store) == {} and engine.memories == {}


def test_no_usable_text_stored_ungated_when_configured() -> None:
    store, engine = _store(ungated=True, json_fallback=False)
    store.put(NS, "blob", {"bytes": [1, 2]})
    assert store.decisions[0].rule == "ungated" and _contents(store) == {"blob": {"bytes": [1, 2]}}
    assert engine.memories == {}


def test_episodic_items_are_appended_never_gated() -> None:
    store, engine = _store(episodic_namespaces=(("logs",),))
    store.put(NS, "e1", {"content": "went jogging", "kind": "episodic"})
    store.put(("logs", "alice"), "e2", {"content": "said hello"})
    assert engine.memories == {} and [d.rule for d in store.decisions] == ["episodic"]
    assert store.get(NS, "e1").value["kind"] == "episodic"
    assert store.get(("logs", "alice"), "e2") is not None


def test_on_decision_sees_every_put_and_decisions_are_the_last_batch() -> None:
    seen: list[PutDecision] = []
    store = GatedStore(InMemoryStore(), PassThroughEngine(), on_decision=seen.append)
    store.batch([PutOp(NS, "a", {"content": "x"}), PutOp(NS, "b", {"content": "y"})])
    store.put(NS, "c", {"content": "z"})
    assert [d.key for d in seen] == ["a", "b", "c"] and [d.key for d in store.decisions] == ["c"]


def test_async_put_goes_through_the_gate() -> None:
    engine = PassThroughEngine()
    store = GatedStore(InMemoryStore(), engine)

    async def run() -> Any:
        await store.aput(NS, "a", {"content": "x"})
        return await store.aget(NS, "a")

    assert asyncio.run(run()).value == {"content": "x"} and engine.writes == 1


class _FailingPuts(InMemoryStore):
    """An inner store that refuses every batch with a write (a full disk, a lost server)."""

    def batch(self, ops: Any) -> Any:
        ops = list(ops)
        if any(isinstance(op, PutOp) and op.value is not None for op in ops):
            raise OSError("disk full")
        return super().batch(ops)


def test_inner_failure_takes_back_the_memgate_commit() -> None:
    engine = PassThroughEngine()
    store = GatedStore(_FailingPuts(), engine)
    with pytest.raises(OSError, match="disk full"):
        store.put(NS, "a", {"content": "x"})
    assert engine.writes == 1 and engine.memories == {}


def test_settings_are_checked() -> None:
    with pytest.raises(InvalidInput, match="unknown policy"):
        GateStoreSettings(policy="lenient")
    with pytest.raises(InvalidInput, match="override"):
        GateStoreSettings(overrides=(("nonsense", 1),))
    with pytest.raises(InvalidInput, match="prefix"):
        GateStoreSettings(namespace_prefix="a b")
    with pytest.raises(InvalidInput, match="BaseStore"):
        GatedStore(object(), PassThroughEngine())  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="engine must be"):
        GatedStore(InMemoryStore(), object())


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("engine.adapters.langgraph", "langgraph", "langgraph"),
        ("engine.adapters.mem0", "mem0", "mem0"),
    ],
)
def test_a_missing_extra_names_it(module: str, blocked: str, extra: str) -> None:
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        f"try:\n    import {module}\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert f"pip install 'memgate[{extra}]'" in out.stdout


def test_a_target_memgate_has_no_key_for_is_found_through_the_inner_item() -> None:
    from dataclasses import replace

    store, engine = _store()
    engine.script = [("add", None)]
    store.put(NS, "home", {"content": "lives in Denver"})
    home_id = store.memory_id(NS, "home")
    ns = store.memgate_namespace(NS)
    engine.memories[(ns, home_id)] = replace(engine.memories[(ns, home_id)], metadata={})
    engine.script = [("replace", home_id)]
    store.put(NS, "move", {"content": "moved to Austin"})
    assert store.decisions[0].removed_key == "home" and list(_contents(store)) == ["move"]
