"""As-of and latest-only reads and expiry over gRPC: an in-process server on 127.0.0.1, port 0,
over a real gate (real models, SQLite on tmp_path, an injected clock), called through
``engine.client``, raw stubs and the CLI client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402

from engine.cli import main as cli_main  # noqa: E402
from engine.client import MemgateClient  # noqa: E402
from engine.errors import InvalidInput, NotFound  # noqa: E402
from engine.gate.gate import Gate  # noqa: E402
from engine.index import IndexManager  # noqa: E402
from engine.server import ServerSettings, ServerThread  # noqa: E402
from engine.server.proto import pb, pb_grpc  # noqa: E402
from engine.store import SQLiteStore, open_store  # noqa: E402
from engine.types import Fact  # noqa: E402

NS = "acme/u1"
WHERE = "Where does the user live?"


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat().replace("+00:00", "Z")


@pytest.fixture(params=["sqlite", "postgres"])
def served(
    request: pytest.FixtureRequest, models: tuple[Any, Any], tmp_path: Path
) -> Iterator[tuple[ServerThread, MemgateClient, Clock]]:
    clock = Clock()
    spec = (
        str(tmp_path / "reads.db")
        if request.param == "sqlite"
        else str(request.getfixturevalue("pg_dsn"))
    )
    store = open_store(spec, clock=clock)
    embedder, nli = models
    gate = Gate(store, IndexManager(store.iter_active_embeddings), embedder, nli)
    st = ServerThread(gate, ServerSettings(port=0, max_queue_delay_s=None))
    st.start()
    client = MemgateClient(st.target)
    try:
        yield st, client, clock
    finally:
        client.close()
        st.stop(grace=0)
        store.close()


def test_denver_then_chicago_over_grpc(
    served: tuple[ServerThread, MemgateClient, Clock], capsys: pytest.CaptureFixture[str]
) -> None:
    st, c, clock = served
    [denver] = c.write(
        [Fact(namespace=NS, text="The user lives in Denver.", key="home city")]
    ).decisions
    clock.t = 2000.0
    [chicago] = c.write(
        [Fact(namespace=NS, text="The user lives in Chicago.", key="home city")]
    ).decisions
    assert chicago.action == "replace"
    mid = rfc3339(1500.0)

    then = c.recall(NS, WHERE, 5, as_of=mid)
    assert [m.text for m, _ in then] == ["The user lives in Denver."]
    assert then[0][0].status == "active" and then.hidden.total == 0 and then.seq is not None
    assert [m.text for m, _ in c.recall(NS, WHERE, 5, as_of=1500.0)] == [
        "The user lives in Denver."
    ]
    now = c.recall(NS, WHERE, 5)
    assert [m.text for m, _ in now] == ["The user lives in Chicago."]
    assert now.hidden.superseded == 1 and now.hidden.total == 1 and now.seq is None
    both = c.recall(NS, WHERE, 5, include_inactive=True)
    assert {m.status for m, _ in both} == {"active", "superseded"}
    old = next(m for m, _ in both if m.status == "superseded")
    assert old.inactive_since == 2000.0

    assert c.get(NS, denver.memory_id, as_of=mid).status == "active"
    assert c.get(NS, denver.memory_id).status == "superseded"
    with pytest.raises(NotFound):
        c.get(NS, chicago.memory_id, as_of=mid)
    assert [m.id for m in c.history(NS, denver.memory_id, as_of=mid)] == [denver.memory_id]
    events = c.events(NS)
    assert [m.text for m, _ in c.recall(NS, WHERE, 5, as_of=events[0].seq)] == [
        "The user lives in Denver."
    ]

    # Raw stubs: the wire fields, and bad as_of values are INVALID_ARGUMENT.
    with grpc.insecure_channel(st.target) as channel:
        stub = pb_grpc.MemgateStub(channel)
        reply = stub.Recall(pb.RecallRequest(namespace=NS, query=WHERE.encode(), k=5))
        assert reply.hidden.superseded == 1 and not reply.hidden.partial
        for request, rpc in (
            (pb.RecallRequest(namespace=NS, query=b"q", as_of="last tuesday"), stub.Recall),
            (pb.MemoryRef(namespace=NS, memory_id=denver.memory_id, as_of="2026-03-01"), stub.Get),
            (pb.MemoryRef(namespace=NS, memory_id=denver.memory_id, as_of="7"), stub.Forget),
        ):
            with pytest.raises(grpc.RpcError) as err:
                rpc(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # The CLI client: hits, then a last line with what was hidden.
    def run(*argv: str) -> list[dict[str, Any]]:
        assert cli_main(["client", *argv, "--target", st.target]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    lines = run("recall", NS, WHERE, "--as-of", mid)
    assert (
        lines[0]["text"] == "The user lives in Denver." and lines[-1]["hidden"]["superseded"] == 0
    )
    lines = run("recall", NS, WHERE)
    assert lines[0]["text"] == "The user lives in Chicago."
    assert lines[-1]["hidden"]["superseded"] == 1
    assert run("get", NS, denver.memory_id, "--as-of", mid)[0]["status"] == "active"


def test_expiry_over_grpc(served: tuple[ServerThread, MemgateClient, Clock]) -> None:
    _, c, clock = served
    [otp] = c.write(
        [Fact(namespace=NS, text="The one-time passcode is 918273.", ttl_s=60)]
    ).decisions
    assert c.get(NS, otp.memory_id).expires_at == 1060.0
    with pytest.raises(InvalidInput):
        c.write([Fact(namespace=NS, text="The door code is 1234.", ttl_s=5, expires_at=9e9)])
    with pytest.raises(InvalidInput):
        c.write(
            [Fact(namespace=NS, text="The door code is 1234.")],
            overrides={"episodic_ttl_s": -1.0},
        )
    clock.t = 1100.0
    gone = c.recall(NS, "What is the one-time passcode?", 3)
    assert list(gone) == [] and gone.hidden.expired == 1
    assert c.get(NS, otp.memory_id).status == "expired"
    assert c.get(NS, otp.memory_id, as_of=rfc3339(1030.0)).status == "active"
    [seat] = c.write(
        [Fact(namespace=NS, text="Seat 14C is on hold.", kind="episodic")],
        overrides={"episodic_ttl_s": 3600.0},
    ).decisions
    assert c.get(NS, seat.memory_id).expires_at == 1100.0 + 3600.0


def test_the_server_sweeps_expired_memories_periodically(
    models: tuple[Any, Any], tmp_path: Path
) -> None:
    import time

    clock = Clock()
    store = SQLiteStore(tmp_path / "sweep.db", clock=clock)
    embedder, nli = models
    gate = Gate(store, IndexManager(store.iter_active_embeddings), embedder, nli)
    st = ServerThread(gate, ServerSettings(port=0, max_queue_delay_s=None, expiry_interval_s=0.05))
    st.start()
    try:
        with MemgateClient(st.target) as c:
            facts = [
                Fact(namespace=NS, text=f"Locker {i} code is {100 + i}.", ttl_s=30)
                for i in range(3)
            ]
            written = c.write(facts).decisions
            assert "expire" not in {e.type for e in c.events(NS)}
            clock.t = 2000.0  # all three are due; the next sweep round writes their events
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                expired = [e for e in c.events(NS) if e.type == "expire"]
                if len(expired) == 3:
                    break
                time.sleep(0.05)
            assert sorted(e.memory_id for e in expired) == sorted(d.memory_id for d in written)
            assert {c.get(NS, d.memory_id).status for d in written} == {"expired"}
    finally:
        st.stop(grace=0)
        store.close()
