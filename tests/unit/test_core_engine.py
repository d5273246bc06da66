"""The engine core without a model: a fake gate behind ``GateLike``, synthetic streams, the
shutdown cutoff, typed timings, and the sync wrapper."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.core import (
    CoreSettings,
    Engine,
    Entry,
    QueueSettings,
    SyncEngine,
    Timings,
    TokenBudgetQueue,
    Triaged,
    shutdown_message,
)
from engine.errors import InvalidInput, Overloaded, Unavailable
from engine.types import Decision, Event, Fact, Memory


@dataclass
class Outcome:
    decisions: list[Decision]
    timings: dict[str, float] = field(default_factory=dict)


class FakeGate:
    """Decides every fact "add" after ``delay`` seconds per call; records each call's facts
    and the time it committed."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[list[str]] = []
        self.committed: list[tuple[float, str]] = []
        self.gate_open = threading.Event()
        self.gate_open.set()

    def triage(
        self,
        facts: Sequence[Fact],
        policy: str = "strict",
        *,
        apply: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> Outcome:
        self.gate_open.wait(10)
        time.sleep(self.delay)
        self.calls.append([f.text for f in facts])
        if apply:
            now = time.monotonic()
            self.committed.extend((now, f.text) for f in facts)
        decisions = [Decision("add", f, None, (), policy, "new", memory_id=f.text) for f in facts]
        return Outcome(decisions, {"embed": 0.001, "nli": 0.002, "decide": 0.0005})

    def recall(self, namespace: str, query: str, k: int = 10) -> list[tuple[Memory, float]]:
        return []

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        return None

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        return []

    def forget(self, namespace: str, memory_id: str) -> str:
        return memory_id

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]:
        raise NotImplementedError

    def list_review(self, namespace: str, limit: int = 100) -> list[Any]:
        return []

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> Any:
        raise NotImplementedError

    def events(self, namespace: str, after_seq: int = 0, limit: int = 1000) -> list[Event]:
        log = [Event(i, namespace, "add", f"m{i}", None, "strict", {}, 0.0) for i in (1, 2, 3)]
        return [e for e in log if e.seq > after_seq][:limit]


def _no_blank(fact: Fact) -> None:
    if not fact.text.strip():
        raise InvalidInput("fact text is empty")


def facts(n: int, prefix: str = "f") -> list[Fact]:
    return [Fact("ns", f"{prefix}{i}") for i in range(n)]


async def feed(items: Sequence[Fact], pause: float = 0.0) -> AsyncIterator[Fact]:
    for f in items:
        if pause:
            await asyncio.sleep(pause)
        yield f


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- the queue's per-source cap -----------------------------------------------------------------
def test_queue_caps_facts_of_one_source_per_batch() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0, max_source_facts=2))
    a, b = object(), object()
    for i, src in enumerate([a, b, a, b, a, b]):
        q.push(Entry(f"e{i}", "g", 1, 5, 0.0, source=src))
    batch, _ = q.take(0.0)
    assert batch is not None and [e.payload for e in batch.entries] == ["e0", "e1", "e2", "e3"]
    batch, _ = q.take(0.0)
    assert batch is not None and [e.payload for e in batch.entries] == ["e4", "e5"]


def test_queue_source_cap_keeps_arrival_order() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0, max_source_facts=1))
    s = object()
    q.push(Entry("s0", "g", 1, 5, 0.0, source=s))
    q.push(Entry("s1", "g", 1, 5, 0.0, source=s))
    q.push(Entry("u", "g", 1, 5, 0.0))  # a request of its own, behind the stream's second fact
    got = []
    while len(q):
        batch, _ = q.take(0.0)
        assert batch is not None
        got.append([e.payload for e in batch.entries])
    assert got == [["s0"], ["s1", "u"]]


def test_max_source_facts_is_range_checked() -> None:
    with pytest.raises(InvalidInput):
        QueueSettings(max_source_facts=0)


# -- typed timings ------------------------------------------------------------------------------
def test_timings_of_run_puts_untimed_work_in_other() -> None:
    t = Timings.of_run({"embed": 0.1, "nli": 0.2, "decide": 0.05, "store": 0.05}, 0.5)
    assert t.embed == 0.1 and t.decide == 0.05 and t.other == pytest.approx(0.1)
    assert t.model == pytest.approx(0.5)
    assert set(t.as_dict()) >= {"tokenize", "queue", "decide", "keys", "other", "total"}
    # the gate's parsing steps are the keys phase, not hidden in other
    t = Timings.of_run({"embed": 0.1, "identify": 0.15, "relate": 0.05, "nli": 0.2}, 0.55)
    assert t.keys == pytest.approx(0.2) and t.other == pytest.approx(0.05)


# -- the facade ---------------------------------------------------------------------------------
def engine_for(gate: FakeGate, **kw: Any) -> Engine:
    return Engine(gate, CoreSettings(**kw), validate=_no_blank)


def test_events_are_read_through_the_gate() -> None:
    """The core asks the gate for the audit log (it never reaches into the gate's store)."""
    gate = FakeGate()
    assert not hasattr(gate, "store")

    async def main() -> tuple[list[Event], Timings]:
        eng = engine_for(gate)
        await eng.start()
        try:
            return await eng.events("acme", 1, 1)
        finally:
            await eng.close()

    found, timings = run(main())
    assert [(e.seq, e.namespace, e.memory_id) for e in found] == [(2, "acme", "m2")]
    assert timings.store >= 0 and timings.total == timings.store


def test_triage_returns_typed_results_and_batches_concurrent_callers() -> None:
    gate = FakeGate(delay=0.05)

    async def main() -> list[Triaged]:
        eng = engine_for(gate)
        await eng.start()
        try:
            return list(
                await asyncio.gather(
                    *(eng.triage([Fact("ns", f"t{i}")], apply=True) for i in range(6))
                )
            )
        finally:
            await eng.close()

    out = run(main())
    assert [r.decisions[0].fact.text for r in out] == [f"t{i}" for i in range(6)]
    assert all(r.applied and r.timings.decide == 0.0005 for r in out)
    assert all(r.timings.tokenize >= 0 and r.timings.total >= r.timings.queue for r in out)
    assert len(gate.calls) < 6  # the five that waited behind the first shared a model call
    assert max(r.timings.batch_entries for r in out) > 1


def test_admission_refuses_only_beyond_max_queued_facts() -> None:
    gate = FakeGate()
    gate.gate_open.clear()

    async def main() -> tuple[int, int]:
        eng = engine_for(gate, max_queued_facts=4)
        await eng.start()
        tasks = [asyncio.ensure_future(eng.triage([Fact("ns", f"x{i}")])) for i in range(6)]
        await asyncio.sleep(0.05)
        gate.gate_open.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        await eng.close()
        shed = sum(isinstance(r, Overloaded) for r in results)
        return shed, sum(isinstance(r, Triaged) for r in results)

    shed, served = run(main())
    assert (shed, served) == (2, 4)


def test_stream_releases_each_fact_in_order_as_it_commits() -> None:
    gate = FakeGate(delay=0.01)

    async def main() -> list[tuple[int, float]]:
        eng = engine_for(gate)
        await eng.start()
        got = []
        async for item in eng.stream(feed(facts(20)), apply=True):
            got.append((item.index, time.monotonic()))
        await eng.close()
        return got

    got = run(main())
    assert [i for i, _ in got] == list(range(20))
    assert all(len(call) == 1 for call in gate.calls)  # one fact of the stream per model call
    # Each decision came out after its own commit and before the next fact's commit.
    commits = [t for t, _ in gate.committed]
    for (_, sent), committed, nxt in zip(got, commits, commits[1:] + [float("inf")], strict=True):
        assert committed <= sent <= nxt + 0.005


def test_stream_bad_fact_ends_the_stream_in_order() -> None:
    gate = FakeGate()
    items = facts(3) + [Fact("ns", "  ")] + facts(3, "g")

    async def main() -> tuple[list[int], BaseException | None]:
        eng = engine_for(gate)
        await eng.start()
        got: list[int] = []
        err = None
        try:
            async for item in eng.stream(feed(items), apply=True):
                got.append(item.index)
        except InvalidInput as exc:
            err = exc
        await eng.close()
        return got, err

    got, err = run(main())
    assert got == [0, 1, 2] and err is not None and "fact 3" in str(err)


def test_stop_streams_delivers_in_flight_and_names_the_last_committed_fact() -> None:
    gate = FakeGate(delay=0.02)

    async def main() -> tuple[list[int], str, float, float]:
        eng = engine_for(gate)
        await eng.start()
        got: list[int] = []
        loop = asyncio.get_running_loop()
        until = 0.0
        message = ""
        try:
            async for item in eng.stream(feed(facts(1000), pause=0.001), apply=True):
                got.append(item.index)
                if item.index == 5:
                    until = loop.time() + 0.3
                    eng.stop_streams(until)
        except Unavailable as exc:
            message = str(exc)
        stopped_at = time.monotonic() - loop.time()  # monotonic and loop.time() share a clock
        await eng.close()
        return got, message, until + stopped_at, stopped_at

    got, message, until_mono, _ = run(main())
    assert got == list(range(len(got))) and len(got) < 1000
    assert message == shutdown_message(got[-1])
    committed = [text for _, text in gate.committed]
    assert committed == [f"f{i}" for i in range(len(got))]  # a prefix, nothing beyond it
    assert all(t <= until_mono + 0.05 for t, _ in gate.committed)


@pytest.mark.parametrize("tail", [0.0, 0.4])
def test_a_batch_committing_past_the_cutoff_is_delivered_within_the_tail(tail: float) -> None:
    """A batch that started in time but commits after the cutoff (a loaded machine): with a
    tail the stream waits for it and delivers it; without one it is committed, not delivered,
    and the stream's last named fact falls one batch short of the store."""
    gate = FakeGate(delay=0.01)

    async def main() -> tuple[list[int], str]:
        eng = engine_for(gate)
        await eng.start()
        got: list[int] = []
        loop = asyncio.get_running_loop()
        message = ""
        try:
            async for item in eng.stream(feed(facts(1000), pause=0.001), apply=True):
                got.append(item.index)
                if item.index == 5:
                    gate.gate_open.clear()  # the next batch stalls in the gate...
                    eng.stop_streams(loop.time() + 0.1, tail=tail)
                    loop.call_later(0.25, gate.gate_open.set)  # ...and commits after the cutoff
        except Unavailable as exc:
            message = str(exc)
        await eng.close()
        return got, message

    got, message = run(main())
    committed = [text for _, text in gate.committed]
    assert message == shutdown_message(got[-1])
    if tail:
        assert committed == [f"f{i}" for i in range(len(got))]  # committed = delivered
    else:
        assert len(committed) > len(got)  # the race the tail closes


def test_cutoff_refuses_work_that_would_end_after_it() -> None:
    gate = FakeGate(delay=0.2)

    async def main() -> list[Any]:
        eng = engine_for(gate)
        await eng.start()
        await eng.triage([Fact("ns", "warm")])  # measures ~0.2 s per fact
        loop = asyncio.get_running_loop()
        gate.gate_open.clear()
        first = asyncio.ensure_future(eng.triage([Fact("ns", "a")], apply=True))
        await asyncio.sleep(0.02)  # "a" is in the model
        later = [
            asyncio.ensure_future(eng.triage([Fact("ns", f"b{i}")], apply=True)) for i in range(3)
        ]
        await asyncio.sleep(0.02)
        eng.stop_streams(loop.time() + 0.25)
        gate.gate_open.set()
        out = await asyncio.gather(first, *later, return_exceptions=True)
        await eng.close()
        return out

    out = run(main())
    assert isinstance(out[0], Triaged)
    assert all(isinstance(r, Unavailable) for r in out[1:])
    assert [t for _, t in gate.committed] == ["a"]


def test_sync_engine_serves_scripts_through_the_same_batching() -> None:
    gate = FakeGate(delay=0.01)
    with SyncEngine(engine_for(gate)) as eng:
        triaged = eng.triage(facts(3), apply=False)
        assert [d.fact.text for d in triaged.decisions] == ["f0", "f1", "f2"]
        streamed = list(eng.stream(iter(facts(10, "s")), apply=True))
        assert [s.index for s in streamed] == list(range(10))
        assert all(s.applied for s in streamed)
        hits = eng.recall("ns", "anything")
        assert hits.hits == ()
    assert [t for _, t in gate.committed] == [f"s{i}" for i in range(10)]


def test_the_core_imports_no_grpc() -> None:
    code = "import sys, engine.core; print('grpc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_deadline_the_queue_cannot_meet_is_refused_at_the_door() -> None:
    gate = FakeGate(delay=0.05)

    async def main() -> tuple[list[Any], Any]:
        eng = engine_for(gate)
        await eng.start()
        loop = asyncio.get_running_loop()
        await eng.triage([Fact("ns", "warm")])  # measures ~0.05 s per fact
        gate.gate_open.clear()
        queued = [asyncio.ensure_future(eng.triage([Fact("ns", f"q{i}")])) for i in range(20)]
        await asyncio.sleep(0.01)
        # ~21 facts ahead at 0.05 s: about 1 s of work; 0.3 s cannot be met, 30 s can.
        short = await asyncio.gather(
            eng.triage([Fact("ns", "short")], deadline=loop.time() + 0.3), return_exceptions=True
        )
        patient = asyncio.ensure_future(
            eng.triage([Fact("ns", "patient")], deadline=loop.time() + 30)
        )
        await asyncio.sleep(0.01)
        gate.gate_open.set()
        out = await asyncio.gather(*queued, patient, return_exceptions=True)
        await eng.close()
        return out, short[0]

    out, short = run(main())
    assert isinstance(short, Overloaded) and "deadline" in str(short)
    assert all(isinstance(r, Triaged) for r in out)
    assert "short" not in {t for call in gate.calls for t in call}


# -- checked once: the edge's checks, policy and encodings reach the gate as they are -----------
@dataclass(frozen=True)
class _Tok:
    """What a tokenizer hands the core: a token count, and the encoding it carries along."""

    tokens: int
    text: str


class _Recording(FakeGate):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[Sequence[Fact], Any, dict[str, Any] | None]] = []

    def triage(self, facts: Sequence[Fact], policy: Any = "strict", **kw: Any) -> Outcome:
        self.seen.append((facts, policy, kw.get("overrides")))
        return super().triage(facts, "resolved" if policy is not None else "?", **kw)


def test_the_gate_gets_checked_facts_the_resolved_policy_and_their_encodings() -> None:
    from engine.types import ValidFacts

    gate = _Recording()
    checked: list[str] = []
    resolved: list[tuple[str, dict[str, Any]]] = []

    def validate(fact: Fact) -> None:
        checked.append(fact.text)
        _no_blank(fact)

    def check_policy(name: str, overrides: Any) -> tuple[str, tuple[tuple[str, Any], ...]]:
        resolved.append((name, dict(overrides)))
        return (name, tuple(sorted(overrides.items())))  # hashable, as the gate's Policy is

    def tokenizer(texts: Sequence[str]) -> list[_Tok]:
        return [_Tok(len(t.split()) + 2, t) for t in texts]

    async def main() -> list[Triaged]:
        eng = Engine(
            gate,  # type: ignore[arg-type]
            CoreSettings(),
            validate=validate,
            check_policy=check_policy,
            tokenizer=tokenizer,
        )
        await eng.start()
        try:
            one = await eng.triage([Fact("ns", "a b"), Fact("ns", "c")], overrides={"top_k": 3})
            # facts the caller checked (the server, as it decodes) are not checked again
            two = await eng.triage(ValidFacts([Fact("ns", "d")]), apply=True)
            with pytest.raises(InvalidInput, match="fact 1: fact text is empty"):
                await eng.triage([Fact("ns", "e"), Fact("ns", " ")])
            return [one, two]
        finally:
            await eng.close()

    run(main())
    assert checked == ["a b", "c", "e", " "]  # once each: "d" came checked
    # resolved once per distinct (policy, overrides), not per request
    assert resolved == [("strict", {"top_k": 3}), ("strict", {})]
    (facts1, policy1, ov1), (facts2, policy2, ov2) = gate.seen
    assert isinstance(facts1, ValidFacts) and [f.text for f in facts1] == ["a b", "c"]
    assert policy1 == ("strict", (("top_k", 3),)) and ov1 is None  # resolved, handed on as is
    assert facts1.encoded == (_Tok(4, "a b"), _Tok(3, "c"))  # tokenised once, carried along
    assert isinstance(facts2, ValidFacts) and facts2.encoded == (_Tok(3, "d"),)
    assert policy2 == ("strict", ())


def test_without_the_edge_checks_the_gate_checks_itself() -> None:
    """An engine without ``validate`` hands plain facts, the policy's name and the overrides
    on: nothing unchecked is passed off as checked."""
    from engine.types import ValidFacts

    gate = _Recording()

    async def main() -> None:
        eng = Engine(gate, CoreSettings(), check_policy=lambda n, o: (n,))  # type: ignore[arg-type]
        await eng.start()
        try:
            await eng.triage(ValidFacts([Fact("ns", "x")]), overrides={"top_k": 3})
        finally:
            await eng.close()

    run(main())
    ((facts_, policy, overrides),) = gate.seen
    assert not isinstance(facts_, ValidFacts) and policy == "strict"
    assert overrides == {"top_k": 3}
