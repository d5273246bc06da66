"""Shared fixtures: the real models (built by `memgate models build`) and a fresh gate per test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _pg import pg_cluster, pg_dsn  # noqa: F401 - the PostgreSQL server fixtures

from engine.cli.common import default_cache_dir

CACHE = default_cache_dir()  # the one default: $MEMGATE_HOME, else ~/.cache/memgate


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    if not (CACHE / "models" / "minilm").is_dir():
        pytest.fail(f"no model artefacts in {CACHE}: run `make models` (or set MEMGATE_HOME)")
    return CACHE


@pytest.fixture(scope="session")
def models(cache_dir: Path) -> tuple[object, object]:
    """The real MiniLM fp32 embedder and the best available real NLI model."""
    from engine.runtime.loader import load_models

    return load_models(cache_dir)


@pytest.fixture
def make_gate(models: tuple[object, object], tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Build a Gate over a fresh SQLite store in tmp_path (call again to reopen the same store)."""
    from engine.gate.gate import Gate
    from engine.index import IndexManager
    from engine.store import SQLiteStore

    opened: list[SQLiteStore] = []

    def factory(name: str = "memgate.db", **settings: object) -> Gate:
        store = SQLiteStore(tmp_path / name)
        opened.append(store)
        index = IndexManager(store.iter_active_embeddings)
        embedder, nli = models
        return Gate(store, index, embedder, nli, **settings)  # type: ignore[arg-type]

    yield factory
    for store in opened:
        store.close()
