"""Items 9 and 10: overload and deadlines, against a real server with its shipped admission
settings.

9. 2x overload: offered load twice what the server completes, from clients that carry 5 s
   deadlines. Pass: >= 99% of the non-OK answers are RESOURCE_EXHAUSTED, 0 UNKNOWN or INTERNAL,
   health answers SERVING within 1 s throughout (probed on its own channel and thread, every
   100 ms). Admission queues up to a count bound and refuses at the door a request whose
   deadline the queue ahead cannot meet, so the overload is shed once the queue holds about a
   deadline's worth of work (with 30 s deadlines that takes longer than this test runs).
9b. The delay door (``max_queue_delay_s``, off by default), set: with the model held, requests
   are admitted up to what the measured rate finishes in the delay and the next is refused at
   once with RESOURCE_EXHAUSTED, its deadline far away; health answers SERVING meanwhile.
10. Deadlines (the door's deadline check off, so every request is queued): a request whose
   deadline passes while it is queued never reaches the model
   (>= 95% skipped; model calls counted by :class:`~_serving.ModelGate`) and is answered
   DEADLINE_EXCEEDED promptly: the server answers it (access log) while the model is still
   busy, without waiting for it to come free.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conftest import within

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402
from _serving import AccessLog, ModelGate, percentile, running  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from engine.server.proto import pb, pb_grpc  # noqa: E402
from engine.server.server import ServerSettings  # noqa: E402

FACTS_PER_REQUEST = 4
OVERLOAD_DEADLINE_S = 5.0


def _write(ns: str, tag: str) -> Any:
    return pb.WriteRequest(
        facts=[
            pb.Fact(namespace=ns, text=f"{tag}: event {j} was logged.".encode(), kind=pb.EPISODIC)
            for j in range(FACTS_PER_REQUEST)
        ]
    )


class Load:
    """Requests on a few channels, answered through futures; every answer's code and latency."""

    def __init__(self, target: str, channels: int = 4) -> None:
        self._channels = [grpc.insecure_channel(target) for _ in range(channels)]
        self._stubs = [pb_grpc.MemgateStub(c) for c in self._channels]
        self._lock = threading.Lock()
        self.codes: Counter[str] = Counter()
        self.ok_latency: list[float] = []
        self.ok_at: list[float] = []
        """``time.monotonic()`` of every OK answer, in order."""
        self.sent = 0
        self.answered = threading.Semaphore(0)

    def send(self, request: Any, timeout: float = 30.0) -> None:
        stub = self._stubs[self.sent % len(self._stubs)]
        self.sent += 1
        t0 = time.monotonic()
        future = stub.Write.future(request, timeout=timeout)

        def done(f: Any) -> None:
            code = f.code()
            with self._lock:
                self.codes[code.name] += 1
                if code == grpc.StatusCode.OK:
                    now = time.monotonic()
                    self.ok_latency.append(now - t0)
                    self.ok_at.append(now)
            self.answered.release()

        future.add_done_callback(done)

    def completed_since(self, since: float) -> int:
        with self._lock:
            return len(self.ok_at) - bisect.bisect_left(self.ok_at, since)

    def wait(self, n: int, timeout: float) -> None:
        end = time.monotonic() + timeout
        for _ in range(n):
            assert self.answered.acquire(timeout=max(0.0, end - time.monotonic())), "no answer"

    def close(self) -> None:
        for c in self._channels:
            c.close()


class HealthProbe(threading.Thread):
    """Checks health every ``every`` seconds on its own channel; records status and latency."""

    def __init__(self, target: str, every: float = 0.1) -> None:
        super().__init__(daemon=True)
        self._channel = grpc.insecure_channel(target)
        self._stub = health_pb2_grpc.HealthStub(self._channel)
        self._every = every
        self.stop = threading.Event()
        self.latencies: list[float] = []
        self.statuses: Counter[str] = Counter()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                status = self._stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(status.status)
            except grpc.RpcError as err:
                name = err.code().name
            self.latencies.append(time.monotonic() - t0)
            self.statuses[name] += 1
            self.stop.wait(self._every)
        self._channel.close()


def test_twice_the_load_it_completes_is_shed_with_resource_exhausted(
    make_gate: Callable[..., Any], figures: Any
) -> None:
    with running(make_gate()) as st:
        load = Load(st.target)
        probe = HealthProbe(st.target)
        probe.start()
        # A first estimate of capacity: a closed loop keeping the model busy for a few seconds.
        warm = Load(st.target)
        for i in range(8):
            warm.send(_write("load/warm", f"warm-up {i}"))
        warm.wait(8, 120)
        done = Counter[str]()
        stop_at = time.monotonic() + 8.0
        t0 = time.monotonic()

        def closed_loop(w: int) -> None:
            stub = pb_grpc.MemgateStub(warm._channels[w % 4])
            i = 0
            while time.monotonic() < stop_at:
                try:
                    stub.Write(_write(f"load/cap{w}", f"capacity {w}.{i}"), timeout=30)
                    done["ok"] += 1
                except grpc.RpcError as err:
                    done[err.code().name] += 1
                i += 1

        with ThreadPoolExecutor(12) as pool:
            list(pool.map(closed_loop, range(12)))
        capacity = done["ok"] * FACTS_PER_REQUEST / (time.monotonic() - t0)
        warm.close()

        # Overload: open-loop arrivals at twice the rate the server completes. That rate grows
        # under load (fuller batches), so it is re-measured every second over the last three.
        rate = 2 * capacity / FACTS_PER_REQUEST  # requests per second
        seconds, window = 20.0, 3.0
        t0 = next_check = time.monotonic()
        sent_at = t0
        n = 0
        while (now := time.monotonic()) < t0 + seconds:
            if now >= next_check and now - t0 >= window:
                recent = load.completed_since(now - window) / window
                rate = max(rate / 2, 2 * recent)
                next_check = now + 1.0
            sent_at += 1 / rate
            pause = sent_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            load.send(_write(f"load/o{n % 16}", f"overload {n}"), timeout=OVERLOAD_DEADLINE_S)
            n += 1
        offered_s = time.monotonic() - t0
        load.wait(n, 120)
        loaded_s = time.monotonic() - t0
        probe.stop.set()
        probe.join(30)
        load.close()

    codes = load.codes
    ok = codes["OK"]
    non_ok = sum(codes.values()) - ok
    shed = codes["RESOURCE_EXHAUSTED"]
    worst_health = max(probe.latencies)
    figures.record(
        "9 2x overload",
        capacity_facts_per_s=round(capacity, 1),
        offered_facts_per_s=round(n * FACTS_PER_REQUEST / offered_s, 1),
        completed_facts_per_s=round(ok * FACTS_PER_REQUEST / loaded_s, 1),
        offered_over_completed=round((n / offered_s) / (ok / loaded_s), 2),
        requests=n,
        codes=dict(codes),
        resource_exhausted_share_of_non_ok=round(shed / non_ok, 4) if non_ok else None,
        accepted_p50_s=round(percentile(load.ok_latency, 50), 3),
        accepted_p99_s=round(percentile(load.ok_latency, 99), 3),
        health_probes=sum(probe.statuses.values()),
        health_statuses=dict(probe.statuses),
        health_max_latency_s=round(worst_health, 4),
        health_p99_latency_s=round(percentile(probe.latencies, 99), 4),
    )
    assert sum(codes.values()) == n
    assert (n / offered_s) / (ok / loaded_s) >= 1.8  # the load really was about twice
    assert non_ok > 0, "the offered load never exceeded what the server admits"
    assert shed / non_ok >= 0.99, codes
    assert codes["UNKNOWN"] == 0 and codes["INTERNAL"] == 0, codes
    assert set(probe.statuses) == {"SERVING"}, probe.statuses
    assert within(worst_health, 1.0), worst_health


DOOR_S = 1.0
"""The delay door under test (``--max-queue-delay-ms 1000``). It is off by default
(docs/experiments/2026-12-05-default-door.md); every other setting here is the shipped one."""


def test_the_delay_door_sheds_what_would_wait_past_it_never_health(
    make_gate: Callable[..., Any], figures: Any
) -> None:
    """With the delay door set, a server whose measured rate is known admits facts in flight
    only up to what its model finishes in ``max_queue_delay_s``; the next request is refused at
    once with RESOURCE_EXHAUSTED although its deadline (120 s) is far away, while health, asked
    on the same channel meanwhile, answers SERVING."""
    settings = ServerSettings(max_queue_delay_s=DOOR_S)
    gate = ModelGate(make_gate())
    with running(gate, max_queue_delay_s=DOOR_S) as st:
        server = st.server
        assert server is not None
        permits = server.permits
        assert permits.max_delay_s == settings.max_queue_delay_s
        channel = grpc.insecure_channel(st.target)
        stub = pb_grpc.MemgateStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        for i in range(8):  # a few batches, so the rate is measured on real work
            stub.Write(_write("door/warm", f"warm {i}"), timeout=120)
        rate = permits.rate
        assert rate is not None
        bound = permits.current_limit
        assert bound == max(
            settings.min_admitted_facts,
            min(settings.max_queued_facts, int(rate * settings.max_queue_delay_s)),
        )
        assert bound < settings.max_queued_facts  # the door binds, not the hard cap
        gate.block()  # nothing finishes from here on, so the measured rate stays as it is
        admitted = [stub.Write.future(_write("door/held", "held"), timeout=120)]
        assert gate.entered.wait(60)
        refused: list[tuple[int, str]] = []  # (facts in flight when refused, code)
        statuses: Counter[str] = Counter()
        for i in range(2 * bound // FACTS_PER_REQUEST + 8):
            before = permits.in_use
            future = stub.Write.future(_write(f"door/q{i % 4}", f"queued {i}"), timeout=120)
            _wait(lambda f=future, b=before: f.done() or permits.in_use > b, "admission")
            if future.done():
                refused.append((before, future.code().name))
            else:
                admitted.append(future)
            check = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            statuses[health_pb2.HealthCheckResponse.ServingStatus.Name(check.status)] += 1
            if len(refused) >= 4:
                break
        held_in_flight = permits.in_use
        gate.hold.set()
        for future in admitted:
            future.exception(timeout=120)  # wait for its answer
        codes = Counter(f.code().name for f in admitted)
        channel.close()
    figures.record(
        "9b delay door",
        max_queue_delay_s=settings.max_queue_delay_s,
        measured_facts_per_s=round(rate, 1),
        bound_facts=bound,
        admitted_requests=len(admitted),
        facts_in_flight_when_refused=held_in_flight,
        refused=[c for _, c in refused],
        health=dict(statuses),
    )
    assert len(refused) == 4 and {c for _, c in refused} == {"RESOURCE_EXHAUSTED"}, refused
    # Refused exactly where the door is: the facts in flight plus this request exceed it.
    assert all(bound - FACTS_PER_REQUEST < n <= bound for n, _ in refused), (refused, bound)
    assert held_in_flight <= bound
    assert codes == {"OK": len(admitted)}, codes
    assert statuses == {"SERVING": sum(statuses.values())}, statuses


def test_requests_that_expire_while_queued_never_reach_the_model(
    make_gate: Callable[..., Any], figures: Any
) -> None:
    gate = ModelGate(make_gate())
    rounds, short_per_round, controls_per_round = 3, 30, 6
    expired: list[tuple[str, str, float, float]] = []  # (request id, text, timeout, client s)
    codes: Counter[str] = Counter()
    control_texts: list[str] = []
    # A fixed admission bound and no deadline check at the door, so every request of a round
    # is queued rather than shed.
    with running(gate, max_queue_delay_s=None, admit_by_deadline=False) as st, AccessLog() as log:
        channel = grpc.insecure_channel(st.target)
        stub = pb_grpc.MemgateStub(channel)
        server = st.server
        assert server is not None

        def call(rid: str, text: str, timeout: float) -> tuple[str, float]:
            req = pb.WriteRequest(facts=[pb.Fact(namespace="deadline/a", text=text.encode())])
            t0 = time.monotonic()
            try:
                stub.Write(req, timeout=timeout, metadata=(("x-request-id", rid),))
                code = "OK"
            except grpc.RpcError as err:
                code = err.code().name
            return code, time.monotonic() - t0

        with ThreadPoolExecutor(short_per_round + controls_per_round + 1) as pool:
            for r in range(rounds):
                gate.block()
                blocker = pool.submit(call, f"block-{r}", f"Round {r} holds the model.", 120)
                assert gate.entered.wait(60)
                futures = []
                for i in range(short_per_round):
                    timeout = 0.2 + 0.8 * i / short_per_round
                    rid, text = f"short-{r}-{i}", f"Round {r}: short deadline request {i}."
                    futures.append((rid, text, timeout, pool.submit(call, rid, text, timeout)))
                    if i % 5 == 0:
                        control = f"Round {r}: patient request {i}."
                        control_texts.append(control)
                        futures.append(
                            (f"ctl-{r}-{i}", control, 120.0, pool.submit(call, "", control, 120))
                        )
                shorts = [f for f in futures if f[0].startswith("short")]
                for rid, text, timeout, fut in shorts:
                    code, secs = fut.result(60)
                    codes[code] += 1
                    expired.append((rid, text, timeout, secs))
                # The server answered every one of them while the model is still held.
                wanted = {rid for rid, *_ in shorts}
                _wait(lambda w=wanted: w <= {ln.request_id for ln in log.lines}, "access log")
                assert not gate.hold.is_set() and server.batcher.pending_facts > 0
                gate.hold.set()
                assert blocker.result(120)[0] == "OK"
                for rid, _, _, fut in futures:
                    if rid.startswith("ctl"):
                        assert fut.result(120)[0] == "OK"
        channel.close()

    seen = gate.seen()
    reached = [text for _, text, _, _ in expired if seen[text]]
    skipped = len(expired) - len(reached)
    server_ms = {ln.request_id: (ln.code, ln.ms) for ln in log.lines}
    past_client = [secs - timeout for _, _, timeout, secs in expired]
    past_server = [server_ms[rid][1] / 1000 - timeout for rid, _, timeout, _ in expired]
    figures.record(
        "10 deadlines",
        expired_requests=len(expired),
        client_codes=dict(codes),
        server_codes=dict(Counter(server_ms[rid][0] for rid, *_ in expired)),
        reached_model=len(reached),
        skipped_share=round(skipped / len(expired), 4),
        control_requests=len(control_texts),
        client_past_deadline_max_s=round(max(past_client), 4),
        server_past_deadline_max_s=round(max(past_server), 4),
        server_past_deadline_p50_s=round(percentile(past_server, 50), 4),
    )
    assert codes == {"DEADLINE_EXCEEDED": len(expired)}, codes
    assert skipped / len(expired) >= 0.95 and not reached, reached[:5]
    assert all(seen[t] == 1 for t in control_texts)  # queued alongside, served once each
    assert {server_ms[rid][0] for rid, *_ in expired} <= {"DEADLINE_EXCEEDED", "CANCELLED"}


def _wait(predicate: Callable[[], bool], what: str, tries: int = 6000) -> None:
    for _ in range(tries):
        if predicate():
            return
        time.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")
