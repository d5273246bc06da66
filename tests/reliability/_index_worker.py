"""A process that keeps a real ``IndexManager`` busy over a real ``SQLiteStore``, to be killed.

``python _index_worker.py DB SNAPSHOT_DIR MODE SEED`` opens the store and the manager the way
``engine.app`` does (snapshots on), runs ``recover()`` like the server's start, prints
``ready`` and then loops until it is SIGKILLed, doing what the gate does after each store
change (``add`` / ``remove`` on the index):

* ``bulk``: commits batches of new memories across the namespaces;
* ``snapshot``: small commits and forgets, each followed by ``snapshot_all()`` (so most of its
  time is spent writing snapshot files);
* ``forget``: forgets batches of active memories, with a few adds and snapshots in between.

Embeddings are synthetic random unit vectors (no model). The settings are shared with the
test through :data:`SETTINGS`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from engine.index import IndexManager, IndexSettings
from engine.store import SQLiteStore, Write
from engine.types import Fact

DIM = 64
NAMESPACES = ("tenant/a", "tenant/b", "tenant/c")
# tenant/b grows past exact_max, so its index is IVF (trained), the case snapshots exist for.
SETTINGS = IndexSettings(dim=DIM, exact_max=2000, snapshot_min_vectors=100, nprobe=8)


def vectors(rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def open_manager(db: Path, snapshots: Path) -> tuple[SQLiteStore, IndexManager]:
    store = SQLiteStore(db)
    return store, IndexManager(
        store.iter_active_embeddings, SETTINGS, snapshot_dir=snapshots, source=store
    )


def commit_adds(
    store: SQLiteStore, index: IndexManager, rng: np.random.Generator, namespace: str, n: int
) -> None:
    vecs = vectors(rng, n)
    tag = rng.integers(1 << 62)
    results = store.commit(
        [
            Write(action="add", fact=Fact(namespace, f"fact {tag}-{i}"), embedding=vecs[i])
            for i in range(n)
        ]
    )
    index.add(namespace, np.array([r.rowid for r in results], dtype=np.int64), vecs)


def forget_some(
    store: SQLiteStore, index: IndexManager, rng: np.random.Generator, namespace: str, n: int
) -> None:
    active = store.active_rowids(namespace)
    if len(active) <= n:
        return
    pick = rng.choice(active, size=n, replace=False)
    texts = store.texts_for_rowids(namespace, pick.tolist())
    for rowid in pick.tolist():
        if rowid in texts:
            forgotten = store.forget(namespace, texts[rowid].id)
            index.remove(namespace, np.array([forgotten], dtype=np.int64))


def main(db: str, snapshots: str, mode: str, seed: str) -> None:
    rng = np.random.default_rng(int(seed))
    store, index = open_manager(Path(db), Path(snapshots))
    index.recover()
    for ns in NAMESPACES:
        index.rowids(ns)  # load all: the writes below then follow the store into the index
    print("ready", flush=True)
    step = 0
    while True:
        step += 1
        ns = NAMESPACES[int(rng.integers(len(NAMESPACES)))]
        if mode == "bulk":
            commit_adds(store, index, rng, ns, int(rng.integers(20, 120)))
            if step % 4 == 0:
                index.snapshot_all()
        elif mode == "snapshot":
            commit_adds(store, index, rng, ns, 3)
            forget_some(store, index, rng, ns, 2)
            index.snapshot_all()
        elif mode == "forget":
            forget_some(store, index, rng, ns, int(rng.integers(1, 12)))
            if step % 5 == 0:
                commit_adds(store, index, rng, ns, 30)
            if step % 7 == 0:
                index.snapshot_all()
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(*sys.argv[1:5])
