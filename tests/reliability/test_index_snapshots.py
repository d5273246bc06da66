"""Items 3 and 4: the FAISS index is derived state, and a snapshot is never loaded unverified.

Item 3 (index reconciliation): a real ``IndexManager`` over a real ``SQLiteStore`` (real FAISS,
snapshots on) runs in a subprocess (``_index_worker.py``) doing bulk adds, snapshot writes or
forgets, and is SIGKILLed at a random moment (in ``snapshot`` mode: the moment a snapshot's
temporary file appears, i.e. inside a write). After each kill a fresh manager recovers the
snapshot directory like the server's start; then, in every namespace, the index's ids must
equal the store's active rowids, and 100 sampled memories must find themselves at rank 1 when
searched by their own stored embedding.

Item 4 (corrupted snapshots): 200 damaged snapshot files (truncations, bit flips in header,
payload and trailer, empty files, another namespace's file, garbage, forged files whose
checksums are right but whose content is not, stale sequences) each go through ``recover()``:
every damaged one must be refused and its namespace rebuilt from the store, every stale one
reconciled, and the index must equal the store afterwards. A handful of them are then given to
a real ``memgate serve`` process: it must start, report SERVING, answer a Recall, and shut down
cleanly, writing a snapshot that verifies.

Embeddings are synthetic unit vectors written through the store's commit API; only the server
test loads the models (the server needs them to start).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _index_worker import DIM, NAMESPACES, SETTINGS, commit_adds, forget_some, vectors

from engine.index import IndexManager, IndexSettings, NamespaceIndex, RecoveryReport
from engine.index.snapshot import MAGIC, decode, snapshot_path
from engine.store import SQLiteStore, Write
from engine.types import Fact

WORKER = Path(__file__).with_name("_index_worker.py")
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = 100


# -- helpers -----------------------------------------------------------------------------------


def seed_store(db: Path, sizes: dict[str, int], dim: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with SQLiteStore(db) as store:
        for ns, n in sizes.items():
            vecs = vectors(rng, n) if dim == DIM else unit(rng, n, dim)
            store.commit(
                [
                    Write(action="add", fact=Fact(ns, f"{ns} seed {i}"), embedding=vecs[i])
                    for i in range(n)
                ]
            )


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def open_index(
    store: SQLiteStore, snapshots: Path, settings: IndexSettings = SETTINGS
) -> IndexManager:
    return IndexManager(
        store.iter_active_embeddings, settings, snapshot_dir=snapshots, source=store
    )


def check_index(
    store: SQLiteStore, index: IndexManager, rng: np.random.Generator, sample: int = SAMPLE
) -> int:
    """Index ids == active store ids in every namespace; ``sample`` memories (spread over the
    namespaces) find themselves at rank 1. Returns how many were sampled."""
    pool: list[tuple[str, int]] = []
    for ns in store.namespaces():
        active = store.active_rowids(ns)
        held = index.rowids(ns)
        assert held.tolist() == active.tolist(), (
            f"{ns}: {len(np.setdiff1d(held, active))} ids not active, "
            f"{len(np.setdiff1d(active, held))} active ids missing"
        )
        pool.extend((ns, int(r)) for r in active)
    picks = rng.choice(len(pool), size=min(sample, len(pool)), replace=False)
    by_ns: dict[str, list[int]] = {}
    for i in picks.tolist():
        ns, rowid = pool[i]
        by_ns.setdefault(ns, []).append(rowid)
    for ns, rowids in by_ns.items():
        rows, vecs = store.active_embeddings(ns, rowids)
        assert sorted(rows.tolist()) == sorted(rowids)
        _, found = index.search(ns, vecs, k=1)
        assert found[:, 0].tolist() == rows.tolist(), f"{ns}: a sampled memory missed rank 1"
    return len(picks)


def leftover_temporary(snapshots: Path) -> int:
    if not snapshots.exists():
        return 0
    return sum(1 for p in snapshots.iterdir() if p.name.endswith(".tmp"))


# -- item 3: kill -9 during bulk add, snapshot write and forget --------------------------------

CYCLES = 10
_TOTALS: Counter[str] = Counter()


def start_worker(db: Path, snapshots: Path, mode: str, seed: int, log: Path) -> subprocess.Popen:
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(db), str(snapshots), mode, str(seed)],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=ROOT,
        )
    assert proc.stdout is not None
    # "ready" comes once the worker recovered the snapshots and loaded every namespace.
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else b"(no answer in 120 s)"
    if line.strip() != b"ready":
        proc.kill()
        proc.wait()
        proc.stdout.close()
        pytest.fail(f"the worker did not start: {line!r}; see {log}: {log.read_text()[-2000:]}")
    return proc


def kill_inside_a_write(snapshots: Path, proc: subprocess.Popen, limit_s: float) -> bool:
    """SIGKILL the worker the moment a snapshot temporary file exists; True if one was seen."""
    deadline = time.monotonic() + limit_s
    seen = False
    while time.monotonic() < deadline and not seen:
        with os.scandir(snapshots) as entries:
            seen = any(e.name.endswith(".tmp") for e in entries)
    proc.send_signal(signal.SIGKILL)
    return seen


@pytest.mark.parametrize("mode", ["bulk", "snapshot", "forget"])
def test_kill_9_leaves_an_index_that_equals_the_store(
    tmp_path: Path, mode: str, figures: object
) -> None:
    db, snapshots, log = tmp_path / "memgate.db", tmp_path / "index", tmp_path / "worker.log"
    seed_store(db, {NAMESPACES[0]: 800, NAMESPACES[1]: 2600, NAMESPACES[2]: 300}, DIM, 1)
    rng = np.random.default_rng(len(mode))
    sampled = inside_write = tmp_left = reconciled = rejected = 0
    for cycle in range(CYCLES):
        proc = start_worker(db, snapshots, mode, cycle, log)
        if mode == "snapshot":
            inside_write += kill_inside_a_write(snapshots, proc, limit_s=3.0)
        else:
            time.sleep(float(rng.uniform(0.05, 1.0)))
            proc.send_signal(signal.SIGKILL)
        code = proc.wait(30)
        assert proc.stdout is not None
        proc.stdout.close()
        assert code == -signal.SIGKILL, "the worker ended before it was killed"
        tmp_left += leftover_temporary(snapshots)
        with SQLiteStore(db) as store:
            assert store.integrity_check()
            index = open_index(store, snapshots)
            report = index.recover()
            assert leftover_temporary(snapshots) == 0
            reconciled += report.reconciled
            rejected += len(report.rejected)
            sampled += check_index(store, index, rng)
            assert index.flush(timeout=60)  # before the next worker shares the directory
    if mode == "snapshot":
        # The kills did land inside snapshot writes, and those left only a temporary file.
        assert inside_write >= CYCLES // 2 and tmp_left >= 1
    _TOTALS.update(
        {
            "kills": CYCLES,
            f"kills_{mode}": CYCLES,
            "kills_inside_snapshot_write": inside_write,
            "temporary_files_cleaned": tmp_left,
            "snapshots_reconciled": reconciled,
            "snapshots_rejected": rejected,
            "sampled_rank1": sampled,
        }
    )
    figures.record(  # type: ignore[attr-defined]
        "3 index reconciliation",
        **dict(_TOTALS),
        namespaces_mismatched=0,
        sampled_missed=0,
    )


# -- item 4: 200 corrupted snapshots -----------------------------------------------------------

Case = tuple[str, str, Callable[[], None]]
"""``(kind, target namespace, damage())``: damage writes the bad file (or moves the store)."""


def _frame(data: bytes) -> tuple[dict[str, object], bytes]:
    (n,) = struct.unpack("<I", data[8:12])
    return json.loads(data[12 : 12 + n]), data[12 + n : -32]


def _forged(head: dict[str, object], payload: bytes) -> bytes:
    """A file with right checksums around whatever header and payload it is given."""
    head = {
        **head,
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }
    raw = json.dumps(head).encode()
    body = MAGIC + struct.pack("<I", len(raw)) + raw + payload
    return body + hashlib.sha256(body).digest()


def corruption_cases(
    snapshots: Path, pristine: dict[str, bytes], store: SQLiteStore, rng: np.random.Generator
) -> list[Case]:
    a, b, c = NAMESPACES
    cases: list[Case] = []

    def put(kind: str, ns: str, data: bytes) -> None:
        path = snapshot_path(snapshots, ns)
        cases.append((kind, ns, lambda: path.write_bytes(data)))

    # Truncations: 50, every region (magic, length, header, payload, trailer).
    for i in range(50):
        ns = a if i % 3 else b
        data = pristine[ns]
        n = len(data)
        cut = [1, 4, 8, 10, 12, 30, 100, 200, n // 3, n // 2, n - 33, n - 32, n - 31, n - 1]
        at = cut[i] if i < len(cut) else int(rng.integers(1, n))
        put("truncation", ns, data[:at])
    # Bit and byte flips: 70 (header 35, payload 25, trailer 10).
    for i in range(70):
        ns = a if i % 2 else b
        data = bytearray(pristine[ns])
        (head_len,) = struct.unpack("<I", bytes(data[8:12]))
        if i < 35:
            at = int(rng.integers(0, 12 + head_len))
        elif i < 60:
            at = int(rng.integers(12 + head_len, len(data) - 32))
        else:
            at = int(rng.integers(len(data) - 32, len(data)))
        data[at] ^= 1 << int(rng.integers(8)) if i % 3 else 0xFF
        put("flip", ns, bytes(data))
    # Empty and nearly empty: 6.
    for data in (b"", b"\0", MAGIC, MAGIC + b"\0\0\0\0", b"\0" * len(pristine[a]), b"\n"):
        put("empty", a, data)
    # Another namespace's file in place: 12.
    pairs = [(a, b), (a, c), (b, a), (b, c), (c, a), (c, b)] * 2
    for target, other in pairs:
        put("other namespace", target, pristine[other])
    # Garbage: 20.
    for i in range(20):
        if i < 12:
            data = rng.bytes(int(rng.integers(1, 200_000)))
        elif i < 15:
            data = MAGIC + rng.bytes(int(rng.integers(40, 5000)))
        elif i < 17:
            data = json.dumps({"namespace": a, "count": 1}).encode() * (i + 1)
        else:
            # A raw faiss index, without our framing.
            rows, vecs = store.iter_active_embeddings(a)
            data = NamespaceIndex.build(rows, vecs, SETTINGS).to_bytes().tobytes()[: 1000 * i]
        put("garbage", a, data)
    # Forged: checksums right, content wrong: 22.
    head_a, payload_a = _frame(pristine[a])
    _, payload_c = _frame(pristine[c])
    forged = [
        {"format": 2},
        {"format": 0},
        {"dim": DIM * 2},
        {"dim": 0},
        {"kind": "ivf"},
        {"kind": "flat"},
        {"count": int(head_a["count"]) - 1},  # type: ignore[call-overload]
        {"count": int(head_a["count"]) + 1},  # type: ignore[call-overload]
        {"count": -1},
        {"seq": -5},
        {"seq": 10**12},  # ahead of the store
        {"namespace": a + " "},
        {"namespace": a.upper()},
        {"namespace": ""},
        {"namespace": None},
        {"built_n": "many"},
    ]
    for fields in forged:
        put("forged", a, _forged({**head_a, **fields}, payload_a))
    put("forged", a, _forged(head_a, payload_a[: len(payload_a) // 2]))
    put("forged", a, _forged(head_a, rng.bytes(len(payload_a))))
    put("forged", a, _forged(head_a, payload_a[:100] + rng.bytes(len(payload_a) - 100)))
    # c's index relabelled as a's: no rowid in common with a's store.
    head_c = {**head_a, "count": len(store.active_rowids(c))}
    put("forged", a, _forged(head_c, payload_c))
    # a's index with each vector's rowid kept but the vectors of another database.
    rows, vecs = store.iter_active_embeddings(a)
    other = NamespaceIndex.build(rows, unit(rng, len(rows), DIM), SETTINGS).to_bytes().tobytes()
    put("forged", a, _forged(head_a, other))
    put("forged", a, _forged({**head_a, "extra": 1}, payload_a))
    # Stale: the store moved on after the snapshot: 20 (reconciled, not refused).
    for i in range(20):
        ns = (a, b)[i % 2]

        def move(ns: str = ns, i: int = i) -> None:
            snapshot_path(snapshots, ns).write_bytes(pristine[ns])
            index = IndexManager(store.iter_active_embeddings, SETTINGS)  # nothing loaded
            if i % 3 != 1:
                commit_adds(store, index, rng, ns, int(rng.integers(1, 40)))
            if i % 3 != 0:
                forget_some(store, index, rng, ns, int(rng.integers(1, 40)))

        cases.append(("stale", ns, move))
    return cases


def test_200_corrupted_snapshots_are_refused_and_rebuilt(tmp_path: Path, figures: object) -> None:
    db, snapshots = tmp_path / "memgate.db", tmp_path / "index"
    seed_store(db, {NAMESPACES[0]: 600, NAMESPACES[1]: 2300, NAMESPACES[2]: 300}, DIM, 2)
    rng = np.random.default_rng(4)
    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    with SQLiteStore(db) as store:
        first = open_index(store, snapshots)
        for ns in NAMESPACES:
            first.rowids(ns)  # built, then snapshotted in the background
        assert first.flush(timeout=60)
        pristine = {ns: snapshot_path(snapshots, ns).read_bytes() for ns in NAMESPACES}
        cases = corruption_cases(snapshots, pristine, store, rng)
        assert len(cases) == 200
        for i, (kind, target, damage) in enumerate(cases):
            for ns in NAMESPACES:  # everything sound but the target
                snapshot_path(snapshots, ns).write_bytes(pristine[ns])
            damage()
            index = open_index(store, snapshots)
            report = index.recover()
            assert index.flush(timeout=60)
            kinds[kind] += 1
            where = f"case {i} ({kind} of {target})"
            if kind == "stale":
                assert report.rejected == () and report.rebuilt == 0, where
                assert (report.loaded, report.reconciled) == (3, 1), where
                outcomes["reconciled"] += 1
                index.close()  # the reconciled index is written back: the next pristine file
                pristine[target] = snapshot_path(snapshots, target).read_bytes()
            else:
                # The damaged file was not used: its namespace was built from the store.
                assert (report.loaded, report.rebuilt, report.reconciled) == (2, 1, 0), where
                quarantined = [n for n, _ in report.rejected]
                assert quarantined in ([snapshot_path(snapshots, target).name], []), where
                outcomes["quarantined" if quarantined else "discarded as unusable"] += 1
                outcomes["refused"] += 1
                # Rebuilt and snapshotted again: the new file verifies.
                decode(snapshot_path(snapshots, target).read_bytes(), namespace=target, dim=DIM)
            check_index(store, index, rng, sample=10)
            assert index.flush(timeout=60)
        last = open_index(store, snapshots)
        check_index(store, last, rng, sample=SAMPLE)
        assert last.flush(timeout=60)
    assert outcomes["refused"] + outcomes["reconciled"] == 200
    figures.record(  # type: ignore[attr-defined]
        "4 corrupted snapshots",
        total=200,
        rejected=outcomes["refused"],
        quarantined=outcomes["quarantined"],
        reconciled_stale=outcomes["reconciled"],
        crashes=0,
        **{f"cases_{k.replace(' ', '_')}": v for k, v in sorted(kinds.items())},
    )


# -- item 4 against a real server process ------------------------------------------------------

SERVER_NAMESPACES = ("acme/big", "acme/other")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(data_dir: Path, cache_dir: Path, port: int, log: Path) -> subprocess.Popen:
    with log.open("wb") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine",
                "--cache-dir",
                str(cache_dir),
                "serve",
                "--data-dir",
                str(data_dir),
                "--port",
                str(port),
                "--threads",
                "1",
                "--no-access-log",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=ROOT,
        )


def wait_serving(proc: subprocess.Popen, target: str, limit_s: float = 90.0) -> str:
    from engine.client import MemgateClient

    deadline = time.monotonic() + limit_s
    status = "UNREACHABLE"
    with MemgateClient(target, timeout=2.0) as client:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = client.health()
            except Exception:  # noqa: BLE001 - not bound yet
                status = "UNREACHABLE"
            if status == "SERVING":
                return status
            time.sleep(0.2)
    return status


def test_a_real_server_survives_corrupted_snapshots(
    tmp_path: Path, cache_dir: Path, figures: object
) -> None:
    from engine.server.codegen import ensure

    ensure()
    from engine.client import MemgateClient

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db, snapshots = data_dir / "memgate.db", data_dir / "index"
    settings = IndexSettings()  # what `memgate serve` uses: dim 384, snapshots from 1,000
    sizes = dict.fromkeys(SERVER_NAMESPACES, settings.snapshot_min_vectors + 100)
    seed_store(db, sizes, settings.dim, 5)
    big, other = SERVER_NAMESPACES
    with SQLiteStore(db) as store:
        first = open_index(store, snapshots, settings)
        for ns in SERVER_NAMESPACES:
            first.rowids(ns)
        assert first.flush(timeout=60)
    pristine = {ns: snapshot_path(snapshots, ns).read_bytes() for ns in SERVER_NAMESPACES}
    good = pristine[big]
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x04
    damages = {
        "truncated": good[: len(good) // 3],
        "payload bit flip": bytes(flipped),
        "empty": b"",
        "another namespace's file": pristine[other],
        "garbage": np.random.default_rng(6).bytes(50_000),
    }
    crashes = served = 0
    for name, data in damages.items():
        for ns in SERVER_NAMESPACES:
            snapshot_path(snapshots, ns).write_bytes(pristine[ns])
        snapshot_path(snapshots, big).write_bytes(data)
        port, log = free_port(), tmp_path / f"serve-{len(name)}.log"
        proc = serve(data_dir, cache_dir, port, log)
        try:
            status = wait_serving(proc, f"127.0.0.1:{port}")
            if proc.poll() is not None:
                crashes += 1
                pytest.fail(
                    f"{name}: the server exited {proc.returncode}: {log.read_text()[-3000:]}"
                )
            assert status == "SERVING", f"{name}: health says {status}"
            with MemgateClient(f"127.0.0.1:{port}", timeout=30.0) as client:
                hits = client.recall(big, "what does the customer prefer?", k=5)
                assert len(hits) == 5 and all(m.namespace == big for m, _ in hits)
            served += 1
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        assert code == 0, f"{name}: exit code {code}: {log.read_text()[-3000:]}"
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        refused = [x for x in lines if x.get("msg", "").startswith("index snapshot rejected")]
        assert [x["file"] for x in refused] == [snapshot_path(snapshots, big).name], name
        assert not any(big in x or other in x for x in log.read_text().splitlines())
        # Its shutdown snapshot verifies and equals the store.
        with SQLiteStore(db) as store:
            index = open_index(store, snapshots, settings)
            report = index.recover()
            assert isinstance(report, RecoveryReport) and report.rejected == ()
            assert report.loaded == 2
            check_index(store, index, np.random.default_rng(7), sample=20)
            assert index.flush(timeout=60)
    figures.record(  # type: ignore[attr-defined]
        "4 corrupted snapshots",
        server_cases=len(damages),
        server_serving_after=served,
        server_crashes=crashes,
    )
