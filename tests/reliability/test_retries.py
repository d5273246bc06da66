"""Item 8: idempotent retries under injected UNAVAILABLE. Pass: 0 duplicates, 0 lost over 5,000
writes.

The faults come from :class:`FaultInjector`, a gRPC client interceptor handed to
``MemgateClient(interceptors=...)`` (a collaborator, not a monkeypatch). On a Write it either

* fails the call with UNAVAILABLE *before* sending it (the server never saw it),
* lets the call complete on the server and then drops the answer, failing it with UNAVAILABLE
  (the server committed: the retry must replay, not write again), or
* sends the call with its own deadline but stops waiting for it after a few milliseconds and
  reports UNAVAILABLE (the connection broke mid-call: the server may or may not have committed,
  and may commit it after the retry arrived). The server never sees a shortened deadline, so
  its deadline door is on, as in production.

Every fact carries an idempotency key, so the client retries UNAVAILABLE itself, with the same
keys. The facts are cheap for the gate (episodes, keyed updates, and free-text facts alone in
their namespace: no NLI pair), ten to a request, from ten writer threads.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402
from _proc import start_server  # noqa: E402
from _serving import ModelGate, chain_faults, running, stored  # noqa: E402

from engine.client import MemgateClient  # noqa: E402
from engine.errors import MemgateError  # noqa: E402
from engine.store import SQLiteStore  # noqa: E402
from engine.types import Decision, Fact  # noqa: E402

WRITE = "/memgate.v1.Memgate/Write"


class Unavailable(grpc.RpcError, grpc.Call, grpc.Future):  # type: ignore[misc]
    """A finished call that failed with UNAVAILABLE, as the channel would report a lost
    connection."""

    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple[()]:
        return ()

    def trailing_metadata(self) -> tuple[()]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> None:
        return None

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return False

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        raise self

    def exception(self, timeout: float | None = None) -> BaseException:
        return self

    def traceback(self, timeout: float | None = None) -> None:
        return None

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        fn(self)


class FaultInjector(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Fails a share ``rate`` of Write attempts with UNAVAILABLE, at most ``per_request`` times
    per request (so a client with enough attempts always gets through). A request is known by
    its first fact's idempotency key."""

    MODES = ("before", "after", "mid")

    def __init__(
        self, rate: float, seed: int, per_request: int = 2, weights: tuple[int, ...] = (2, 2, 1)
    ) -> None:
        self._rate = rate
        self._per_request = per_request
        self._weights = weights
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.faults: Counter[str] = Counter()
        self.by_request: dict[str, list[str]] = defaultdict(list)
        self.attempts = 0
        # Calls cut mid-way go on here after the client stopped waiting for them.
        self._cut_calls = ThreadPoolExecutor(64, thread_name_prefix="cut-call")

    def close(self) -> None:
        """Wait for the calls cut mid-way (after the client's channel closed, they end)."""
        self._cut_calls.shutdown(wait=True)

    def _choose(self, key: str) -> str | None:
        with self._lock:
            self.attempts += 1
            if len(self.by_request[key]) >= self._per_request or self._rng.random() >= self._rate:
                return None
            return self._rng.choices(self.MODES, self._weights)[0]

    def _record(self, key: str, mode: str) -> None:
        with self._lock:
            self.faults[mode] += 1
            self.by_request[key].append(mode)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        if details.method != WRITE or not request.facts:
            return continuation(details, request)
        key = request.facts[0].idempotency_key
        mode = self._choose(key)
        if mode is None:
            return continuation(details, request)
        if mode == "before":
            self._record(key, "before")
            return Unavailable("injected: connection lost before the request was sent")
        if mode == "mid":
            with self._lock:
                cut = self._rng.uniform(0.002, 0.15)
            call = self._cut_calls.submit(continuation, details, request)
            try:
                outcome = call.result(timeout=cut)
            except FutureTimeout:
                self._record(key, "mid")
                return Unavailable("injected: connection lost while the server worked")
            if isinstance(outcome, grpc.RpcError):
                return outcome  # the server refused it within the cut: nothing to lose
            mode = "after"  # it finished within the cut: its answer is lost like "after"
        else:
            outcome = continuation(details, request)
            if isinstance(outcome, grpc.RpcError):
                return outcome  # the server refused it: nothing to lose
        self._record(key, "after")
        return Unavailable("injected: connection lost after the server answered")


def _facts(w: int, r: int, size: int) -> list[Fact]:
    """One request of writer ``w``: mostly episodes, some keyed updates, some free-text facts
    alone in a fresh namespace. Every fact has its own idempotency key and a unique text."""
    out = []
    for j in range(size):
        n = r * size + j
        idem = f"w{w}-r{r}-f{j}"
        if n % 10 == 3:
            out.append(
                Fact(
                    f"retry/w{w}",
                    f"Setting {n % 4}: value {w}.{n}",
                    key=f"setting-{n % 4}",
                    idempotency_key=idem,
                )
            )
        elif n % 10 == 7:
            out.append(
                Fact(
                    f"retry/s{w}-{n}",
                    f"Writer {w} noted fact {n} about the depot.",
                    idempotency_key=idem,
                )
            )
        else:
            out.append(
                Fact(
                    f"retry/w{w}",
                    f"Writer {w} logged event {n}.",
                    kind="episodic",
                    idempotency_key=idem,
                )
            )
    return out


def test_idempotent_retries_under_injected_unavailable(
    make_gate: Callable[..., Any], figures: Any
) -> None:
    writers, size, total = 10, 10, 5000
    per_writer = total // writers // size
    injector = FaultInjector(rate=0.2, seed=8, weights=(2, 3, 1))
    gate = make_gate()
    answers: dict[str, list[Decision]] = {}
    errors: list[str] = []
    lock = threading.Lock()
    started = time.perf_counter()
    # A fixed admission bound (no queue-delay budget): this test is about retries. The deadline
    # door is on: every attempt carries the client's own deadline.
    with running(gate, max_queue_delay_s=None) as st:
        client = MemgateClient(st.target, timeout=120, interceptors=[injector])

        def writer(w: int) -> None:
            for r in range(per_writer):
                facts = _facts(w, r, size)
                try:
                    out = client.write(facts).decisions
                except Exception as exc:  # counted, then asserted on
                    with lock:
                        errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with lock:
                    answers[facts[0].idempotency_key or ""] = out

        with ThreadPoolExecutor(writers) as pool:
            for f in [pool.submit(writer, w) for w in range(writers)]:
                f.result(600)
        client.close()
        injector.close()
    seconds = time.perf_counter() - started

    facts = [f for w in range(writers) for r in range(per_writer) for f in _facts(w, r, size)]
    assert len(facts) == total
    replayed = {k for k, ds in answers.items() if any(d.replayed for d in ds)}
    committed_then_lost = {k for k, modes in injector.by_request.items() if "after" in modes}
    unknown = {k for k, modes in injector.by_request.items() if "mid" in modes}

    store: SQLiteStore = gate.store
    namespaces = sorted({f.namespace for f in facts})
    memories = [m for ns in namespaces for m in stored(store, ns)]
    texts = Counter((m.namespace, m.text) for m in memories)
    expected = Counter((f.namespace, f.text) for f in facts)
    lost = sum((expected - texts).values())
    duplicates = sum(n - 1 for n in texts.values() if n > 1)
    phantoms = sum((texts - expected).values())
    by_id = {m.id: m for m in memories}
    wrong_ids = [
        d.memory_id
        for ds in answers.values()
        for d in ds
        if d.memory_id is None
        or by_id.get(d.memory_id) is None
        or by_id[d.memory_id].text != d.fact.text
    ]
    events = sum(
        1
        for ns in namespaces
        for e in store.events(ns, limit=10_000)
        if e.type in ("add", "replace")
    )
    forks = sum(len(chain_faults(stored(store, f"retry/w{w}")).forks) for w in range(writers))
    figures.record(
        "8 idempotent retries",
        writes=total,
        requests=len(answers),
        facts_per_request=size,
        attempts=injector.attempts,
        injected_unavailable=dict(injector.faults),
        replayed_requests=len(replayed),
        failed_writes=len(errors),
        lost=lost,
        duplicates=duplicates,
        phantoms=phantoms,
        wrong_ids=len(wrong_ids),
        forks=forks,
        seconds=round(seconds, 1),
        writes_per_s=round(total / seconds, 1),
    )
    assert not errors, errors[:5]
    assert injector.faults["after"] >= 20 and injector.faults["before"] >= 20  # faults happened
    assert lost == 0 and duplicates == 0 and phantoms == 0
    assert events == total  # one add or replace logged per fact: nothing applied twice
    assert not wrong_ids and forks == 0
    # A request whose answer was lost after it committed is answered by a replay, and only a
    # request whose earlier attempt may have committed is.
    assert committed_then_lost <= replayed <= committed_then_lost | unknown
    assert all(all(d.replayed for d in answers[k]) for k in committed_then_lost)


def test_a_retry_sharing_a_batch_with_a_new_write_of_its_key(
    make_gate: Callable[..., Any], figures: Any
) -> None:
    # The server merges concurrent requests into one gate batch: a retried Write (already
    # committed) can meet a new Write of the same key. The replay must answer its first result
    # and not be decided afresh, or the new write chains onto an id that is never stored and
    # the whole batch fails (FAILED_PRECONDITION for both callers).
    gate = ModelGate(make_gate())
    ns = "retry/merged"
    with running(gate) as st, MemgateClient(st.target, timeout=120) as c:
        pro = Fact(ns, "Plan: Pro", key="plan", idempotency_key="req-1")
        first = c.write([pro]).decisions[0]
        team = c.write([Fact(ns, "Plan: Team", key="plan")]).decisions[0]
        gate.block()
        with ThreadPoolExecutor(3) as pool:
            # The blocker writes the same namespace: batches of one namespace run one after
            # the other (other namespaces would go by on another lane).
            blocker = pool.submit(c.write, [Fact(ns, "Held.", kind="episodic")])
            assert gate.entered.wait(60)
            server = st.server
            assert server is not None
            retry = pool.submit(c.write, [pro])
            _wait(lambda: server.batcher.pending_facts == 1)
            new = pool.submit(c.write, [Fact(ns, "Plan: Enterprise", key="plan")])
            _wait(lambda: server.batcher.pending_facts == 2)
            gate.hold.set()
            blocker.result(60)
            again, enterprise = retry.result(60).decisions[0], new.result(60).decisions[0]
        merged = [texts for _, texts in gate.calls if "Plan: Enterprise" in texts]
    assert merged == [["Plan: Pro", "Plan: Enterprise"]]  # one gate batch held both
    assert again.replayed and (again.action, again.memory_id) == ("add", first.memory_id)
    assert (enterprise.action, enterprise.target_id) == ("replace", team.memory_id)
    chain = gate.store.history(ns, enterprise.memory_id or "")
    assert [m.text for m in chain] == ["Plan: Pro", "Plan: Team", "Plan: Enterprise"]
    figures.record("8 idempotent retries", replay_merged_with_new_write="ok")


def _wait(predicate: Callable[[], bool], tries: int = 6000) -> None:
    for _ in range(tries):
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError("timed out waiting for the queue")


RESTARTS = 2
RESTART_WRITERS = 4


def test_idempotent_writes_outlast_a_restart(tmp_path: Path, cache_dir: Path, figures: Any) -> None:
    """Item 7: writers with idempotency keys and the client's default retry budget ride out a
    ``kill -9`` and restart of the real server (real models): no write fails, none is lost or
    stored twice. (On main the budget, 5 attempts with at most 1 s of backoff, ran out during
    the restart and the application got UNAVAILABLE.) Records restart-to-SERVING on the real
    models and the outage the writers saw."""
    data = tmp_path / "data"
    server = start_server(data, cache_dir=cache_dir, timeout=180)
    port = server.port
    serving = [server.serving_s]
    acks: list[tuple[str, str, bool, float]] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()
    client = MemgateClient(server.target, timeout=90)  # the default retry budget (retry_s)

    def writer(w: int) -> None:
        for n in range(10_000):
            if stop.is_set():
                return
            key = f"restart-{w}-{n}"
            fact = Fact(f"restart/w{w}", f"w{w} episode {n}", kind="episodic", idempotency_key=key)
            try:
                d = client.write([fact]).decisions[0]
            except MemgateError as exc:
                with lock:
                    errors.append(f"{key}: {getattr(exc, 'code', '?')} {exc}")
                return
            with lock:
                acks.append((key, d.memory_id or "", d.replayed, time.monotonic()))

    def acked_after(moment: float) -> bool:
        with lock:
            return any(at > moment for *_, at in acks)

    def wait_for(predicate: Callable[[], bool], what: str, seconds: float = 120.0) -> None:
        end = time.monotonic() + seconds
        while not predicate():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            assert not errors, errors[:5]
            time.sleep(0.01)

    outages: list[float] = []
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(RESTART_WRITERS)]
    try:
        for t in threads:
            t.start()
        for _ in range(RESTARTS):
            with lock:
                target = len(acks) + 10
            wait_for(lambda n=target: len(acks) >= n, "ten more acknowledged writes")
            server.kill()
            killed = time.monotonic()
            server = start_server(data, cache_dir=cache_dir, timeout=180, port=port)
            serving.append(server.serving_s)
            wait_for(lambda k=killed: acked_after(k), "a write acknowledged after the kill")
            with lock:
                outages.append(min(at for *_, at in acks if at > killed) - killed)
        stop.set()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a writer hung"
    finally:
        stop.set()
        client.close()
        server.stop()
    assert errors == [], errors[:10]
    store = SQLiteStore(data / "memgate.db")
    try:
        ids_by_key: dict[str, set[str]] = defaultdict(set)
        for key, mid, _replayed, _at in acks:
            ids_by_key[key].add(mid)
        texts: Counter[str] = Counter()
        for w in range(RESTART_WRITERS):
            texts.update(m.text for m in stored(store, f"restart/w{w}"))
        present = {
            key
            for key, mids in ids_by_key.items()
            for mid in mids
            if store.get(f"restart/w{key.split('-')[1]}", mid) is not None
        }
    finally:
        store.close()
    duplicates = [t for t, n in texts.items() if n > 1]
    lost = sorted(set(ids_by_key) - present)
    figures.record(
        "7 retries outlast a restart",
        restarts=RESTARTS,
        writers=RESTART_WRITERS,
        acked=len(acks),
        replayed=sum(1 for _, _, r, _ in acks if r),
        failed_writes=len(errors),
        lost=len(lost),
        duplicates=len(duplicates),
        restart_to_serving_s_real_models=[round(x, 3) for x in serving[1:]],
        first_start_serving_s=round(serving[0], 3),
        kill_to_first_ack_s=[round(x, 3) for x in outages],
    )
    assert all(len(m) == 1 for m in ids_by_key.values()), "one key, two memory ids"
    assert lost == [] and duplicates == []
