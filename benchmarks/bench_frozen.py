"""A replica frozen for 30 s while it holds a namespace: p99 of the other namespaces (issue 34).

The issue's first target: *a replica frozen for 30 s while holding namespace A: on the other
replicas, writes to every other namespace keep their p99 within 2x of the unfrozen run; writes
to A get a retryable status within the lock timeout; 0 lost, 0 forks.*

Setup: a throwaway PostgreSQL server (``tests/_pg.py``, as ``bench_scale`` uses it) and three
``python -m engine serve --store <dsn>`` replicas P, Q and R on the real models of the cache
(MiniLM fp32 and the NLI model ``--nli auto`` picks, as ``bench_grpc`` serves them) with the
shipped defaults for everything, lock bounds included (``--lock-timeout`` 5 s,
``--lock-hold-timeout`` 15 s: no lock flag is passed). Each replica's DSN carries its own
``application_name``, so ``pg_locks`` tells which replica holds which namespace.

Load, in the benchmark process (sync ``MemgateClient`` threads, no retries, 30 s deadlines):

* on Q and on R, ``--clients`` closed-loop writers each, one fact per ``Write``, to a random
  one of ``--namespaces`` other namespaces (seeded with ``--memories`` memories each; both
  replicas write every namespace, so they contend for the same namespace locks). Half the
  facts are keyed (``alice.office``: a supersede chain per subject and attribute), half
  free text (an update of a stored attribute, a paraphrase, or something new), short
  sentences as in ``bench_grpc``;
* on P, a feeder writing batches of ``--feed-batch`` episodic facts to HOT, one after the
  other, so P holds HOT's advisory lock most of the time;
* on Q, one client writing one keyed fact to HOT after the other (``key=plan``), in every
  phase.

Phases, A-B-A: ``unfrozen-1`` (``--unfrozen-s``), ``frozen`` (P stopped with SIGSTOP for
``--frozen-s`` while it holds HOT's lock: checked in ``pg_locks`` before and after the stop; if
the lock was gone the stop is undone and tried again), ``thaw`` (``--thaw-s`` after SIGCONT,
reported but not in the ratio), ``unfrozen-2``. A warm-up before ``unfrozen-1`` is not
counted. Writes belong to the phase in which they started.

Figures: per phase, for the other namespaces on Q and R: writes, facts/s, p50 / p95 / p99
latency, status counts, mean server-side queue and store seconds; the CPU each replica and the
rest of the machine used (cores). The target ratio: frozen p99 / mean of the two unfrozen p99s
(<= 2x), over Q and R together and for each of them (per namespace too, for information: each
has ~1/8 of the writes). A control that CPU does not move: in the frozen phase, Q's p99 / R's
p99 (Q's lanes also serve the HOT writes that wait on P's lock, R's do not; ``--lanes 1`` shows
what head-of-line blocking looks like). HOT writes on Q during the freeze: each call's time
and status (expected: UNAVAILABLE naming HOT after about the lock timeout while P's frozen
session holds the lock; OK once the database has ended that session at the hold bound), the
slowest retryable answer (target:
within the lock timeout + 1 s), the first OK after the freeze, and when P's lock left
``pg_locks``. Health of Q and R every second. After P is thawed and the load stopped: every
acknowledged write read back (lost: a stored decision whose memory is missing or holds another
text) and the supersede chains checked (forks, broken links, chains with two active heads: the
checks of ``tests/reliability/_serving.py::chain_faults``, imported from there).

Prints a table, writes JSON and a PNG (latency over time with the frozen window shaded, and
per-phase p99 bars) to ``--out``. Full: 30 s phases, about 2-3 minutes with start-up;
``--quick``: 15 s phases (a 15 s freeze equals the hold bound, so P's lock may still be held
when P is thawed: the HOT writes then see no OK while P is frozen).

    MEMGATE_HOME=~/.cache/memgate python benchmarks/bench_frozen.py --quick
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402 - the path above makes the helpers importable
    ROOT,
    default_cache_dir,
    fmt,
    run_header,
    save_results,
    table,
)

NAME = "bench_frozen"
HOT = "frozen/hot"
LOCK_TIMEOUT_S = 5.0
"""The shipped ``--lock-timeout`` (the servers get no lock flag; this is only for the target)."""
HOLD_S = 15.0
"""The shipped ``--lock-hold-timeout``."""
CALL_TIMEOUT_S = 30.0

SUBJECTS = [
    ("Alice", "alice"),
    ("Bob", "bob"),
    ("Priya", "priya"),
    ("Marco", "marco"),
    ("Yuki", "yuki"),
    ("The CTO", "cto"),
    ("The support lead", "support-lead"),
    ("The customer", "customer"),
    ("The finance team", "finance"),
    ("The warehouse manager", "warehouse"),
]
ATTRIBUTES = [
    ("office", "office is in", ["Denver", "Chicago", "Austin", "Boston", "Seattle", "Lisbon"]),
    ("contact", "preferred contact channel is", ["email", "phone", "Slack", "SMS"]),
    ("lunch", "favourite lunch is", ["ramen", "tacos", "a salad", "falafel", "pizza"]),
    ("team", "team has", ["4 people", "12 people", "30 people", "7 people"]),
    ("timezone", "timezone is", ["UTC", "UTC+1", "UTC-5", "UTC+9", "UTC-8"]),
    ("laptop", "laptop is", ["a ThinkPad", "a MacBook Pro", "a Dell XPS", "a Framework"]),
    ("meeting", "weekly meeting is on", ["Monday", "Tuesday", "Wednesday", "Thursday"]),
    ("project", "main project is", ["the billing migration", "the mobile app", "SSO"]),
]
NEW_TOPICS = [
    "is learning to play the cello",
    "ran a half marathon last spring",
    "keeps bees on the roof",
    "collects vintage maps",
    "is allergic to peanuts",
    "volunteers at the food bank",
    "speaks fluent Portuguese",
]
EPISODES = [
    "asked about the refund for order",
    "reported a login problem on ticket",
    "confirmed the delivery window for shipment",
    "requested an invoice copy for account",
    "escalated the outage report",
]


def _possessive(subject: str) -> str:
    return subject + "'s"


# -- servers ------------------------------------------------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_app(dsn: str, name: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


@dataclass
class Replica:
    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: list[str] = field(default_factory=list)
    serving_s: float = float("nan")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)  # a stopped process cannot drain
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(30)


def spawn(name: str, dsn: str, work: Path, cache_dir: Path, extra: list[str]) -> Replica:
    """``python -m engine serve`` with the shipped defaults (no lock flag), this checkout;
    ``extra``: more flags (``--lanes`` when given)."""
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "engine",
        "serve",
        "--cache-dir",
        str(cache_dir),
        "--port",
        str(port),
        "--data-dir",
        str(work / name),
        "--store",
        _with_app(dsn, f"memgate-{name}"),
        "--no-access-log",
        "--log-format",
        "text",
        "--grace",
        "2",
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), MEMGATE_LOG="WARNING")
    popen = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    rep = Replica(name, popen, port)

    def drain() -> None:
        assert popen.stderr is not None
        for raw in popen.stderr:
            rep.log.append(raw.decode("utf-8", "replace").rstrip())

    threading.Thread(target=drain, name=f"log-{name}", daemon=True).start()
    return rep


def wait_serving(reps: list[Replica], timeout: float = 300.0) -> None:
    from engine.client import MemgateClient
    from engine.errors import MemgateError

    started = time.monotonic()
    pending = list(reps)
    while pending:
        for rep in list(pending):
            if rep.popen.poll() is not None:
                tail = "\n".join(rep.log[-30:])
                raise SystemExit(f"replica {rep.name} exited ({rep.popen.returncode}):\n{tail}")
            with MemgateClient(rep.target, timeout=0.5, retry=False) as c:
                try:
                    status = c.health()
                except MemgateError:
                    status = ""
            if status == "SERVING":
                rep.serving_s = time.monotonic() - started
                pending.remove(rep)
        if time.monotonic() - started > timeout:
            raise SystemExit(f"no SERVING after {timeout:.0f} s: {[r.name for r in pending]}")
        time.sleep(0.2)


# -- pg_locks -------------------------------------------------------------------------------------
class Locks:
    """One autocommit connection that reads which backend of which replica holds HOT's lock."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        from engine.store.postgres import namespace_key

        key = namespace_key(HOT) & 0xFFFFFFFFFFFFFFFF
        self.classid, self.objid = key >> 32, key & 0xFFFFFFFF
        self.conn = psycopg.connect(dsn, autocommit=True)

    def holder(self) -> str | None:
        """The application name (``memgate-P``...) of the session holding HOT's lock, or None."""
        row = self.conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid = %s "
            "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (self.classid, self.objid),
        ).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        self.conn.close()


# -- load -----------------------------------------------------------------------------------------
@dataclass
class Call:
    who: str
    """``Q`` / ``R`` (other namespaces), ``hot`` (Q's HOT writer), ``feed`` (P's feeder)."""
    namespace: str
    start: float
    seconds: float
    status: str
    keyed: bool = False
    message: str = ""
    queue_s: float = 0.0
    store_s: float = 0.0
    batch_facts: float = 0.0


@dataclass
class Load:
    t0: float
    stop: threading.Event = field(default_factory=threading.Event)
    calls: list[Call] = field(default_factory=list)
    acked: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    """(namespace, text, action, memory id) of every acknowledged decision."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    health: list[tuple[float, str, str]] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, call: Call, decisions: Any = ()) -> None:
        with self.lock:
            self.calls.append(call)
            for d in decisions:
                self.acked.append((d.fact.namespace, d.fact.text, d.action, d.memory_id))


def _code(exc: BaseException) -> str:
    return str(getattr(exc, "code", type(exc).__name__))


def _write(load: Load, client: Any, who: str, facts: list[Any], keyed: bool) -> str:
    from engine.errors import MemgateError

    start = load.now()
    t = time.perf_counter()
    try:
        out = client.write(facts)
    except MemgateError as exc:
        load.record(
            Call(
                who, facts[0].namespace, start, time.perf_counter() - t, _code(exc), keyed, str(exc)
            )
        )
        return _code(exc)
    tm = out.timings
    call = Call(
        who,
        facts[0].namespace,
        start,
        time.perf_counter() - t,
        "OK",
        keyed,
        queue_s=tm.get("queue", 0.0),
        store_s=tm.get("store", 0.0),
        batch_facts=tm.get("batch_facts", 0.0),
    )
    load.record(call, out.decisions)
    return "OK"


class Texts:
    """Short memory-like facts: keyed (``alice.office``) or free text (update, paraphrase, new)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.n = 0

    def slot(self) -> tuple[tuple[str, str], tuple[str, str, list[str]]]:
        return self.rng.choice(SUBJECTS), self.rng.choice(ATTRIBUTES)

    def stored(self, namespace: str, count: int) -> list[Any]:
        from engine.types import Fact

        pairs = [(s, a) for s in SUBJECTS for a in ATTRIBUTES]
        self.rng.shuffle(pairs)
        return [
            Fact(namespace, f"{_possessive(s[0])} {a[1]} {self.rng.choice(a[2])}.")
            for s, a in pairs[:count]
        ]

    def one(self, namespace: str, tag: str) -> tuple[Any, bool]:
        from engine.types import Fact

        self.n += 1
        (subject, slug), (attr, phrase, values) = self.slot()
        value = self.rng.choice(values)
        idem = f"{tag}-{self.n}"
        if self.rng.random() < 0.5:
            text = f"{_possessive(subject)} {phrase} {value}."
            return Fact(namespace, text, key=f"{slug}.{attr}", idempotency_key=idem), True
        roll = self.rng.random()
        if roll < 0.5:
            text = f"{_possessive(subject)} {phrase} {value} now."
        elif roll < 0.75:
            text = f"As noted, {_possessive(subject).lower()} {phrase} {value}."
        else:
            text = f"{subject} {self.rng.choice(NEW_TOPICS)}."
        return Fact(namespace, text, idempotency_key=idem), False


def writer(load: Load, target: str, who: str, namespaces: list[str], seed: int) -> None:
    from engine.client import MemgateClient

    texts = Texts(random.Random(seed))
    tag = f"{who}{seed}"
    with MemgateClient(target, timeout=CALL_TIMEOUT_S, retry=False) as client:
        while not load.stop.is_set():
            fact, keyed = texts.one(texts.rng.choice(namespaces), tag)
            _write(load, client, who, [fact], keyed)


def hot_writer(load: Load, target: str) -> None:
    """Q's client of HOT: one keyed fact after the other (no retries: each answer is recorded)."""
    from engine.client import MemgateClient
    from engine.types import Fact

    n = 0
    with MemgateClient(target, timeout=CALL_TIMEOUT_S, retry=False) as client:
        while not load.stop.is_set():
            n += 1
            fact = Fact(
                HOT, f"The on-call plan is version {n}.", key="plan", idempotency_key=f"q{n}"
            )
            _write(load, client, "hot", [fact], True)
            time.sleep(0.05)


def feeder(load: Load, target: str, batch: int) -> None:
    """P's feeder: batches of episodic facts to HOT, one after the other."""
    from engine.client import MemgateClient
    from engine.types import Fact

    rng = random.Random(7)
    n = 0
    with MemgateClient(target, timeout=120.0, retry=False) as client:
        while not load.stop.is_set():
            n += 1
            facts = [
                Fact(
                    HOT,
                    f"{rng.choice(SUBJECTS)[0]} {rng.choice(EPISODES)} {n}-{i}.",
                    kind="episodic",
                )
                for i in range(batch)
            ]
            if _write(load, client, "feed", facts, False) != "OK":
                time.sleep(0.2)


def health_poller(load: Load, reps: list[Replica]) -> None:
    from engine.client import MemgateClient
    from engine.errors import MemgateError

    clients = {r.name: MemgateClient(r.target, timeout=1.0, retry=False) for r in reps}
    try:
        while not load.stop.wait(1.0):
            for name, c in clients.items():
                try:
                    status = c.health()
                except MemgateError as exc:
                    status = _code(exc)
                with load.lock:
                    load.health.append((load.now(), name, status))
    finally:
        for c in clients.values():
            c.close()


# -- CPU ---------------------------------------------------------------------------------------
def cpu_snapshot(reps: list[Replica]) -> dict[str, float]:
    """CPU seconds of each replica, of this process and of the whole machine, now."""
    import psutil

    out: dict[str, float] = {"wall": time.monotonic()}
    for r in reps:
        try:
            t = psutil.Process(r.pid).cpu_times()
            out[r.name] = t.user + t.system
        except psutil.Error:
            out[r.name] = float("nan")
    me = psutil.Process().cpu_times()
    out["bench"] = me.user + me.system
    m = psutil.cpu_times()
    out["machine"] = (
        m.user + m.nice + m.system + getattr(m, "irq", 0.0) + getattr(m, "softirq", 0.0)
    )
    return out


def cpu_between(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Cores' worth each used between two snapshots; ``others``: everything else on the machine."""
    wall = max(b["wall"] - a["wall"], 1e-9)
    used = {k: (b[k] - a[k]) / wall for k in a if k != "wall"}
    ours = sum(v for k, v in used.items() if k != "machine" and v == v)
    used["others"] = max(0.0, used["machine"] - ours)
    return {k: round(v, 2) for k, v in used.items()}


# -- read back ------------------------------------------------------------------------------------
def _chain_checks() -> tuple[Any, Any]:
    """``stored`` and ``chain_faults`` of the reliability suite (``tests/reliability/_serving.py``):
    the same read-back and supersede-chain checks as ``test_replicas_kill.py``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from reliability._serving import chain_faults, stored

    return stored, chain_faults


def read_back(dsn: str, namespaces: list[str], acked: list[tuple[str, str, str, str | None]]):
    from engine.store import open_store

    stored, chain_faults = _chain_checks()
    with open_store(dsn) as store:
        memories = {ns: stored(store, ns) for ns in namespaces}
        integrity = store.integrity_check()
    by_id = {m.id: m for ms in memories.values() for m in ms}
    lost = [
        (ns, text)
        for ns, text, _action, mid in acked
        if mid is not None and (mid not in by_id or by_id[mid].text != text)
    ]
    faults = {
        ns: {
            "forks": len(f.forks),
            "broken_links": len(f.broken_links),
            "multi_active": len(f.multi_active),
            "chains": f.chains,
            "longest": f.longest,
        }
        for ns, f in ((ns, chain_faults(ms)) for ns, ms in memories.items())
    }
    return {
        "acked_decisions": len(acked),
        "acked_stored": sum(1 for a in acked if a[3] is not None),
        "actions": dict(Counter(a[2] for a in acked)),
        "lost": len(lost),
        "lost_examples": lost[:5],
        "forks": sum(f["forks"] + f["broken_links"] + f["multi_active"] for f in faults.values()),
        "chains": {ns: f for ns, f in faults.items()},
        "memories": {ns: len(ms) for ns, ms in memories.items()},
        "integrity_check": integrity,
    }


# -- figures --------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation) of ``values``, in ms."""
    if not values:
        return float("nan")
    import numpy as np

    return float(np.percentile(np.asarray(values) * 1000.0, q))


def phase_stats(calls: list[Call], phases: list[tuple[str, float, float]]) -> list[dict[str, Any]]:
    rows = []
    for name, a, b in phases:
        mine = [c for c in calls if c.who in ("Q", "R") and a <= c.start < b]
        ok = [c for c in mine if c.status == "OK"]
        lat = [c.seconds for c in ok]
        row: dict[str, Any] = {
            "phase": name,
            "start_s": round(a, 2),
            "seconds": round(b - a, 2),
            "writes": len(mine),
            "ok": len(ok),
            "facts_per_s": len(ok) / max(b - a, 1e-9),
            "p50_ms": _pct(lat, 50),
            "p95_ms": _pct(lat, 95),
            "p99_ms": _pct(lat, 99),
            "max_ms": max(lat, default=float("nan")) * 1000.0,
            "statuses": dict(Counter(c.status for c in mine)),
            "queue_ms_mean": 1000.0 * statistics.fmean([c.queue_s for c in ok]) if ok else 0.0,
            "store_ms_mean": 1000.0 * statistics.fmean([c.store_s for c in ok]) if ok else 0.0,
            "batch_facts_mean": statistics.fmean([c.batch_facts for c in ok]) if ok else 0.0,
        }
        for who in ("Q", "R"):
            lw = [c.seconds for c in ok if c.who == who]
            row[f"p99_ms_{who}"] = _pct(lw, 99)
        by_ns: dict[str, list[float]] = defaultdict(list)
        for c in ok:
            by_ns[c.namespace].append(c.seconds)
        row["p99_ms_by_namespace"] = {ns: _pct(v, 99) for ns, v in sorted(by_ns.items())}
        hot = [c for c in calls if c.who == "hot" and a <= c.start < b]
        row["hot_statuses"] = dict(Counter(c.status for c in hot))
        feed = [c for c in calls if c.who == "feed" and a <= c.start < b]
        row["feed_batches"] = dict(Counter(c.status for c in feed))
        rows.append(row)
    return rows


def hot_figures(
    calls: list[Call], frozen_at: float, thawed_at: float, released_at: float | None
) -> dict[str, Any]:
    """Q's HOT writes that were in flight while P was frozen (the one that started just before
    the freeze, waiting on P's lock, included: its time counts from its own start)."""
    hot = sorted(
        (
            c
            for c in calls
            if c.who == "hot" and c.start < thawed_at and c.start + c.seconds > frozen_at
        ),
        key=lambda c: c.start,
    )
    refused = [c for c in hot if c.status != "OK"]
    retryable = [c for c in refused if c.status == "UNAVAILABLE"]
    first_ok = next((c for c in hot if c.status == "OK"), None)
    slowest = max((c.seconds for c in retryable), default=float("nan"))
    return {
        "calls": [
            {
                "start_after_freeze_s": round(c.start - frozen_at, 3),
                "seconds": round(c.seconds, 3),
                "status": c.status,
                "names_hot": HOT in c.message,
                "message": c.message[:200],
            }
            for c in hot
        ],
        "statuses": dict(Counter(c.status for c in hot)),
        "refused_not_unavailable": len(refused) - len(retryable),
        "unavailable_naming_hot": sum(1 for c in retryable if HOT in c.message),
        "slowest_retryable_s": slowest,
        "retryable_within_lock_timeout_plus_1s": bool(retryable)
        and slowest <= LOCK_TIMEOUT_S + 1.0,
        "first_ok_after_freeze_s": None
        if first_ok is None
        else round(first_ok.start + first_ok.seconds - frozen_at, 2),
        "lock_left_pg_locks_after_s": None
        if released_at is None
        else round(released_at - frozen_at, 2),
    }


def draw(plt: Any, payload: dict[str, Any], calls: list[Call]) -> Any:
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 1]}, constrained_layout=True
    )
    fz = payload["freeze"]
    ax.axvspan(fz["frozen_at_s"], fz["thawed_at_s"], color="tab:blue", alpha=0.12, label="P frozen")
    for who, colour in (("Q", "tab:green"), ("R", "tab:orange")):
        pts = [(c.start, c.seconds) for c in calls if c.who == who and c.status == "OK"]
        if pts:
            ax.scatter(
                *zip(*pts, strict=True), s=4, color=colour, alpha=0.5, label=f"{who}: other ns"
            )
    for status, marker, colour in (("OK", "o", "black"), ("UNAVAILABLE", "x", "red")):
        pts = [(c.start, c.seconds) for c in calls if c.who == "hot" and c.status == status]
        if pts:
            ax.scatter(
                *zip(*pts, strict=True), s=22, marker=marker, color=colour, label=f"Q: HOT {status}"
            )
    ax.axhline(LOCK_TIMEOUT_S, color="grey", lw=0.8, ls="--", label="lock timeout")
    for row in payload["phases"]:
        ax.axvline(row["start_s"], color="grey", lw=0.6, ls=":")
        ax.text(
            row["start_s"],
            0.98,
            f" {row['phase']}",
            transform=ax.get_xaxis_transform(),
            fontsize=7,
            va="top",
            color="dimgrey",
        )
    ax.set_yscale("log")
    ax.set_xlabel("seconds since the load started (call start)")
    ax.set_ylabel("write latency (s)")
    ax.set_title("Writes on Q and R while P is frozen holding HOT")
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    rows = [r for r in payload["phases"] if r["phase"] != "thaw"]
    xs = range(len(rows))
    for k, (key, label, colour) in enumerate(
        (
            ("p99_ms", "Q and R", "tab:grey"),
            ("p99_ms_Q", "Q", "tab:green"),
            ("p99_ms_R", "R", "tab:orange"),
        )
    ):
        bx.bar(
            [x + (k - 1) * 0.27 for x in xs],
            [r[key] for r in rows],
            0.27,
            color=colour,
            label=label,
        )
    bx.set_xticks(list(xs))
    bx.set_xticklabels([r["phase"] for r in rows], rotation=30)
    bx.set_ylabel("p99 of other-namespace writes (ms)")
    bx.set_title(f"frozen / unfrozen p99 = {payload['target']['p99_ratio']:.2f}x")
    bx.legend(fontsize=7)
    return fig


# -- main -----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="15 s phases instead of 30 s")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--clients", type=int, default=8, help="closed-loop writers on Q and on R")
    parser.add_argument("--namespaces", type=int, default=8, help="other namespaces")
    parser.add_argument("--memories", type=int, default=30, help="seeded memories per namespace")
    parser.add_argument("--feed-batch", type=int, default=128, help="facts per batch of P's feeder")
    parser.add_argument("--unfrozen-s", type=float, default=None, help="each unfrozen phase")
    parser.add_argument("--frozen-s", type=float, default=None, help="how long P stays frozen")
    parser.add_argument("--thaw-s", type=float, default=5.0, help="after SIGCONT, not in the ratio")
    parser.add_argument("--warmup-s", type=float, default=10.0, help="load before the first phase")
    parser.add_argument(
        "--lanes",
        type=int,
        default=None,
        help="serve with --lanes N (default: the shipped default; 1 shows head-of-line blocking)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    phase_s = 15.0 if args.quick else 30.0
    args.unfrozen_s = args.unfrozen_s or phase_s
    args.frozen_s = args.frozen_s or phase_s

    sys.path.insert(0, str(ROOT / "tests"))
    from _pg import PgCluster, find_bin

    from engine.server.codegen import ensure

    ensure()
    from engine.client import MemgateClient

    payload = run_header(NAME, args)
    payload["machine"]["lscpu_model_name"] = _lscpu_model()
    payload["settings"].update(
        lock_timeout_s=LOCK_TIMEOUT_S,
        lock_hold_s=HOLD_S,
        lock_flags="none (shipped defaults)",
        call_timeout_s=CALL_TIMEOUT_S,
    )
    print(
        f"{NAME}: CPU {payload['machine']['lscpu_model_name']}, load average "
        f"{payload['machine']['load_average_at_start']}, git {payload['git']['sha'][:10]}",
        flush=True,
    )
    bindir = find_bin()
    if bindir is None:
        raise SystemExit("no PostgreSQL binaries (initdb, pg_ctl): install Debian's postgresql")
    cluster = PgCluster(bindir)
    work = Path(tempfile.mkdtemp(prefix="bench-frozen-"))
    reps: list[Replica] = []
    load: Load | None = None
    threads: list[threading.Thread] = []
    frozen = False
    try:
        dsn = cluster.create_database("frozen")
        t = time.monotonic()
        extra = [] if args.lanes is None else ["--lanes", str(args.lanes)]
        reps = [spawn(n, dsn, work, args.cache_dir, extra) for n in ("P", "Q", "R")]
        wait_serving(reps)
        p, q, r = reps
        print(f"  3 replicas SERVING in {time.monotonic() - t:.1f} s", flush=True)
        others = [f"frozen/ns{i}" for i in range(args.namespaces)]
        texts = Texts(random.Random(args.seed))
        with MemgateClient(q.target, timeout=300.0, retry=False) as c:
            t = time.monotonic()
            for ns in others:
                c.write(texts.stored(ns, args.memories))
            print(
                f"  seeded {args.namespaces} x {args.memories} memories in "
                f"{time.monotonic() - t:.1f} s",
                flush=True,
            )

        load = Load(time.monotonic())
        threads = [threading.Thread(target=feeder, args=(load, p.target, args.feed_batch))]
        threads.append(threading.Thread(target=hot_writer, args=(load, q.target)))
        for i in range(args.clients):
            for rep in (q, r):
                seed = args.seed * 1000 + i * 2 + (rep is r)
                threads.append(
                    threading.Thread(target=writer, args=(load, rep.target, rep.name, others, seed))
                )
        threads.append(threading.Thread(target=health_poller, args=(load, [q, r])))
        for th in threads:
            th.daemon = True
            th.start()
        locks = Locks(dsn)
        phases: list[tuple[str, float, float]] = []
        cpu: dict[str, dict[str, float]] = {}

        def hold(name: str, seconds: float) -> None:
            a = load.now()
            snap = cpu_snapshot(reps)
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(left, 5.0))
                _progress(load, name, a)
            phases.append((name, a, load.now()))
            cpu[name] = cpu_between(snap, cpu_snapshot(reps))

        print(f"  warm-up {args.warmup_s:.0f} s", flush=True)
        time.sleep(args.warmup_s)
        hold("unfrozen-1", args.unfrozen_s)

        # Freeze P while its session provably holds HOT's lock.
        tries = 0
        wait_from = time.monotonic()
        while True:
            if time.monotonic() - wait_from > 120:
                raise SystemExit("P never held HOT's lock when it was stopped (2 minutes)")
            if locks.holder() == "memgate-P":
                tries += 1
                os.kill(p.pid, signal.SIGSTOP)
                frozen = True
                if locks.holder() == "memgate-P":
                    break
                os.kill(p.pid, signal.SIGCONT)
                frozen = False
            time.sleep(0.005)
        frozen_at = load.now()
        print(
            f"  P frozen at {frozen_at:.1f} s holding {HOT} (pg_locks; {tries} stop(s), "
            f"{time.monotonic() - wait_from:.2f} s waiting for the lock)",
            flush=True,
        )
        snap = cpu_snapshot(reps)
        released_at: float | None = None
        holders: list[tuple[float, str | None]] = []
        end = time.monotonic() + args.frozen_s
        last = time.monotonic()
        while time.monotonic() < end:
            h = locks.holder()
            now = load.now()
            holders.append((round(now - frozen_at, 2), h))
            if released_at is None and h != "memgate-P":
                released_at = now
                print(f"  P's lock on {HOT} gone after {now - frozen_at:.1f} s", flush=True)
            if time.monotonic() - last >= 5:
                _progress(load, "frozen", frozen_at)
                last = time.monotonic()
            time.sleep(0.25)
        os.kill(p.pid, signal.SIGCONT)
        frozen = False
        thawed_at = load.now()
        phases.append(("frozen", frozen_at, thawed_at))
        cpu["frozen"] = cpu_between(snap, cpu_snapshot(reps))
        print(f"  P thawed at {thawed_at:.1f} s", flush=True)
        hold("thaw", args.thaw_s)
        hold("unfrozen-2", args.unfrozen_s)

        load.stop.set()
        for th in threads:
            th.join(CALL_TIMEOUT_S + 130)
        hung = [th.name for th in threads if th.is_alive()]
        locks.close()
        after_thaw_feed = [c for c in load.calls if c.who == "feed" and c.start >= thawed_at]
        in_flight = [
            {"status": c.status, "seconds": round(c.seconds, 2), "message": c.message[:200]}
            for c in load.calls
            if c.who == "feed" and c.start < frozen_at < c.start + c.seconds
        ]
        p_alive = p.popen.poll() is None
        print("  load stopped; reading the store back", flush=True)
        check = read_back(dsn, [HOT, *others], load.acked)
    finally:
        if frozen and reps:
            os.kill(reps[0].pid, signal.SIGCONT)
        if load is not None:
            load.stop.set()
        for rep in reps:
            rep.stop()
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)

    calls = load.calls
    rows = phase_stats(calls, phases)
    by = {r["phase"]: r for r in rows}
    unfrozen_p99 = statistics.fmean([by["unfrozen-1"]["p99_ms"], by["unfrozen-2"]["p99_ms"]])
    ratio = by["frozen"]["p99_ms"] / unfrozen_p99
    hot = hot_figures(calls, frozen_at, thawed_at, released_at)
    health = Counter(
        f"{name}:{status}" for at, name, status in load.health if frozen_at <= at < thawed_at
    )
    payload.update(
        phases=rows,
        cpu_cores_by_phase=cpu,
        replicas={rep.name: {"serving_s": round(rep.serving_s, 1)} for rep in reps},
        freeze={
            "frozen_at_s": round(frozen_at, 2),
            "thawed_at_s": round(thawed_at, 2),
            "frozen_s": round(thawed_at - frozen_at, 2),
            "stop_attempts": tries,
            "hot_lock_holder_samples": holders,
        },
        hot_writes_while_frozen=hot,
        health_while_frozen=dict(health),
        p_after_thaw={
            "alive": p_alive,
            "feed_batches": dict(Counter(c.status for c in after_thaw_feed)),
            "batch_in_flight_at_freeze": in_flight,
        },
        read_back=check,
        hung_threads=hung,
    )

    def per(key: str) -> float:
        return by["frozen"][key] / statistics.fmean([by["unfrozen-1"][key], by["unfrozen-2"][key]])

    per_ns = {}
    for ns, v in by["frozen"]["p99_ms_by_namespace"].items():
        base = [by[k]["p99_ms_by_namespace"].get(ns) for k in ("unfrozen-1", "unfrozen-2")]
        if all(b is not None for b in base):
            per_ns[ns] = v / statistics.fmean(base)
    target = {
        "p99_ratio": ratio,
        "p99_ratio_by_replica": {"Q": per("p99_ms_Q"), "R": per("p99_ms_R")},
        "p99_ratio_by_namespace": per_ns,
        "p99_ratio_met": ratio <= 2.0 and per("p99_ms_Q") <= 2.0 and per("p99_ms_R") <= 2.0,
        "unfrozen_p99_mean_ms": unfrozen_p99,
        "frozen_p99_ms": by["frozen"]["p99_ms"],
        "q_over_r_frozen": by["frozen"]["p99_ms_Q"] / by["frozen"]["p99_ms_R"],
        "q_over_r_unfrozen": statistics.fmean(
            [by[k]["p99_ms_Q"] / by[k]["p99_ms_R"] for k in ("unfrozen-1", "unfrozen-2")]
        ),
        "hot_retryable_within_lock_timeout_plus_1s": hot["retryable_within_lock_timeout_plus_1s"],
        "hot_refused_not_unavailable": hot["refused_not_unavailable"],
        "lost": check["lost"],
        "forks": check["forks"],
    }
    target["met"] = bool(
        target["p99_ratio_met"]
        and target["hot_retryable_within_lock_timeout_plus_1s"]
        and not target["hot_refused_not_unavailable"]
        and check["lost"] == 0
        and check["forks"] == 0
    )
    payload["target"] = target

    print()
    print(
        table(
            [
                "phase",
                "s",
                "writes",
                "facts/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "p99 Q / R",
                "queue ms",
                "store ms",
                "statuses",
                "HOT on Q",
                "cores P/Q/R/bench/others",
            ],
            [
                [
                    r["phase"],
                    r["seconds"],
                    r["writes"],
                    r["facts_per_s"],
                    r["p50_ms"],
                    r["p95_ms"],
                    r["p99_ms"],
                    f"{r['p99_ms_Q']:,.0f} / {r['p99_ms_R']:,.0f}",
                    r["queue_ms_mean"],
                    r["store_ms_mean"],
                    _counts(r["statuses"]),
                    _counts(r["hot_statuses"]),
                    "/".join(fmt(cpu[r["phase"]][k]) for k in ("P", "Q", "R", "bench", "others")),
                ]
                for r in rows
            ],
            title="Other-namespace writes on Q and R (HOT: Q's writes to the held namespace)",
        )
    )
    print()
    print(
        f"p99 frozen / mean unfrozen: {by['frozen']['p99_ms']:.0f} / {unfrozen_p99:.0f} ms = "
        f"{ratio:.2f}x (target <= 2x: {'met' if target['p99_ratio_met'] else 'NOT met'})"
    )
    print(
        f"per replica: Q {target['p99_ratio_by_replica']['Q']:.2f}x, R "
        f"{target['p99_ratio_by_replica']['R']:.2f}x (in the target); per namespace (p99 of "
        f"~1/{args.namespaces} of the writes, information only): "
        f"{min(per_ns.values(), default=float('nan')):.2f}-"
        f"{max(per_ns.values(), default=float('nan')):.2f}x"
    )
    print(
        f"control, not the issue's target: p99 on Q (which also waits on HOT) / p99 on R = "
        f"{by['frozen']['p99_ms_Q']:.0f} / "
        f"{by['frozen']['p99_ms_R']:.0f} ms = {target['q_over_r_frozen']:.2f}x "
        f"(unfrozen: {target['q_over_r_unfrozen']:.2f}x)"
    )
    print(
        f"HOT on Q while P frozen: {_counts(hot['statuses'])}; slowest retryable answer "
        f"{hot['slowest_retryable_s']:.2f} s (<= {LOCK_TIMEOUT_S + 1:.0f} s: "
        f"{hot['retryable_within_lock_timeout_plus_1s']}); P's lock left pg_locks "
        + (
            "while P was frozen: no (still held at the thaw)"
            if hot["lock_left_pg_locks_after_s"] is None
            else f"after {hot['lock_left_pg_locks_after_s']} s"
        )
        + f"; first OK {hot['first_ok_after_freeze_s']} s after the freeze"
    )
    print(f"health while frozen: {dict(health)}")
    print(
        f"P's batch in flight at the freeze: "
        f"{', '.join(c['status'] for c in in_flight) or 'none'}; after the thaw: P alive "
        f"{p_alive}, its feeder batches "
        f"{_counts(payload['p_after_thaw']['feed_batches'])}; acknowledged decisions "
        f"{check['acked_decisions']} ({check['acked_stored']} stored): lost {check['lost']}, "
        f"forks {check['forks']}; integrity {check['integrity_check']}"
    )
    print(f"target {'MET' if target['met'] else 'NOT met'}")
    save_results(args.out, NAME, payload, lambda plt: draw(plt, payload, calls))
    return 0 if not hung else 1


def _counts(c: dict[str, int]) -> str:
    return " ".join(f"{k}:{v}" for k, v in sorted(c.items())) or "-"


def _progress(load: Load, name: str, since: float) -> None:
    with load.lock:
        mine = [c for c in load.calls if c.who in ("Q", "R") and c.start >= since]
        hot = [c.status for c in load.calls if c.who == "hot" and c.start >= since]
    ok = sorted(c.seconds for c in mine if c.status == "OK")
    p99 = ok[min(len(ok) - 1, int(0.99 * len(ok)))] * 1000 if ok else float("nan")
    print(
        f"    {name} +{load.now() - since:5.1f} s: {len(mine)} writes, p99 so far {p99:.0f} ms, "
        f"HOT {_counts(Counter(hot))}, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )


def _lscpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
