"""Item 12: the namespace isolation matrix (contract point 5).

Two tenants on one real server (real models, SQLite on tmp_path, gRPC on loopback), each token
bound to its namespace prefix. Tenant A plants unique random canary strings (in texts, metadata,
sources, a review item). The matrix is generated, not written out: for EVERY RPC of
``memgate.v1.Memgate`` x

* ``foreign_token``: a token used on the other tenant's namespaces (and no / an unknown token);
* ``foreign_ids``:   A's memory and review ids under B's own namespaces, including namespaces
  crafted to look like A's (``globex/../acme/alice``, ``globex/acme/alice``);
* ``mixed_batch``:   requests mixing own and foreign namespaces (the RPCs that carry several);
* ``canary``:        B's calls aimed at A's planted facts (similar queries and writes, the same
  attribute key, the same idempotency key), and B's own objects built by such writes;

every cell must be denied (PERMISSION_DENIED / UNAUTHENTICATED / NOT_FOUND) or answer with B's
data only. A foreign id is answered exactly like an absent id of the same shape (status, details
with the id itself masked, metadata keys). No canary byte may appear in any answer, error detail,
metadata, server log line (access log + python logging) or the process's stdout/stderr. The whole
matrix runs again after a restart on the same store (indexes rebuilt). A's data is unchanged.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402
from _tenants import Answer, ask, ask_stream, captured_logs, serve  # noqa: E402

from engine.server.proto import pb, pb_grpc  # noqa: E402

TOKENS = {
    "tok-acme-isolation-0123456789": ["acme/"],
    "tok-globex-isolation-0123456789": ["globex/"],
}
A_TOKEN, B_TOKEN = TOKENS
RPCS = (
    "Triage",
    "Write",
    "Recall",
    "Get",
    "Forget",
    "Undo",
    "History",
    "ListReview",
    "ResolveReview",
    "ListEvents",
    "Backfill",
)
REF_RPCS = ("Get", "Forget", "Undo", "History")
DENIED = frozenset({"PERMISSION_DENIED", "UNAUTHENTICATED", "NOT_FOUND"})
RESOLUTIONS = (pb.ACCEPT, pb.KEEP_BOTH, pb.REJECT)
A_SPACES = ("acme/alice", "acme/vault")
# B's own namespaces, some crafted to read like A's: namespaces are opaque strings.
B_SPACES = ("globex/bob", "globex/../acme/alice", "globex/acme/alice", "globex//acme/vault")
# What B aims at A's planted facts with (B never knows the canaries).
AIMED = (
    "What is the vault code?",
    "The vault code is 0000.",
    "Plan: enterprise",
    "The customer's office is in Chicago.",
    "Alice said the password is hunter2.",
)
SHARED_IDEMPOTENCY_KEY = "retry-0001"


def fact(ns: str, text: str, **kw: Any) -> Any:
    return pb.Fact(namespace=ns, text=text.encode("utf-8"), **kw)


def absent_like(ident: str) -> str:
    """An id of the same shape that names nothing."""
    return ident[:4] + secrets.token_hex(12)


@dataclass
class World:
    canaries: list[str]
    a_memories: dict[str, str]  # memory id -> its namespace
    a_reviews: dict[str, str]  # review id -> its namespace
    a_snapshot: dict[str, bytes]
    b_keyed: set[str] = field(default_factory=set)
    """B's namespaces where B committed a fact with the shared idempotency key."""


@dataclass
class Cell:
    rpc: str
    kind: str
    label: str
    expect: frozenset[str]
    call: Callable[[], Answer]
    absent: Callable[[], Answer] | None = None
    """The same call with an absent id in place of the foreign one."""
    sent_id: str = ""
    absent_id: str = ""
    check: Callable[[Answer], str | None] | None = None
    """Extra check on an answer; returns what is wrong, or None."""


class Tenants:
    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.MemgateStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def call(self, rpc: str, request: Any, token: str | None) -> Answer:
        if rpc == "Backfill":
            return ask_stream(self.stub, request, token)
        return ask(self.stub, rpc, request, token)

    def ok(self, rpc: str, request: Any, token: str | None) -> Any:
        answer = self.call(rpc, request, token)
        assert answer.code == "OK", (rpc, answer.code, answer.details)
        return answer.responses[0] if rpc != "Backfill" else answer.responses


# -- planting -------------------------------------------------------------------------------------
def plant(t: Tenants) -> World:
    c = [f"CANARY{secrets.token_hex(12)}" for _ in range(8)]
    mems: dict[str, str] = {}
    reviews: dict[str, str] = {}

    def write(ns: str, text: str, policy: Any = pb.STRICT, scope: str = "", **kw: Any) -> Any:
        overrides = pb.PolicyOverrides(review_scope=scope) if scope else None
        d = t.ok(
            "Write",
            pb.WriteRequest(facts=[fact(ns, text, **kw)], policy=policy, overrides=overrides),
            A_TOKEN,
        ).decisions[0]
        if d.memory_id:
            mems[d.memory_id] = ns
        if d.review_id:
            reviews[d.review_id] = ns
        return d

    vault = write(
        "acme/vault",
        f"The vault code is {c[0]}.",
        metadata_json=f'{{"secret": "{c[1]}"}}',
        source=c[2],
        idempotency_key=SHARED_IDEMPOTENCY_KEY,
    )
    assert vault.action == pb.ADD
    queued = write("acme/vault", f"The vault code is {c[3]}.", pb.REVIEW_POLICY, "all")
    assert queued.action == pb.REVIEW, "the planted review item needs a review decision"
    assert write("acme/alice", f"Plan: starter {c[4]}", key="plan").action == pb.ADD
    assert write("acme/alice", f"Plan: enterprise {c[5]}", key="plan").action == pb.REPLACE
    assert write("acme/alice", "The customer's office is in Denver.").action == pb.ADD
    office = write(
        "acme/alice", f"The customer's office is in Chicago, badge {c[6]}.", pb.REVIEW_POLICY, "all"
    )
    assert office.action == pb.REVIEW
    episode = write("acme/alice", f"Alice said the password is {c[7]}.", kind=pb.EPISODIC)
    assert episode.action == pb.ADD
    world = World(c, mems, reviews, {})
    world.a_snapshot = snapshot(t, world)
    # Positive control: the leak detector finds every canary in A's own answers.
    blob = b"".join(world.a_snapshot.values())
    assert all(x.encode() in blob for x in c), "a canary did not reach A's own answers"
    return world


def snapshot(t: Tenants, world: World) -> dict[str, bytes]:
    """Everything A can read of its own data (as A): memories, chains, review queues."""
    out = {}
    for mid, ns in sorted(world.a_memories.items()):
        out[f"get {mid}"] = t.ok("Get", pb.MemoryRef(namespace=ns, memory_id=mid), A_TOKEN).memory
        out[f"history {mid}"] = t.ok(
            "History", pb.MemoryRef(namespace=ns, memory_id=mid), A_TOKEN
        ).chain
    for ns in A_SPACES:
        out[f"review {ns}"] = t.ok("ListReview", pb.ListReviewRequest(namespace=ns), A_TOKEN).items
        out[f"events {ns}"] = t.ok(
            "ListEvents", pb.ListEventsRequest(namespace=ns, limit=1000), A_TOKEN
        ).events
    return {
        k: b"".join(m.SerializeToString() for m in (v if not hasattr(v, "id") else [v]))
        for k, v in out.items()
    }


def leaks(blob: bytes, canaries: list[str]) -> int:
    return sum(blob.count(x.encode()) for x in canaries)


# -- the matrix -----------------------------------------------------------------------------------
def _triage_like(rpc: str, facts: list[Any], **kw: Any) -> tuple[str, Any]:
    """The request of a fact-carrying RPC (Triage, Write, Backfill) for ``facts``."""
    if rpc == "Triage":
        return rpc, pb.TriageRequest(facts=facts, **kw)
    if rpc == "Write":
        return rpc, pb.WriteRequest(facts=facts, **kw)
    first = pb.BackfillRequest(fact=facts[0], dry_run=kw.pop("dry_run", False), **kw)
    return rpc, [first, *(pb.BackfillRequest(fact=f) for f in facts[1:])]


def _no_foreign(
    world: World, gate: Any, spaces: tuple[str, ...], commits_key: bool = False
) -> Callable[[Answer], str | None]:
    """B's answer names none of A's ids, every memory or item it holds is in ``spaces``, and a
    replay (same idempotency key) is only ever of B's own earlier write in that namespace.
    ``commits_key``: the call commits a fact with the shared idempotency key."""
    foreign = [i.encode() for i in (*world.a_memories, *world.a_reviews)]

    def check(answer: Answer) -> str | None:
        hit = next((i for i in foreign if i in answer.payload), None)
        if hit is not None:
            return f"foreign id {hit!r} in the answer"
        for msg in answer.responses:
            for ns in _namespaces(msg):
                if spaces and ns not in spaces:
                    return f"a memory of namespace {ns!r} in the answer"
            for d in _decisions(msg):
                if d.replayed:
                    if not set(spaces) <= world.b_keyed:
                        return f"replayed a write B never made here: {d.memory_id or '(dry run)'}"
                    if d.memory_id and not any(gate.store.get(ns, d.memory_id) for ns in spaces):
                        return f"replayed a write of another namespace: {d.memory_id}"
                elif commits_key:
                    world.b_keyed.update(spaces)
        return None

    return check


def _decisions(msg: Any) -> list[Any]:
    if hasattr(msg, "decisions"):
        return list(msg.decisions)
    if hasattr(msg, "decision") and msg.HasField("decision"):
        return [msg.decision]
    return []


def _namespaces(msg: Any) -> list[str]:
    out = []
    for hit in getattr(msg, "hits", ()):
        out.append(hit.memory.namespace)
    for item in getattr(msg, "items", ()):
        out.append(item.namespace)
    for m in getattr(msg, "chain", ()):
        out.append(m.namespace)
    for e in getattr(msg, "events", ()):
        out.append(e.namespace)
    for name in ("memory", "restored", "undone"):
        if hasattr(msg, name) and msg.HasField(name):
            out.append(getattr(msg, name).namespace)
    return out


def build_matrix(t: Tenants, world: World, gate: Any) -> list[Cell]:
    cells: list[Cell] = []
    a_mem_ids = list(world.a_memories)
    a_rev_ids = list(world.a_reviews)

    def add(
        rpc: str, kind: str, label: str, expect: frozenset[str], request: Any, **kw: Any
    ) -> None:
        token = kw.pop("token", B_TOKEN)
        cells.append(Cell(rpc, kind, label, expect, lambda: t.call(rpc, request, token), **kw))

    def ref_cell(rpc: str, kind: str, ns: str, ident: str, expect: str, token: str | None) -> None:
        other = absent_like(ident)
        if rpc == "ResolveReview":
            for res in RESOLUTIONS:
                mk = lambda i, r=res: pb.ResolveReviewRequest(  # noqa: E731
                    namespace=ns, review_id=i, resolution=r
                )
                add(
                    rpc,
                    kind,
                    f"{ns} {ident} res={res}",
                    frozenset({expect}),
                    mk(ident),
                    token=token,
                    absent=lambda m=mk, tok=token: t.call(rpc, m(other), tok),
                    sent_id=ident,
                    absent_id=other,
                )
            return
        add(
            rpc,
            kind,
            f"{ns} {ident}",
            frozenset({expect}),
            pb.MemoryRef(namespace=ns, memory_id=ident),
            token=token,
            absent=lambda tok=token: t.call(rpc, pb.MemoryRef(namespace=ns, memory_id=other), tok),
            sent_id=ident,
            absent_id=other,
        )

    # 1. foreign token: B on A's namespaces, A on B's, no token, an unknown token.
    attackers = [
        (B_TOKEN, A_SPACES + ("acme/../globex/bob", "acme/never-used"), "PERMISSION_DENIED"),
        (A_TOKEN, ("globex/bob", "globex/../acme/alice"), "PERMISSION_DENIED"),
        (None, A_SPACES, "UNAUTHENTICATED"),
        ("tok-unknown-0123456789abcdef", A_SPACES, "UNAUTHENTICATED"),
    ]
    for token, spaces, expect in attackers:
        for ns in spaces:
            own = [m for m, s in world.a_memories.items() if s == ns] or a_mem_ids
            revs = [r for r, s in world.a_reviews.items() if s == ns] or a_rev_ids
            for rpc in RPCS:
                if rpc in REF_RPCS:
                    for mid in own[:2]:
                        ref_cell(rpc, "foreign_token", ns, mid, expect, token)
                elif rpc == "ResolveReview":
                    ref_cell(rpc, "foreign_token", ns, revs[0], expect, token)
                elif rpc == "Recall":
                    for q in AIMED[:2]:
                        add(
                            rpc,
                            "foreign_token",
                            f"{ns} {q!r}",
                            frozenset({expect}),
                            pb.RecallRequest(namespace=ns, query=q.encode(), k=1000),
                            token=token,
                        )
                elif rpc == "ListReview":
                    req = pb.ListReviewRequest(namespace=ns)
                    add(rpc, "foreign_token", ns, frozenset({expect}), req, token=token)
                elif rpc == "ListEvents":
                    for after in (0, 1):
                        req = pb.ListEventsRequest(namespace=ns, after_seq=after, limit=1000)
                        label = f"{ns} after={after}"
                        add(rpc, "foreign_token", label, frozenset({expect}), req, token=token)
                else:
                    f = fact(ns, "The vault code is 4321.")
                    variants = (
                        [{"dry_run": True}, {"dry_run": False}] if rpc == "Backfill" else [{}]
                    )
                    for kw in variants:
                        name, req = _triage_like(rpc, [f], **kw)
                        add(
                            name,
                            "foreign_token",
                            f"{ns} {kw}",
                            frozenset({expect}),
                            req,
                            token=token,
                        )

    # 2. foreign ids under B's own namespaces (crafted look-alikes included).
    for ns in B_SPACES:
        b_only = _no_foreign(world, gate, (ns,))
        for rpc in RPCS:
            if rpc in REF_RPCS:
                for mid in a_mem_ids:
                    ref_cell(rpc, "foreign_ids", ns, mid, "NOT_FOUND", B_TOKEN)
            elif rpc == "ResolveReview":
                for rid in a_rev_ids:
                    ref_cell(rpc, "foreign_ids", ns, rid, "NOT_FOUND", B_TOKEN)
            elif rpc == "ListReview":
                req = pb.ListReviewRequest(namespace=ns, limit=1000)
                add(rpc, "foreign_ids", ns, frozenset({"OK"}), req, check=b_only)
            elif rpc == "ListEvents":
                # The log's seq is global: paging from 0 (or from past A's events) in B's
                # namespace never yields A's events.
                for after in (0, 1, 3):
                    req = pb.ListEventsRequest(namespace=ns, after_seq=after, limit=1000)
                    label = f"{ns} after={after}"
                    add(rpc, "foreign_ids", label, frozenset({"OK"}), req, check=b_only)
            elif rpc == "Recall":
                for q in (*a_mem_ids[:2], SHARED_IDEMPOTENCY_KEY):
                    req = pb.RecallRequest(namespace=ns, query=q.encode(), k=1000)
                    add(rpc, "foreign_ids", f"{ns} {q}", frozenset({"OK"}), req, check=b_only)
            else:
                # A's attribute key and A's idempotency key, from B's namespace.
                f = fact(
                    ns,
                    f"Plan: freeloader {secrets.token_hex(3)}",
                    key="plan",
                    idempotency_key=SHARED_IDEMPOTENCY_KEY,
                )
                name, req = _triage_like(rpc, [f])
                check = _no_foreign(world, gate, (ns,), commits_key=rpc != "Triage")
                add(name, "foreign_ids", f"{ns} key+idem", frozenset({"OK"}), req, check=check)

    # 3. batches mixing own and foreign namespaces: all or nothing.
    mixes = [
        ("own,foreign", ["globex/bob", "acme/alice"]),
        ("foreign,own", ["acme/vault", "globex/bob"]),
        ("own,own,crafted", ["globex/bob", "globex/carol", "acme/../globex/bob"]),
    ]
    for rpc in ("Triage", "Write", "Backfill"):
        for label, spaces in mixes:
            for policy in (pb.STRICT, pb.REVIEW_POLICY):
                marker = secrets.token_hex(4)
                facts = [
                    fact(ns, f"Mixed batch fact {marker} number {i}.")
                    for i, ns in enumerate(spaces)
                ]
                name, req = _triage_like(rpc, facts, policy=policy)
                cells.append(
                    Cell(
                        name,
                        "mixed_batch",
                        f"{label} policy={policy}",
                        frozenset({"PERMISSION_DENIED"}),
                        _all_or_nothing(t, gate, name, req, spaces),
                    )
                )

    # 4. canary: B's calls aimed at A's planted facts, and B's own objects built by them.
    for ns in B_SPACES[:3]:
        b_only = _no_foreign(world, gate, (ns,))
        for q in AIMED:
            req = pb.RecallRequest(namespace=ns, query=q.encode(), k=1000)
            add("Recall", "canary", f"{ns} {q!r}", frozenset({"OK"}), req, check=b_only)
            for rpc in ("Triage", "Write", "Backfill"):
                name, req = _triage_like(rpc, [fact(ns, q)])
                add(name, "canary", f"{ns} {q!r}", frozenset({"OK"}), req, check=b_only)
        add(
            "ListReview",
            "canary",
            ns,
            frozenset({"OK"}),
            pb.ListReviewRequest(namespace=ns, limit=1000),
            check=b_only,
        )
        add(
            "ListEvents",
            "canary",
            f"{ns} after B's aimed writes",
            frozenset({"OK"}),
            pb.ListEventsRequest(namespace=ns, limit=1000),
            check=_events_of(ns, b_only),
        )
        for rpc in ("Get", "History", "Forget", "Undo", "ResolveReview"):
            cells.append(
                Cell(
                    rpc,
                    "canary",
                    f"{ns} own object",
                    frozenset({"OK"}),
                    _own(t, rpc, ns),
                    check=b_only,
                )
            )
    assert {c.rpc for c in cells} == set(RPCS)
    return cells


def _events_of(ns: str, b_only: Callable[[Answer], str | None]) -> Callable[[Answer], str | None]:
    """B's audit log holds B's events only, and B's aimed writes are in it (a log that answers
    nothing would pass the isolation check without showing anything)."""

    def check(answer: Answer) -> str | None:
        problem = b_only(answer)
        if problem is not None:
            return problem
        events = [e for msg in answer.responses for e in msg.events]
        if not any(e.type in ("add", "replace", "skip") for e in events):
            return "no decision events in B's own log"
        return None

    return check


def _all_or_nothing(
    t: Tenants, gate: Any, rpc: str, request: Any, spaces: list[str]
) -> Callable[[], Answer]:
    """The call, plus a check that a refused Write stored nothing in any namespace it named
    (Triage stores nothing; a Backfill stream applies the facts it read before the refusal)."""

    def run() -> Answer:
        before = [gate.store.count_active(ns) for ns in spaces]
        answer = t.call(rpc, request, B_TOKEN)
        after = [gate.store.count_active(ns) for ns in spaces]
        if rpc == "Write" and after != before:
            return Answer("STORED_PART_OF_A_REFUSED_BATCH", f"{before} -> {after}", b"", ())
        return answer

    return run


def _own(t: Tenants, rpc: str, ns: str) -> Callable[[], Answer]:
    """B builds its own object with writes aimed at A's facts, then calls ``rpc`` on it."""

    def run() -> Answer:
        def write(text: str, **kw: Any) -> Any:
            policy = kw.pop("policy", pb.STRICT)
            overrides = kw.pop("overrides", None)
            req = pb.WriteRequest(facts=[fact(ns, text, **kw)], policy=policy, overrides=overrides)
            return t.ok("Write", req, B_TOKEN).decisions[0]

        if rpc == "ResolveReview":
            write("The customer's office is in Denver.")
            d = write(
                "The customer's office is in Chicago.",
                policy=pb.REVIEW_POLICY,
                overrides=pb.PolicyOverrides(review_scope="all"),
            )
            if not d.review_id:
                return Answer("NO_REVIEW_ITEM", d.rule, b"", ())
            req = pb.ResolveReviewRequest(namespace=ns, review_id=d.review_id, resolution=pb.ACCEPT)
            return t.call(rpc, req, B_TOKEN)
        tag = secrets.token_hex(3)
        first = write(f"Plan: starter {tag}", key="plan")
        target = first.memory_id
        if rpc == "Undo":
            target = write(f"Plan: enterprise {tag}", key="plan").memory_id
        return t.call(rpc, pb.MemoryRef(namespace=ns, memory_id=target), B_TOKEN)

    return run


@dataclass
class Tally:
    cells: int = 0
    denied: int = 0
    isolated: int = 0
    like_absent: int = 0
    canary_leaks: int = 0
    failures: list[str] | None = None


def run_matrix(t: Tenants, world: World, gate: Any, tally: Tally) -> None:
    assert tally.failures is not None
    for cell in build_matrix(t, world, gate):
        answer = cell.call()
        tally.cells += 1
        where = f"{cell.kind} {cell.rpc} {cell.label}"
        found = leaks(answer.blob(), world.canaries)
        tally.canary_leaks += found
        if found:
            tally.failures.append(f"{where}: {found} canary bytes in the answer")
        if answer.code not in cell.expect:
            tally.failures.append(f"{where}: {answer.code} {answer.details!r}, want {cell.expect}")
            continue
        if answer.code in DENIED:
            tally.denied += 1
        else:
            tally.isolated += 1
        if cell.check is not None and (problem := cell.check(answer)) is not None:
            tally.failures.append(f"{where}: {problem}")
        if cell.absent is not None:
            twin = cell.absent()
            seen = (
                answer.code,
                answer.details.replace(cell.sent_id, "<id>"),
                answer.trailing_keys(),
            )
            like = (twin.code, twin.details.replace(cell.absent_id, "<id>"), twin.trailing_keys())
            if seen != like:
                tally.failures.append(f"{where}: foreign {seen} != absent {like}")
            else:
                tally.like_absent += 1


def test_namespace_isolation_matrix(
    make_gate: Callable[..., Any], figures: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    tally = Tally(failures=[])
    with captured_logs() as logs:
        gate = make_gate("isolation.db")
        st = serve(gate, TOKENS)
        t = Tenants(st.target)
        try:
            world = plant(t)
            run_matrix(t, world, gate, tally)
            if snapshot(t, world) != world.a_snapshot:
                tally.failures.append("B's calls changed A's data")
        finally:
            t.close()
            st.stop(grace=0)
        # Restart on the same store: fresh gate, indexes rebuilt from the store.
        gate = make_gate("isolation.db")
        st = serve(gate, TOKENS)
        t = Tenants(st.target)
        try:
            run_matrix(t, world, gate, tally)
            if snapshot(t, world) != world.a_snapshot:
                tally.failures.append("B's calls changed A's data (after the restart)")
        finally:
            t.close()
            st.stop(grace=0)
    out, err = capfd.readouterr()
    log_text = logs.text()
    log_leaks = leaks(log_text.encode(), world.canaries)
    std_leaks = leaks((out + err).encode(), world.canaries)
    assert logs.lines and '"rpc": "Get"' in log_text, "the access log was not captured"
    figures.record(
        "12 isolation matrix",
        cells=tally.cells,
        denied=tally.denied,
        isolated_ok=tally.isolated,
        foreign_ids_like_absent=tally.like_absent,
        canary_leaks=tally.canary_leaks + log_leaks + std_leaks,
        log_lines=len(logs.lines),
        canaries=len(world.canaries),
        restarts=1,
        failures=len(tally.failures),
    )
    assert not tally.failures, "\n".join(tally.failures[:40])
    assert tally.cells == tally.denied + tally.isolated
    assert log_leaks == 0 and std_leaks == 0
