"""GatedStore against a bare InMemoryStore: the same operation sequences, the same answers.

The engine is a pass-through (every put stored, a put over a key replaces what the key held),
so this tests the wrapper's plumbing: every get, search (filter, limit, offset),
list_namespaces (prefix, suffix, max_depth, limit, offset), put, delete and mixed batch must
answer exactly as LangGraph's own store does. Timestamps are left out of the comparison (the
two stores write at different instants)."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from _passthrough import PassThroughEngine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.store.base import BaseStore, GetOp, Item, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore
from langgraph.store.sqlite import SqliteStore

from engine.adapters.langgraph import GatedStore

LABELS = st.sampled_from(["users", "alice", "bob smith", "é/ü", "team-x", "@home"])
NAMESPACES = st.lists(LABELS, min_size=1, max_size=3).map(tuple)
KEYS = st.sampled_from(["k1", "k2", "k 3", "ключ"])
VALUES = st.fixed_dictionaries(
    {
        "content": st.builds(str.__add__, st.sampled_from("abcé"), st.text("ab c/é.", max_size=8)),
        "n": st.integers(0, 5),
        "tag": st.sampled_from(["a", "b", "c"]),
    }
)
FILTERS = st.one_of(
    st.none(),
    st.fixed_dictionaries({"tag": st.sampled_from(["a", "b", "z"])}),
    st.fixed_dictionaries({"n": st.fixed_dictionaries({"$gt": st.integers(0, 5)})}),
    st.fixed_dictionaries(
        {
            "n": st.fixed_dictionaries({"$lte": st.integers(0, 5)}),
            "tag": st.sampled_from(["a", "b"]),
        }
    ),
)
PREFIXES = st.lists(LABELS, max_size=2).map(tuple)
SOME_LABELS = st.lists(LABELS, min_size=1, max_size=2).map(tuple)

OPS = st.one_of(
    st.tuples(st.just("put"), NAMESPACES, KEYS, VALUES),
    st.tuples(st.just("delete"), NAMESPACES, KEYS),
    st.tuples(st.just("get"), NAMESPACES, KEYS),
    st.tuples(
        st.just("search"),
        PREFIXES,
        FILTERS,
        st.integers(1, 6),
        st.integers(0, 4),
        st.one_of(st.none(), st.sampled_from(["a", "b c", "é"])),
    ),
    st.tuples(
        st.just("list"),
        st.one_of(st.none(), SOME_LABELS),
        st.one_of(st.none(), SOME_LABELS),
        st.one_of(st.none(), st.integers(1, 3)),
        st.integers(1, 6),
        st.integers(0, 3),
    ),
    st.tuples(st.just("batch"), NAMESPACES, KEYS, VALUES, KEYS),
)


def _embed(texts: list[str]) -> list[list[float]]:
    """A fixed, pure embedding (letter counts): the plumbing test needs no model."""
    return [[1.0 + text.count(ch) for ch in "abc é/."] + [float(len(text))] for text in texts]


def _stores(kind: str = "memory") -> tuple[BaseStore, GatedStore]:
    """A bare store and a gated one of the same kind. The in-memory pair is semantic, indexed
    on ``content`` (with the default ``$`` the inner store would embed the ``_memgate_id`` the
    gated items carry: see engine/adapters/langgraph.py)."""

    def make() -> BaseStore:
        if kind == "sqlite":
            conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            store = SqliteStore(conn)
            store.setup()
            return store
        return InMemoryStore(index={"dims": 8, "embed": _embed, "fields": ["content"]})

    return make(), GatedStore(make(), PassThroughEngine())


def _plain(result: Any) -> Any:
    if isinstance(result, Item):
        return (result.namespace, result.key, result.value, getattr(result, "score", None))
    if isinstance(result, list):
        return [_plain(r) for r in result]
    return result


def _do(store: Any, op: tuple[Any, ...]) -> Any:
    """The answer, or the error class: both stores must fail alike where LangGraph does."""
    try:
        return _call(store, op)
    except Exception as exc:
        return ("error", type(exc).__name__)


def _call(store: Any, op: tuple[Any, ...]) -> Any:
    kind = op[0]
    if kind == "put":
        return store.put(op[1], op[2], op[3])
    if kind == "delete":
        return store.delete(op[1], op[2])
    if kind == "get":
        return store.get(op[1], op[2])
    if kind == "search":
        return store.search(op[1], filter=op[2], limit=op[3], offset=op[4], query=op[5])
    if kind == "list":
        return store.list_namespaces(
            prefix=op[1], suffix=op[2], max_depth=op[3], limit=op[4], offset=op[5]
        )
    # One batch mixing reads with puts: reads see the state before the batch's puts.
    _, ns, key, value, other = op
    return store.batch(
        [
            GetOp(ns, key),
            PutOp(ns, key, value),
            SearchOp(ns[:1]),
            PutOp(ns, other, value),
            GetOp(ns, other),
            PutOp(ns, key, {**value, "n": 9}),
        ]
    )


def _everything(store: Any) -> Any:
    return _plain(store.search((), limit=10_000))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=25))
def test_same_answers_as_in_memory_store(ops: list[tuple[Any, ...]]) -> None:
    bare, gated = _stores()
    divergences = []
    for i, op in enumerate(ops):
        want, got = _plain(_do(bare, op)), _plain(_do(gated, op))
        if want != got:
            divergences.append((i, op, want, got))
    assert divergences == []
    assert _everything(gated) == _everything(bare)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS.filter(lambda op: op[0] != "batch"), min_size=1, max_size=20))
def test_same_answers_as_sqlite_store(ops: list[tuple[Any, ...]]) -> None:
    """LangGraph's SqliteStore. Its searches here take no query (no vector index) and its SQL
    has no ORDER BY without one, so their order (and so a page's content) is unspecified:
    searches read whole results, compared as sets (mixed batches: the in-memory test)."""
    bare, gated = _stores("sqlite")
    ops = [(op[0], op[1], op[2], 10_000, 0, None) if op[0] == "search" else op for op in ops]
    divergences = []
    for i, op in enumerate(ops):
        want, got = _plain(_do(bare, op)), _plain(_do(gated, op))
        if op[0] == "search":
            want, got = sorted(map(repr, want)), sorted(map(repr, got))
        if want != got:
            divergences.append((i, op, want, got))
    assert divergences == []
    assert sorted(map(repr, _everything(gated))) == sorted(map(repr, _everything(bare)))


@settings(max_examples=40, deadline=None)
@given(st.lists(OPS.filter(lambda op: op[0] != "batch"), min_size=1, max_size=15))
def test_async_path_agrees_with_the_sync_store(ops: list[tuple[Any, ...]]) -> None:
    bare, gated = _stores()

    async def run() -> list[Any]:
        out = []
        for op in ops:
            kind = op[0]
            if kind == "put":
                out.append(await gated.aput(op[1], op[2], op[3]))
            elif kind == "delete":
                out.append(await gated.adelete(op[1], op[2]))
            elif kind == "get":
                out.append(await gated.aget(op[1], op[2]))
            elif kind == "search":
                out.append(
                    await gated.asearch(op[1], filter=op[2], limit=op[3], offset=op[4], query=op[5])
                )
            else:
                names = ("prefix", "suffix", "max_depth", "limit", "offset")
                kwargs = dict(zip(names, op[1:], strict=True))
                out.append(await gated.alist_namespaces(**kwargs))
        return out

    got = [_plain(r) for r in asyncio.run(run())]
    want = [_plain(_do(bare, op)) for op in ops]
    assert got == want
    assert _everything(gated) == _everything(bare)


def test_reads_never_reach_the_engine() -> None:
    engine = PassThroughEngine()
    gated = GatedStore(InMemoryStore(), engine)
    gated.put(("a",), "k", {"content": "x"})
    assert engine.writes == 1
    gated.get(("a",), "k")
    gated.search(("a",), filter={"content": "x"})
    gated.list_namespaces()
    assert engine.writes == 1
    # The memory id is kept in the inner item and stripped from what callers read.
    assert "_memgate_id" in gated.inner.get(("a",), "k").value
    assert gated.get(("a",), "k").value == {"content": "x"}
