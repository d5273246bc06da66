"""Issue 14, items 5 and 6: replicas on one PostgreSQL database under kills and outages.

* **3 replicas, 30 kill -9.** Three ``memgate serve --store postgresql://...`` processes share
  one database (a throwaway PostgreSQL server, tests/_pg.py). Writer threads, each with one
  client of all three replicas (round-robin, keyed writes retried on another replica), write
  to a *shared* namespace (keyed facts: each replaces the current ``plan``, a decision that
  must see every replica's last write) and to a namespace of their own (episodes). 30 times a
  random replica is killed with SIGKILL and restarted on its port. Then the writes that got no
  answer are retried with their idempotency keys and the database is read back: acknowledged
  writes lost, forked chains, chains with two active heads, duplicated texts and decisions
  made on stale state (a refused ``Conflict``, or a keyed write that added a second head
  instead of replacing the first) are counted; every count must be 0.
* **The database lost under load.** The PostgreSQL server is stopped while a replica serves
  writes: writes answer UNAVAILABLE (never INTERNAL), health turns NOT_SERVING, and when the
  server is started again health returns to SERVING by itself, writes succeed, and no
  acknowledged write is lost.
* **A database that is not there at start**: ``memgate serve`` exits non-zero with an error
  that names the DSN with its password masked.

Tiny random-weight models (``_proc.tiny_models``): the things under test are the store and
the replicas' coordination, not the model's decisions (keyed and episodic facts decide
without it)."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()  # the client needs the generated stubs

from _proc import TINY_FLAGS, ServerProc, free_port, spawn_server, start_server, tiny_models  # noqa: E402,I001
from _serving import chain_faults, stored  # noqa: E402
from conftest import within  # noqa: E402

from engine.client import MemgateClient  # noqa: E402
from engine.errors import MemgateError  # noqa: E402
from engine.store import open_store  # noqa: E402
from engine.types import Fact  # noqa: E402

REPLICAS = 3
KILLS = 30
WRITERS = 4
SHARED = "replicas/shared"
NOT_SERVING_BOUND_S = 5.0
"""Health follows the database within a few store pings (every 0.5 s)."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("optimum", reason="the tiny models need the export extra")
    return tiny_models(tmp_path_factory.mktemp("tiny-cache"))


@dataclass
class Writer:
    index: int
    rng: random.Random
    seq: int = 0
    acked: dict[str, str] = field(default_factory=dict)
    """Acknowledged fact text -> memory id."""
    actions: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    pending: list[list[Fact]] = field(default_factory=list)
    """Requests that got no answer: retried with the same keys at the end."""

    @property
    def own(self) -> str:
        return f"replicas/w{self.index}"

    def request(self) -> list[Fact]:
        self.seq += 1
        key = f"k-{self.index}-{self.seq}"
        if self.rng.random() < 0.5:
            text = f"plan of w{self.index} #{self.seq}"
            return [Fact(SHARED, text, key="plan", idempotency_key=key)]
        text = f"w{self.index} episode {self.seq}"
        return [Fact(self.own, text, kind="episodic", idempotency_key=key)]

    def send(self, client: MemgateClient, facts: list[Fact]) -> bool:
        try:
            out = client.write(facts)
        except MemgateError as exc:
            self.errors[str(getattr(exc, "code", type(exc).__name__))] += 1
            return False
        for d in out.decisions:
            assert d.memory_id, d
            self.acked[d.fact.text] = d.memory_id
            self.actions["replayed" if d.replayed else d.action] += 1
        return True

    def run(self, targets: list[str], stop: threading.Event) -> None:
        with MemgateClient(targets, timeout=20.0, write_attempts=20) as client:
            while not stop.is_set():
                facts = self.request()
                if not self.send(client, facts):
                    self.pending.append(facts)


def _start(port: int, data: Path, cache: Path, dsn: str) -> ServerProc:
    return start_server(
        data, cache_dir=cache, flags=(*TINY_FLAGS, "--store", dsn), port=port, timeout=120
    )


def test_three_replicas_survive_30_kills(
    tmp_path: Path, tiny: Path, pg_dsn: str, figures: Any
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    ports = [free_port() for _ in range(REPLICAS)]
    datas = [tmp_path / f"replica{i}" for i in range(REPLICAS)]
    servers = [_start(p, d, tiny, pg_dsn) for p, d in zip(ports, datas, strict=True)]
    targets = [s.target for s in servers]
    writers = [Writer(i, random.Random(rng.random())) for i in range(WRITERS)]
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(targets, stop)) for w in writers]
    started = time.monotonic()
    restart_s: list[float] = []
    try:
        for t in threads:
            t.start()
        for _ in range(KILLS):
            time.sleep(rng.uniform(0.2, 0.8))
            victim = rng.randrange(REPLICAS)
            servers[victim].kill()
            servers[victim] = _start(ports[victim], datas[victim], tiny, pg_dsn)
            restart_s.append(servers[victim].serving_s)
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(120)
            assert not t.is_alive(), "a writer hung"
        with MemgateClient(targets, timeout=60.0, write_attempts=20) as client:
            for w in writers:
                retried, w.pending = w.pending, []
                for facts in retried:
                    assert w.send(client, facts), w.errors
    finally:
        stop.set()
        for s in servers:
            s.kill()
    wall_s = time.monotonic() - started

    with open_store(pg_dsn) as store:
        integrity = store.integrity_check()
        memories = {ns: stored(store, ns) for ns in [SHARED, *(w.own for w in writers)]}
    by_id = {m.id: m for ms in memories.values() for m in ms}
    texts = Counter(m.text for ms in memories.values() for m in ms)
    acked = {t: i for w in writers for t, i in w.acked.items()}
    lost = [t for t, i in acked.items() if i not in by_id or by_id[i].text != t]
    duplicates = [t for t, n in texts.items() if n > 1]
    faults = {ns: chain_faults(ms) for ns, ms in memories.items()}
    forks = sum(len(f.forks) + len(f.broken_links) for f in faults.values())
    two_heads = sum(len(f.multi_active) for f in faults.values())
    plans = [m for m in memories[SHARED] if m.key == "plan"]
    active_plans = [m for m in plans if m.status == "active"]
    # A keyed write decided on stale state either adds a second head (it did not see the
    # last plan) or is refused (its target was replaced meanwhile: Conflict).
    refused = sum(w.errors["FAILED_PRECONDITION"] for w in writers)
    stale = refused + max(0, len(active_plans) - 1)
    actions = sum((w.actions for w in writers), Counter())
    errors = sum((w.errors for w in writers), Counter())
    figures.record(
        "14.5 three replicas, kill -9",
        replicas=REPLICAS,
        kills=KILLS,
        writers=WRITERS,
        acked=len(acked),
        actions=dict(actions),
        client_errors_retried=dict(errors),
        lost=len(lost),
        forked_chains=forks,
        chains_with_two_active=two_heads,
        duplicates=len(duplicates),
        stale_decisions=stale,
        shared_chain_length=len(plans),
        integrity_check=integrity,
        restart_to_serving_s_max=round(max(restart_s), 2),
        wall_s=round(wall_s, 1),
        seed=seed,
    )
    assert len(acked) > KILLS * 2, "too few writes were acknowledged to test anything"
    assert actions["replace"] > KILLS, actions  # the shared chain really grew across replicas
    assert lost == [], lost[:10]
    assert forks == 0 and two_heads == 0, faults
    assert duplicates == [], duplicates[:10]
    assert stale == 0, (refused, [m.id for m in active_plans])
    assert "INTERNAL" not in errors, errors
    assert integrity


def _health(target: str) -> str:
    with MemgateClient(target, timeout=2.0, retry=False) as client:
        try:
            return client.health()
        except MemgateError as exc:
            return str(getattr(exc, "code", "?"))


def _wait_health(target: str, want: str, bound: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < bound:
        if _health(target) == want:
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"health did not turn {want} within {bound:.0f} s")


def test_a_lost_database_is_unavailable_then_recovers_by_itself(
    tmp_path: Path, tiny: Path, pg_cluster: Any, pg_dsn: str, figures: Any
) -> None:
    server = _start(free_port(), tmp_path / "replica", tiny, pg_dsn)
    acked: dict[str, str] = {}
    codes: Counter[str] = Counter()
    seq = 0

    def write_some(client: MemgateClient, n: int) -> None:
        nonlocal seq
        for _ in range(n):
            seq += 1
            fact = Fact("outage", f"episode {seq}", kind="episodic", idempotency_key=f"o{seq}")
            try:
                [d] = client.write([fact]).decisions
            except MemgateError as exc:
                codes[str(getattr(exc, "code", type(exc).__name__))] += 1
                continue
            acked[fact.text] = d.memory_id or ""
            codes["OK"] += 1

    try:
        with MemgateClient(server.target, timeout=5.0, write_attempts=1) as client:
            write_some(client, 20)
            pg_cluster.stop("fast")
            try:
                write_some(client, 5)
                down_s = _wait_health(server.target, "NOT_SERVING", NOT_SERVING_BOUND_S * 4)
                write_some(client, 5)
            finally:
                pg_cluster.start()
            up_s = _wait_health(server.target, "SERVING", NOT_SERVING_BOUND_S * 4)
            before_ok = codes["OK"]
            write_some(client, 20)
            after_ok = codes["OK"] - before_ok
        assert server.alive(), server.tail()
    finally:
        server.kill()
    # The server logged the outage (the pool's reconnection attempts) without the password.
    assert pg_cluster.password not in "\n".join(server.log)
    with open_store(pg_dsn) as store:
        by_id = {m.id: m for m in stored(store, "outage")}
    lost = [t for t, i in acked.items() if i not in by_id or by_id[i].text != t]
    refused = {k: v for k, v in codes.items() if k != "OK"}
    figures.record(
        "14.6 database lost under load",
        acked=len(acked),
        refused=refused,
        not_serving_after_s=round(down_s, 2),
        serving_again_after_restart_s=round(up_s, 2),
        writes_ok_after_recovery=after_ok,
        lost=len(lost),
    )
    assert lost == []
    assert set(refused) <= {"UNAVAILABLE"}, refused  # never INTERNAL
    assert refused.get("UNAVAILABLE", 0) >= 5
    assert after_ok == 20, codes  # recovered by itself: no restart of memgate
    assert within(down_s, NOT_SERVING_BOUND_S) and within(up_s, NOT_SERVING_BOUND_S)


def test_an_unreachable_database_at_start_is_a_clear_error(tmp_path: Path, tiny: Path) -> None:
    dsn = f"postgresql://memgate:s3cret-word@127.0.0.1:{free_port()}/memgate?connect_timeout=2"
    proc = spawn_server(tmp_path / "replica", cache_dir=tiny, flags=(*TINY_FLAGS, "--store", dsn))
    code = proc.popen.wait(120)
    proc.kill()
    log = proc.tail(50)
    assert code != 0, log
    assert "postgresql://memgate:***@127.0.0.1" in log, log
    assert "s3cret-word" not in log, log


# -- issue 34: a replica frozen while it holds a namespace ---------------------------------------
LOCK_TIMEOUT_S = 2.0
HOLD_S = 8.0
LOCK_FLAGS = ("--lock-timeout", str(LOCK_TIMEOUT_S), "--lock-hold-timeout", str(HOLD_S))
HOT = "frozen/hot"


def _advisory_holders(dsn: str) -> set[int]:
    """Backend pids holding a namespace advisory lock in this database (only HOT is written
    through the frozen replica, so every such lock is HOT's)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchall()
    return {int(r[0]) for r in rows}


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "code", type(exc).__name__))


def test_a_replica_frozen_holding_a_namespace_stalls_only_that_namespace(
    tmp_path: Path, tiny: Path, pg_dsn: str, figures: Any
) -> None:
    import os
    import signal

    flags = (*TINY_FLAGS, "--store", pg_dsn, *LOCK_FLAGS)
    p = start_server(tmp_path / "p", cache_dir=tiny, flags=flags, timeout=120)
    q = start_server(tmp_path / "q", cache_dir=tiny, flags=flags, timeout=120)
    acked: dict[str, str] = {}
    codes: Counter[str] = Counter()
    frozen = False
    stop_feed = threading.Event()

    def feed_p() -> None:
        # Large batches to HOT keep P's namespace lock held for a while at a time.
        with MemgateClient(p.target, timeout=120.0, retry=False) as client:
            n = 0
            while not stop_feed.is_set():
                n += 1
                facts = [
                    Fact(HOT, f"P batch {n} episode {i} was logged.", kind="episodic")
                    for i in range(256)
                ]
                try:
                    for d in client.write(facts).decisions:
                        acked[d.fact.text] = d.memory_id or ""
                except MemgateError as exc:
                    codes[f"p:{_code(exc)}"] += 1

    def write(client: MemgateClient, fact: Fact) -> str:
        try:
            [d] = client.write([fact]).decisions
        except MemgateError as exc:
            codes[_code(exc)] += 1
            return f"{_code(exc)}: {exc}"
        acked[fact.text] = d.memory_id or ""
        codes["OK"] += 1
        return "OK"

    feeder = threading.Thread(target=feed_p, daemon=True)
    try:
        feeder.start()
        # Freeze P while one of its transactions holds HOT's lock (checked after the freeze).
        for _ in range(400):
            if _advisory_holders(pg_dsn):
                os.kill(p.pid, signal.SIGSTOP)
                if _advisory_holders(pg_dsn):
                    frozen = True
                    break
                os.kill(p.pid, signal.SIGCONT)
            time.sleep(0.005)
        assert frozen, "P never held HOT's lock when frozen"
        stop_feed.set()
        with MemgateClient(q.target, timeout=30.0, retry=False) as client:
            # Other namespaces on Q proceed while P holds HOT.
            others = [
                write(client, Fact(f"frozen/other{i % 4}", f"other write {i}.", kind="episodic"))
                for i in range(12)
            ]
            others += [
                write(client, Fact(f"frozen/keyed{i % 2}", f"plan v{i}", key="plan"))
                for i in range(4)
            ]
            # A recall of HOT needs no lock: it is answered too.
            recalled = client.recall(HOT, "episode", k=3)
            # A write to HOT waits at most the lock timeout, then a retryable UNAVAILABLE
            # naming the namespace (the client's 30 s deadline is far away).
            hot = write(client, Fact(HOT, "Q plan v1", key="plan", idempotency_key="q-hot-1"))
            still_held = bool(_advisory_holders(pg_dsn))
            # The frozen holder loses the lock within the hold bound: HOT is writable again
            # while P is still frozen.
            after: list[str] = []
            for _ in range(60):
                after.append(
                    write(client, Fact(HOT, "Q plan v1", key="plan", idempotency_key="q-hot-1"))
                )
                if after[-1] == "OK":
                    break
                time.sleep(0.5)
            hot_ok_while_frozen = after[-1] == "OK" and p.alive()
        os.kill(p.pid, signal.SIGCONT)
        frozen = False
        # P comes back: its transaction was ended by the database; it serves again.
        with MemgateClient(p.target, timeout=30.0, write_attempts=20) as client:
            again = write(client, Fact(HOT, "P plan v2", key="plan", idempotency_key="p-hot-2"))
        feeder.join(120)
        assert not feeder.is_alive(), "P's feeder hung"
    finally:
        if frozen:
            os.kill(p.pid, signal.SIGCONT)
        stop_feed.set()
        p.kill()
        q.kill()

    names = [HOT, *(f"frozen/other{i}" for i in range(4)), "frozen/keyed0", "frozen/keyed1"]
    with open_store(pg_dsn) as store:
        memories = {ns: stored(store, ns) for ns in names}
    by_id = {m.id: m for ms in memories.values() for m in ms}
    lost = [t for t, i in acked.items() if i not in by_id or by_id[i].text != t]
    faults = {ns: chain_faults(ms) for ns, ms in memories.items()}
    forks = sum(len(f.forks) + len(f.broken_links) + len(f.multi_active) for f in faults.values())
    figures.record(
        "34.1 a replica frozen holding a namespace",
        lock_timeout_s=LOCK_TIMEOUT_S,
        hold_s=HOLD_S,
        other_namespace_writes=len(others),
        other_namespace_ok=others.count("OK"),
        hot_write_while_held=hot.split(":")[0],
        hot_attempts_until_ok=len(after),
        codes=dict(codes),
        acked=len(acked),
        lost=len(lost),
        forks=forks,
    )
    assert others == ["OK"] * len(others), others
    assert recalled is not None
    assert still_held, "the lock was gone before the HOT write was tried: nothing was tested"
    assert hot.startswith("StatusCode.UNAVAILABLE") or hot.startswith("UNAVAILABLE"), hot
    assert HOT in hot, hot  # the refusal names the namespace
    assert hot_ok_while_frozen, after
    assert again == "OK", again
    assert lost == [], lost[:10]
    assert forks == 0, faults
    assert "INTERNAL" not in " ".join(codes), codes
