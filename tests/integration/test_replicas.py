"""Several memgate replicas on one PostgreSQL database: real gRPC servers on loopback, each
with its own gate, FAISS index and store connections; the real MiniLM and NLI models (one
set of ONNX sessions shared by the replicas of this process, as they are thread-safe).

The required test: replica A stores "office in Chicago", replica B asked straight after about
"office in Boston" sees the Chicago memory as its candidate (B's index was loaded before A's
write, so only following the event log can show it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()  # the client needs the generated stubs

from engine.client import MemgateClient  # noqa: E402
from engine.gate.gate import Gate  # noqa: E402
from engine.index import IndexManager  # noqa: E402
from engine.server import ServerSettings, ServerThread  # noqa: E402
from engine.store import open_store  # noqa: E402
from engine.types import Fact  # noqa: E402

NS = "acme"


@pytest.fixture
def replicas(models: tuple[Any, Any], pg_dsn: str) -> Iterator[Callable[[int], list[ServerThread]]]:
    """``start(n)``: n servers, each its own gate, index and store pool on ``pg_dsn``."""
    with ExitStack() as stack:

        def start(n: int) -> list[ServerThread]:
            out = []
            for _ in range(n):
                store = stack.enter_context(open_store(pg_dsn))
                index = IndexManager(store.iter_active_embeddings, follow=store)
                gate = Gate(store, index, *models)
                server = ServerThread(gate, ServerSettings(port=0))
                server.start()
                stack.callback(server.stop, 0)
                out.append(server)
            return out

        yield start


def test_a_replica_decides_on_what_another_just_stored(
    replicas: Callable[[int], list[ServerThread]],
) -> None:
    a, b = replicas(2)
    with MemgateClient(a.target) as ca, MemgateClient(b.target) as cb:
        # B loads the namespace's index first (one unrelated memory), so a stale cache would
        # not hold what A stores next.
        cb.write([Fact(NS, "The team likes pizza on Fridays.")])
        assert cb.recall(NS, "pizza", k=1)
        [chicago] = ca.write([Fact(NS, "Our office is in Chicago.")]).decisions
        assert chicago.action == "add" and chicago.memory_id
        [boston] = cb.triage([Fact(NS, "Our office is in Boston.")]).decisions
        assert chicago.memory_id in [c.memory_id for c in boston.candidates], boston
        best = max(boston.candidates, key=lambda c: c.similarity)
        assert best.memory_id == chicago.memory_id
        # And B's write decides against it, on the state A left.
        [written] = cb.write([Fact(NS, "Our office is in Boston.")]).decisions
        assert chicago.memory_id in [c.memory_id for c in written.candidates]
        if written.action == "replace":
            assert written.target_id == chicago.memory_id
            assert ca.get(NS, chicago.memory_id).status == "superseded"
        # A's recall sees B's write too.
        texts = [m.text for m, _ in ca.recall(NS, "Where is the office?", k=3)]
        assert "Our office is in Boston." in texts


def test_forget_on_one_replica_leaves_every_replica_index(
    replicas: Callable[[int], list[ServerThread]],
) -> None:
    a, b = replicas(2)
    with MemgateClient(a.target) as ca, MemgateClient(b.target) as cb:
        [d] = ca.write([Fact(NS, "My locker code is 4512.", kind="episodic")]).decisions
        assert [m.id for m, _ in cb.recall(NS, "locker code", k=1)] == [d.memory_id]
        ca.forget(NS, d.memory_id or "")
        assert cb.recall(NS, "locker code", k=1) == []


def test_a_client_of_several_replicas_retries_keyed_writes_on_another(
    replicas: Callable[[int], list[ServerThread]],
) -> None:
    servers = replicas(3)
    targets = [s.target for s in servers]
    with MemgateClient(targets, timeout=60) as client:
        first = [
            client.write([Fact(NS, f"Episode {i}.", kind="episodic", idempotency_key=f"k{i}")])
            for i in range(6)
        ]
        servers[0].stop(0)  # one replica gone: keyed writes go on on the others
        later = [
            client.write([Fact(NS, f"Episode {i}.", kind="episodic", idempotency_key=f"k{i}")])
            for i in range(6, 12)
        ]
        ids = [t.decisions[0].memory_id for t in first + later]
        assert len(set(ids)) == 12 and all(ids)
        # A retry of an acknowledged write is a replay, whichever replica answers it.
        again = client.write([Fact(NS, "Episode 0.", kind="episodic", idempotency_key="k0")])
        assert again.decisions[0].replayed and again.decisions[0].memory_id == ids[0]
