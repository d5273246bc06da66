"""Index snapshots: the file format, atomic writes, and the manager's load / reconcile / reject
logic on real FAISS, against an in-memory store (``Source``: the store's reads, from dicts)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.errors import InvalidInput
from engine.index import IndexManager, IndexSettings, NamespaceIndex, SnapshotSource
from engine.index.snapshot import (
    MAGIC,
    CorruptSnapshot,
    SnapshotHeader,
    clean_temporary,
    decode,
    encode,
    namespace_digest,
    snapshot_path,
    write_atomic,
)

DIM = 8


def unit(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Source:
    """The store's side of the index, in memory: active rowids and embeddings per namespace
    and an event counter per namespace. Also the loader (counts calls)."""

    def __init__(self) -> None:
        self.vectors: dict[str, dict[int, np.ndarray]] = {}
        self.seq: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._next = 1

    def add(self, namespace: str, vecs: np.ndarray) -> np.ndarray:
        rows = np.arange(self._next, self._next + len(vecs), dtype=np.int64)
        self._next += len(vecs)
        self.vectors.setdefault(namespace, {}).update(zip(rows.tolist(), vecs, strict=True))
        self.seq[namespace] += 1
        return rows

    def forget(self, namespace: str, rows: np.ndarray) -> None:
        for r in rows.tolist():
            del self.vectors[namespace][r]
        self.seq[namespace] += 1

    def __call__(self, namespace: str) -> tuple[np.ndarray, np.ndarray]:
        self.calls[namespace] += 1
        rows = self.active_rowids(namespace)
        return self.active_embeddings(namespace, rows)

    def namespaces(self) -> list[str]:
        return sorted(self.vectors)

    def namespace_seq(self, namespace: str) -> int:
        return self.seq[namespace]

    def active_rowids(self, namespace: str) -> np.ndarray:
        return np.array(sorted(self.vectors.get(namespace, {})), dtype=np.int64)

    def active_embeddings(
        self, namespace: str, rowids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        held = self.vectors.get(namespace, {})
        rows = sorted(int(r) for r in rowids if int(r) in held)
        if not rows:
            return np.empty(0, np.int64), np.empty((0, 0), np.float32)
        return np.array(rows, dtype=np.int64), np.stack([held[r] for r in rows])


SETTINGS = IndexSettings(dim=DIM, exact_max=200, snapshot_min_vectors=1)


def manager(source: Source, directory: Path, **settings: object) -> IndexManager:
    s = IndexSettings(**{**SETTINGS.__dict__, **settings})  # type: ignore[arg-type]
    return IndexManager(source, s, snapshot_dir=directory, source=source)


def assert_follows(m: IndexManager, source: Source, namespace: str) -> None:
    """The index holds exactly the active rowids, and each finds itself first."""
    active = source.active_rowids(namespace)
    assert m.rowids(namespace).tolist() == active.tolist()
    if len(active):
        rows, vecs = source.active_embeddings(namespace, active)
        _, found = m.search(namespace, vecs, k=1)
        assert found[:, 0].tolist() == rows.tolist()


def small_file(namespace: str = "ns", n: int = 3) -> bytes:
    rng = np.random.default_rng(0)
    index = NamespaceIndex.build(np.arange(n), unit(rng, n), SETTINGS)
    header = SnapshotHeader(namespace, seq=5, count=n, dim=DIM, kind="exact", built_n=n)
    return encode(header, index.to_bytes())


def forge(data: bytes, **fields: object) -> bytes:
    """``data`` with header fields replaced and both checksums recomputed: a file that
    passes the byte checks, so only the semantic checks can reject it."""
    (head_len,) = struct.unpack("<I", data[8:12])
    head = json.loads(data[12 : 12 + head_len])
    payload = data[12 + head_len : -32]
    if "payload" in fields:
        payload = fields.pop("payload")  # type: ignore[assignment]
        head["payload_bytes"] = len(payload)
        head["payload_sha256"] = hashlib.sha256(payload).hexdigest()
    head.update(fields)
    raw = json.dumps(head).encode()
    body = MAGIC + struct.pack("<I", len(raw)) + raw + payload
    return body + hashlib.sha256(body).digest()


# -- the format -----------------------------------------------------------------------------


def test_round_trip_keeps_every_field() -> None:
    data = small_file("tenant/ü ☃")
    header, payload = decode(data, namespace="tenant/ü ☃", dim=DIM)
    assert (header.namespace, header.seq, header.count, header.kind) == (
        "tenant/ü ☃",
        5,
        3,
        "exact",
    )
    index = NamespaceIndex.from_bytes(payload, SETTINGS, "exact", header.count, header.built_n)
    assert index.rowids().tolist() == [0, 1, 2]


def test_every_truncation_and_every_bit_flip_is_rejected() -> None:
    data = small_file()
    for end in range(len(data)):
        with pytest.raises(CorruptSnapshot):
            decode(data[:end], namespace="ns", dim=DIM)
    for i in range(len(data)):
        for bit in (0, 7):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            with pytest.raises(CorruptSnapshot):
                decode(bytes(bad), namespace="ns", dim=DIM)


@pytest.mark.parametrize(
    ("fields", "namespace"),
    [
        ({}, "other"),  # the file of another namespace
        ({"format": 2}, "ns"),
        ({"format": True}, "ns"),
        ({"kind": "hnsw"}, "ns"),
        ({"dim": DIM * 2}, "ns"),
        ({"count": -1}, "ns"),
        ({"count": 10**6}, "ns"),  # more vectors than the payload can hold
        ({"seq": "5"}, "ns"),
        ({"namespace": ""}, None),
        ({"extra": 1}, "ns"),
    ],
)
def test_forged_headers_are_rejected(fields: dict[str, object], namespace: str | None) -> None:
    with pytest.raises(CorruptSnapshot):
        decode(forge(small_file(), **fields), namespace=namespace, dim=DIM)


@pytest.mark.parametrize(
    ("kind", "count", "payload"),
    [
        ("exact", 3, b"not a faiss index at all" * 8),
        ("ivf", 3, None),  # an exact payload announced as IVF
        ("exact", 2, None),  # the count disagrees with the payload
    ],
)
def test_payloads_that_pass_the_checksums_are_still_checked(
    kind: str, count: int, payload: bytes | None
) -> None:
    fields: dict[str, object] = {"kind": kind, "count": count}
    if payload is not None:
        fields["payload"] = payload
    header, body = decode(forge(small_file(), **fields), namespace="ns", dim=DIM)
    with pytest.raises(ValueError):
        NamespaceIndex.from_bytes(body, SETTINGS, header.kind, header.count, header.built_n)  # type: ignore[arg-type]


def test_write_atomic_leaves_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "snap" / "a.idx"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert [p.name for p in target.parent.iterdir()] == ["a.idx"]
    leftover = target.parent / ".a.idx.123.abcd.tmp"
    leftover.write_bytes(b"half")
    (target.parent / "keep.tmp.not").write_bytes(b"x")
    assert clean_temporary(target.parent) == 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.idx", "keep.tmp.not"]


def test_file_names_are_digests_of_the_exact_namespace(tmp_path: Path) -> None:
    assert snapshot_path(tmp_path, "a").name == namespace_digest("a") + ".idx"
    assert namespace_digest("a") != namespace_digest("a ") != namespace_digest("A")
    assert len(namespace_digest("x" * 10_000)) == 64


# -- the manager ----------------------------------------------------------------------------


def test_settings_and_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        IndexSettings(snapshot_min_vectors=-1)
    with pytest.raises(InvalidInput):
        IndexSettings(reconcile_max_fraction=1.5)
    with pytest.raises(InvalidInput):
        IndexManager(Source(), SETTINGS, snapshot_dir=tmp_path)
    assert isinstance(Source(), SnapshotSource)


@pytest.mark.parametrize("n", [50, 400])  # exact and IVF
def test_a_snapshot_spares_the_rebuild_and_follows_the_store(tmp_path: Path, n: int) -> None:
    source = Source()
    rng = np.random.default_rng(n)
    source.add("a", unit(rng, n))
    first = manager(source, tmp_path)
    assert_follows(first, source, "a")  # built, then snapshotted (above the minimum)
    assert first.flush(timeout=30)
    assert first.stats().snapshots_written == 1 and source.calls["a"] == 1
    assert first.close() == 0  # unchanged since: nothing to write

    again = manager(source, tmp_path)
    assert_follows(again, source, "a")
    stats = again.stats()
    assert source.calls["a"] == 1 and stats.snapshot_loads == 1 and stats.loads == 0
    assert stats.namespaces[0].kind == ("ivf" if n > 200 else "exact")


def test_a_stale_snapshot_is_reconciled(tmp_path: Path) -> None:
    source = Source()
    rng = np.random.default_rng(1)
    rows = source.add("a", unit(rng, 100))
    built = manager(source, tmp_path)
    built.rowids("a")  # builds and snapshots
    assert built.flush(timeout=30)
    source.forget("a", rows[:7])
    source.add("a", unit(rng, 5))
    m = manager(source, tmp_path)
    report = m.recover()
    assert (report.loaded, report.reconciled, report.rebuilt, report.rejected) == (1, 1, 0, ())
    assert_follows(m, source, "a")
    assert source.calls["a"] == 1  # patched, not rebuilt
    assert m.close() == 1  # the patched index is written back


def test_a_snapshot_too_far_behind_is_rebuilt_and_replaced(tmp_path: Path) -> None:
    source = Source()
    rng = np.random.default_rng(2)
    rows = source.add("a", unit(rng, 40))
    built = manager(source, tmp_path)
    built.rowids("a")
    assert built.flush(timeout=30)
    source.forget("a", rows[:30])
    m = manager(source, tmp_path, reconcile_max_fraction=0.5)
    report = m.recover()
    assert (report.loaded, report.rebuilt, report.rejected) == (0, 1, ())
    assert_follows(m, source, "a")
    assert source.calls["a"] == 2
    assert m.flush(timeout=30)
    header, _ = decode(snapshot_path(tmp_path, "a").read_bytes(), namespace="a", dim=DIM)
    assert header.count == 10  # the rebuilt index replaced the stale file


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate", "checksum"),
        ("flip", "checksum"),
        ("empty", "too short"),
        ("other namespace", "another namespace"),
        ("ahead of the store", "ahead of the store"),
        ("other database", "vectors differ"),
    ],
)
def test_a_bad_snapshot_is_quarantined_and_the_namespace_rebuilt(
    tmp_path: Path, damage: str, reason: str
) -> None:
    source = Source()
    rng = np.random.default_rng(3)
    source.add("a", unit(rng, 30))
    source.add("b", unit(rng, 20))
    m = manager(source, tmp_path)
    m.rowids("a"), m.rowids("b")
    assert m.flush(timeout=30)
    path = snapshot_path(tmp_path, "a")
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:40] + bytes([data[40] ^ 0x10]) + data[41:])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "other namespace":
        path.write_bytes(snapshot_path(tmp_path, "b").read_bytes())
    elif damage == "ahead of the store":
        source.seq["a"] = 0  # as if the store were restored from an older backup
    else:  # same namespace and rowids, other vectors
        held = source.vectors["a"]
        for r in held:
            held[r] = unit(rng, 1)[0]
    fresh = manager(source, tmp_path)
    report = fresh.recover()
    assert [name for name, _ in report.rejected] == [path.name]
    assert reason in report.rejected[0][1]
    assert fresh.stats().snapshots_rejected == 1
    assert_follows(fresh, source, "a")
    assert_follows(fresh, source, "b")
    assert path.with_suffix(".bad").exists()
    assert fresh.flush(timeout=30)
    # The rebuilt namespace was snapshotted again, and that file verifies.
    decode(path.read_bytes(), namespace="a", dim=DIM)


def test_eviction_writes_the_snapshot_and_the_reload_uses_it(tmp_path: Path) -> None:
    source = Source()
    rng = np.random.default_rng(4)
    for ns in "abc":
        source.add(ns, unit(rng, 60))
    one = NamespaceIndex.build(*source("a"), SETTINGS).nbytes
    m = manager(source, tmp_path, memory_budget_bytes=one + 100, snapshot_min_vectors=10)
    m.rowids("a")  # built, then snapshotted with 60 vectors
    assert m.flush(timeout=30)
    rows = source.add("a", unit(rng, 2))
    assert m.add("a", rows, source.active_embeddings("a", rows)[1]) == 2
    written = m.stats().snapshots_written
    m.rowids("b")  # evicts a: its 62 vectors are written then
    assert m.flush(timeout=30)
    assert m.loaded() == ["b"] and m.stats().snapshots_written == written + 2  # a, then b
    header, _ = decode(snapshot_path(tmp_path, "a").read_bytes(), namespace="a", dim=DIM)
    assert header.count == 62 and header.seq == source.seq["a"]
    calls = source.calls["a"]
    assert_follows(m, source, "a")
    assert source.calls["a"] == calls and m.stats().snapshots_reconciled == 0


def test_small_namespaces_lose_their_snapshot(tmp_path: Path) -> None:
    source = Source()
    rng = np.random.default_rng(5)
    rows = source.add("a", unit(rng, 30))
    first = manager(source, tmp_path, snapshot_min_vectors=20)
    first.rowids("a")
    assert first.flush(timeout=30)
    assert snapshot_path(tmp_path, "a").exists()
    m = manager(source, tmp_path, snapshot_min_vectors=20)
    m.rowids("a")
    source.forget("a", rows[:15])
    m.remove("a", rows[:15])
    m.close()
    assert not snapshot_path(tmp_path, "a").exists()


def test_recover_cleans_temporary_files_and_unknown_files_stay_out(tmp_path: Path) -> None:
    source = Source()
    source.add("a", unit(np.random.default_rng(6), 10))
    tmp_path.joinpath(".x.idx.1.ab.tmp").write_bytes(b"half written")
    tmp_path.joinpath(namespace_digest("gone") + ".idx").write_bytes(os.urandom(100))
    m = manager(source, tmp_path)
    report = m.recover()
    assert report.temporary_removed == 1 and report.files == 1
    assert report.rebuilt == 0 and len(report.rejected) == 1  # nothing stored under "gone"
    assert m.loaded() == []


def test_recover_respects_the_memory_budget(tmp_path: Path) -> None:
    source = Source()
    rng = np.random.default_rng(7)
    for ns in "abcd":
        source.add(ns, unit(rng, 50))
    m = manager(source, tmp_path)
    for ns in "abcd":
        m.rowids(ns)
    assert m.flush(timeout=30)
    one = NamespaceIndex.build(*source("a"), SETTINGS).nbytes
    fresh = manager(source, tmp_path, memory_budget_bytes=2 * one + 10)
    report = fresh.recover()
    assert report.loaded == 2 and report.deferred == 2 and report.rejected == ()
    for ns in "abcd":
        assert_follows(fresh, source, ns)


def test_the_snapshot_module_exports_what_it_names() -> None:
    import engine.index.snapshot as snapshot

    for name in snapshot.__all__:
        assert getattr(snapshot, name) is not None
