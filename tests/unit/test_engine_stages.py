"""Issue 34: the engine's stages without a model. Lanes per namespace set (FIFO per lock in the
queue), the model stage (forwards on one thread, model seconds charged to their caller, stall
detection with a fake clock), admission that counts model time only, and the warm-up prime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from engine.core import CoreSettings, Engine, Entry, QueueSettings, TokenBudgetQueue, Triaged
from engine.core.stage import Budget, ModelStage, Staged
from engine.errors import InvalidInput, NamespaceBusy, Unavailable
from engine.types import Decision, Fact


# -- the queue's locks ---------------------------------------------------------------------------
def _entry(name: str, group: str, t: float, locks: set[str]) -> Entry[str]:
    return Entry(name, group, 1, 4, t, locks=frozenset(locks))


def _names(batch: Any) -> list[str]:
    return [e.payload for e in batch.entries]


def test_a_running_batch_holds_its_locks_and_other_locks_go_by() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0))
    q.push(_entry("a1", "A", 0.0, {"a"}))
    first, _ = q.take(0.0)
    assert first is not None and _names(first) == ["a1"] and q.held == {"a"}
    q.push(_entry("a2", "A", 0.1, {"a"}))
    q.push(_entry("b1", "B", 0.2, {"b"}))
    second, _ = q.take(1.0)
    assert second is not None and _names(second) == ["b1"]  # a2 waits for a1's lock
    assert q.take(1.0)[0] is None and q.wake_at() is None  # nothing startable: no busy wake
    q.finished(first)
    third, _ = q.take(1.0)
    assert third is not None and _names(third) == ["a2"]


def test_locks_are_fifo_across_groups() -> None:
    # An older entry of another group that claims lock "b" goes before a newer one of "b",
    # even while the older one itself waits for lock "a".
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0))
    q.push(_entry("a1", "A", 0.0, {"a"}))
    running, _ = q.take(0.0)
    assert running is not None
    q.push(_entry("ab", "AB", 0.1, {"a", "b"}))
    q.push(_entry("b1", "B", 0.2, {"b"}))
    q.push(_entry("c1", "C", 0.3, {"c"}))
    batch, _ = q.take(1.0)
    assert batch is not None and _names(batch) == ["c1"]
    assert q.take(1.0)[0] is None
    q.finished(running)
    batch, _ = q.take(1.0)
    assert batch is not None and _names(batch) == ["ab"]
    q.finished(batch)
    batch, _ = q.take(1.0)
    assert batch is not None and _names(batch) == ["b1"]


def test_entries_of_one_group_still_share_a_batch() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(max_wait_s=0.0))
    for i in range(5):
        q.push(_entry(f"a{i}", "A", 0.01 * i, {"a"}))
    batch, _ = q.take(1.0)
    assert batch is not None and _names(batch) == [f"a{i}" for i in range(5)]


# -- the model stage -----------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SplitModel:
    """A runtime with tokenize / bucket / forward / postprocess; its forward advances the fake
    clock by ``cost`` per item and can be held. Records the thread of every step."""

    def __init__(self, clock: FakeClock, cost: float) -> None:
        self.clock = clock
        self.cost = cost
        self.threads: Counter[str] = Counter()
        self.calls: list[list[str]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.dim = 2

    def tokenize(self, items: Sequence[str]) -> tuple[list[str], int]:
        self.threads["tokenize:" + threading.current_thread().name] += 1
        return list(items), 0

    def bucket(self, encodings: Sequence[str], *, clipped: int = 0) -> list[str]:
        return list(encodings)

    def forward(self, prepared: list[str]) -> list[str]:
        self.threads["forward:" + threading.current_thread().name] += 1
        assert self.hold.wait(10)
        self.calls.append(list(prepared))
        self.clock.now += self.cost * len(prepared)
        return prepared

    def postprocess(self, outputs: list[str], prepared: list[str]) -> np.ndarray:
        return np.asarray([[float(len(x)), 1.0] for x in outputs], dtype=np.float32)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.postprocess(self.forward(self.bucket(texts)), list(texts))


def test_forwards_run_on_the_model_thread_and_are_charged_to_their_caller() -> None:
    clock = FakeClock()
    stage = ModelStage(clock=clock)
    model = SplitModel(clock, cost=0.5)
    staged = Staged(model, stage)
    try:
        with stage.charged() as charge:
            out = staged.embed(["x", "y"])
            clock.now += 7.0  # a lock wait on this thread is not model time
        assert out.shape == (2, 2) and staged.dim == 2
        assert charge.seconds == pytest.approx(1.0)
        assert model.threads["forward:memgate-model"] == 1
        assert model.threads["tokenize:memgate-model"] == 0  # tokenising stays on the caller
        assert stage.forwards == 1 and stage.busy_s == pytest.approx(1.0)
    finally:
        stage.close()


def test_a_held_forward_is_a_stall_once_work_waits_and_clears_after() -> None:
    clock = FakeClock()
    stage = ModelStage(clock=clock)
    model = SplitModel(clock, cost=0.0)
    staged = Staged(model, stage)
    try:
        assert stage.stalled_s() == 0.0  # no work: never stalled
        model.hold.clear()
        t = threading.Thread(target=staged.embed, args=(["x"],))
        t.start()
        for _ in range(1000):
            if stage.waiting:
                break
            time.sleep(0.001)
        clock.now += 45.0
        assert stage.stalled_s() == pytest.approx(45.0)
        model.hold.set()
        t.join(10)
        assert stage.stalled_s() == 0.0 and stage.waiting == 0
    finally:
        model.hold.set()
        stage.close()


# -- the engine over lanes -----------------------------------------------------------------------
@dataclass
class Outcome:
    decisions: list[Decision]
    timings: dict[str, float] = field(default_factory=dict)


class LaneGate:
    """A gate whose triage embeds through ``embedder`` (staged or not), can be held per
    namespace, and records how many calls of each namespace overlap."""

    def __init__(self, embedder: Any = None) -> None:
        self.embedder = embedder
        self.held: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = {}
        self._guard = threading.Lock()
        self.active: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.most_total = 0
        self.wait_s = 0.0

    def hold(self, ns: str) -> None:
        self.held[ns] = threading.Event()
        self.entered[ns] = threading.Event()

    def triage(
        self,
        facts: Sequence[Fact],
        policy: str = "strict",
        *,
        apply: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> Outcome:
        names = {f.namespace for f in facts}
        with self._guard:
            for ns in names:
                self.active[ns] += 1
                self.most[ns] = max(self.most[ns], self.active[ns])
            self.most_total = max(self.most_total, sum(self.active.values()))
        try:
            if self.embedder is not None:
                self.embedder.embed([f.text for f in facts])
            for ns in names:
                if apply and ns in self.held:  # a write waiting on the namespace's lock
                    self.entered[ns].set()
                    assert self.held[ns].wait(10)
            if self.wait_s:
                time.sleep(self.wait_s)  # a store / lock wait: not model time
        finally:
            with self._guard:
                for ns in names:
                    self.active[ns] -= 1
        return Outcome(
            [Decision("add", f, None, (), policy, "new", memory_id=f.text) for f in facts]
        )

    def recall(self, namespace: str, query: str, k: int = 10) -> list[Any]:
        return []


def test_a_held_namespace_holds_up_no_other_and_one_namespace_never_overlaps() -> None:
    gate = LaneGate()
    gate.hold("hot")

    async def main() -> tuple[list[Triaged], bool]:
        eng = Engine(gate, CoreSettings(lanes=4))  # type: ignore[arg-type]
        await eng.start()
        try:
            hot = asyncio.ensure_future(eng.triage([Fact("hot", "held")], apply=True))
            await asyncio.get_running_loop().run_in_executor(None, gate.entered["hot"].wait, 10)
            hot_later = asyncio.ensure_future(eng.triage([Fact("hot", "later")], apply=True))
            cold = await asyncio.gather(
                *(eng.triage([Fact(f"cold{i % 3}", f"c{i}")], apply=True) for i in range(12))
            )
            hot_waiting = not hot.done() and not hot_later.done()
            gate.held["hot"].set()
            await asyncio.gather(hot, hot_later)
            return list(cold), hot_waiting
        finally:
            gate.held["hot"].set()
            await eng.close()

    cold, hot_waiting = asyncio.run(main())
    assert [r.decisions[0].fact.text for r in cold] == [f"c{i}" for i in range(12)]
    assert hot_waiting  # the cold namespaces were all answered while hot was held
    assert max(gate.most.values()) == 1  # never two batches of one namespace at once
    assert gate.most_total >= 2  # and other namespaces ran beside it


def test_the_rate_estimate_counts_model_time_not_lock_waits() -> None:
    clock = FakeClock()
    stage = ModelStage(clock=clock)
    gate = LaneGate(Staged(SplitModel(clock, cost=0.01), stage))
    gate.wait_s = 0.05  # each call also waits on a "lock", in real time

    async def main() -> float | None:
        eng = Engine(gate, CoreSettings(lanes=2), stage=stage)  # type: ignore[arg-type]
        await eng.start()
        try:
            await eng.triage([Fact("ns", f"f{i}") for i in range(4)], apply=True)
            return eng.seconds_per_fact
        finally:
            await eng.close()

    per_fact = asyncio.run(main())
    # 0.01 s of forwards per fact, plus the lane's CPU (microseconds): the 0.05 s lock wait
    # per call (0.0125 s per fact) is not in it.
    assert per_fact is not None and 0.01 <= per_fact < 0.01 + 0.0125 / 2


def test_warm_up_primes_admission_so_a_fresh_engine_admits_a_large_write() -> None:
    gate = LaneGate()
    primed: list[float] = []

    def warm() -> float:
        primed.append(1.0)
        return 0.02

    async def main() -> tuple[float | None, float | None, Triaged]:
        eng = Engine(gate, CoreSettings(), warm=warm)  # type: ignore[arg-type]
        await eng.start()
        try:
            before = eng.seconds_per_fact
            await eng.warm_up()
            after = eng.seconds_per_fact
            deadline = asyncio.get_running_loop().time() + 30.0
            out = await eng.triage(
                [Fact("fresh", f"fact {i}") for i in range(64)], apply=True, deadline=deadline
            )
            return before, after, out
        finally:
            await eng.close()

    before, after, out = asyncio.run(main())
    assert before is None and after == pytest.approx(0.02) and primed == [1.0]
    assert len(out.decisions) == 64


def test_lanes_and_stall_are_range_checked() -> None:
    with pytest.raises(InvalidInput):
        CoreSettings(lanes=0)
    with pytest.raises(InvalidInput):
        CoreSettings(stall_s=0.0)


def test_namespace_busy_is_a_retryable_unavailable() -> None:
    assert issubclass(NamespaceBusy, Unavailable)


def test_calls_waiting_together_share_one_model_call_and_large_calls_go_in_pieces() -> None:
    clock = FakeClock()
    stage = ModelStage(clock=clock)
    model = SplitModel(clock, cost=1.0)
    staged = Staged(model, stage, budget=Budget(tokens=1024, chunk_tokens=1024, chunk_items=4))
    release = threading.Event()
    try:
        holder = threading.Thread(target=stage.run, args=(release.wait, 10))
        holder.start()  # the model thread is busy: the next calls wait together
        got: dict[str, Any] = {}
        charges: dict[str, float] = {}

        def call(name: str, texts: list[str]) -> None:
            with stage.charged() as charge:
                got[name] = staged.embed(texts)
            charges[name] = charge.seconds

        lanes = [
            threading.Thread(target=call, args=("a", ["a1", "a22"])),
            threading.Thread(target=call, args=("b", ["b333"])),
        ]
        for t in lanes:
            t.start()
        for _ in range(2000):
            if stage.waiting >= 3:
                break
            time.sleep(0.001)
        release.set()
        for t in (holder, *lanes):
            t.join(10)
        assert sorted(map(sorted, model.calls)) == [["a1", "a22", "b333"]]  # one merged call
        assert got["a"][:, 0].tolist() == [2.0, 3.0] and got["b"][:, 0].tolist() == [4.0]
        # 3 s of forward shared by tokens: a has 2 + 3 of the call's 9, b has 4
        assert charges["a"] == pytest.approx(3.0 * 5 / 9) and charges["b"] == pytest.approx(
            3.0 * 4 / 9
        )
        model.calls.clear()
        big = staged.embed([f"t{i}" for i in range(10)])  # chunk_items 4: three trips
        assert [len(c) for c in model.calls] == [4, 4, 2] and big.shape == (10, 2)
    finally:
        release.set()
        stage.close()


def test_dry_runs_of_every_namespace_share_a_batch_and_wait_on_no_writer() -> None:
    gate = LaneGate()
    gate.hold("hot")
    seen: list[int] = []

    async def main() -> None:
        eng = Engine(gate, CoreSettings(lanes=2))  # type: ignore[arg-type]
        await eng.start()
        try:
            writer = asyncio.ensure_future(eng.triage([Fact("hot", "held write")], apply=True))
            await asyncio.get_running_loop().run_in_executor(None, gate.entered["hot"].wait, 10)
            dry = await asyncio.gather(
                *(eng.triage([Fact(ns, f"dry {ns}")]) for ns in ("hot", "a", "b", "c"))
            )
            seen.extend(r.timings.batch_facts for r in dry)
            assert not writer.done()  # the dry run of "hot" did not wait for its writer
            gate.held["hot"].set()
            await writer
        finally:
            gate.held["hot"].set()
            await eng.close()

    asyncio.run(main())
    assert max(seen) > 1  # dry runs of different namespaces shared a batch
