"""Item 6: a stateful property test of the store and the index against a plain model.

A hypothesis ``RuleBasedStateMachine`` drives a real store (:class:`SQLiteStore`, and in a
second, shorter run :class:`PostgresStore` on a fresh database of a throwaway server) and a real
:class:`IndexManager` (FAISS, with snapshots) the way the gate does (commit, then move the
index), across three namespaces, with synthetic unit vectors and no model: adds (some with
idempotency keys, retried), supersedes (replace), batches that must fail whole, undos, forgets,
review items queued and resolved (accept, keep_both, reject), index evictions, and restarts
(clean: the index snapshots itself and the store checkpoints; crash-like: the index is dropped
without a snapshot, so the next load reconciles a stale one). Every operation is also tried
with another namespace's ids and must change nothing.

The model is a dict of memories and review items. After every step, for every namespace:
``get`` / ``get_many`` / ``history`` / ``count_active`` / the active embeddings / the pending
review queue / the index's ids equal the model's; at most one memory of a supersedes chain is
active; a forgotten memory has no text and no vector; no id is visible from another namespace.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from engine.errors import Conflict, NotFound
from engine.index import IndexManager, IndexSettings
from engine.store import Write, new_memory_id, open_store
from engine.types import Fact

NAMESPACES = ("tenant/a", "tenant/b", "tenant/c")
DIM = 8
INDEX = IndexSettings(dim=DIM, snapshot_min_vectors=0)
RESOLUTIONS = ("accept", "keep_both", "reject")
IDEM_KEYS = ("k1", "k2", "k3")


@dataclass
class Mem:
    id: str
    ns: str
    text: str
    status: str
    supersedes: str | None
    superseded_by: str | None
    rowid: int
    vec: np.ndarray | None


@dataclass
class Rev:
    id: str
    ns: str
    text: str
    target: str | None
    status: str
    resolved: str | None
    vec: np.ndarray


_STATS = {"examples": 0, "steps": 0, "restarts": 0, "refused_foreign": 0, "conflicts": 0}


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


class StoreMachine(RuleBasedStateMachine):
    new_database: Any = None
    """``() -> DSN`` of a fresh PostgreSQL database; None: a SQLite file per example."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="memgate-stateful-"))
        maker = type(self).new_database
        self.db: Path | str = self.dir / "memgate.db" if maker is None else maker()
        self.snapshots = self.dir / "index"
        self.mems: dict[str, Mem] = {}
        self.revs: dict[str, Rev] = {}
        self.idem: dict[tuple[str, str], str] = {}
        self.order: list[str] = []  # memory ids in creation (rowid) order
        self._created: dict[str, int] = {}  # memory and review ids -> creation rank
        self.seed = 0
        self.texts = 0
        self._open()
        _STATS["examples"] += 1

    # -- plumbing -----------------------------------------------------------------------------
    def _open(self) -> None:
        self.store = open_store(self.db)
        self.index = IndexManager(
            self.store.iter_active_embeddings,
            INDEX,
            snapshot_dir=self.snapshots,
            source=self.store,
        )

    def teardown(self) -> None:
        self.index.close()
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _text(self) -> str:
        self.texts += 1
        return f"fact {self.texts}"

    def _vec(self) -> np.ndarray:
        self.seed += 1
        return unit(self.seed)

    def _in(self, ns: str, status: str | None = None) -> list[str]:
        return [
            m.id
            for m in self.mems.values()
            if m.ns == ns and (status is None or m.status == status)
        ]

    def _foreign(self, ns: str) -> list[str]:
        return [m.id for m in self.mems.values() if m.ns != ns]

    def _pick(self, data: Any, ids: list[str]) -> str | None:
        # In creation order, not by id: ids are random, and hypothesis needs the same choices
        # to give the same draws when it replays or shrinks an example.
        return (
            data.draw(st.sampled_from(sorted(ids, key=self._created.__getitem__))) if ids else None
        )

    def _new(
        self, ns: str, text: str, vec: np.ndarray, rowid: int, mid: str, sup: str | None
    ) -> None:
        self.mems[mid] = Mem(mid, ns, text, "active", sup, None, rowid, vec)
        self.order.append(mid)
        self._created[mid] = len(self._created)

    def _unchanged(self, call: Any, expected: type[Exception]) -> None:
        """A refused operation raises ``expected`` and changes nothing."""
        before = self._snapshot_model_view()
        with pytest.raises(expected):
            call()
        assert self._snapshot_model_view() == before

    def _snapshot_model_view(self) -> tuple[Any, ...]:
        rows = []
        for ns in NAMESPACES:
            ids = self._in(ns)
            rows.append(
                tuple(
                    (m.id, m.status, m.text, m.supersedes, m.superseded_by)
                    for m in self.store.get_many(ns, ids)
                )
            )
            rows.append(tuple(r.id for r in self.store.list_review(ns, "pending", 1000)))
        return tuple(rows)

    # -- writes ---------------------------------------------------------------------------------
    @rule(ns=st.sampled_from(NAMESPACES), key=st.none() | st.sampled_from(IDEM_KEYS))
    def add(self, ns: str, key: str | None) -> None:
        text, vec, mid = self._text(), self._vec(), new_memory_id()
        fact = Fact(ns, text, idempotency_key=key)
        result = self.store.commit([Write("add", fact, embedding=vec, memory_id=mid)])[0]
        if key is not None and (ns, key) in self.idem:
            # A retry: the first write's result, nothing stored, the index untouched.
            assert result.replayed and result.memory_id == self.idem[(ns, key)]
            return
        assert not result.replayed and result.memory_id == mid and result.rowid is not None
        if key is not None:
            self.idem[(ns, key)] = mid
        self._new(ns, text, vec, result.rowid, mid, None)
        self.index.add(ns, [result.rowid], vec[None, :])

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def supersede(self, ns: str, data: Any) -> None:
        target = self._pick(data, self._in(ns, "active"))
        if target is None:
            return
        text, vec, mid = self._text(), self._vec(), new_memory_id()
        w = Write("replace", Fact(ns, text), target_id=target, embedding=vec, memory_id=mid)
        result = self.store.commit([w])[0]
        old = self.mems[target]
        assert result.superseded_rowid == old.rowid and result.rowid is not None
        old.status, old.superseded_by = "superseded", mid
        self._new(ns, text, vec, result.rowid, mid, target)
        self.index.add(ns, [result.rowid], vec[None, :])
        self.index.remove(ns, [old.rowid])

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def batch_that_fails_whole(self, ns: str, data: Any) -> None:
        """An add, a valid supersede, then a replace of something not active here (another
        namespace's memory, or one no longer active): Conflict, and nothing of it stored."""
        bad = [m for m in self._foreign(ns)] + [
            m for m in self._in(ns) if self.mems[m].status != "active"
        ]
        target_bad = self._pick(data, bad)
        if target_bad is None:
            return
        writes = [Write("add", Fact(ns, self._text()), embedding=self._vec())]
        good = self._pick(data, self._in(ns, "active"))
        if good is not None:
            writes.append(
                Write("replace", Fact(ns, self._text()), target_id=good, embedding=self._vec())
            )
        writes.append(
            Write("replace", Fact(ns, self._text()), target_id=target_bad, embedding=self._vec())
        )
        _STATS["conflicts"] += 1
        self._unchanged(lambda: self.store.commit(writes), Conflict)

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def forget(self, ns: str, data: Any) -> None:
        mid = self._pick(data, self._in(ns))
        if mid is None:
            return
        m = self.mems[mid]
        assert self.store.forget(ns, mid) == m.rowid
        m.status, m.text, m.vec = "forgotten", "", None
        self.index.remove(ns, [m.rowid])

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def undo(self, ns: str, data: Any) -> None:
        mid = self._pick(data, self._in(ns))
        if mid is None:
            return
        m = self.mems[mid]
        old = self.mems.get(m.supersedes) if m.supersedes else None
        if (
            m.status != "active"
            or old is None
            or old.status != "superseded"
            or old.superseded_by != mid
        ):
            _STATS["conflicts"] += 1
            self._unchanged(lambda: self.store.undo(ns, mid), Conflict)
            return
        res = self.store.undo(ns, mid)
        assert res.undone_rowid == m.rowid and res.restored_rowid == old.rowid
        assert res.restored_embedding is not None and old.vec is not None
        assert np.array_equal(res.restored_embedding, old.vec)
        m.status = "undone"
        old.status, old.superseded_by = "active", None
        self.index.remove(ns, [m.rowid])
        self.index.add(ns, [old.rowid], res.restored_embedding[None, :])

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def queue_review(self, ns: str, data: Any) -> None:
        target = self._pick(data, self._in(ns, "active")) if data.draw(st.booleans()) else None
        text, vec = self._text(), self._vec()
        w = Write("review", Fact(ns, text), target_id=target, embedding=vec)
        result = self.store.commit([w])[0]
        assert result.review_id is not None and result.rowid is None
        self.revs[result.review_id] = Rev(result.review_id, ns, text, target, "pending", None, vec)
        self._created[result.review_id] = len(self._created)

    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def resolve(self, ns: str, data: Any) -> None:
        rid = self._pick(data, [r.id for r in self.revs.values() if r.ns == ns])
        if rid is None:
            return
        r = self.revs[rid]
        resolution = data.draw(st.sampled_from(RESOLUTIONS))
        target = self.mems.get(r.target) if r.target else None
        if r.status != "pending" or (
            resolution == "accept" and r.target is not None and target.status != "active"  # type: ignore[union-attr]
        ):
            _STATS["conflicts"] += 1
            self._unchanged(lambda: self.store.resolve_review(ns, rid, resolution), Conflict)
            return
        mid = new_memory_id()
        res = self.store.resolve_review(ns, rid, resolution, memory_id=mid)
        r.status = {"accept": "accepted", "keep_both": "kept_both", "reject": "rejected"}[
            resolution
        ]
        assert res.review.status == r.status
        if resolution == "reject":
            assert res.memory_id is None and res.rowid is None
            return
        assert res.memory_id == mid and res.rowid is not None
        r.resolved = mid
        sup = r.target if resolution == "accept" else None
        self._new(ns, r.text, r.vec, res.rowid, mid, sup)
        self.index.add(ns, [res.rowid], r.vec[None, :])
        if sup is not None:
            assert target is not None and res.superseded_rowid == target.rowid
            target.status, target.superseded_by = "superseded", mid
            self.index.remove(ns, [target.rowid])

    # -- another tenant's ids -------------------------------------------------------------------
    @rule(ns=st.sampled_from(NAMESPACES), data=st.data())
    def foreign_ids_are_absent(self, ns: str, data: Any) -> None:
        mid = self._pick(data, self._foreign(ns))
        if mid is not None:
            _STATS["refused_foreign"] += 1
            assert self.store.get(ns, mid) is None
            self._unchanged(lambda: self.store.forget(ns, mid), NotFound)
            self._unchanged(lambda: self.store.undo(ns, mid), NotFound)
            self._unchanged(lambda: self.store.history(ns, mid), NotFound)
        rid = self._pick(data, [r.id for r in self.revs.values() if r.ns != ns])
        if rid is not None:
            self._unchanged(lambda: self.store.resolve_review(ns, rid, "accept"), NotFound)

    # -- the index and restarts -----------------------------------------------------------------
    @rule(ns=st.sampled_from(NAMESPACES))
    def evict(self, ns: str) -> None:
        self.index.evict(ns)

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        _STATS["restarts"] += 1
        if clean:
            self.index.close()  # snapshots every loaded namespace
        else:
            self.index.flush()  # background writes only; what changed since is not on disk
        self.store.close()
        self._open()

    # -- invariants -----------------------------------------------------------------------------
    @invariant()
    def store_and_index_match_the_model(self) -> None:
        _STATS["steps"] += 1
        rank = {mid: i for i, mid in enumerate(self.order)}
        for ns in NAMESPACES:
            ids = self._in(ns)
            got = {m.id: m for m in self.store.get_many(ns, ids)}
            assert set(got) == set(ids)
            for mid in ids:
                want, m = self.mems[mid], got[mid]
                assert (m.status, m.text, m.supersedes, m.superseded_by) == (
                    want.status,
                    want.text,
                    want.supersedes,
                    want.superseded_by,
                ), mid
            for other in NAMESPACES:
                if other != ns:
                    assert self.store.get_many(other, ids) == []
            active = sorted(self.mems[i].rowid for i in ids if self.mems[i].status == "active")
            assert self.store.count_active(ns) == len(active)
            rowids, vecs = self.store.iter_active_embeddings(ns)
            assert rowids.tolist() == active
            for rowid, vec in zip(rowids.tolist(), vecs, strict=True):
                m = next(self.mems[i] for i in ids if self.mems[i].rowid == rowid)
                assert m.vec is not None and np.array_equal(vec, m.vec)
            assert self.index.rowids(ns).tolist() == active
            pending = [r.id for r in self.revs.values() if r.ns == ns and r.status == "pending"]
            listed = [r.id for r in self.store.list_review(ns, "pending", 1000)]
            assert sorted(listed) == sorted(pending)
            # Chains: the store's history equals the model's, and holds at most one active.
            for mid in ids:
                root = mid
                while self.mems[root].supersedes is not None:
                    root = self.mems[root].supersedes  # type: ignore[assignment]
                chain = [i for i in ids if self._root(i) == root]
                history = [m.id for m in self.store.history(ns, mid)]
                assert history == sorted(chain, key=rank.__getitem__), mid
                assert sum(self.mems[i].status == "active" for i in chain) <= 1
        for m in self.mems.values():
            if m.status == "forgotten":
                assert m.text == "" and m.vec is None

    def _root(self, mid: str) -> str:
        while self.mems[mid].supersedes is not None:
            mid = self.mems[mid].supersedes  # type: ignore[assignment]
        return mid


SETTINGS = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_store_and_index_follow_a_plain_model(
    figures: Any, backend: str, request: pytest.FixtureRequest
) -> None:
    for key in _STATS:
        _STATS[key] = 0
    started = time.monotonic()
    machine: type[StoreMachine] = StoreMachine
    run_settings = SETTINGS
    if backend == "postgres":
        cluster = request.getfixturevalue("pg_cluster")
        count = iter(range(1_000_000))

        class PostgresMachine(StoreMachine):
            new_database = staticmethod(lambda: cluster.create_database(f"stateful_{next(count)}"))

            def teardown(self) -> None:
                super().teardown()
                cluster.drop_database(str(self.db).rsplit("/", 1)[1].split("?")[0])

        machine = PostgresMachine
        run_settings = settings(SETTINGS, max_examples=15)
    failing = 1  # until the run returns: hypothesis raises on the first (shrunk) failure
    try:
        run_state_machine_as_test(machine, settings=run_settings)
        failing = 0
    finally:
        figures.record(
            f"6 stateful property test ({backend})",
            examples=_STATS["examples"],
            steps=_STATS["steps"],
            restarts=_STATS["restarts"],
            refused_foreign_calls=_STATS["refused_foreign"],
            refused_conflicts=_STATS["conflicts"],
            failing_examples=failing,
            seconds=round(time.monotonic() - started, 1),
        )
