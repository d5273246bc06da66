"""GatedMemory's pure parts: which texts an ``add`` gates, the namespace of a scope, and the
checks made before anything is written (no models, no mem0 object)."""

from __future__ import annotations

import pytest
from _passthrough import PassThroughEngine

from engine.errors import InvalidInput

pytest.importorskip("mem0")
from engine.adapters.mem0 import GatedMemory, GatedMemorySettings, _texts  # noqa: E402


def test_texts_of_strings_messages_and_lists() -> None:
    assert _texts("a") == ["a"]
    assert _texts({"role": "user", "content": "b"}) == ["b"]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "c"},
        "d",
        {"role": "assistant", "content": "e"},
    ]
    assert _texts(messages) == ["c", "d", "e"]
    with pytest.raises(InvalidInput, match="message 0"):
        _texts([{"role": "user", "content": [{"type": "image_url"}]}])


class _NotMem0:
    add = update = delete = get = search = None


def test_scope_namespace_and_checks() -> None:
    with pytest.raises(InvalidInput, match="mem0.Memory"):
        GatedMemory(_NotMem0(), PassThroughEngine())
    with pytest.raises(InvalidInput, match="unknown policy"):
        GatedMemorySettings(policy="lenient")


def test_namespace_of_a_scope() -> None:
    class Shape:
        def add(self) -> None: ...
        def update(self) -> None: ...
        def delete(self) -> None: ...
        def get(self) -> None: ...
        def get_all(self) -> None: ...
        def search(self) -> None: ...

    memory = GatedMemory(Shape(), PassThroughEngine())
    assert memory.namespace(user_id="alice smith") == "mem0/user:alice.20smith"
    assert memory.namespace(user_id="a", run_id="r1") == "mem0/user:a/run:r1"
    with pytest.raises(InvalidInput, match="one of user_id"):
        memory.namespace()
    with pytest.raises(InvalidInput, match="infer=True"):
        memory.add("x", user_id="a", infer=True)
