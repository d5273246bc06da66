"""The model stage: one thread that runs model forwards and nothing else.

::

    lane thread (one batch of one namespace set: parse, SQL, lock wait, decide, commit)
        -> Staged.embed / Staged.score
             preprocess (tokenise)          on the lane
             forward, pass by pass          on the model thread, in arrival order
             postprocess (pool, softmax)    on the lane

The lanes (:class:`~engine.core.batcher.Batcher`) run the gate's steps for different namespaces
at once; only the ONNX forwards are serialised here, so two forwards never fight over the
cores, and a lane that waits on a namespace lock, a store read or an fsync holds up nothing
but its own namespaces. This is infinity's preprocess / forward / postprocess split: a lane
tokenises its next call while the model thread runs another lane's forward.

The stage keeps the figures the engine needs:

* **model seconds per caller** (:meth:`ModelStage.charged`): the forward time of the calls made
  by one lane inside the block, so the admission rate estimate counts model time only, never
  lock or store waits;
* **progress** (:meth:`ModelStage.stalled_s`): how long work has been waiting on the model
  thread without a forward finishing, which turns health NOT_SERVING when the model is stuck.

A model without ``preprocess / forward / postprocess`` (a fake) runs whole on the model thread.
Pure threading and a clock: no model, no I/O imported here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import is_dataclass, replace
from typing import Any, TypeVar

__all__ = ["ModelStage", "Staged"]

T = TypeVar("T")


class _Charge:
    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


class ModelStage:
    """One model thread; forwards run on it one at a time, in arrival order.

    ``clock`` measures forward time and progress (tests pass a fake one)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="memgate-model")
        self._guard = threading.Lock()
        self._local = threading.local()
        self._waiting = 0
        self._since: float | None = None
        """When the oldest unfinished forward was submitted, or the last one finished."""
        self.forwards = 0
        """Forwards finished since start."""
        self.busy_s = 0.0
        """Seconds the model thread spent in forwards since start."""

    # -- what lanes call ------------------------------------------------------------------------
    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the model thread and wait for it (from a lane, never from the
        model thread itself). Its seconds are charged to the caller's :meth:`charged` block."""
        charge: _Charge | None = getattr(self._local, "charge", None)
        with self._guard:
            if self._waiting == 0:
                self._since = self._clock()
            self._waiting += 1
        future: Future[T] = self._executor.submit(self._timed, fn, args, charge)
        return future.result()

    @contextmanager
    def charged(self) -> Iterator[_Charge]:
        """Count the forward seconds of this thread's :meth:`run` calls inside the block."""
        charge = _Charge()
        previous = getattr(self._local, "charge", None)
        self._local.charge = charge
        try:
            yield charge
        finally:
            self._local.charge = previous

    # -- what the engine reads ------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        """Forwards submitted and not finished (queued or running)."""
        return self._waiting

    def stalled_s(self) -> float:
        """Seconds since the model thread last made progress while work waits on it; 0 when it
        has no work."""
        with self._guard:
            if self._waiting == 0 or self._since is None:
                return 0.0
            return max(0.0, self._clock() - self._since)

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    # -- on the model thread --------------------------------------------------------------------
    def _timed(self, fn: Callable[..., T], args: tuple[Any, ...], charge: _Charge | None) -> T:
        t0 = self._clock()
        try:
            return fn(*args)
        finally:
            now = self._clock()
            spent = now - t0
            with self._guard:
                self._waiting -= 1
                self._since = now
                self.forwards += 1
                self.busy_s += spent
            if charge is not None:
                charge.seconds += spent


class Staged:
    """A runtime (embedder or NLI scorer) whose forwards run on a :class:`ModelStage`.

    ``embed`` and ``score`` tokenise and post-process on the calling thread and send only the
    forward to the model thread; every other attribute (``dim``, ``manifest``, labels,
    ``token_lengths``) is the wrapped runtime's own."""

    def __init__(self, model: Any, stage: ModelStage) -> None:
        self._model = model
        self._stage = stage
        steps = ("preprocess", "forward", "postprocess")
        self._split = all(callable(getattr(model, name, None)) for name in steps)

    @property
    def wrapped(self) -> Any:
        return self._model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def _call(self, whole: str, items: Sequence[Any]) -> Any:
        if not items:
            return getattr(self._model, whole)(items)
        if not self._split:
            return self._stage.run(getattr(self._model, whole), items)
        prepared: Any = self._model.preprocess(items)
        buckets = getattr(prepared, "buckets", None)
        split = is_dataclass(prepared) and not isinstance(prepared, type)
        if not split or not isinstance(buckets, list) or len(buckets) < 2:
            return self._model.postprocess(self._stage.run(self._model.forward, prepared), prepared)
        # One forward pass (bucket) per trip to the model thread: a large call cannot hold the
        # model for its whole length while another lane's small call waits, and every pass
        # counts as progress. The last pass carries the call's stats, so the runtime's totals
        # still add up once per call.
        outputs: list[Any] = []
        for i, bucket in enumerate(buckets):
            last = i == len(buckets) - 1
            stats = prepared.stats if last else type(prepared.stats)()
            outputs.extend(
                self._stage.run(
                    self._model.forward, replace(prepared, buckets=[bucket], stats=stats)
                )
            )
        return self._model.postprocess(outputs, prepared)

    def embed(self, texts: Sequence[str]) -> Any:
        return self._call("embed", texts)

    def score(self, pairs: Sequence[tuple[str, str]]) -> Any:
        return self._call("score", pairs)

    def contradiction(self, pairs: Sequence[tuple[str, str]]) -> Any:
        return self.score(pairs)[:, self._model.contradiction_index]
