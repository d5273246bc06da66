"""SIGTERM during a Backfill stream, against a real ``memgate serve`` process (tiny models).

For each kill point (SIGTERM after the client has received k decisions), one stream of
``FACTS`` episodic facts with idempotency keys is in flight and a Health.Watch stream is open:

* the Backfill stream and the Watch stream end with UNAVAILABLE (never INTERNAL or UNKNOWN),
  and the Backfill message names the last committed fact's index;
* every decision delivered is in stream order, and the named index is the last one delivered;
* no event in the store's log is later than SIGTERM + grace; the process exits within
  grace + 2 s;
* a client that resumes from the named index on a restarted server, with the same idempotency
  keys, ends with every fact stored exactly once, and none of the resumed facts was a replay
  (nothing after the named index had been committed).
"""

from __future__ import annotations

import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))

import grpc  # noqa: E402
from _proc import TINY_FLAGS, ServerProc, start_server, tiny_models  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from engine.server.proto import pb, pb_grpc  # noqa: E402

FACTS = 600
GRACE_S = 1.5
KILL_POINTS = (0, 1, 10, 60, 150, 300)
SLACK = float(os.environ.get("MEMGATE_RELIABILITY_SLACK", "4"))
"""The contract's time bound (exit within grace + 2 s) is asserted times this slack, as the
reliability suite does for its bounds; the measured figure is printed (``-s``)."""
_RESUME = re.compile(r"resume from (?:index )?(\d+)")


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("optimum", reason="the tiny model cache needs the export extra")
    return tiny_models(tmp_path_factory.mktemp("tiny-cache"))


def _requests(ns: str, start: int, sent: threading.Event) -> Iterator[Any]:
    for i in range(start, FACTS):
        fact = pb.Fact(
            namespace=ns,
            text=f"episode {i} of the stream".encode(),
            kind=pb.EPISODIC,
            idempotency_key=f"k-{i}",
        )
        yield pb.BackfillRequest(fact=fact)
        sent.set()


def _serve(data: Path, cache: Path) -> ServerProc:
    return start_server(data, cache_dir=cache, flags=(*TINY_FLAGS, "--grace", str(GRACE_S)))


class Watch(threading.Thread):
    """A Health.Watch stream; ``code`` is how it ended."""

    def __init__(self, target: str) -> None:
        super().__init__(daemon=True)
        self.target = target
        self.code: str | None = None
        self.statuses: list[int] = []
        self.started_ok = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                for msg in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60):
                    self.statuses.append(msg.status)
                    self.started_ok.set()
                self.code = "OK"
            except grpc.RpcError as err:
                self.code = err.code().name


def _stream(
    target: str, ns: str, start: int, on_decision: Any = None
) -> tuple[list[int], list[bool], str, str]:
    """(indexes delivered, replayed flags, final code, details) of one Backfill stream."""
    got: list[int] = []
    replayed: list[bool] = []
    sent = threading.Event()
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.MemgateStub(channel)
        try:
            for resp in stub.Backfill(_requests(ns, start, sent), timeout=120):
                got.append(resp.decision.index + start)
                replayed.append(resp.decision.replayed)
                if on_decision is not None:
                    on_decision(len(got))
            return got, replayed, "OK", ""
        except grpc.RpcError as err:
            return got, replayed, err.code().name, err.details() or ""


def _stored(db: Path, ns: str) -> tuple[dict[str, int], list[float]]:
    with sqlite3.connect(db) as conn:
        texts = dict(
            conn.execute(
                "SELECT text, COUNT(*) FROM memories WHERE namespace = ? GROUP BY text", (ns,)
            ).fetchall()
        )
        times = [
            t for (t,) in conn.execute("SELECT created_at FROM events WHERE namespace = ?", (ns,))
        ]
    return texts, times


@pytest.mark.parametrize("kill_after", KILL_POINTS)
def test_sigterm_during_backfill_keeps_its_word(
    tiny_cache: Path, tmp_path: Path, kill_after: int
) -> None:
    ns = f"shutdown/k{kill_after}"
    data = tmp_path / "data"
    proc = _serve(data, tiny_cache)
    terminated: list[float] = []
    watch = Watch(proc.target)
    watch.start()
    assert watch.started_ok.wait(10)

    def term() -> None:
        terminated.append(time.time())
        proc.popen.send_signal(15)

    def on_decision(n: int) -> None:
        if n == kill_after and not terminated:
            term()

    if kill_after == 0:
        timer = threading.Timer(0.05, term)  # after the stream opened, before its first answer
        timer.start()
    try:
        got, _, code, details = _stream(proc.target, ns, 0, on_decision)
        exit_code = proc.popen.wait(GRACE_S + 10)
        exited = time.time()
    finally:
        proc.stop()
    watch.join(10)

    assert terminated, "the stream ended before the kill point"
    t_term = terminated[0]
    assert watch.code == "UNAVAILABLE", watch.code
    assert got == list(range(len(got)))  # in order, no gap
    if code == "OK":  # the whole stream was in flight and finished within the grace
        assert len(got) == FACTS
        resume = FACTS
    else:
        assert code == "UNAVAILABLE", (code, details)
        m = _RESUME.search(details)
        assert m is not None, details
        resume = int(m.group(1))
    assert resume == len(got)  # the last committed fact is the last one delivered
    texts, times = _stored(data / "memgate.db", ns)
    late = [t for t in times if t > t_term + GRACE_S]
    print(
        f"\nkill after {kill_after}: stream {code}, watch {watch.code}, delivered {len(got)}, "
        f"exit {exited - t_term:.2f} s after SIGTERM (grace {GRACE_S}), "
        f"{len(late)} events after grace"
    )
    assert exit_code == 0 and exited - t_term <= (GRACE_S + 2.0) * SLACK, exited - t_term
    assert late == [], f"{len(late)} events committed after the grace period"
    assert sum(texts.values()) == resume  # committed = delivered, nothing beyond

    # A client resumes from the named index with the same idempotency keys.
    proc = _serve(data, tiny_cache)
    try:
        more, replayed, code2, details2 = _stream(proc.target, ns, resume)
    finally:
        proc.stop()
    assert code2 == "OK", details2
    assert more == list(range(resume, FACTS)) and not any(replayed)
    texts, _ = _stored(data / "memgate.db", ns)
    assert len(texts) == FACTS and set(texts.values()) == {1}  # exactly once
