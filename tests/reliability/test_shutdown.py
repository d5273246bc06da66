"""Item 11: graceful shutdown. Pass: 0 failures among in-flight calls shorter than the grace
period, while ``stop(grace)`` drains; new calls are refused with UNAVAILABLE (retryable).

Each cycle starts a real server over the same gate and store, lets closed-loop writers run,
and stops it with a 10 s grace at a random moment. Every call carries its own request id, so the
client's answer is joined with the server's access-log line for the same call:

* a call the server handled (any access-log code but the drain's UNAVAILABLE) was in flight when
  the drain began or finished before it: it must be OK on both sides;
* a call the server refused or never saw must be UNAVAILABLE on the client (the server's
  lame-duck period after the drain gives a client that sends its next call at once the
  retryable UNAVAILABLE, not gRPC's own CANCELLED of a call caught by the closing listener);
* every acknowledged write is in the store after the cycle.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402
from _serving import AccessLog, running, stored  # noqa: E402

from engine.server.proto import pb, pb_grpc  # noqa: E402

GRACE_S = 10.0
WRITERS = 6


def _write(ns: str, rid: str, w: int) -> Any:
    return pb.WriteRequest(
        facts=[
            pb.Fact(namespace=ns, text=f"{rid}: first.".encode(), kind=pb.EPISODIC),
            pb.Fact(namespace=ns, text=f"{rid}: second.".encode(), kind=pb.EPISODIC),
            pb.Fact(namespace=ns, text=f"Owner {w}: {rid}".encode(), key=f"owner-{w}"),
        ]
    )


def _code(call: Callable[[], Any]) -> str:
    try:
        call()
    except grpc.RpcError as err:
        return str(err.code().name)
    return "OK"


class Cycle:
    """One server's life: closed-loop writers, a stop at ``stop_after`` seconds, a prober."""

    def __init__(self, gate: Any, n: int, stop_after: float) -> None:
        self.gate = gate
        self.ns = f"drain/c{n}"
        self.n = n
        self.stop_after = stop_after
        self.calls: dict[str, tuple[float, float, str]] = {}  # rid -> (start, end, client code)
        self.lock = threading.Lock()
        self.stopping, self.stopped = threading.Event(), threading.Event()
        self.probes: Counter[str] = Counter()
        self.t_stop = 0.0
        self.stop_s = 0.0
        self.lines: dict[str, Any] = {}

    def writer(self, target: str, w: int) -> None:
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.MemgateStub(channel)
            for i in range(10_000):
                rid = f"c{self.n}-w{w}-{i}"
                t0 = time.monotonic()
                code = _code(
                    lambda r=rid: stub.Write(
                        _write(self.ns, r, w), timeout=30, metadata=(("x-request-id", r),)
                    )
                )
                with self.lock:
                    self.calls[rid] = (t0, time.monotonic(), code)
                if code != "OK":
                    return  # refused: a real client would go to another replica

    def prober(self, target: str) -> None:
        """A new call once the drain began (the first answers may still be NOT_FOUND, until
        the server's loop has started the drain), and one after the stop."""
        self.stopping.wait()
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.MemgateStub(channel)
            ref = pb.MemoryRef(namespace=self.ns, memory_id="mem_x")
            for _ in range(500):
                code = _code(lambda: stub.Get(ref, timeout=5))
                if code != "NOT_FOUND":
                    break
                time.sleep(0.002)
            self.probes[f"draining {code}"] += 1
            self.stopped.wait()
            self.probes[f"stopped {_code(lambda: stub.Get(ref, timeout=5))}"] += 1

    def run(self) -> None:
        with AccessLog() as log, running(self.gate, grace_s=GRACE_S) as st:
            with ThreadPoolExecutor(WRITERS + 1) as pool:
                futures = [pool.submit(self.writer, st.target, w) for w in range(WRITERS)]
                futures.append(pool.submit(self.prober, st.target))
                time.sleep(self.stop_after)
                self.t_stop = time.monotonic()
                self.stopping.set()
                st.stop_async(grace=GRACE_S).result(GRACE_S + 60)
                self.stop_s = time.monotonic() - self.t_stop
                self.stopped.set()
                for f in futures:
                    f.result(60)
            self.lines = {ln.request_id: ln for ln in log.lines}


def test_graceful_shutdown_drains_every_in_flight_call(
    make_gate: Callable[..., Any], figures: Any
) -> None:
    gate = make_gate()
    rng = random.Random(11)
    cycles = 4
    totals: Counter[str] = Counter()
    failures: list[tuple[str, str, str]] = []
    probe_codes: Counter[str] = Counter()
    stop_s: list[float] = []
    for n in range(cycles):
        cycle = Cycle(gate, n, rng.uniform(1.0, 2.5))
        cycle.run()
        probe_codes.update(cycle.probes)
        stop_s.append(cycle.stop_s)
        acked: set[str] = set()
        for rid, (start, end, code) in cycle.calls.items():
            line = cycle.lines.get(rid)
            handled = line is not None and line.code != "UNAVAILABLE"
            totals["calls"] += 1
            totals[f"client {code}"] += 1
            if handled and start < cycle.t_stop < end:
                totals["in_flight_at_stop"] += 1
            if handled and end > cycle.t_stop and code == "OK":
                totals["drained_ok"] += 1
            if handled and (code != "OK" or line is None or line.code != "OK"):
                failures.append((rid, code, line.code if line else "-"))
            elif not handled and code != "UNAVAILABLE":
                failures.append((rid, code, "not handled"))
            if code == "OK":
                acked.add(rid)
        texts = {m.text for m in stored(gate.store, cycle.ns)}
        totals["missing_acked_writes"] += sum(1 for rid in acked if f"{rid}: first." not in texts)

    figures.record(
        "11 graceful shutdown",
        cycles=cycles,
        grace_s=GRACE_S,
        calls=totals["calls"],
        in_flight_at_stop=totals["in_flight_at_stop"],
        answered_ok_during_drain=totals["drained_ok"],
        failures_in_flight=len(failures),
        refused_new_calls=totals["client UNAVAILABLE"],
        probe_codes=dict(probe_codes),
        stop_max_s=round(max(stop_s), 3),
        missing_acked_writes=totals["missing_acked_writes"],
    )
    assert not failures, failures[:5]
    assert totals["in_flight_at_stop"] >= cycles  # the drain really had calls to finish
    assert totals["missing_acked_writes"] == 0
    assert probe_codes == {"draining UNAVAILABLE": cycles, "stopped UNAVAILABLE": cycles}
    assert max(stop_s) < GRACE_S  # every in-flight call finished within the grace period
