"""What the framework adapters need from memgate, and its two implementations.

The adapters talk to :class:`GateEngine` only. :class:`LocalEngine` drives an in-process
:class:`engine.app.OpenedEngine` (its ``Gate``); :class:`RemoteEngine` drives a ``memgate serve``
through :class:`engine.client.MemgateClient`. This is the one module that knows either of them,
so pointing the adapters at another engine facade means adding one class here.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from engine.errors import InvalidInput, NotFound
from engine.lifecycle import to_as_of
from engine.types import Decision, Fact, Memory, ReviewItem

__all__ = ["GateEngine", "LocalEngine", "RemoteEngine", "as_gate_engine", "open_local"]


@runtime_checkable
class GateEngine(Protocol):
    """The engine operations an adapter uses. Errors are :mod:`engine.errors` classes."""

    def write(
        self, facts: Sequence[Fact], policy: str, overrides: Mapping[str, Any] | None = None
    ) -> list[Decision]:
        """Decide and commit ``facts`` in one transaction; one decision per fact, in order."""
        ...

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        """The memory, whatever its status; None when the namespace holds no such id."""
        ...

    def forget(self, namespace: str, memory_id: str) -> None: ...

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]:
        """Undo the replacement ``memory_id`` made: returns (restored, undone)."""
        ...

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        """The supersedes chain holding ``memory_id``, oldest first."""
        ...

    def list_review(self, namespace: str, limit: int = 100) -> list[ReviewItem]: ...

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> str | None:
        """accept / keep_both / reject; returns the id of the memory stored (None: reject)."""
        ...

    def close(self) -> None: ...


class LocalEngine:
    """A :class:`GateEngine` over an in-process ``Gate`` (``engine.app.OpenedEngine().gate``)."""

    def __init__(self, gate: Any, *, owner: Any = None) -> None:
        self.gate = gate
        self._owner = owner
        """The ``engine.app.OpenedEngine`` this adapter opened and so closes; None when borrowed."""

    def write(
        self, facts: Sequence[Fact], policy: str, overrides: Mapping[str, Any] | None = None
    ) -> list[Decision]:
        result = self.gate.triage(facts, policy, apply=True, overrides=dict(overrides or {}))
        return list(result.decisions)

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        memory: Memory | None = self.gate.get(namespace, memory_id)
        return memory

    def forget(self, namespace: str, memory_id: str) -> None:
        self.gate.forget(namespace, memory_id)

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]:
        restored, undone = self.gate.undo(namespace, memory_id)
        return restored, undone

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        return list(self.gate.history(namespace, memory_id))

    def recall(
        self, namespace: str, query: str, k: int = 10, *, as_of: Any = None
    ) -> list[tuple[Memory, float]]:
        """The ``k`` memories active now (or at ``as_of``: an event seq, a Unix time, an aware
        datetime or an RFC 3339 string) most similar to ``query``, best first."""
        point = to_as_of(as_of)
        if point is None:
            return list(self.gate.recall(namespace, query, k))
        return list(self.gate.recall(namespace, query, k, as_of=point))

    def list_review(self, namespace: str, limit: int = 100) -> list[ReviewItem]:
        return list(self.gate.list_review(namespace, limit))

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> str | None:
        res = self.gate.resolve_review(namespace, review_id, resolution)
        memory_id: str | None = res.memory_id
        return memory_id

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()
            self._owner = None


class RemoteEngine:
    """A :class:`GateEngine` over a :class:`engine.client.MemgateClient` (``memgate serve``)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def write(
        self, facts: Sequence[Fact], policy: str, overrides: Mapping[str, Any] | None = None
    ) -> list[Decision]:
        return list(self.client.write(facts, policy, overrides).decisions)

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        try:
            memory: Memory = self.client.get(namespace, memory_id)
        except NotFound:
            return None
        return memory

    def forget(self, namespace: str, memory_id: str) -> None:
        self.client.forget(namespace, memory_id)

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]:
        restored, undone = self.client.undo(namespace, memory_id)
        return restored, undone

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        return list(self.client.history(namespace, memory_id))

    def recall(
        self, namespace: str, query: str, k: int = 10, *, as_of: Any = None
    ) -> list[tuple[Memory, float]]:
        """As :meth:`LocalEngine.recall`, over the server."""
        return list(self.client.recall(namespace, query, k, as_of=as_of))

    def list_review(self, namespace: str, limit: int = 100) -> list[ReviewItem]:
        return list(self.client.list_review(namespace, limit))

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> str | None:
        memory_id: str | None = self.client.resolve_review(
            namespace, review_id, resolution
        ).memory_id
        return memory_id

    def close(self) -> None:
        """The caller owns the client (and its channel): nothing to close here."""


def as_gate_engine(engine: Any) -> GateEngine:
    """Wrap what the user passed: an ``engine.app.OpenedEngine``, a ``Gate``, a
    ``MemgateClient``, or anything that already implements :class:`GateEngine`."""
    client_module = sys.modules.get("engine.client")
    if client_module is not None and isinstance(engine, client_module.MemgateClient):
        return RemoteEngine(engine)
    from engine.gate.gate import Gate

    if isinstance(engine, Gate):
        return LocalEngine(engine)
    if isinstance(engine, GateEngine):
        return engine
    if isinstance(getattr(engine, "gate", None), Gate):
        return LocalEngine(engine.gate)
    raise InvalidInput(
        f"engine must be an engine.app.OpenedEngine, a Gate, a MemgateClient or a GateEngine; "
        f"got {type(engine).__name__}"
    )


def open_local(data_dir: str | Path, *, cache_dir: str | Path | None = None) -> LocalEngine:
    """Open an in-process engine over ``data_dir`` on the default models of ``cache_dir``
    (default: ``$MEMGATE_HOME``, else ``~/.cache/memgate``); closing the adapter closes it."""
    from engine.app import EngineSettings, open_engine

    cache = local_cache_dir(cache_dir)
    opened = open_engine(EngineSettings(data_dir=Path(data_dir), cache_dir=cache))
    return LocalEngine(opened.gate, owner=opened)


def local_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, or the default one: ``$MEMGATE_HOME``, else ``~/.cache/memgate``."""
    from engine.runtime.layout import default_cache_dir

    return default_cache_dir() if cache_dir is None else Path(cache_dir)


def load_local_models(cache_dir: str | Path | None = None) -> tuple[Any, Any]:
    """The default embedder and NLI model of ``cache_dir`` (:func:`local_cache_dir`), loaded
    and warmed up, for an adapter that scores without a store."""
    from engine.runtime.loader import load_models

    embedder, nli = load_models(local_cache_dir(cache_dir))
    embedder.warmup()
    nli.warmup()
    return embedder, nli


__all__ += ["load_local_models", "local_cache_dir"]  # apart, so the list above merges unchanged
