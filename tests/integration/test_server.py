"""The gRPC service end to end: an in-process grpc.aio server on 127.0.0.1, port 0, over a real
gate (real models, SQLite on tmp_path), called through ``engine.client`` and raw stubs.

Faults are injected with :class:`GateWrapper`, a collaborator handed to the server in place of
the gate (it can hold the model thread, or make triage raise), never by monkeypatching.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()  # the stubs are generated, never checked in: make sure they match protos/

import grpc  # noqa: E402

from engine.cli import main as cli_main  # noqa: E402
from engine.client import MemgateClient  # noqa: E402
from engine.errors import (  # noqa: E402
    Conflict,
    DeadlineExceeded,
    InvalidInput,
    MemgateError,
    NotFound,
    Overloaded,
    PermissionDenied,
    StorageError,
    Unauthenticated,
    Unavailable,
)
from engine.server import ServerSettings, ServerThread  # noqa: E402
from engine.server.metrics import Metrics  # noqa: E402
from engine.server.proto import SERVICE_NAME, pb, pb_grpc  # noqa: E402
from engine.types import Fact  # noqa: E402

TOKENS = {"tok-acme-0123456789abcdef": ["acme/"], "tok-globex-0123456789abcdef": ["globex/"]}
ACME, GLOBEX = TOKENS


class GateWrapper:
    """The real gate with two switches: ``hold`` (clear it to block triage on the model thread)
    and ``fail`` (raise it from triage). Records the texts of every triage call."""

    def __init__(self, gate: Any) -> None:
        self._gate = gate
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail: BaseException | None = None
        self.calls: list[list[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate, name)

    def triage(self, facts: Any, policy: Any = "strict", **kw: Any) -> Any:
        self.calls.append([f.text for f in facts])
        self.entered.set()
        assert self.hold.wait(120), "a test left the model thread held"
        if self.fail is not None:
            raise self.fail
        return self._gate.triage(facts, policy, **kw)


class Harness:
    def __init__(self, make_gate: Callable[..., Any]) -> None:
        self._make_gate = make_gate
        self._servers: list[ServerThread] = []
        self._clients: list[MemgateClient] = []
        self._channels: list[grpc.Channel] = []
        self._wrappers: list[GateWrapper] = []

    def gate(self) -> GateWrapper:
        w = GateWrapper(self._make_gate(f"memgate-{len(self._wrappers)}.db"))
        self._wrappers.append(w)
        return w

    def serve(
        self,
        gate: Any = None,
        *,
        tokens: dict[str, list[str]] | None = None,
        metrics: Metrics | None = None,
        **settings: Any,
    ) -> ServerThread:
        # A fixed admission bound: the queue-delay budget depends on measured speed, which
        # would make these tests depend on the machine (tests/unit/test_batcher.py covers it).
        settings.setdefault("max_queue_delay_s", None)
        st = ServerThread(
            gate if gate is not None else self.gate(),
            ServerSettings(port=0, **settings),
            tokens=tokens,
            metrics=metrics,
        )
        st.start()
        self._servers.append(st)
        return st

    def client(self, st: ServerThread, token: str | None = None, **kw: Any) -> MemgateClient:
        c = MemgateClient(st.target, token=token, **kw)
        self._clients.append(c)
        return c

    def stub(self, st: ServerThread) -> Any:
        channel = grpc.insecure_channel(st.target)
        self._channels.append(channel)
        return pb_grpc.MemgateStub(channel)

    def close(self) -> None:
        for w in self._wrappers:
            w.fail = None
            w.hold.set()
        for c in self._clients:
            c.close()
        for ch in self._channels:
            ch.close()
        for st in self._servers:
            st.stop(grace=0)


@pytest.fixture
def h(make_gate: Callable[..., Any]) -> Iterator[Harness]:
    harness = Harness(make_gate)
    yield harness
    harness.close()


def wait_until(predicate: Callable[[], bool], what: str, tries: int = 3000) -> None:
    """Bounded polling for state another thread changes (never a timing assertion)."""
    for _ in range(tries):
        if predicate():
            return
        threading.Event().wait(0.005)
    raise AssertionError(f"timed out waiting for {what}")


def code_of(fn: Callable[[], Any]) -> tuple[str, str]:
    """Call a raw stub; return (status name, details) of the error it must raise."""
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code().name, info.value.details()


# -- the story ------------------------------------------------------------------------------------
DENVER = "The customer's office is in Denver."
CHICAGO = "The customer's office is in Chicago."
SEED = [
    DENVER,
    "The customer prefers email over phone calls.",
    "The customer's account manager is Priya.",
]


def test_denver_to_chicago_end_to_end(h: Harness) -> None:
    c = h.client(h.serve())
    ns = "demo/acme"
    seeded = c.write([Fact(ns, t) for t in SEED])
    assert [d.action for d in seeded.decisions] == ["add", "add", "add"]
    denver = seeded.decisions[0].memory_id
    assert denver and seeded.request_id

    # Triage is a dry run: it decides the replacement and stores nothing.
    dry = c.triage([Fact(ns, CHICAGO), Fact(ns, "The customer is learning to play the cello.")])
    assert [d.action for d in dry.decisions] == ["replace", "add"]
    assert dry.decisions[0].target_id == denver
    assert all(d.memory_id is None for d in dry.decisions)
    assert c.get(ns, denver).status == "active"

    wrote = c.write([Fact(ns, CHICAGO)])
    d = wrote.decisions[0]
    assert (d.action, d.target_id) == ("replace", denver) and d.memory_id
    chicago = d.memory_id
    assert any(cand.memory_id == denver and cand.passed for cand in d.candidates)
    for phase in ("embed", "search", "nli", "store", "queue", "tokenize", "total"):
        assert wrote.timings[phase] >= 0
    assert wrote.timings["total"] > 0 and wrote.timings["batch_facts"] >= 1

    old = c.get(ns, denver)
    assert old.status == "superseded" and old.superseded_by == chicago
    assert [m.id for m in c.history(ns, chicago)] == [denver, chicago]
    hits = c.recall(ns, "Where is the customer's office?", 3)
    assert hits[0][0].id == chicago and denver not in {m.id for m, _ in hits}

    restored, undone = c.undo(ns, chicago)
    assert (restored.id, restored.status) == (denver, "active")
    assert (undone.id, undone.status) == (chicago, "undone")
    assert c.recall(ns, "Where is the customer's office?", 1)[0][0].id == denver


def test_review_queue_over_grpc(h: Harness) -> None:
    c = h.client(h.serve())
    ns = "demo/review"
    denver = c.write([Fact(ns, DENVER)]).decisions[0].memory_id
    queued = c.write([Fact(ns, CHICAGO)], "review", {"review_scope": "all"}).decisions[0]
    assert queued.action == "review" and queued.review_id and queued.target_id == denver
    assert queued.memory_id is None
    items = c.list_review(ns)
    assert [(i.id, i.fact.text, i.status) for i in items] == [
        (queued.review_id, CHICAGO, "pending")
    ]
    assert c.list_review("demo/other") == []

    resolved = c.resolve_review(ns, queued.review_id, "accept")
    assert resolved.status == "accepted" and resolved.memory_id
    assert c.get(ns, denver).status == "superseded"
    assert c.get(ns, resolved.memory_id).text == CHICAGO
    assert c.list_review(ns) == []
    with pytest.raises(Conflict) as info:
        c.resolve_review(ns, queued.review_id, "reject")
    assert info.value.code == "FAILED_PRECONDITION"  # type: ignore[attr-defined]
    with pytest.raises(NotFound):
        c.resolve_review("demo/other", queued.review_id, "accept")


def test_list_events_is_the_audit_log(h: Harness) -> None:
    """Every decision and every change (add, replace, skip, review, resolve, undo, forget) is
    an event with its rule, scores, target and time, in commit order, paged by seq."""
    gate = h.gate()
    st = h.serve(gate)
    c, stub = h.client(st), h.stub(st)
    ns = "audit/a"
    denver = c.write([Fact(ns, DENVER)]).decisions[0]
    chicago = c.write([Fact(ns, CHICAGO)]).decisions[0]
    assert chicago.action == "replace"
    skip = c.write([Fact(ns, CHICAGO)]).decisions[0]
    assert skip.action == "skip"
    queued = c.write([Fact(ns, DENVER)], "review", {"review_scope": "all"}).decisions[0]
    assert queued.action == "review" and queued.review_id
    resolved = c.resolve_review(ns, queued.review_id, "reject")
    assert resolved.status == "rejected"
    assert chicago.memory_id is not None and denver.memory_id is not None
    c.undo(ns, chicago.memory_id)
    c.forget(ns, denver.memory_id)

    events = c.events(ns)
    assert [e.type for e in events] == [
        "add",
        "replace",
        "skip",
        "review_queued",
        "review_resolved",
        "undo",
        "forget",
    ]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    add, replace, skipped, review, resolve, undo, forget = events
    for e, d in ((add, denver), (replace, chicago), (skipped, skip), (review, queued)):
        assert e.scores["rule"] == d.rule and e.policy == d.policy
        assert e.scores["similarity"] is None or 0 <= e.scores["similarity"] <= 1.0001
    assert (replace.memory_id, replace.target_id) == (chicago.memory_id, denver.memory_id)
    assert replace.scores["contradiction"] is not None
    assert skipped.target_id == chicago.memory_id
    assert review.scores["review_id"] == queued.review_id
    assert resolve.scores == {"review_id": queued.review_id, "resolution": "reject"}
    assert (undo.memory_id, undo.target_id) == (chicago.memory_id, denver.memory_id)
    assert forget.memory_id == denver.memory_id
    assert all(e.created_at > 1.7e9 and e.namespace == ns for e in events)
    assert [e.seq for e in events] == [e.seq for e in gate.store.events(ns)]  # the store's log
    # The forgotten memory's normalised text is erased from its events, over the API too.
    assert "hypothesis" not in add.scores or not add.scores["hypothesis"]

    # Paging: after_seq and limit walk the same log.
    first, second = c.events(ns, 0, 3), c.events(ns, events[2].seq, 100)
    assert [e.seq for e in first + second] == [e.seq for e in events]
    assert c.events(ns, events[-1].seq) == []
    assert c.events("audit/other") == []
    raw = stub.ListEvents(pb.ListEventsRequest(namespace=ns), timeout=30)
    assert [e.type for e in raw.events][3:5] == ["review", "resolve"]  # the API's words
    assert raw.events[1].rule == chicago.rule and raw.events[1].HasField("similarity")
    assert raw.next_after_seq == events[-1].seq
    for bad in ({"limit": 1001}, {"namespace": "audit a"}, {"after_seq": 1 << 63}):
        request = pb.ListEventsRequest(**{"namespace": ns, **bad})  # type: ignore[arg-type]
        code, _ = code_of(lambda r=request: stub.ListEvents(r, timeout=30))
        assert code == "INVALID_ARGUMENT", bad


def test_forget_and_undo_of_an_add(h: Harness) -> None:
    c = h.client(h.serve())
    ns = "demo/forget"
    mid = c.write([Fact(ns, "The customer's cat is called Miso.")]).decisions[0].memory_id
    assert mid is not None
    with pytest.raises(Conflict) as info:
        c.undo(ns, mid)  # an add replaced nothing
    assert info.value.code == "FAILED_PRECONDITION"  # type: ignore[attr-defined]
    assert c.forget(ns, mid) == mid
    gone = c.get(ns, mid)
    assert gone.status == "forgotten" and gone.text == ""
    assert mid not in {m.id for m, _ in c.recall(ns, "What is the cat called?", 5)}


def test_keyed_writes_and_idempotency(h: Harness) -> None:
    c = h.client(h.serve())
    ns = "demo/keys"
    first = c.write([Fact(ns, "Plan: starter", key="plan", idempotency_key="req-1")])
    again = c.write([Fact(ns, "Plan: starter", key="plan", idempotency_key="req-1")])
    assert (
        again.decisions[0].replayed and again.decisions[0].memory_id == first.decisions[0].memory_id
    )
    up = c.write([Fact(ns, "Plan: enterprise", key="plan")]).decisions[0]
    assert (up.action, up.target_id, up.rule) == ("replace", first.decisions[0].memory_id, "keyed")


def test_backfill_streams_decisions_in_order(h: Harness) -> None:
    st = h.serve(backfill_window=4)
    c = h.client(st)
    facts = [
        Fact(
            f"bulk/{i % 3}",
            f"Backfilled note {i}: the build server {i} runs Linux.",
            kind="episodic" if i % 4 == 0 else "semantic",
        )
        for i in range(30)
    ]
    dry = list(c.backfill(iter(facts), dry_run=True))
    assert [d.fact.text for d in dry] == [f.text for f in facts]
    assert all(d.memory_id is None for d in dry)
    assert c.recall("bulk/0", "build server", 5) == []

    out = list(c.backfill(iter(facts)))
    assert [d.fact.text for d in out] == [f.text for f in facts]
    stored = [d for d in out if d.action in ("add", "replace")]
    assert stored and all(c.get(d.fact.namespace, d.memory_id or "").status for d in stored)

    chain = list(c.backfill(Fact("bulk/key", f"Timezone: UTC+{i}", key="tz") for i in range(8)))
    assert [d.action for d in chain] == ["add"] + ["replace"] * 7
    assert [d.target_id for d in chain[1:]] == [d.memory_id for d in chain[:-1]]


def test_backfill_stops_at_an_invalid_fact(h: Harness) -> None:
    c = h.client(h.serve())
    facts = [Fact("bulk/bad", f"Valid fact number {i}.") for i in range(3)]
    facts.append(Fact("bulk/bad", "   "))
    facts.append(Fact("bulk/bad", "Never read."))
    got = []
    with pytest.raises(InvalidInput) as info:
        for d in c.backfill(iter(facts), dry_run=True):
            got.append(d.fact.text)
    assert got == [f.text for f in facts[:3]] and "fact 3" in str(info.value)


# -- INVALID_ARGUMENT ------------------------------------------------------------------------------
def _fact(text: bytes = b"A perfectly fine fact.", **kw: Any) -> Any:
    return pb.Fact(namespace=kw.pop("namespace", "t/a"), text=text, **kw)


BAD_REQUESTS: list[tuple[str, str, Any, str]] = [
    ("empty text", "Triage", pb.TriageRequest(facts=[_fact(b"")]), "empty"),
    ("blank text", "Write", pb.WriteRequest(facts=[_fact(b"  \n ")]), "empty"),
    ("oversize bytes", "Triage", pb.TriageRequest(facts=[_fact(b"x" * 40_000)]), "bytes"),
    ("oversize chars", "Triage", pb.TriageRequest(facts=[_fact(b"x" * 9_000)]), "characters"),
    ("bad utf-8", "Write", pb.WriteRequest(facts=[_fact(), _fact(b"caf\xc3 \xff")]), "fact 1"),
    ("bad kind", "Triage", pb.TriageRequest(facts=[_fact(kind=99)]), "kind"),
    ("bad namespace", "Triage", pb.TriageRequest(facts=[_fact(namespace="")]), "namespace"),
    ("bad policy", "Triage", pb.TriageRequest(facts=[_fact()], policy=7), "policy"),
    (
        "override out of range",
        "Triage",
        pb.TriageRequest(facts=[_fact()], overrides=pb.PolicyOverrides(floor=2.0)),
        "floor",
    ),
    (
        "override top_k 0",
        "Write",
        pb.WriteRequest(facts=[_fact()], overrides=pb.PolicyOverrides(top_k=0)),
        "top_k",
    ),
    ("bad metadata", "Write", pb.WriteRequest(facts=[_fact(metadata_json="[1]")]), "metadata"),
    ("no facts", "Write", pb.WriteRequest(), "at least one"),
    ("oversize batch", "Triage", pb.TriageRequest(facts=[_fact()] * 5), "limit is 4"),
    ("recall k", "Recall", pb.RecallRequest(namespace="t/a", query=b"q", k=5000), "k must"),
    ("recall utf-8", "Recall", pb.RecallRequest(namespace="t/a", query=b"\xff"), "UTF-8"),
    ("empty id", "Get", pb.MemoryRef(namespace="t/a", memory_id=""), "memory_id"),
    (
        "no resolution",
        "ResolveReview",
        pb.ResolveReviewRequest(namespace="t/a", review_id="rev_x"),
        "resolution",
    ),
]


def test_invalid_requests_are_invalid_argument(h: Harness) -> None:
    gate = h.gate()
    stub = h.stub(h.serve(gate, max_request_facts=4, max_queued_facts=8))
    for name, rpc, request, needle in BAD_REQUESTS:
        code, details = code_of(lambda r=request, m=rpc: getattr(stub, m)(r, timeout=30))
        assert code == "INVALID_ARGUMENT", name
        assert needle in details, (name, details)
    assert gate.calls == []  # nothing invalid ever reached the model


# -- NOT_FOUND, auth and isolation ----------------------------------------------------------------
def test_foreign_ids_read_exactly_like_absent_ones(h: Harness) -> None:
    c = h.client(h.serve())
    mine = c.write([Fact("tenant/a", "Alice's favourite colour is green.")]).decisions[0].memory_id
    assert mine is not None
    absent = "mem_" + "0" * 24
    for call in (c.get, c.history, c.forget, c.undo):
        errors = []
        for mid in (absent, mine):
            with pytest.raises(NotFound) as info:
                call("tenant/b", mid)
            errors.append((info.value.code, str(info.value).replace(mid, "<id>")))  # type: ignore[attr-defined]
        assert errors[0] == errors[1] and errors[0][0] == "NOT_FOUND"
    assert c.get("tenant/a", mine).status == "active"  # the probing changed nothing


def test_tokens_authenticate_and_bind_namespaces(h: Harness) -> None:
    st = h.serve(tokens=TOKENS)
    anon, stranger = h.client(st), h.client(st, token="not-a-known-token-at-all")
    acme = h.client(st, token=ACME)
    for client in (anon, stranger):
        with pytest.raises(Unauthenticated) as info:
            client.write([Fact("acme/alice", "Alice likes tea.")])
        assert info.value.code == "UNAUTHENTICATED"  # type: ignore[attr-defined]
    assert anon.health() == "SERVING"  # health needs no token
    bad_header = h.stub(st)
    code, _ = code_of(
        lambda: bad_header.Get(
            pb.MemoryRef(namespace="acme/a", memory_id="mem_x"),
            metadata=(("authorization", f"Basic {ACME}"),),
            timeout=30,
        )
    )
    assert code == "UNAUTHENTICATED"
    with pytest.raises(PermissionDenied) as denied:
        acme.write(
            [Fact("acme/alice", "Alice likes tea."), Fact("globex/bob", "Bob likes coffee.")]
        )
    assert denied.value.code == "PERMISSION_DENIED"  # type: ignore[attr-defined]
    assert acme.recall("acme/alice", "What does Alice like?", 5) == []  # all or nothing
    with pytest.raises(PermissionDenied):
        list(acme.backfill([Fact("globex/bob", "Bob likes coffee.")]))
    streamed = list(acme.backfill([Fact("acme/alice", "Alice likes tea.")], dry_run=True))
    assert [d.action for d in streamed] == ["add"]


def test_two_tenants_are_isolated(h: Harness) -> None:
    st = h.serve(tokens=TOKENS)
    acme, globex = h.client(st, token=ACME), h.client(st, token=GLOBEX)
    mid = (
        acme.write([Fact("acme/alice", "Alice's favourite colour is green.")])
        .decisions[0]
        .memory_id
    )
    assert mid is not None
    globex.write([Fact("globex/bob", "Bob's favourite colour is blue.")])
    for call in (globex.get, globex.history, globex.forget, globex.undo):
        with pytest.raises(PermissionDenied):
            call("acme/alice", mid)
        with pytest.raises(NotFound):
            call("globex/bob", mid)
    with pytest.raises(PermissionDenied):
        globex.recall("acme/alice", "favourite colour")
    with pytest.raises(PermissionDenied):
        globex.list_review("acme/alice")
    assert mid not in {m.id for m, _ in globex.recall("globex/bob", "favourite colour", 10)}
    assert acme.get("acme/alice", mid).text == "Alice's favourite colour is green."


# -- overload, deadlines, failures ----------------------------------------------------------------
def test_admission_control_sheds_with_resource_exhausted(h: Harness) -> None:
    gate, metrics = h.gate(), Metrics()
    st = h.serve(gate, max_queued_facts=2, max_request_facts=2, metrics=metrics)
    c = h.client(st, retry=False)
    gate.hold.clear()
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(
            c.write, [Fact("load/a", "First held fact."), Fact("load/a", "Second.")]
        )
        assert gate.entered.wait(60)
        with pytest.raises(Overloaded) as info:
            c.write([Fact("load/a", "One fact too many.")])
        assert info.value.code == "RESOURCE_EXHAUSTED"  # type: ignore[attr-defined]
        with pytest.raises(Overloaded):
            c.recall("load/a", "anything")
        assert c.health() == "SERVING"  # health checks are never shed
        assert c.list_review("load/a") == []  # reads take no permits
        gate.hold.set()
        assert [d.action for d in blocker.result(60).decisions] == ["add", "add"]
    assert c.write([Fact("load/a", "Room again.")]).decisions[0].action == "add"
    shed = metrics.registry.get_sample_value(
        "memgate_requests_total", {"rpc": "Write", "code": "RESOURCE_EXHAUSTED"}
    )
    assert shed == 1


def test_deadlines_are_honoured_and_expired_work_skips_the_model(h: Harness) -> None:
    gate = h.gate()
    c = h.client(h.serve(gate))
    with pytest.raises(DeadlineExceeded):
        c.write([Fact("slow/a", "Instant deadline.")], timeout=1e-6)
    gate.hold.clear()
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(c.write, [Fact("slow/a", "The blocker.")])
        assert gate.entered.wait(60)
        with pytest.raises(DeadlineExceeded) as info:
            c.write([Fact("slow/a", "Too late for the model.")], timeout=0.3)
        assert info.value.code == "DEADLINE_EXCEEDED"  # type: ignore[attr-defined]
        gate.hold.set()
        assert blocker.result(60).decisions[0].action == "add"
    assert c.write([Fact("slow/a", "After the jam.")]).decisions[0].action == "add"
    seen = [t for call in gate.calls for t in call]
    assert "Too late for the model." not in seen and "The blocker." in seen


def test_unknown_errors_are_internal_with_a_request_id(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    gate = h.gate()
    c = h.client(h.serve(gate))
    gate.fail = RuntimeError("secret-internal-detail at /srv/memgate/memgate.db")
    with caplog.at_level("ERROR", logger="memgate.server"):
        with pytest.raises(MemgateError) as info:
            c.write([Fact("oops/a", "This write meets a bug.")])
    err = info.value
    rid = err.request_id  # type: ignore[attr-defined]
    assert err.code == "INTERNAL" and rid and rid in str(err)  # type: ignore[attr-defined]
    assert "secret" not in str(err) and "RuntimeError" not in str(err)
    logged = [r for r in caplog.records if getattr(r, "fields", {}).get("request_id") == rid]
    assert logged and logged[0].exc_info is not None
    gate.fail = None
    assert c.health() == "SERVING"  # a failed batch is not a dead worker
    assert c.write([Fact("oops/a", "Fine again.")]).decisions[0].action == "add"


def test_a_dead_worker_turns_health_not_serving(h: Harness) -> None:
    gate = h.gate()
    c = h.client(h.serve(gate))
    assert c.health() == "SERVING" and c.health(SERVICE_NAME) == "SERVING"
    with pytest.raises(NotFound):
        c.health("no.such.Service")
    gate.fail = StorageError("disk I/O error")
    with pytest.raises(Unavailable) as info:
        c.write([Fact("dead/a", "The store fails under this write.")])
    assert info.value.code == "UNAVAILABLE"  # type: ignore[attr-defined]
    wait_until(lambda: c.health() == "NOT_SERVING", "health NOT_SERVING")
    assert c.health(SERVICE_NAME) == "NOT_SERVING"
    with pytest.raises(Unavailable):
        c.triage([Fact("dead/a", "No model work after the worker died.")])


# -- concurrency and shutdown ----------------------------------------------------------------------
def test_concurrent_writers_to_one_key_build_one_linear_chain(h: Harness) -> None:
    gate = h.gate()
    c = h.client(h.serve(gate))
    ns, n = "race/one", 20
    values = [f"Plan: tier {i}" for i in range(n)]
    with ThreadPoolExecutor(2 * n) as pool:
        # Writers to a second namespace race alongside; neither may lose an update.
        futures = [
            (
                pool.submit(c.write, [Fact(ns, v, key="plan")]),
                pool.submit(c.write, [Fact("race/two", v, key="plan")]),
            )
            for v in values
        ]
        results = [mine.result(120) for mine, _ in futures]
        others = [other.result(120) for _, other in futures]
    assert sorted(d.action for r in results for d in r.decisions) == ["add"] + ["replace"] * (n - 1)
    assert gate.store.count_active(ns) == 1 and gate.store.count_active("race/two") == 1
    active = gate.store.active_by_key(ns, "plan")
    chain = c.history(ns, active.id)
    assert len(chain) == n and sorted(m.text for m in chain) == sorted(values)
    assert chain[0].supersedes is None
    for older, newer in zip(chain, chain[1:], strict=False):
        assert newer.supersedes == older.id and older.superseded_by == newer.id
        assert older.status == "superseded"
    assert chain[-1].id == active.id and chain[-1].status == "active"
    assert len(others) == n


def test_concurrent_requests_share_model_batches(h: Harness) -> None:
    gate, metrics = h.gate(), Metrics()
    st = h.serve(gate, metrics=metrics)
    c = h.client(st)
    gate.hold.clear()
    texts = [f"Shared batch fact number {i} about ferries." for i in range(6)]
    with ThreadPoolExecutor(7) as pool:
        first = pool.submit(c.triage, [Fact("batch/a", "The first request holds the model.")])
        assert gate.entered.wait(60)
        rest = [pool.submit(c.triage, [Fact(f"batch/{i % 2}", t)]) for i, t in enumerate(texts)]
        assert st.server is not None
        wait_until(lambda: st.server.batcher.pending_facts == len(texts), "queued requests")
        gate.hold.set()
        assert first.result(60).decisions[0].action == "add"
        answers = [f.result(60) for f in rest]
    assert len(gate.calls) == 2 and sorted(gate.calls[1]) == sorted(texts)
    assert all(a.timings["batch_facts"] == len(texts) for a in answers)
    assert [a.decisions[0].fact.text for a in answers] == texts
    assert metrics.registry.get_sample_value("memgate_batch_facts_count") == 2


def test_graceful_shutdown_drains_in_flight_calls(h: Harness) -> None:
    gate = h.gate()
    st = h.serve(gate)
    c = h.client(st)
    gate.hold.clear()
    with ThreadPoolExecutor(5) as pool:
        calls = [pool.submit(c.write, [Fact("drain/a", "In-flight write 0.", kind="episodic")])]
        assert gate.entered.wait(60)
        calls += [
            pool.submit(c.write, [Fact("drain/a", f"In-flight write {i}.", kind="episodic")])
            for i in range(1, 5)
        ]
        assert st.server is not None
        wait_until(lambda: st.server.batcher.pending_facts == 4, "queued writes")
        stopping = st.stop_async(grace=60)

        def refused() -> bool:  # new calls are refused (retryable) once the drain began
            try:
                c.get("drain/a", "mem_probe", timeout=5)
            except Unavailable:
                return True
            except NotFound:
                return False
            raise AssertionError("unreachable")

        wait_until(refused, "the drain to start")
        assert c.health() == "NOT_SERVING"  # health still answers, for the load balancer
        gate.hold.set()
        done = [f.result(60) for f in calls]
        stopping.result(60)
    assert all(r.decisions[0].action == "add" and r.decisions[0].memory_id for r in done)
    assert gate.store.count_active("drain/a") == 5


# -- operations: metrics, logs, TLS, reflection, CLI ----------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_and_access_log(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    port = _free_port()
    metrics = Metrics()
    st = h.serve(metrics=metrics, metrics_port=port)
    c = h.client(st)
    secret = "The vault combination is 12-34-56."
    with caplog.at_level("INFO", logger="memgate.server.access"):
        c.write([Fact("ops/a", secret)])
        with pytest.raises(NotFound):
            c.get("ops/a", "mem_missing")

        def access_lines() -> list[dict[str, Any]]:
            records = [r for r in caplog.records if r.name == "memgate.server.access"]
            return [getattr(r, "fields", {}) for r in records]

        # The line is written after the status went out: wait for it, boundedly.
        wait_until(lambda: len(access_lines()) >= 2, "two access-log lines")
    lines = access_lines()
    assert {(f["rpc"], f["code"], f["facts"]) for f in lines} >= {
        ("Write", "OK", 1),
        ("Get", "NOT_FOUND", 0),
    }
    assert all(f["request_id"] and f["ms"] >= 0 for f in lines)
    for record in caplog.records:
        fields = json.dumps(getattr(record, "fields", {}), default=str)
        assert secret not in fields and secret not in record.getMessage()
    sample = metrics.registry.get_sample_value
    assert sample("memgate_requests_total", {"rpc": "Write", "code": "OK"}) == 1
    assert sample("memgate_request_seconds_count", {"rpc": "Get", "code": "NOT_FOUND"}) == 1
    assert sample("memgate_decisions_total", {"action": "add", "dry_run": "false"}) == 1
    assert sample("memgate_queue_facts") == 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
        body = resp.read().decode()
    assert 'memgate_requests_total{code="OK",rpc="Write"} 1.0' in body


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(h: Harness, tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    st = h.serve(tls_cert=cert.read_bytes(), tls_key=key.read_bytes())
    secure = h.client(st, tls=cert.read_bytes(), tls_server_name="localhost")
    assert secure.health() == "SERVING"
    with pytest.raises(NotFound):
        secure.get("tls/a", "mem_missing")
    with pytest.raises(Unavailable):
        h.client(st, timeout=5).health()  # plaintext to a TLS port


def test_reflection_flag(h: Harness) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    st = h.serve(reflection=True)
    with grpc.insecure_channel(st.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert SERVICE_NAME in names and "grpc.health.v1.Health" in names


def test_cli_client_subcommands(
    h: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    st = h.serve()
    facts = tmp_path / "facts.jsonl"
    facts.write_text(json.dumps({"namespace": "cli/a", "text": DENVER}) + "\n", encoding="utf-8")

    def run(*argv: str) -> list[dict[str, Any]]:
        assert cli_main(["client", *argv, "--target", st.target]) == 0
        return [json.loads(line) for line in capsys.readouterr().out.splitlines()]

    assert run("triage", str(facts))[0]["action"] == "add"
    wrote = run("write", str(facts))
    mid = wrote[0]["memory_id"]
    assert wrote[0]["action"] == "add" and wrote[-1]["timings"]["total"] > 0
    assert run("get", "cli/a", mid)[0]["text"] == DENVER
    assert [m["id"] for m in run("history", "cli/a", mid)] == [mid]
    assert run("recall", "cli/a", "office", "-k", "1")[0]["id"] == mid
    assert run("review", "list", "cli/a") == []
    assert [e["type"] for e in run("events", "cli/a", "--all")] == ["add"]
    assert run("health") == [{"status": "SERVING"}]
    assert run("forget", "cli/a", mid) == [{"forgotten": mid}]
    assert cli_main(["client", "undo", "cli/a", mid, "--target", st.target]) == 2
    assert "Conflict" in capsys.readouterr().err


def test_review_uncertain_travels_over_grpc(
    h: Harness, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``REVIEW_UNCERTAIN`` (3) is the review-uncertain policy on the server, not review: from a
    raw stub, the client, the Backfill stream, ``memgate client --policy`` and ``memgate
    backfill --policy``, the gate decides with it (each decision, event and audit line names
    it) exactly as it does in process."""
    from engine.gate.policy import POLICY_NAMES
    from engine.server import convert

    assert set(convert.POLICY_TO_PB) == set(POLICY_NAMES)  # every policy has a wire name
    assert pb.PolicyName.Name(pb.REVIEW_UNCERTAIN) == "REVIEW_UNCERTAIN"
    assert pb.REVIEW_UNCERTAIN == 3 and pb.REVIEW_POLICY == 2  # appended, never renumbered
    gate = h.gate()
    st = h.serve(gate)
    c = h.client(st)
    ns = "policy/uncertain"
    denver = c.write([Fact(ns, DENVER)]).decisions[0].memory_id
    facts = [Fact(ns, CHICAGO), Fact(ns, "The customer is learning to play the cello.")]

    local = gate.triage(facts, "review-uncertain").decisions  # in process, the same store
    expected = [("review-uncertain", d.action, d.target_id, d.rule) for d in local]
    assert expected[0][2] == denver  # Chicago meets Denver: the policy has a conflict to weigh

    def seen(ds: Any) -> list[tuple[str, str, str | None, str]]:
        return [(d.policy, d.action, d.target_id, d.rule) for d in ds]

    assert seen(c.triage(facts, "review-uncertain").decisions) == expected
    assert seen(c.backfill(facts, "review-uncertain", dry_run=True)) == expected
    request = pb.TriageRequest(
        facts=[convert.fact_to_pb(f) for f in facts], policy=pb.REVIEW_UNCERTAIN
    )
    raw = h.stub(st).Triage(request, timeout=60)
    assert [(d.policy, convert.PB_TO_ACTION[d.action]) for d in raw.decisions] == [
        (p, a) for p, a, _, _ in expected
    ]
    # review (scope all) is another policy on the wire: it queues the conflict.
    queued = c.triage(facts[:1], "review").decisions[0]
    assert (queued.policy, queued.action) == ("review", "review")

    rows = tmp_path / "facts.jsonl"
    rows.write_text(json.dumps({"namespace": ns, "text": CHICAGO}) + "\n", encoding="utf-8")
    argv = ["client", "write", str(rows), "--policy", "review-uncertain", "--target", st.target]
    assert cli_main(argv) == 0
    wrote = [json.loads(line) for line in capsys.readouterr().out.splitlines()][0]
    assert (wrote["action"], wrote["target_id"]) == (expected[0][1], expected[0][2])
    assert c.events(ns, 0, 100)[-1].policy == "review-uncertain"

    # memgate backfill --policy review-uncertain --target: the stream's first message names it.
    audit = tmp_path / "audit.jsonl"
    argv = ["backfill", "--input", str(rows), "--policy", "review-uncertain", "--dry-run"]
    argv += ["--target", st.target, "--audit", str(audit), "--progress", "off"]
    assert cli_main(argv) == 0
    capsys.readouterr()
    [record] = [json.loads(line) for line in audit.read_text(encoding="utf-8").splitlines()]
    assert record["policy"] == "review-uncertain"


def test_the_seed_policies_travel_over_grpc(h: Harness) -> None:
    """``SEED`` (4) and ``SEED_REVIEW`` (5), appended to ``PolicyName``: the server decides with
    the seed's plain rule, as the gate does in process, from the client and a raw stub."""
    from engine.server import convert

    assert (pb.SEED, pb.SEED_REVIEW) == (4, 5)
    assert convert.PB_TO_POLICY[pb.SEED] == "seed"
    assert convert.PB_TO_POLICY[pb.SEED_REVIEW] == "seed-review"
    gate = h.gate()
    st = h.serve(gate)
    c = h.client(st)
    ns = "policy/seed"
    c.write([Fact(ns, DENVER)])
    facts = [Fact(ns, CHICAGO)]
    for name, wire in (("seed", pb.SEED), ("seed-review", pb.SEED_REVIEW)):
        local = gate.triage(facts, name).decisions
        expected = [(name, d.action, d.target_id, d.rule) for d in local]
        got = c.triage(facts, name).decisions
        assert [(d.policy, d.action, d.target_id, d.rule) for d in got] == expected
        request = pb.TriageRequest(facts=[convert.fact_to_pb(f) for f in facts], policy=wire)
        raw = h.stub(st).Triage(request, timeout=60)
        assert [(d.policy, convert.PB_TO_ACTION[d.action]) for d in raw.decisions] == [
            (p, a) for p, a, _, _ in expected
        ]


def test_public_names_resolve() -> None:
    import importlib

    import engine.client
    import engine.server

    for name in engine.server.__all__:
        assert getattr(engine.server, name) is not None
    modules = [
        "auth",
        "codegen",
        "convert",
        "interceptor",
        "logs",
        "metrics",
        "proto",
        "reflection",
        "server",
        "service",
        "status",
    ]
    for short in modules:
        module = importlib.import_module(f"engine.server.{short}")
        assert all(hasattr(module, name) for name in module.__all__), short
    assert all(hasattr(engine.client, name) for name in engine.client.__all__)


def test_one_bad_request_does_not_fail_its_batch_neighbours() -> None:
    from types import SimpleNamespace

    from engine.core import ModelDone, ModelWork, TriageGroup, run_model_batch

    class Strict:
        """Stands in for the gate: refuses any batch holding the text "bad"."""

        calls = 0

        def triage(self, facts: Any, policy: str, **kw: Any) -> Any:
            Strict.calls += 1
            if any(f.text == "bad" for f in facts):
                raise InvalidInput("bad fact")
            return SimpleNamespace(decisions=[f.text for f in facts], timings={"embed": 0.0})

    works = [
        ModelWork((Fact("a/b", "x"),)),
        ModelWork((Fact("a/b", "bad"),)),
        ModelWork((Fact("a/b", "y"), Fact("a/b", "z"))),
    ]
    out = run_model_batch(Strict(), TriageGroup("strict", (), False), works)  # type: ignore[arg-type]
    assert isinstance(out[0], ModelDone) and isinstance(out[2], ModelDone)
    assert out[0].decisions == ("x",) and isinstance(out[1], InvalidInput)
    assert out[2].decisions == ("y", "z")
    assert Strict.calls == 4  # the merged call, then one per request
