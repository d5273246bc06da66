"""A real memgate server under load, and what the load tests read back (items 7-11).

* :class:`ModelGate`: the real gate handed to the server in place of itself. It records every
  model call (its texts and when it started) and can hold the model thread (``hold.clear()``),
  so a test can tell whether a request reached the model, and fill the queue deterministically.
  A collaborator, not a monkeypatch.
* :func:`running`: a :class:`~engine.server.ServerThread` on port 0, stopped on exit.
* :class:`AccessLog`: the server's access-log lines (rpc, code, ms, request id) as the server
  wrote them, read through a logging handler on ``memgate.server.access``.
* :func:`chain_faults` / :func:`stored`: the store read back after a race: forked supersede
  chains, chains with more than one active memory, every memory a namespace ever stored.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.server import ServerSettings, ServerThread
from engine.types import Memory

__all__ = [
    "AccessLog",
    "ChainFaults",
    "ModelGate",
    "chain_faults",
    "percentile",
    "running",
    "stored",
]


class ModelGate:
    """The real gate; every model call (triage, recall) is recorded with its texts and start
    time (``time.monotonic``). Clear ``hold`` to block the model thread at its next call."""

    def __init__(self, gate: Any) -> None:
        self._gate = gate
        self._lock = threading.Lock()
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()
        self.calls: list[tuple[float, list[str]]] = []

    def block(self) -> None:
        """Hold the model thread at its next call (``entered`` is set when one is held)."""
        self.entered.clear()
        self.hold.clear()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate, name)

    def seen(self) -> Counter[str]:
        """How many times each text reached the model."""
        with self._lock:
            return Counter(t for _, texts in self.calls for t in texts)

    def _enter(self, texts: list[str]) -> None:
        with self._lock:
            self.calls.append((time.monotonic(), texts))
        self.entered.set()
        assert self.hold.wait(300), "a test left the model thread held"

    def triage(self, facts: Any, policy: Any = "strict", **kw: Any) -> Any:
        self._enter([f.text for f in facts])
        return self._gate.triage(facts, policy, **kw)

    def recall(self, namespace: str, query: str, k: int = 10) -> Any:
        self._enter([query])
        return self._gate.recall(namespace, query, k)


@contextmanager
def running(gate: Any, **settings: Any) -> Iterator[ServerThread]:
    """A real server over ``gate`` on 127.0.0.1, port 0; stopped (no grace) on exit, after
    releasing a held :class:`ModelGate`."""
    st = ServerThread(gate, ServerSettings(port=0, **settings))
    st.start()
    try:
        yield st
    finally:
        if isinstance(gate, ModelGate):
            gate.hold.set()  # a failed test may have left the model thread held
        st.stop(grace=0)


@dataclass(frozen=True)
class Line:
    rpc: str
    code: str
    ms: float
    request_id: str
    at: float
    """``time.monotonic()`` when the line was written (the call had just ended)."""


class AccessLog(logging.Handler):
    """Collects the server's access-log lines while installed (``with AccessLog() as log``)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[Line] = []
        self._logger = logging.getLogger("memgate.server.access")
        self._level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        f = getattr(record, "fields", {})
        line = Line(f["rpc"], f["code"], float(f["ms"]), f["request_id"], time.monotonic())
        with self.lock or threading.Lock():
            self.lines.append(line)

    def __enter__(self) -> AccessLog:
        self._logger.addHandler(self)
        self._logger.setLevel(logging.INFO)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def stored(store: Any, namespace: str) -> list[Memory]:
    """Every memory ``namespace`` ever stored (any status), oldest first, found through the
    event log (adds, replaces and resolved reviews name the memory they stored)."""
    ids: list[str] = []
    after = 0
    while True:
        events = store.events(namespace, after_seq=after, limit=10_000)
        if not events:
            break
        ids += [e.memory_id for e in events if e.memory_id and e.type in ("add", "replace")]
        after = events[-1].seq
    return store.get_many(namespace, list(dict.fromkeys(ids)))


@dataclass
class ChainFaults:
    forks: list[str] = field(default_factory=list)
    """Memories superseded by more than one memory that was not undone."""
    broken_links: list[str] = field(default_factory=list)
    """Superseded memories whose ``superseded_by`` does not point back to their successor."""
    multi_active: list[list[str]] = field(default_factory=list)
    """Chains holding more than one active memory."""
    no_active: int = 0
    """Chains with no active memory (only right when their head was forgotten)."""
    chains: int = 0
    longest: int = 0

    @property
    def ok(self) -> bool:
        return not (self.forks or self.broken_links or self.multi_active)


def chain_faults(memories: list[Memory]) -> ChainFaults:
    """Check the supersede chains ``memories`` form (all of one namespace).

    A chain is a connected set of memories linked by ``supersedes``. Undo leaves the undone
    memory in its chain (status ``undone``) and the memory it replaced active again, which may
    then be replaced anew: only successors that were not undone count towards a fork.
    """
    by_id = {m.id: m for m in memories}
    successors: dict[str, list[Memory]] = defaultdict(list)
    for m in memories:
        if m.supersedes is not None and m.status != "undone":
            successors[m.supersedes].append(m)
    out = ChainFaults()
    for old_id, news in successors.items():
        if len(news) > 1:
            out.forks.append(old_id)
        old = by_id.get(old_id)
        if old is not None and (old.status == "active" or old.superseded_by != news[-1].id):
            out.broken_links.append(old_id)
    parent = {m.id: m.id for m in memories}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for m in memories:
        if m.supersedes in parent:
            parent[root(m.id)] = root(m.supersedes)
    groups: dict[str, list[Memory]] = defaultdict(list)
    for m in memories:
        groups[root(m.id)].append(m)
    out.chains = len(groups)
    out.longest = max((len(g) for g in groups.values()), default=0)
    for group in groups.values():
        active = [m.id for m in group if m.status == "active"]
        if len(active) > 1:
            out.multi_active.append(active)
        elif not active:
            out.no_active += 1
    return out


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100, nearest rank) of ``values``; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[rank]


# -- racing writers in other processes (multiprocessing "spawn" targets) --------------------------
Acked = tuple[str, str, str, str | None, str | None]
"""(namespace, text, action, memory_id, target_id) of one acknowledged decision."""


def _acked(decisions: Any) -> list[Acked]:
    return [(d.fact.namespace, d.fact.text, d.action, d.memory_id, d.target_id) for d in decisions]


def grpc_writer(
    target: str, namespace: str, key: str, tag: str, rounds: int
) -> tuple[list[Acked], dict[str, int]]:
    """Write ``rounds`` requests (a keyed update of ``key`` and an episode) through its own
    client; the acknowledged decisions and the status names of the failed calls."""
    from engine.client import MemgateClient
    from engine.errors import MemgateError
    from engine.types import Fact

    acked: list[Acked] = []
    errors: Counter[str] = Counter()
    with MemgateClient(target, timeout=120) as client:
        for i in range(rounds):
            facts = [
                Fact(namespace, f"Slot {key}: {tag}-{i}", key=key),
                Fact(namespace, f"Process {tag} wrote episode {i}.", kind="episodic"),
            ]
            try:
                acked += _acked(client.write(facts).decisions)
            except MemgateError as exc:
                errors[str(getattr(exc, "code", type(exc).__name__))] += 1
    return acked, dict(errors)


def gate_writer(
    db: str, cache: str, namespace: str, key: str, tag: str, rounds: int, threads: int
) -> tuple[list[Acked], dict[str, int]]:
    """An engine of its own (models, store connection, index, gate) over the shared database
    ``db`` (a SQLite file, or a PostgreSQL DSN): ``threads`` threads write ``rounds`` keyed
    updates and episodes each. Errors are counted by class; a SQLITE_BUSY ("database is
    locked") one separately."""
    from pathlib import Path

    from engine.errors import MemgateError
    from engine.gate.gate import Gate
    from engine.index import IndexManager
    from engine.runtime.loader import load_models
    from engine.store import open_store
    from engine.types import Fact

    embedder, nli = load_models(Path(cache))
    store = open_store(db)  # a SQLite file, or a postgresql:// DSN shared by the engines
    follow = store if getattr(store, "shared", False) else None
    gate = Gate(store, IndexManager(store.iter_active_embeddings, follow=follow), embedder, nli)
    acked: list[Acked] = []
    errors: Counter[str] = Counter()
    lock = threading.Lock()

    def work(t: int) -> None:
        for i in range(rounds):
            facts = [
                Fact(namespace, f"Slot {key}: {tag}.{t}-{i}", key=key),
                Fact(namespace, f"Engine {tag} thread {t} wrote episode {i}.", kind="episodic"),
            ]
            try:
                out = gate.triage(facts, "strict", apply=True).decisions
            except MemgateError as exc:
                text = str(exc).lower()
                locked = "locked" in text or "busy" in text
                with lock:
                    errors[type(exc).__name__ + (" (database is locked)" if locked else "")] += 1
                continue
            with lock:
                acked.extend(_acked(out))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    store.close()
    return acked, dict(errors)
