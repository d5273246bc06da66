"""Item 1: kill -9 durability of the real server.

``memgate serve`` runs as a subprocess (``_proc.start_server``). Three client threads, one
namespace each, write unique facts as fast as the server answers: requests of 1-3 episodic
facts and keyed facts (``key="plan"``: each replaces the writer's previous plan, a supersede
without the model), every fact with its own idempotency key. At a random moment the server is
killed with SIGKILL; it is restarted on the same data directory, and then, every cycle:

1. the store is opened next to the running server: ``integrity_check`` must pass; every
   memory must be a fact some client attempted (else a *phantom*), no text may be stored twice
   (a *duplicate*), every acknowledged memory must be there (else *lost*), every stored
   memory must be complete (embedding, event, idempotency record; a replace's target
   superseded by it) and a request that got no answer must be all there or not at all;
2. the requests that got no answer are retried with the same idempotency keys (a client's
   retry after a crash): facts the crash had committed come back ``replayed`` with their ids;
3. every memory acknowledged since the last crash is read back over gRPC (``Get`` by id).

50 cycles. The time from the restart (process start) to health SERVING is measured each cycle.

The 50 restarts use a tiny random-weight model cache built once (``_proc.tiny_models``): the
thing under test is durability, and the real models would double each restart. Two more
restarts with the real default models (the installed cache) measure the realistic restart time
on the same data directory; both figures are recorded and both are held to the 5 s bound.
"""

from __future__ import annotations

import json
import random
import sqlite3
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()  # the client needs the generated stubs

from _proc import TINY_FLAGS, ServerProc, spawn_server, start_server, tiny_models  # noqa: E402
from conftest import within  # noqa: E402

from engine.client import MemgateClient  # noqa: E402
from engine.errors import MemgateError, NotFound  # noqa: E402
from engine.store import SQLiteStore  # noqa: E402
from engine.types import Fact  # noqa: E402

CYCLES = 50
WRITERS = 3
KILL_DURING_START_EVERY = 5
"""Every 5th cycle the restarted server is first killed again while it starts (opening and
recovering the store, loading models), before the restart that is verified."""
REAL_RESTARTS = 2
SERVING_BOUND_S = 5.0


@dataclass
class Request:
    """One Write request: its facts (unique texts, one idempotency key each)."""

    facts: list[Fact]
    cycle: int


@dataclass
class Ack:
    text: str
    memory_id: str
    action: str
    namespace: str
    replayed: bool


@dataclass
class Writer:
    index: int
    namespace: str
    seq: int = 0
    attempted: dict[str, Fact] = field(default_factory=dict)
    """Every fact text ever sent, with the fact."""
    acks: list[Ack] = field(default_factory=list)
    pending: Request | None = None
    """The request that got no answer (the server died under it); retried after the restart."""
    unanswered: int = 0

    def next_request(self, rng: random.Random, cycle: int) -> Request:
        facts = []
        if rng.random() < 0.3:
            self.seq += 1
            text = f"w{self.index} plan {self.seq} c{cycle}"
            facts.append(
                Fact(self.namespace, text, key="plan", idempotency_key=f"k-{self.index}-{self.seq}")
            )
        else:
            for _ in range(rng.randint(1, 3)):
                self.seq += 1
                text = f"w{self.index} fact {self.seq} c{cycle}"
                facts.append(
                    Fact(
                        self.namespace,
                        text,
                        kind="episodic",
                        idempotency_key=f"k-{self.index}-{self.seq}",
                    )
                )
        for f in facts:
            self.attempted[f.text] = f
        return Request(facts, cycle)

    def send(self, client: MemgateClient, request: Request) -> list[Ack]:
        out = client.write(request.facts)
        acks = []
        for d in out.decisions:
            assert d.action in ("add", "replace", "skip"), d
            assert d.memory_id, f"a stored fact came back without an id: {d}"
            acks.append(Ack(d.fact.text, d.memory_id, d.action, self.namespace, d.replayed))
        self.acks.extend(acks)
        return acks

    def run(self, target: str, rng: random.Random, cycle: int, stop: threading.Event) -> None:
        """Write until the server stops answering (it was killed) or ``stop`` is set."""
        with MemgateClient(target, timeout=5.0, retry=False) as client:
            while not stop.is_set():
                request = self.next_request(rng, cycle)
                try:
                    self.send(client, request)
                except MemgateError:
                    self.pending = request
                    self.unanswered += 1
                    return


@dataclass
class Stored:
    id: str
    namespace: str
    text: str
    status: str
    key: str | None
    supersedes: str | None
    superseded_by: str | None
    has_embedding: bool


def read_store(db: Path) -> tuple[dict[str, Stored], set[str], dict[tuple[str, str], str]]:
    """Every memory, the memory ids with an add/replace event, and the idempotency records
    ``(namespace, key) -> memory id``, read with a read-only connection."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        conn.execute("BEGIN")
        memories = {
            r[0]: Stored(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]))
            for r in conn.execute(
                "SELECT id, namespace, text, status, key, supersedes, superseded_by, "
                "embedding IS NOT NULL FROM memories"
            )
        }
        events = {
            r[0]
            for r in conn.execute(
                "SELECT memory_id FROM events WHERE type IN ('add', 'replace') "
                "AND memory_id IS NOT NULL"
            )
        }
        idem = {
            (r[0], r[1]): json.loads(r[2]).get("memory_id")
            for r in conn.execute("SELECT namespace, key, result FROM idempotency")
        }
        conn.execute("COMMIT")
    finally:
        conn.close()
    return memories, events, idem


@dataclass
class Tally:
    cycles: int = 0
    lost: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    integrity_ok: int = 0
    serving_s: list[float] = field(default_factory=list)
    replayed: int = 0
    unanswered_present: int = 0
    unanswered_absent: int = 0
    read_back: int = 0
    killed_while_starting: int = 0


def verify_store(db: Path, writers: list[Writer], tally: Tally) -> None:
    with SQLiteStore(db) as store:
        if store.integrity_check():
            tally.integrity_ok += 1
    memories, events, idem = read_store(db)
    attempted = {t: f for w in writers for t, f in w.attempted.items()}
    texts = Counter(m.text for m in memories.values())
    tally.duplicates += [t for t, n in texts.items() if n > 1]
    for m in memories.values():
        fact = attempted.get(m.text)
        if fact is None or fact.namespace != m.namespace:
            tally.phantoms.append(m.id)
            continue
        faults = []
        if not m.has_embedding:
            faults.append("no embedding")
        if m.id not in events:
            faults.append("no event")
        if idem.get((m.namespace, fact.idempotency_key or "")) != m.id:
            faults.append("no idempotency record")
        if m.supersedes is not None:
            old = memories.get(m.supersedes)
            if old is None or old.superseded_by != m.id or old.status != "superseded":
                faults.append("its target is not superseded by it")
        if m.status == "superseded" and m.superseded_by not in memories:
            faults.append("superseded by nothing")
        tally.incomplete += [f"{m.id}: {f}" for f in faults]
    for w in writers:
        for ack in w.acks:
            m = memories.get(ack.memory_id)
            if m is None or m.text != ack.text or m.status not in ("active", "superseded"):
                tally.lost.append(ack.memory_id)
        actives = [m for m in memories.values() if m.namespace == w.namespace and m.key == "plan"]
        if sum(m.status == "active" for m in actives) > 1:
            tally.incomplete.append(f"{w.namespace}: more than one active plan")
        if w.pending is not None:
            present = [f.text in texts for f in w.pending.facts]
            if all(present):
                tally.unanswered_present += 1
            elif not any(present):
                tally.unanswered_absent += 1
            else:
                tally.incomplete.append(f"{w.namespace}: a request is half stored")


def read_back(server: ServerProc, acks: list[Ack], tally: Tally) -> None:
    with MemgateClient(server.target, timeout=10.0, retry=False) as client:
        for ack in acks:
            try:
                memory = client.get(ack.namespace, ack.memory_id)
            except NotFound:
                tally.lost.append(ack.memory_id)
                continue
            tally.read_back += 1
            if memory.text != ack.text:
                tally.lost.append(ack.memory_id)


def retry_pending(server: ServerProc, writers: list[Writer], tally: Tally) -> list[Ack]:
    acks: list[Ack] = []
    with MemgateClient(server.target, timeout=10.0, retry=False) as client:
        for w in writers:
            if w.pending is not None:
                got = w.send(client, w.pending)
                tally.replayed += sum(a.replayed for a in got)
                acks += got
                w.pending = None
    return acks


@pytest.fixture(scope="module")
def model_cache(
    tmp_path_factory: pytest.TempPathFactory, cache_dir: Path
) -> tuple[Path, tuple[str, ...], str]:
    """The tiny cache (``_proc.tiny_models``); without the export extra, the installed models
    with their fastest variants."""
    try:
        import optimum  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        return (
            cache_dir,
            ("--embedder-variant", "int8", "--nli", "aegis-nli", "--threads", "1"),
            "installed",
        )
    return tiny_models(tmp_path_factory.mktemp("tiny-cache")), TINY_FLAGS, "tiny"


def test_kill_9_loses_no_acknowledged_write(
    tmp_path: Path, model_cache: tuple[Path, tuple[str, ...], str], cache_dir: Path, figures: Any
) -> None:
    cache, flags, which = model_cache
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    data = tmp_path / "data"
    db = data / "memgate.db"
    writers = [Writer(i, f"durability/w{i}") for i in range(WRITERS)]
    tally = Tally()
    started = time.monotonic()
    server = start_server(data, cache_dir=cache, flags=flags)
    tally.serving_s.append(server.serving_s)
    since_crash: list[Ack] = []
    try:
        for cycle in range(CYCLES):
            stop = threading.Event()
            marks = [len(w.acks) for w in writers]
            threads = [
                threading.Thread(
                    target=w.run,
                    args=(server.target, random.Random(rng.random()), cycle, stop),
                    name=f"writer-{w.index}",
                )
                for w in writers
            ]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.05, 0.6))
            server.kill()
            stop.set()
            for t in threads:
                t.join(30)
                assert not t.is_alive(), "a writer hung after the kill"
            since_crash = [a for w, m in zip(writers, marks, strict=True) for a in w.acks[m:]]
            if cycle % KILL_DURING_START_EVERY == 0:
                early = spawn_server(data, cache_dir=cache, flags=flags)
                time.sleep(rng.uniform(0.05, 0.8))
                early.kill()
                tally.killed_while_starting += 1
            server = start_server(data, cache_dir=cache, flags=flags)
            tally.serving_s.append(server.serving_s)
            verify_store(db, writers, tally)
            since_crash += retry_pending(server, writers, tally)
            read_back(server, since_crash, tally)
            tally.cycles += 1
        tiny_s = time.monotonic() - started
        # The realistic restart time: the installed default models, same data directory.
        real_s = []
        for _ in range(REAL_RESTARTS):
            server.kill()
            server = start_server(data)
            real_s.append(server.serving_s)
        verify_store(db, writers, tally)
    finally:
        server.kill()
    acked = sum(len(w.acks) for w in writers)
    figures.record(
        "1 kill -9 durability",
        cycles=tally.cycles,
        killed_while_starting=tally.killed_while_starting,
        acked=acked,
        read_back_over_grpc=tally.read_back,
        lost=len(set(tally.lost)),
        phantoms=len(set(tally.phantoms)),
        duplicates=len(set(tally.duplicates)),
        incomplete=len(tally.incomplete),
        integrity_ok=f"{tally.integrity_ok}/{tally.cycles + 1}",
        unanswered_requests=sum(w.unanswered for w in writers),
        unanswered_found_stored=tally.unanswered_present,
        unanswered_found_absent=tally.unanswered_absent,
        replayed_on_retry=tally.replayed,
        models=which,
        serving_s_median=round(statistics.median(tally.serving_s), 3),
        serving_s_max=round(max(tally.serving_s), 3),
        serving_s_real_models=[round(s, 3) for s in real_s],
        cycles_wall_s=round(tiny_s, 1),
        seed=seed,
    )
    assert tally.cycles == CYCLES
    assert acked > CYCLES, "too few writes were acknowledged to test anything"
    assert tally.lost == [], f"lost acknowledged writes: {tally.lost[:10]}"
    assert tally.phantoms == [], f"phantoms: {tally.phantoms[:10]}"
    assert tally.duplicates == [], f"duplicates: {tally.duplicates[:10]}"
    assert tally.incomplete == [], tally.incomplete[:10]
    assert tally.integrity_ok == tally.cycles + 1
    assert sum(w.unanswered for w in writers) > 0, "no kill ever hit a request in flight"
    worst = max([*tally.serving_s, *real_s])
    assert within(worst, SERVING_BOUND_S), f"SERVING after {worst:.2f} s"
