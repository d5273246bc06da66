"""Item 5: I/O errors and a full disk at the N-th write or sync are fail-stop.

Contract point 4: a storage write or fsync error is fail-stop: health goes NOT_SERVING and no
write it could not persist is acknowledged. The answers: UNAVAILABLE for an I/O error,
RESOURCE_EXHAUSTED for a full disk. A full disk is fail-stop too (decided here, see the
README): the operator must free space and restart, and until then every write is refused with
RESOURCE_EXHAUSTED, so a client can tell "disk full" from "server down".

Injected faults (through a real gRPC server, real gate, real SQLite): the store's fault seam
(``SQLiteStore(hook=...)``, a :class:`StatementHook`) raises what SQLite raises for a failing
disk (``disk_error``: ``SQLITE_IOERR_WRITE``, ``SQLITE_IOERR_FSYNC``, ``SQLITE_FULL``) at the
N-th *write point* of an RPC (every INSERT / UPDATE, and the COMMIT of a write transaction,
where SQLite syncs the WAL), for every N, and keeps failing at every later point (a persistent
failure). RPCs: Write (adds, with idempotency keys), Write (a keyed supersede), Forget, Undo,
ResolveReview (accept). Forget, Undo and ResolveReview are served outside the model batcher:
they must trip fail-stop too. After each run the database is reopened: a write that was not
answered OK must be absent (every fault here comes before the COMMIT took effect), except the
"fsync after COMMIT" case, where the COMMIT reached the WAL and the sync then failed: the
answer is not OK and the write is complete (the contract allows absent or complete).

Real faults, no injection:

* a full disk as SQLite itself reports it, at the store's page cap (``max_db_bytes``);
* a real ``ENOSPC`` on a small tmpfs, where mounting one is allowed (root); skipped otherwise;
* a real write error: ``memgate serve`` in a subprocess under ``RLIMIT_FSIZE`` with SIGXFSZ
  ignored. Measured: the kernel answers the write past the limit with ``EFBIG``, which SQLite
  reports as ``SQLITE_IOERR_WRITE`` (an I/O error, not ``SQLITE_FULL``): so UNAVAILABLE.

And SQLite's own behaviour after an error inside a transaction: it rolls back; after an I/O
error the store refuses every later call (poisoned) until it is reopened; after ``SQLITE_FULL``
it stays usable.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()  # the client and server need the generated stubs

from _proc import start_server  # noqa: E402
from conftest import within  # noqa: E402

from engine.client import MemgateClient  # noqa: E402
from engine.errors import MemgateError, StorageError, StorageFull  # noqa: E402
from engine.gate.gate import Gate  # noqa: E402
from engine.index import IndexManager  # noqa: E402
from engine.server import ServerSettings, ServerThread  # noqa: E402
from engine.store import SQLiteStore, StoreSettings, Write  # noqa: E402
from engine.store.sqlite import StatementHook, disk_error  # noqa: E402
from engine.types import Fact  # noqa: E402

NS = "faults/a"
CLOCK = 1_700_000_000.0
NOT_SERVING_BOUND_S = 1.0
NEVER = 1 << 30
EXPECTED = {"io": "UNAVAILABLE", "fsync": "UNAVAILABLE", "full": "RESOURCE_EXHAUSTED"}


class FaultAt(StatementHook):
    """Fails the ``n``-th write point (INSERT / UPDATE / DELETE, or the COMMIT of a write
    transaction) once armed, and every later one: a disk that stays broken. ``after=True``
    fails the COMMIT *after* it returned (the WAL was written, then the sync failed)."""

    def __init__(self, n: int, kind: str, *, after: bool = False) -> None:
        self.n = n
        self.kind = kind
        self.after_commit = after
        self.armed = False
        self.points = 0
        """Write points seen while armed."""
        self.statements = 0
        """Statements of any kind seen while armed."""
        self.failed_at: float | None = None
        self._writing = False
        self._fail_after = False
        self._lock = threading.Lock()

    def _is_point(self, sql: str) -> bool:
        head = sql.lstrip().split(None, 1)[0].upper()
        if head == "BEGIN":
            self._writing = "IMMEDIATE" in sql.upper()
            return False
        if head == "COMMIT":
            writing, self._writing = self._writing, False
            return writing
        return head in ("INSERT", "UPDATE", "DELETE", "REPLACE")

    def _fail(self) -> None:
        if self.failed_at is None:
            self.failed_at = time.monotonic()
        raise disk_error(self.kind)

    def before(self, sql: str) -> None:
        with self._lock:
            point = self._is_point(sql)
            if not self.armed:
                return
            self.statements += 1
            if not point:
                return
            self.points += 1
            if self.failed_at is not None:
                self._fail()  # the disk stays broken
            if self.points == self.n:
                if self.after_commit and sql.lstrip().upper().startswith("COMMIT"):
                    self._fail_after = True
                else:
                    self._fail()

    def after(self, sql: str) -> None:
        with self._lock:
            if self._fail_after:
                self._fail_after = False
                self._fail()


_IDS = re.compile(r"\b(mem|rev)_[0-9a-f]{24}\b")


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table. Ids the gate draws at random for new memories and review
    items are masked, so the committed state of two runs of one RPC compares equal (the
    store's clock is fixed, see :data:`CLOCK`)."""

    def mask(value: Any) -> Any:
        return _IDS.sub(r"\1_*", value) if isinstance(value, str) else value

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY 1")
        ]
        return {
            n: sorted(
                (tuple(mask(v) for v in row) for row in conn.execute(f"SELECT * FROM {n}")),
                key=repr,
            )
            for n in names
        }
    finally:
        conn.close()


def make_gate(store: SQLiteStore, models: tuple[Any, Any]) -> Gate:
    embedder, nli = models
    return Gate(store, IndexManager(store.iter_active_embeddings), embedder, nli)


@contextmanager
def serving(gate: Gate) -> Iterator[ServerThread]:
    st = ServerThread(gate, ServerSettings(port=0, max_queue_delay_s=None, grace_s=0.0))
    st.start()
    try:
        yield st
    finally:
        st.stop()


def call(fn: Callable[[], Any]) -> str:
    """The status code name of one call: OK, or the code its error carried."""
    try:
        fn()
    except MemgateError as exc:
        return str(getattr(exc, "code", type(exc).__name__))
    return "OK"


def wait_not_serving(client: MemgateClient, since: float, limit: float = 10.0) -> float:
    """Seconds from ``since`` to the first NOT_SERVING answer (inf if none within ``limit``)."""
    while time.monotonic() - since < limit:
        try:
            if client.health(timeout=1.0) == "NOT_SERVING":
                return time.monotonic() - since
        except MemgateError:
            pass
        time.sleep(0.001)
    return float("inf")


# -- the prepared database ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, models: tuple[Any, Any]) -> dict[str, Any]:
    """A store holding what each RPC acts on: a keyed plan, a supersede (to undo), a memory
    to forget, a pending review item (to accept)."""
    path = tmp_path_factory.mktemp("faults") / "base.db"
    embedder = models[0]
    texts = [
        "Plan: silver.",
        "Lives in Lisbon.",
        "Lives in Porto.",
        "Likes green tea.",
        "Car: blue.",
        "Car: red.",
    ]
    vecs = embedder.embed(texts)
    ids: dict[str, str] = {}
    with SQLiteStore(path, clock=lambda: CLOCK) as s:

        def commit(w: Write) -> Any:
            return s.commit([w])[0]

        ids["plan"] = commit(
            Write("add", Fact(NS, texts[0], key="plan"), embedding=vecs[0])
        ).memory_id
        old = commit(Write("add", Fact(NS, texts[1]), embedding=vecs[1])).memory_id
        ids["moved"] = commit(
            Write("replace", Fact(NS, texts[2]), target_id=old, embedding=vecs[2])
        ).memory_id
        ids["forget"] = commit(Write("add", Fact(NS, texts[3]), embedding=vecs[3])).memory_id
        car = commit(Write("add", Fact(NS, texts[4]), embedding=vecs[4])).memory_id
        ids["review"] = commit(
            Write("review", Fact(NS, texts[5]), target_id=car, embedding=vecs[5])
        ).review_id
    return {"path": path, "ids": ids, "before": dump(path)}


def operations(ids: dict[str, str]) -> dict[str, Callable[[MemgateClient], Any]]:
    return {
        "write_add": lambda c: c.write(
            [
                Fact(NS, "Had lunch at noon.", kind="episodic", idempotency_key="idem-1"),
                Fact(NS, "Took the train home.", kind="episodic"),
            ]
        ),
        "write_supersede": lambda c: c.write([Fact(NS, "Plan: gold.", key="plan")]),
        "forget": lambda c: c.forget(NS, ids["forget"]),
        "undo": lambda c: c.undo(NS, ids["moved"]),
        "resolve_accept": lambda c: c.resolve_review(NS, ids["review"], "accept"),
    }


def run_once(
    base: dict[str, Any], models: tuple[Any, Any], tmp: Path, op: str, hook: FaultAt
) -> dict[str, Any]:
    """One server over a copy of the base store with ``hook``; run ``op`` once, then probe."""
    db = tmp / "run.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    shutil.copy(base["path"], db)
    store = SQLiteStore(db, clock=lambda: CLOCK + 1, hook=hook)
    out: dict[str, Any] = {}
    try:
        with serving(make_gate(store, models)) as st:
            client = MemgateClient(st.target, timeout=20.0, retry=False)
            try:
                client.get(NS, base["ids"]["plan"])  # the namespace's index is loaded
                hook.armed = True
                out["code"] = call(lambda: operations(base["ids"])[op](client))
                if hook.failed_at is not None:
                    out["not_serving_s"] = wait_not_serving(client, hook.failed_at)
                    out["next_write"] = call(
                        lambda: client.write([Fact(NS, "After the failure.", kind="episodic")])
                    )
                    out["next_forget"] = call(lambda: client.forget(NS, base["ids"]["plan"]))
                    out["read"] = call(lambda: client.get(NS, base["ids"]["plan"]))
                out["health"] = client.health()
            finally:
                client.close()
    finally:
        store.close()
    out["points"] = hook.points
    out["state"] = dump(db)
    with SQLiteStore(db) as again:
        out["integrity"] = again.integrity_check()
    return out


def test_injected_io_errors_and_full_disk_at_every_write_point(
    base: dict[str, Any], models: tuple[Any, Any], tmp_path: Path, figures: Any
) -> None:
    before = base["before"]
    problems: list[str] = []
    points: dict[str, int] = {}
    runs = 0
    ok_uncommitted = 0
    slowest = 0.0
    for op in operations(base["ids"]):
        clean = run_once(base, models, tmp_path, op, FaultAt(NEVER, "io"))
        assert clean["code"] == "OK" and clean["state"] != before, f"{op} did nothing: {clean}"
        after = clean["state"]
        k = points[op] = clean["points"]
        assert k >= 2, f"{op}: {k} write points"
        # io and full at every point (the last one is the COMMIT); fsync at the COMMIT, before
        # it took effect and after it reached the WAL.
        cases = [(kind, n, False) for kind in ("io", "full") for n in range(1, k + 1)]
        cases += [("fsync", k, False), ("fsync", k, True)]
        for kind, n, after_commit in cases:
            label = f"{op} {kind}@{n}/{k}{' after COMMIT' if after_commit else ''}"
            got = run_once(base, models, tmp_path, op, FaultAt(n, kind, after=after_commit))
            runs += 1
            want = EXPECTED[kind]
            committed = got["state"] == after
            if got["code"] == "OK" and not committed:
                ok_uncommitted += 1
            if got["code"] != want:
                problems.append(f"{label}: answered {got['code']}, expected {want}")
            if after_commit:
                if got["state"] not in (before, after):
                    problems.append(f"{label}: half-applied")
            elif got["state"] != before:
                problems.append(
                    f"{label}: the store changed ({'complete' if committed else 'half'})"
                )
            if got.get("health") != "NOT_SERVING":
                problems.append(f"{label}: health {got.get('health')}")
            if got.get("next_write") != want or got.get("next_forget") != want:
                problems.append(
                    f"{label}: later writes answered {got.get('next_write')} / "
                    f"{got.get('next_forget')}, expected {want}"
                )
            # After a full disk reads still work; after an I/O error the store is poisoned.
            read_want = "OK" if kind == "full" else "UNAVAILABLE"
            if got.get("read") != read_want:
                problems.append(f"{label}: a read answered {got.get('read')}, not {read_want}")
            if not got["integrity"]:
                problems.append(f"{label}: integrity_check failed")
            seconds = got.get("not_serving_s", float("inf"))
            slowest = max(slowest, seconds)
            if not within(seconds, NOT_SERVING_BOUND_S):
                problems.append(f"{label}: NOT_SERVING after {seconds:.3f} s")
    figures.record(
        "5 I/O errors and full disk (injected)",
        write_points_per_rpc=points,
        runs=runs,
        ok_answers_for_uncommitted_writes=ok_uncommitted,
        wrong_answers=len(problems),
        not_serving_max_s=round(slowest, 4),
    )
    assert ok_uncommitted == 0
    assert problems == []


# -- real faults ----------------------------------------------------------------------------------
def write_until_refused(
    client: MemgateClient, make: Callable[[int], Fact], limit: int = 2000
) -> tuple[list[tuple[str, str]], Fact, str, float]:
    """Write one fact at a time until an answer is not OK. Returns the acknowledged
    ``(memory id, text)``, the refused fact, its status, and when it was sent."""
    acked: list[tuple[str, str]] = []
    for i in range(limit):
        fact = make(i)
        sent = time.monotonic()
        try:
            d = client.write([fact]).decisions[0]
        except MemgateError as exc:
            return acked, fact, str(getattr(exc, "code", "")), sent
        assert d.memory_id
        acked.append((d.memory_id, fact.text))
    raise AssertionError(f"{limit} writes and the disk never filled")


def check_after_real_fault(
    db: Path, acked: list[tuple[str, str]], refused: Fact
) -> tuple[int, bool, bool]:
    """Reopen the store: (acknowledged writes missing, refused fact present, integrity ok)."""
    with SQLiteStore(db) as store:
        found = {m.id: m.text for m in store.get_many(refused.namespace, [i for i, _ in acked])}
        missing = sum(found.get(i) != t for i, t in acked)
        ok = store.integrity_check()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        present = conn.execute(
            "SELECT COUNT(*) FROM memories WHERE text = ?", (refused.text,)
        ).fetchone()[0]
    finally:
        conn.close()
    return missing, bool(present), ok


def fill_until_refused(
    store: SQLiteStore, models: tuple[Any, Any], fact_of: Callable[[int], Fact]
) -> tuple[list[Any], list[Any], str, float, str, str]:
    """Serve ``store``, write ``fact_of(i)`` until the disk refuses, then probe.

    Returns (acked, refused, the refusal's code, seconds to NOT_SERVING, the code of a later
    write, the code of a read of the first acked memory); closes the store."""
    try:
        with serving(make_gate(store, models)) as st:
            with MemgateClient(st.target, timeout=20.0, retry=False) as client:
                acked, refused, code, sent = write_until_refused(client, fact_of)
                not_serving = wait_not_serving(client, sent)
                after = call(lambda: client.write([Fact(NS, "More.", kind="episodic")]))
                read = call(lambda: client.get(NS, acked[0][0])) if acked else "-"
    finally:
        store.close()
    return acked, refused, code, not_serving, after, read


def test_a_full_disk_at_the_store_cap_is_resource_exhausted_and_fail_stop(
    models: tuple[Any, Any], tmp_path: Path, figures: Any
) -> None:
    db = tmp_path / "capped.db"
    SQLiteStore(db).close()
    cap = db.stat().st_size + (192 << 10)
    acked, refused, code, not_serving, after, read = fill_until_refused(
        SQLiteStore(db, StoreSettings(max_db_bytes=cap)),
        models,
        lambda i: Fact(NS, f"Entry {i}: " + "lorem ipsum " * 600, "episodic"),
    )
    missing, present, ok = check_after_real_fault(db, acked, refused)
    figures.record(
        "5 full disk (SQLite page cap)",
        acked=len(acked),
        status=code,
        later_write=after,
        read_after=read,
        not_serving_s=round(not_serving, 4),
        acked_missing=missing,
        refused_stored=present,
    )
    assert acked, "the cap refused the first write: nothing was tested"
    assert code == "RESOURCE_EXHAUSTED" and after == "RESOURCE_EXHAUSTED" and read == "OK"
    assert within(not_serving, NOT_SERVING_BOUND_S)
    assert missing == 0 and not present and ok


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (a disk that really fills up), where this machine lets us mount one."""
    where = tmp_path / "small-disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_real_enospc_is_resource_exhausted_and_fail_stop(
    models: tuple[Any, Any], small_tmpfs: Path, figures: Any
) -> None:
    db = small_tmpfs / "memgate.db"
    acked, refused, code, not_serving, after, _ = fill_until_refused(
        SQLiteStore(db),
        models,
        lambda i: Fact(NS, f"Note {i}: " + "dolor sit amet " * 500, "episodic"),
    )
    # Free space the way an operator would (here: copy the files to a roomy disk), then reopen.
    roomy = small_tmpfs.parent / "roomy"
    roomy.mkdir()
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{db}{suffix}").exists():
            shutil.copy(f"{db}{suffix}", roomy / f"memgate.db{suffix}")
    missing, present, ok = check_after_real_fault(roomy / "memgate.db", acked, refused)
    figures.record(
        "5 full disk (real ENOSPC, tmpfs)",
        acked=len(acked),
        status=code,
        later_write=after,
        not_serving_s=round(not_serving, 4),
        acked_missing=missing,
        refused_stored=present,
    )
    assert acked and code == "RESOURCE_EXHAUSTED" and after == "RESOURCE_EXHAUSTED"
    assert within(not_serving, NOT_SERVING_BOUND_S)
    assert missing == 0 and not present and ok


def test_a_real_write_error_in_the_real_server_is_unavailable_and_fail_stop(
    cache_dir: Path, tmp_path: Path, figures: Any
) -> None:
    data = tmp_path / "data"
    flags = ("--embedder-variant", "int8", "--nli", "aegis-nli", "--threads", "1")
    server = start_server(data, cache_dir=cache_dir, flags=flags, fsize_limit=768 << 10)
    try:
        with MemgateClient(server.target, timeout=20.0, retry=False) as client:
            acked, refused, code, sent = write_until_refused(
                client, lambda i: Fact(NS, f"Record {i}: " + "consectetur " * 200, "episodic")
            )
            not_serving = wait_not_serving(client, sent)
            after = call(lambda: client.write([Fact(NS, "More.", kind="episodic")]))
    finally:
        server.kill()
    db = data / "memgate.db"
    missing, present, ok = check_after_real_fault(db, acked, refused)
    # A restart without the limit serves every acknowledged write.
    again = start_server(data, cache_dir=cache_dir, flags=flags)
    try:
        with MemgateClient(again.target, timeout=20.0, retry=False) as client:
            unreadable = sum(call(lambda i=i: client.get(NS, i)) != "OK" for i, _ in acked)
            health = client.health()
    finally:
        again.kill()
    figures.record(
        "5 write error (RLIMIT_FSIZE -> EFBIG, real server)",
        acked=len(acked),
        status=code,
        later_write=after,
        not_serving_s=round(not_serving, 4),
        acked_missing=missing,
        refused_stored=present,
        unreadable_after_restart=unreadable,
    )
    assert acked and code == "UNAVAILABLE" and after == "UNAVAILABLE"
    assert within(not_serving, NOT_SERVING_BOUND_S)
    assert missing == 0 and ok and unreadable == 0 and health == "SERVING"
    # A refused write may be present only if complete: it is one row with its embedding.
    if present:
        with SQLiteStore(db) as store:
            assert store.count_active(NS) == len(acked) + 1


# -- SQLite after an error inside a transaction ---------------------------------------------------
def _add(text: str, seed: int = 0) -> Write:
    import numpy as np

    v = np.random.default_rng(seed).standard_normal(8).astype(np.float32)
    return Write(
        "add", Fact(NS, text, idempotency_key=f"i-{text}"), embedding=v / np.linalg.norm(v)
    )


def test_an_io_error_rolls_back_and_poisons_the_store(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    hook = FaultAt(2, "io")
    store = SQLiteStore(db, hook=hook)
    first = store.commit([_add("kept")])[0]
    hook.armed = True
    with pytest.raises(StorageError) as info:
        store.commit([_add("lost", 1), _add("lost too", 2)])
    assert not isinstance(info.value, StorageFull)
    assert store.failed is not None
    seen = hook.statements
    with pytest.raises(StorageError):
        store.get(NS, first.memory_id or "")  # poisoned: not even reads
    with pytest.raises(StorageError):
        store.commit([_add("refused")])
    assert hook.statements == seen, "a poisoned store touched the database again"
    store.close()
    with SQLiteStore(db) as again:
        assert again.failed is None
        assert again.count_active(NS) == 1 and again.get(NS, first.memory_id or "") is not None
        assert again.integrity_check()


def test_a_full_disk_rolls_back_and_the_store_stays_usable(tmp_path: Path) -> None:
    hook = FaultAt(3, "full")
    with SQLiteStore(tmp_path / "s.db", hook=hook) as store:
        hook.armed = True
        with pytest.raises(StorageFull):
            store.commit([_add("a"), _add("b", 1)])
        assert store.failed is None and store.count_active(NS) == 0
        hook.armed = False
        assert store.commit([_add("c", 2)])[0].rowid is not None
        assert store.count_active(NS) == 1 and store.integrity_check()


def test_an_fsync_error_after_commit_is_not_ok_but_complete(tmp_path: Path) -> None:
    """The ambiguous case: the COMMIT reached the WAL, then the sync failed. The caller gets an
    error (never OK); after a restart the write is there, whole; a retry with its idempotency
    key returns it instead of writing it twice."""
    db = tmp_path / "s.db"
    hook = FaultAt(4, "fsync", after=True)  # 2 inserts + 1 idempotency insert, then COMMIT
    store = SQLiteStore(db, hook=hook)
    hook.armed = True
    with pytest.raises(StorageError):
        store.commit([_add("maybe")])
    assert hook.failed_at is not None and store.failed is not None
    store.close()
    with SQLiteStore(db) as again:
        assert again.count_active(NS) == 1
        replay = again.commit([_add("maybe")])[0]
        assert replay.replayed and again.count_active(NS) == 1 and again.integrity_check()
