"""The dynamic batcher without a model: the pure token-budget queue with synthetic requests and a
fake clock, admission permits, and the asyncio driver over a fake ``run``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.admission import Permits
from engine.core.batcher import Batcher
from engine.core.queue import Entry, QueueSettings, TokenBudgetQueue, estimate_tokens
from engine.errors import DeadlineExceeded, InvalidInput, StorageError, Unavailable


def entry(
    name: str,
    t: float = 0.0,
    *,
    group: Hashable = "g",
    facts: int = 1,
    tokens: int = 10,
    deadline: float | None = None,
) -> Entry[str]:
    return Entry(name, group, facts, tokens, t, deadline)


def names(batch: Any) -> list[str]:
    return [e.payload for e in batch.entries]


# -- the pure queue ------------------------------------------------------------------------------
def test_settings_are_range_checked() -> None:
    for bad in (
        {"max_batch_tokens": 8},
        {"max_batch_facts": 0},
        {"max_wait_s": -0.001},
        {"max_wait_s": 2.0},
    ):
        with pytest.raises(InvalidInput):
            QueueSettings(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        entry("x", facts=0)


def test_estimate_tokens_counts_specials() -> None:
    assert estimate_tokens("") == 2
    assert estimate_tokens("x" * 40) == 12


def test_partial_batch_waits_for_max_wait() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.002))
    assert q.wake_at() is None
    q.push(entry("a", 1.0))
    assert q.wake_at() == pytest.approx(1.002)
    batch, dropped = q.take(1.001)
    assert batch is None and dropped == []
    batch, _ = q.take(1.002)
    assert batch is not None and names(batch) == ["a"]
    assert batch.started == 1.002 and len(q) == 0 and q.pending_facts == 0


def test_zero_wait_dispatches_at_once() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0))
    q.push(entry("a", 5.0))
    batch, _ = q.take(5.0)
    assert batch is not None and names(batch) == ["a"]


def test_full_batch_by_facts_goes_without_waiting() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_batch_facts=4, max_wait_s=1.0))
    for i in range(6):
        q.push(entry(f"e{i}"))
    batch, _ = q.take(0.0)
    assert batch is not None and names(batch) == ["e0", "e1", "e2", "e3"] and batch.facts == 4
    batch, _ = q.take(0.0)
    assert batch is None  # two left: not full, not waited long enough
    batch, _ = q.take(1.0)
    assert batch is not None and names(batch) == ["e4", "e5"]


def test_token_budget_cuts_batches_in_arrival_order() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_batch_tokens=100, max_wait_s=0))
    for i, tokens in enumerate([40, 40, 40, 10]):
        q.push(entry(f"e{i}", tokens=tokens))
    assert q.pending_tokens == 130
    first, _ = q.take(0.0)
    second, _ = q.take(0.0)
    assert first is not None and names(first) == ["e0", "e1"] and first.tokens == 80
    # e3 would fit after e2, and it does: the order is kept, nothing jumps the queue.
    assert second is not None and names(second) == ["e2", "e3"]


def test_request_over_the_budget_goes_alone_and_whole() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_batch_tokens=100, max_wait_s=0))
    q.push(entry("big", facts=50, tokens=5000))
    q.push(entry("small"))
    batch, _ = q.take(0.0)
    assert batch is not None and names(batch) == ["big"] and batch.facts == 50
    batch, _ = q.take(0.0)
    assert batch is not None and names(batch) == ["small"]


def test_groups_never_share_a_batch_and_the_oldest_goes_first() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0))
    q.push(entry("b1", 0.0, group="B"))
    q.push(entry("a1", 0.1, group="A"))
    q.push(entry("b2", 0.2, group="B"))
    q.push(entry("a2", 0.3, group="A"))
    first, _ = q.take(1.0)
    second, _ = q.take(1.0)
    assert first is not None and first.group == "B" and names(first) == ["b1", "b2"]
    assert second is not None and second.group == "A" and names(second) == ["a1", "a2"]


def test_a_full_group_does_not_wait_behind_a_waiting_one() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_batch_facts=2, max_wait_s=1.0))
    q.push(entry("a1", 0.0, group="A"))
    q.push(entry("b1", 0.1, group="B"))
    q.push(entry("b2", 0.2, group="B"))
    batch, _ = q.take(0.3)
    assert batch is not None and batch.group == "B"
    assert q.wake_at() == pytest.approx(1.0)


def test_cancelled_and_expired_entries_never_reach_a_batch() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0))
    gone = entry("cancelled")
    late = entry("late", deadline=0.5)
    q.push(gone)
    q.push(late)
    q.push(entry("ok", deadline=5.0))
    gone.cancel()
    assert q.pending_facts == 3
    batch, dropped = q.take(1.0)
    assert batch is not None and names(batch) == ["ok"]
    assert {e.payload for e in dropped} == {"cancelled", "late"}
    assert late.expired(1.0) and not late.cancelled
    assert len(q) == 0 and q.pending_facts == 0 and q.pending_tokens == 0


def test_drain_empties_the_queue() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue()
    q.push(entry("a", group="A"))
    q.push(entry("b", group="B"))
    assert [e.payload for e in q.drain()] == ["a", "b"]
    assert len(q) == 0 and q.take(10.0) == (None, [])


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from("ABC"),
            st.integers(1, 5),
            st.integers(0, 120),
            st.booleans(),
        ),
        st.tuples(st.just("take"), st.floats(0, 0.01)),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_every_live_entry_is_served_once_within_budget_and_in_order(ops: list[Any]) -> None:
    s = QueueSettings(max_batch_tokens=100, max_batch_facts=8, max_wait_s=0.002)
    q: TokenBudgetQueue[int] = TokenBudgetQueue(s)
    now = 0.0
    pushed: list[Entry[int]] = []
    served: list[int] = []
    dropped: list[int] = []

    def take(at: float) -> None:
        batch, gone = q.take(at)
        dropped.extend(e.payload for e in gone)
        if batch is None:
            return
        assert len({e.group for e in batch.entries}) == 1
        assert batch.facts == sum(e.facts for e in batch.entries)
        if len(batch.entries) > 1:
            assert batch.facts <= s.max_batch_facts and batch.tokens <= s.max_batch_tokens
        assert not any(e.cancelled or e.expired(at) for e in batch.entries)
        served.extend(e.payload for e in batch.entries)

    for op in ops:
        if op[0] == "push":
            _, group, facts, tokens, with_deadline = op
            e = Entry(
                len(pushed), group, facts, tokens, now, now + 0.005 if with_deadline else None
            )
            pushed.append(e)
            q.push(e)
        elif op[0] == "take":
            now += op[1]
            take(now)
        elif pushed:
            pushed[op[1] % len(pushed)].cancel()
        assert q.pending_facts >= 0 and len(q) >= 0
    for _ in range(len(pushed) + 1):
        take(now)  # what is left is all ready now (max_wait_s passed or nothing left)
        now += 0.01
    assert len(q) == 0
    assert sorted(served + dropped) == list(range(len(pushed)))
    by_group: dict[Hashable, list[int]] = {}
    for i in served:
        by_group.setdefault(pushed[i].group, []).append(i)
    assert all(ids == sorted(ids) for ids in by_group.values())


# -- admission permits ---------------------------------------------------------------------------
def test_permits_are_all_or_nothing() -> None:
    p = Permits(10)
    assert p.try_acquire(7) and p.in_use == 7
    assert not p.try_acquire(4) and p.in_use == 7
    assert p.try_acquire(3) and p.available == 0
    seen: list[int] = []
    undo = p.on_release(lambda: seen.append(p.available))
    p.release(5)
    undo()
    p.release(5)
    assert seen == [5] and p.in_use == 0
    with pytest.raises(InvalidInput):
        p.release(1)
    with pytest.raises(InvalidInput):
        Permits(0)


def test_permits_follow_the_measured_rate_within_the_hard_cap() -> None:
    p = Permits(100, max_delay_s=0.5, min_limit=1, smoothing=0.5)
    assert p.current_limit == 100 and p.rate is None  # nothing measured: the hard cap
    p.observe(10, 1.0)
    assert p.rate == 10 and p.current_limit == 5  # 10 facts/s x 0.5 s
    p.observe(30, 1.0)
    assert p.rate == 20 and p.current_limit == 10  # smoothed
    p.observe(0, 1.0)
    assert p.rate == 20  # empty samples are ignored
    assert p.try_acquire(8)  # an idle server admits within the hard cap...
    assert not p.try_acquire(3)  # ...a busy one only within the budget
    assert p.try_acquire(2) and p.available == 0
    p.release(10)
    assert p.try_acquire(40)  # idle again: a large request goes alone
    assert not p.try_acquire(1)
    p.release(40)
    assert not p.try_acquire(101)  # never above the hard cap
    slow = Permits(100, max_delay_s=0.5, min_limit=1, smoothing=1.0)
    slow.observe(1, 1000.0)
    assert slow.current_limit == 1  # never below one
    floored = Permits(100, max_delay_s=0.5, smoothing=1.0)  # default floor: 16 facts
    floored.observe(1, 1000.0)
    assert floored.current_limit == 16 and Permits(8, max_delay_s=0.5).min_limit == 8
    with pytest.raises(InvalidInput):
        Permits(10, max_delay_s=0)


# -- the asyncio driver over a fake model --------------------------------------------------------
class FakeModel:
    """Records every batch; ``hold`` blocks the worker so callers pile up behind it."""

    def __init__(self) -> None:
        self.batches: list[tuple[Hashable, list[Any]]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.fail: BaseException | None = None

    def __call__(self, group: Hashable, payloads: list[Any]) -> list[Any]:
        self.entered.set()
        self.hold.wait(30)
        self.batches.append((group, list(payloads)))
        if self.fail is not None:
            raise self.fail
        return [ValueError(p) if p == "bad" else f"{p}!" for p in payloads]


def drive(test: Any, **kw: Any) -> Any:
    """Run ``test(batcher, model, executor)`` on a fresh loop with a one-thread worker."""
    model = FakeModel()
    dead: list[BaseException] = []
    ran: list[tuple[int, float]] = []

    async def main() -> Any:
        with ThreadPoolExecutor(1) as ex:
            b: Batcher[str, str] = Batcher(
                model,
                QueueSettings(**kw),
                executor=ex,
                on_dead=dead.append,
                on_batch=lambda batch, secs: ran.append((batch.facts, secs)),
            )
            b.start()
            try:
                return await asyncio.wait_for(test(b, model), 30)
            finally:
                model.hold.set()
                await b.close()

    result = asyncio.run(main())
    ok_batches = [len(p) for _, p in model.batches] if model.fail is None else []
    if ok_batches:
        assert [f for f, _ in ran][: len(ok_batches)] == ok_batches[: len(ran)]
        assert all(secs >= 0 for _, secs in ran)
    return result, model, dead


async def wait_entered(model: FakeModel) -> None:
    for _ in range(3000):
        if model.entered.is_set():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the worker never started")


def test_concurrent_requests_share_one_model_call() -> None:
    async def test(b: Batcher[str, str], model: FakeModel) -> list[Any]:
        model.hold.clear()
        first = asyncio.ensure_future(b.submit("first", group="g", facts=1, tokens=5))
        await wait_entered(model)
        rest = [
            asyncio.ensure_future(b.submit(f"r{i}", group="g", facts=1, tokens=5)) for i in range(5)
        ]
        await asyncio.sleep(0)
        model.hold.set()
        return await asyncio.gather(first, *rest)

    served, model, dead = drive(test, max_wait_s=0.0)
    assert [s.result for s in served] == ["first!"] + [f"r{i}!" for i in range(5)]
    assert [len(p) for _, p in model.batches] == [1, 5]
    assert served[1].batch_facts == 5 and served[1].batch_entries == 5 and not dead
    assert all(s.queued_s >= 0 for s in served)


def test_per_request_errors_stay_with_their_request() -> None:
    async def test(b: Batcher[str, str], model: FakeModel) -> list[Any]:
        calls = [b.submit(p, group="g", facts=1, tokens=1) for p in ("ok", "bad", "ok2")]
        return await asyncio.gather(*calls, return_exceptions=True)

    out, model, dead = drive(test, max_wait_s=0.001)
    assert out[0].result == "ok!" and isinstance(out[1], ValueError) and out[2].result == "ok2!"
    assert len(model.batches) == 1 and not dead


def test_a_failed_batch_fails_its_requests_and_the_worker_lives() -> None:
    async def test(b: Batcher[str, str], model: FakeModel) -> Any:
        model.fail = RuntimeError("boom")
        out = await asyncio.gather(
            b.submit("x", group="g", facts=1, tokens=1), return_exceptions=True
        )
        model.fail = None
        after = await b.submit("y", group="g", facts=1, tokens=1)
        return out, after, b.alive

    (out, after, alive), _, dead = drive(test)
    assert isinstance(out[0], RuntimeError) and after.result == "y!" and alive and not dead


def test_a_storage_failure_kills_the_worker() -> None:
    async def test(b: Batcher[str, str], model: FakeModel) -> Any:
        model.fail = StorageError("disk I/O error")
        out = await asyncio.gather(
            b.submit("x", group="g", facts=1, tokens=1), return_exceptions=True
        )
        with pytest.raises(Unavailable):
            await b.submit("y", group="g", facts=1, tokens=1)
        return out, b.alive, b.dead

    (out, alive, why), _, dead = drive(test)
    assert isinstance(out[0], Unavailable) and not alive
    assert isinstance(why, StorageError) and len(dead) == 1


def test_expired_and_cancelled_requests_are_dropped_before_the_model() -> None:
    async def test(b: Batcher[str, str], model: FakeModel) -> Any:
        loop = asyncio.get_running_loop()
        model.hold.clear()
        blocker = asyncio.ensure_future(b.submit("blocker", group="g", facts=1, tokens=1))
        await wait_entered(model)
        late = asyncio.ensure_future(
            b.submit("late", group="g", facts=1, tokens=1, deadline=loop.time() + 0.001)
        )
        gone = asyncio.ensure_future(b.submit("gone", group="g", facts=1, tokens=1))
        kept = asyncio.ensure_future(b.submit("kept", group="g", facts=1, tokens=1))
        await asyncio.sleep(0.01)  # the deadline passes while the worker is held
        gone.cancel()
        model.hold.set()
        out = await asyncio.gather(blocker, late, kept, return_exceptions=True)
        with pytest.raises(DeadlineExceeded):
            await b.submit("past", group="g", facts=1, tokens=1, deadline=loop.time() - 1)
        return out

    out, model, _ = drive(test, max_wait_s=0.0)
    assert isinstance(out[1], DeadlineExceeded) and out[2].result == "kept!"
    seen = [p for _, batch in model.batches for p in batch]
    assert seen == ["blocker", "kept"]


def test_close_serves_what_is_queued_then_refuses() -> None:
    async def test(b: Batcher[str, str], model: FakeModel) -> Any:
        calls = [
            asyncio.ensure_future(b.submit(f"q{i}", group="g", facts=1, tokens=1)) for i in range(3)
        ]
        await asyncio.sleep(0)
        await b.close()
        with pytest.raises(Unavailable):
            await b.submit("after", group="g", facts=1, tokens=1)
        return await asyncio.gather(*calls)

    out, _, _ = drive(test, max_wait_s=0.5)
    assert [s.result for s in out] == ["q0!", "q1!", "q2!"]


def test_flush_makes_a_partial_batch_ready() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=1.0))
    q.push(entry("a"))
    assert q.take(0.0)[0] is None
    batch, _ = q.take(0.0, flush=True)
    assert batch is not None and names(batch) == ["a"]


def test_past_the_cutoff_the_queue_is_refused_at_once_and_the_driver_sleeps() -> None:
    """A request waiting (here for the one lane) when the shutdown cutoff passes is refused
    then, not when a lane frees; and the driver does not wake again and again at a cutoff
    already gone (that spin held the GIL from the lane committing the last batch)."""

    async def test(b: Batcher[str, str], model: FakeModel) -> tuple[Any, int, bool]:
        wakes = 0
        assert b._wake is not None
        clear = b._wake.clear

        def counted() -> None:
            nonlocal wakes
            wakes += 1
            clear()

        b._wake.clear = counted  # type: ignore[method-assign]
        model.hold.clear()
        first = asyncio.ensure_future(b.submit("first", group="g", facts=1, tokens=1))
        await wait_entered(model)
        second = asyncio.ensure_future(b.submit("second", group="h", facts=1, tokens=1))
        await asyncio.sleep(0.01)
        b.cut_off_at(asyncio.get_running_loop().time() + 0.05)
        await asyncio.sleep(0.3)  # the cutoff passes while the first batch is held
        refused_while_held = second.done() and isinstance(second.exception(), Unavailable)
        model.hold.set()
        return await first, wakes, refused_while_held

    (served, wakes, refused), _, dead = drive(test, max_wait_s=0.0)
    assert served.result == "first!" and not dead
    assert refused
    assert wakes < 20, wakes  # a handful of wake-ups, not one per turn of the loop
