"""A blocking face of :class:`~engine.core.engine.Engine` for scripts and in-process callers.

The engine runs on a private event loop in a daemon thread, so in-process backfill, eval and
framework adapters get the same dynamic batching, admission and timings as the gRPC service
(several threads calling one :class:`SyncEngine` share model calls)::

    with SyncEngine(build_engine(gate)) as engine:
        triaged = engine.triage(facts, "strict", apply=True)
        for streamed in engine.stream(iter_facts(), apply=True):
            ...
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from engine.core.engine import Engine
from engine.core.results import Recalled, Streamed, Triaged
from engine.lifecycle import AsOf
from engine.types import Fact

__all__ = ["SyncEngine"]

T = TypeVar("T")

_DONE = object()


class SyncEngine:
    """Owns a started :class:`Engine` on a background loop; every method blocks."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="memgate-engine", daemon=True
        )
        self._feed = ThreadPoolExecutor(4, thread_name_prefix="memgate-feed")
        self._thread.start()
        self.run_sync(engine.start)

    def run_sync(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float | None = None) -> T:
        """Run ``fn()`` on the engine's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    def triage(
        self,
        facts: Sequence[Fact],
        policy: str = "strict",
        *,
        apply: bool = False,
        overrides: Mapping[str, Any] | None = None,
    ) -> Triaged:
        return self.run_sync(
            lambda: self.engine.triage(facts, policy, apply=apply, overrides=overrides)
        )

    def recall(
        self,
        namespace: str,
        query: str,
        k: int = 10,
        *,
        as_of: AsOf | None = None,
        include_inactive: bool = False,
    ) -> Recalled:
        return self.run_sync(
            lambda: self.engine.recall(
                namespace, query, k, as_of=as_of, include_inactive=include_inactive
            )
        )

    def stream(
        self,
        facts: Iterable[Fact],
        policy: str = "strict",
        *,
        apply: bool = True,
        overrides: Mapping[str, Any] | None = None,
    ) -> Iterator[Streamed]:
        """Decisions in order, each as soon as it committed. ``facts`` is pulled on a feeder
        thread (it may block, e.g. on the caller's own flow control); closing the returned
        iterator early cancels the stream."""
        out: queue.Queue[Streamed | BaseException | object] = queue.Queue()
        source = iter(facts)
        loop = self._loop
        feed = self._feed

        async def pull() -> AsyncIterator[Fact]:
            while True:
                fact = await loop.run_in_executor(feed, next, source, _DONE)
                if fact is _DONE:
                    return
                assert isinstance(fact, Fact)
                yield fact

        async def pump() -> None:
            try:
                async for item in self.engine.stream(
                    pull(), policy, apply=apply, overrides=overrides
                ):
                    out.put(item)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                out.put(exc)
                if not isinstance(exc, Exception):
                    raise
            else:
                out.put(_DONE)

        future = asyncio.run_coroutine_threadsafe(pump(), loop)
        try:
            while True:
                item = out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, Streamed)
                yield item
        finally:
            future.cancel()

    def close(self) -> None:
        """Serve what is queued, stop the engine and its loop (the gate stays open)."""
        if not self._thread.is_alive():
            return
        try:
            self.run_sync(self.engine.close)
            self.run_sync(self._loop.shutdown_asyncgens)
        finally:
            self._feed.shutdown(wait=False, cancel_futures=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
