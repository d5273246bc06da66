"""Item 2: a crash at every point inside every composite operation leaves it all-or-nothing.

Composite operations: supersede (a ``commit`` carrying a replace, alone and in a batch with an
in-batch chain), forget, undo, and review-resolve (accept, keep_both, reject). For each one a
child process opens a copy of one prepared database with a :class:`StatementHook` that ends
the process (``os._exit(137)``, what kill -9 leaves behind) *before* its N-th SQL statement,
for N = 1 .. k (k statements: ``BEGIN IMMEDIATE`` .. ``COMMIT``), and once more *after* the
``COMMIT`` returned (point k + 1). A first child runs the operation without crashing; it gives
k and the committed state.

After each crash the database is reopened (SQLite recovers from the WAL) and must be exactly
the state before the operation (every point up to ``COMMIT``) or exactly the state after it
(the point after ``COMMIT``): every row of every table compared. On top of that the invariants
the contract names: at most one active memory per supersedes chain, a forgotten memory has no
text and no embedding (here and in its review item), review items agree with the memories they
produced, ``integrity_check`` passes, and the index rebuilt from the store (and one reconciled
from a snapshot taken before the operation) holds exactly the active memories.

This file is also the child: ``python test_crash_points.py DB OP CRASH_AT``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # the child: run from the repository root without installing
    sys.path.insert(0, str(ROOT))

from engine.store import SQLiteStore, Write  # noqa: E402
from engine.store.sqlite import StatementHook  # noqa: E402
from engine.types import Fact  # noqa: E402

NS, OTHER = "crash/a", "crash/b"
DIM = 8
CLOCK = 1_700_000_000.0
CRASHED = 137
NEVER = 1 << 30


def vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def fact(text: str, ns: str = NS, **kw: Any) -> Fact:
    return Fact(namespace=ns, text=text, **kw)


# -- the operations (run in the child) ---------------------------------------------------------
def _op(store: SQLiteStore, op: str, ids: dict[str, str]) -> Any:
    if op == "supersede":
        return store.commit(
            [
                Write(
                    "replace",
                    fact("Plan: gold.", idempotency_key="idem-super"),
                    target_id=ids["plan"],
                    embedding=vec(101),
                    memory_id="mem_super_new",
                )
            ]
        )
    if op == "supersede_batch":
        return store.commit(
            [
                Write(
                    "replace",
                    fact("Office: Austin."),
                    target_id=ids["office"],
                    embedding=vec(102),
                    memory_id="mem_batch_1",
                ),
                Write(
                    "add",
                    fact("Likes tea.", kind="episodic"),
                    embedding=vec(103),
                    memory_id="mem_batch_tea",
                ),
                Write(
                    "replace",
                    fact("Office: Chicago.", idempotency_key="idem-batch"),
                    target_id="mem_batch_1",
                    embedding=vec(104),
                    memory_id="mem_batch_2",
                ),
                Write("skip", fact("Likes tea."), target_id=ids["plan"]),
            ]
        )
    if op == "forget":
        return store.forget(NS, ids["from_review"])
    if op == "forget_head":
        return store.forget(NS, ids["moved"])
    if op == "undo":
        return store.undo(NS, ids["moved"])
    if op.startswith("resolve_"):
        resolution = op.removeprefix("resolve_")
        return store.resolve_review(
            NS, ids[f"review_{resolution}"], resolution, memory_id=f"mem_res_{resolution}"
        )
    raise ValueError(op)


OPS = (
    "supersede",
    "supersede_batch",
    "forget",
    "forget_head",
    "undo",
    "resolve_accept",
    "resolve_keep_both",
    "resolve_reject",
)


class CrashAt(StatementHook):
    """Ends the process before the ``at``-th statement once armed; ``at = k + 1`` ends it after
    the ``COMMIT`` (the k-th statement) returned."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.armed = False
        self.seen = 0

    def before(self, sql: str) -> None:
        if not self.armed:
            return
        self.seen += 1
        if self.seen == self.at:
            os._exit(CRASHED)

    def after(self, sql: str) -> None:
        if self.armed and self.seen + 1 == self.at and sql == "COMMIT":
            os._exit(CRASHED)


def child(db: str, op: str, at: int) -> int:
    hook = CrashAt(at)
    ids = json.loads(Path(db).with_suffix(".ids").read_text())
    store = SQLiteStore(db, clock=lambda: CLOCK + 1, hook=hook)
    hook.armed = True
    _op(store, op, ids)
    hook.armed = False
    print(json.dumps({"statements": hook.seen}), flush=True)  # os._exit flushes nothing
    os._exit(0)  # like a crash after the call returned: no close, no checkpoint


# -- the prepared database (built in the parent) -----------------------------------------------
def prepare(path: Path) -> dict[str, str]:
    """Chains, reviews and a second namespace; returns the ids the operations act on."""
    ids: dict[str, str] = {}
    with SQLiteStore(path, clock=lambda: CLOCK) as s:

        def add(text: str, seed: int, ns: str = NS, **kw: Any) -> str:
            r = s.commit([Write("add", fact(text, ns, **kw), embedding=vec(seed))])[0]
            assert r.memory_id is not None
            return r.memory_id

        def replace(target: str, text: str, seed: int) -> str:
            w = Write("replace", fact(text), target_id=target, embedding=vec(seed))
            r = s.commit([w])[0]
            assert r.memory_id is not None
            return r.memory_id

        def review(text: str, target: str | None, seed: int) -> str:
            w = Write("review", fact(text), target_id=target, embedding=vec(seed))
            r = s.commit([w])[0]
            assert r.review_id is not None
            return r.review_id

        ids["plan"] = add("Plan: silver.", 1, key="plan")
        ids["office"] = add("Office: Denver.", 2)
        first = add("Lives in Lisbon.", 3)
        ids["moved"] = replace(first, "Lives in Porto.", 4)
        ids["moved_from"] = first
        reviewed = review("Works at Initech.", None, 5)
        resolved = s.resolve_review(NS, reviewed, "keep_both")
        assert resolved.memory_id is not None
        ids["from_review"] = resolved.memory_id
        target = add("Car: blue.", 6)
        for i, resolution in enumerate(("accept", "keep_both", "reject")):
            ids[f"review_{resolution}"] = review(f"Car: red {i}.", target, 7 + i)
        ids["canary"] = add("Canary: the other tenant's fact.", 20, OTHER)
    path.with_suffix(".ids").write_text(json.dumps(ids))
    return ids


# -- reading a database back (the parent) ------------------------------------------------------
def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, in a stable order: two states compare equal or not."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        return {t: sorted(conn.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in tables}
    finally:
        conn.close()


def invariant_faults(path: Path, snapshot_dir: Path) -> list[str]:
    """The contract's invariants, read through the store and a rebuilt (and a reconciled) index."""
    from engine.index import IndexManager, IndexSettings

    faults: list[str] = []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT rowid, id, namespace, status, text, embedding IS NOT NULL, supersedes, "
            "superseded_by FROM memories"
        ).fetchall()
        reviews = conn.execute(
            "SELECT id, namespace, status, fact, embedding IS NOT NULL, resolved_memory_id "
            "FROM reviews"
        ).fetchall()
    finally:
        conn.close()
    by_id = {r[1]: r for r in rows}
    # One active version per chain: walk every memory to its chain's root.
    active_per_root: dict[str, int] = defaultdict(int)
    for _rowid, mid, _ns, status, *_ in rows:
        root, seen = mid, set()
        while by_id[root][6] is not None and root not in seen:
            seen.add(root)
            root = by_id[root][6]
        if status == "active":
            active_per_root[root] += 1
    faults += [
        f"chain {root} has {n} active memories" for root, n in active_per_root.items() if n > 1
    ]
    for _rowid, mid, _ns, status, text, has_vec, _sup, by in rows:
        if status == "forgotten" and (text or has_vec):
            faults.append(f"forgotten {mid} still holds its text or embedding")
        if status == "superseded" and (by is None or by not in by_id):
            faults.append(f"superseded {mid} names no superseding memory")
        if status == "active" and not has_vec:
            faults.append(f"active {mid} has no embedding")
    for rid, _ns, status, fact_json, _has_vec, resolved in reviews:
        if status == "pending" and resolved is not None:
            faults.append(f"pending review {rid} names a memory")
        if status in ("accepted", "kept_both") and resolved not in by_id:
            faults.append(f"{status} review {rid} names no stored memory")
        if status == "rejected" and resolved is not None:
            faults.append(f"rejected review {rid} stored a memory")
        if resolved in by_id and by_id[resolved][3] == "forgotten":
            if json.loads(fact_json).get("text"):
                faults.append(f"review {rid} keeps the text of forgotten {resolved}")
    with SQLiteStore(path) as store:
        if not store.integrity_check():
            faults.append("integrity_check failed")
        settings = IndexSettings(dim=DIM, snapshot_min_vectors=0)
        rebuilt = IndexManager(store.iter_active_embeddings, settings)
        from_snapshot = IndexManager(
            store.iter_active_embeddings, settings, snapshot_dir=snapshot_dir, source=store
        )
        for ns in (NS, OTHER):
            active = sorted(r[0] for r in rows if r[2] == ns and r[3] == "active")
            for name, index in (("rebuilt", rebuilt), ("snapshot", from_snapshot)):
                held = index.rowids(ns).tolist()
                if held != active:
                    faults.append(f"{name} index of {ns} holds {held}, store has {active}")
        from_snapshot.close()
        rebuilt.close()
    return faults


def run_child(db: Path, op: str, at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, __file__, str(db), op, str(at)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def snapshot_before(db: Path, snapshot_dir: Path) -> None:
    """Snapshots of both namespaces as they are before the operation (stale after it)."""
    from engine.index import IndexManager, IndexSettings
    from engine.index.snapshot import snapshot_path

    settings = IndexSettings(dim=DIM, snapshot_min_vectors=0)
    with SQLiteStore(db) as store:
        manager = IndexManager(
            store.iter_active_embeddings, settings, snapshot_dir=snapshot_dir, source=store
        )
        for ns in (NS, OTHER):
            manager.rowids(ns)
        manager.close()  # waits for the background writer, then writes what is left
    for ns in (NS, OTHER):
        assert snapshot_path(snapshot_dir, ns).is_file(), f"no snapshot written for {ns}"


def test_every_crash_point_of_every_composite_operation(tmp_path: Path, figures: Any) -> None:
    base = tmp_path / "base.db"
    prepare(base)
    before = dump(base)
    points: dict[str, int] = {}
    half_applied: list[str] = []
    for op in OPS:
        work = tmp_path / op
        work.mkdir()
        # The run without a crash: how many statements, and the committed state.
        full = work / "full.db"
        shutil.copy(base, full)
        shutil.copy(base.with_suffix(".ids"), full.with_suffix(".ids"))
        done = run_child(full, op, NEVER)
        assert done.returncode == 0, f"{op} failed without a crash: {done.stderr[-2000:]}"
        k = json.loads(done.stdout.strip().splitlines()[-1])["statements"]
        after = dump(full)
        assert after != before, f"{op} changed nothing"
        assert invariant_faults(full, work / "snap-full") == [], op
        assert k >= 3, f"{op} ran {k} statements"
        points[op] = k + 1
        for at in range(1, k + 2):
            db = work / f"at{at}.db"
            shutil.copy(base, db)
            shutil.copy(base.with_suffix(".ids"), db.with_suffix(".ids"))
            snaps = work / f"snap{at}"
            snapshot_before(db, snaps)
            crashed = run_child(db, op, at)
            assert crashed.returncode == CRASHED, (
                f"{op} point {at}: exit {crashed.returncode}: {crashed.stderr[-2000:]}"
            )
            state = dump(db)
            expected = before if at <= k else after
            if state != expected:
                which = "before" if state == before else "after" if state == after else "neither"
                half_applied.append(f"{op} point {at}/{k + 1}: state is {which}")
            for fault in invariant_faults(db, snaps):
                half_applied.append(f"{op} point {at}/{k + 1}: {fault}")
    figures.record(
        "2 crash points in composite operations",
        points_per_operation=points,
        points=sum(points.values()),
        half_applied_states=len(half_applied),
    )
    assert half_applied == []


def test_the_crash_hook_really_crashes_mid_transaction(tmp_path: Path) -> None:
    """The harness can tell states apart: a crash inside the transaction (after BEGIN and a
    read) leaves the database as it was, and without a crash the operation is applied."""
    db = tmp_path / "x.db"
    prepare(db)
    before = dump(db)
    crashed = run_child(db, "supersede", 3)
    assert crashed.returncode == CRASHED and dump(db) == before
    ok = run_child(db, "supersede", NEVER)
    assert ok.returncode == 0 and dump(db) != before


if __name__ == "__main__":
    sys.exit(child(sys.argv[1], sys.argv[2], int(sys.argv[3])))
