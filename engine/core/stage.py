"""The model stage: one thread that runs model forwards and nothing else.

::

    lane thread (one batch of one namespace set: parse, SQL, lock wait, decide, commit)
        -> Staged.embed / Staged.score
             tokenise                                  on the lane
             -> ModelStage queue (FIFO)
                  merge the waiting calls of one model,
                  bucket + pad, forward, pool / softmax  on the model thread
             <- this call's rows

The lanes (:class:`~engine.core.batcher.Batcher`) run the gate's steps for different namespaces
at once; only the models run here. Calls of one model from several lanes that wait together
are merged into one call (cut into the runtime's length-sorted forward passes), so forwards
stay batched across namespaces although each lane decides one namespace set; row invariance
(batch-invariant graphs, ``tests/model/test_invariance.py``) makes a row's result independent
of its batch-mates. This is infinity's preprocess / forward / postprocess split with TEI's one
queue in front of the model.

**Budgets in the unit that costs** (:class:`Budget`, one per model in :class:`StageSettings`):
a forward's time grows with the tokens it runs, not with its rows (a 150-token pair costs about
6x a 25-token one), so both limits count tokens: *pair tokens* (premise + hypothesis as encoded)
for the NLI model, *text tokens* for the embedder. The count is the sum of the items' real
lengths, not rows x longest: the runtime sorts a merged call by length and pads each forward
pass only to its own longest item, so the padded tokens it runs stay close to the real ones
whatever the mix (``benchmarks/bench_stage_budget.py`` records the ratio), and a sum is
additive, so each caller's share of a call is its own tokens. Item caps stay as a safety bound.

* a lane's call goes in pieces of at most ``chunk_tokens`` (and ``chunk_items``), so a call of
  5,000 long pairs cannot hold the model while another lane's 10-pair call waits;
* calls of one model waiting together are merged up to ``tokens`` (and ``items``);
* an item larger than a budget goes alone: it is never starved, never cut.

The stage keeps the figures the engine needs:

* **model seconds per caller** (:meth:`ModelStage.charged`): a lane's share (by tokens) of the
  merged calls it took part in, so the admission rate estimate counts model time, never lock
  or store waits;
* **progress** (:meth:`ModelStage.stalled_s`): how long work has waited on the model thread
  without a call finishing, which turns health NOT_SERVING when the model is stuck.

A model without ``tokenize / bucket / forward / postprocess`` (a fake) runs whole on the model
thread, one call at a time. Pure threading and a clock: no model, no I/O imported here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from engine.errors import InvalidInput

__all__ = ["CHUNK", "MERGE", "Budget", "ModelStage", "StageSettings", "Staged", "length", "pieces"]

T = TypeVar("T")

CHUNK = 64
"""Most items of one lane's call in one trip to the model thread (a safety cap; the token
budget ``chunk_tokens`` usually cuts first)."""
MERGE = 256
"""Most items of merged calls in one model call (a safety cap beside ``tokens``)."""


@dataclass(frozen=True)
class Budget:
    """How much of one model's work one model call takes. Tokens are the sum of the items'
    real lengths as encoded (special tokens included, after truncation)."""

    tokens: int
    """Most tokens of merged calls in one model call."""
    chunk_tokens: int
    """Most tokens of one lane's call in one trip to the model thread: a larger call goes in
    pieces, and other lanes' calls get in between them."""
    items: int = MERGE
    """Most items of one model call, whatever their length (a safety bound)."""
    chunk_items: int = CHUNK
    """Most items of one trip (a safety bound)."""

    def __post_init__(self) -> None:
        checks = [
            (16 <= self.tokens <= 1 << 24, f"tokens must be in [16, 16777216], got {self.tokens}"),
            (
                16 <= self.chunk_tokens <= self.tokens,
                f"chunk_tokens must be in [16, tokens={self.tokens}], got {self.chunk_tokens}",
            ),
            (1 <= self.items <= 1 << 20, f"items must be in [1, 1048576], got {self.items}"),
            (
                1 <= self.chunk_items <= self.items,
                f"chunk_items must be in [1, items={self.items}], got {self.chunk_items}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(f"model stage budget: {message}")


@dataclass(frozen=True)
class StageSettings:
    """The model stage's budgets, one per model (``bench_stage_budget.py`` measured them)."""

    nli: Budget = field(default_factory=lambda: Budget(tokens=4096, chunk_tokens=2048))
    """Pair tokens (premise + hypothesis). A trip of 2,048 is about 130 memory-like pairs
    (~16 tokens) or 13 pairs at the int8 NLI model's 160-token limit, near its sub-batch of
    16; a merged call of 4,096 still fills many sub-batches of short pairs. On a loaded 2-core
    Xeon (0.6-1.1 ms a pair token) a short call then waits behind long ones for seconds, where
    256 long pairs held the model for about 40 s (``bench_stage_budget.py``)."""
    embedding: Budget = field(default_factory=lambda: Budget(tokens=16384, chunk_tokens=4096))
    """Text tokens. The embedder (6 layers, 384 wide) costs a small fraction of the NLI model
    per token, so its budget is larger."""

    def __post_init__(self) -> None:
        for name in ("nli", "embedding"):
            if not isinstance(getattr(self, name), Budget):
                raise InvalidInput(f"model stage settings: {name} must be a Budget")

    def budget(self, task: str) -> Budget:
        """The budget of a model of this manifest task (``nli`` or ``embedding``)."""
        return self.nli if task == "nli" else self.embedding


def length(encoding: Any) -> int:
    """An item's tokens as encoded: a ``tokenizers.Encoding``'s ids (a fake's item: its len)."""
    ids = getattr(encoding, "ids", None)
    return len(ids if ids is not None else encoding)


def pieces(lengths: Sequence[int], tokens: int, items: int) -> list[tuple[int, int]]:
    """Cut items of these lengths, in order, into runs ``[start, end)`` of at most ``tokens``
    tokens and ``items`` items; an item longer than ``tokens`` makes a run of its own."""
    runs: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (total + n > tokens or i - start >= items):
            runs.append((start, i))
            start, total = i, 0
        total += n
    if start < len(lengths):
        runs.append((start, len(lengths)))
    return runs


class _Charge:
    """What one caller's calls cost inside a :meth:`ModelStage.charged` block: model seconds
    (its share of each merged call) and the NLI pair tokens it sent."""

    __slots__ = ("pair_tokens", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.pair_tokens = 0


@dataclass(eq=False)
class _Job:
    future: Future[Any]
    charge: _Charge | None
    model: Any = None
    """Merged calls: the runtime, and this call's tokenised items."""
    encodings: list[Any] = field(default_factory=list)
    clipped: int = 0
    tokens: int = 0
    """This call's tokens (the sum of its encodings' lengths)."""
    budget: Budget | None = None
    fn: Callable[[], Any] | None = None
    """A call that runs as it is (a model without the split steps)."""


class ModelStage:
    """One model thread; calls run on it in arrival order, merged per model where they can.

    ``clock`` measures model time and progress (tests pass a fake one); ``settings`` holds
    each model's budget, which its :class:`Staged` reads."""

    def __init__(
        self,
        settings: StageSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or StageSettings()
        self._clock = clock
        self._cv = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._local = threading.local()
        self._closed = False
        self._since: float | None = None
        """When the oldest waiting call arrived at an idle stage, or the last call finished."""
        self._busy = 0
        self.forwards = 0
        """Model calls finished since start (a merged call counts once)."""
        self.busy_s = 0.0
        """Seconds the model thread spent in model calls since start."""
        self.merged = 0
        """Calls that shared a model call with an earlier one."""
        self.tokens = 0
        """Tokens of the merged model calls since start."""
        self._thread = threading.Thread(target=self._loop, name="memgate-model", daemon=True)
        self._thread.start()

    # -- what lanes call ------------------------------------------------------------------------
    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the model thread and wait for it. Its seconds are charged to
        the caller's :meth:`charged` block. On the model thread itself, or once the stage is
        closed, it runs in place."""
        if self._closed or threading.current_thread() is self._thread:
            return fn(*args)
        job = _Job(Future(), self._charge(), fn=lambda: fn(*args))
        result: T = self._submit(job)
        return result

    def rows(
        self,
        model: Any,
        encodings: list[Any],
        clipped: int = 0,
        *,
        tokens: int | None = None,
        budget: Budget | None = None,
    ) -> Any:
        """The runtime's output rows for ``encodings`` (tokenised by the caller), computed on
        the model thread together with other callers' waiting encodings of ``model``, merged
        up to ``budget`` (default: the settings' budget for the model's task). ``tokens``:
        the encodings' total length, when the caller has it."""
        if self._closed or threading.current_thread() is self._thread:
            return _call(model, [encodings], [clipped])[0]
        job = _Job(
            Future(),
            self._charge(),
            model=model,
            encodings=encodings,
            clipped=clipped,
            tokens=sum(map(length, encodings)) if tokens is None else tokens,
            budget=budget or self.settings.budget(_task(model)),
        )
        if job.charge is not None and _task(model) == "nli":
            job.charge.pair_tokens += job.tokens  # the lanes' batch budget learns from it
        return self._submit(job)

    @contextmanager
    def charged(self) -> Iterator[_Charge]:
        """Count the model seconds (and NLI pair tokens) of this thread's calls inside the
        block."""
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
        """Calls queued or running on the model thread."""
        with self._cv:
            return len(self._queue) + self._busy

    def stalled_s(self) -> float:
        """Seconds since the model thread last made progress while calls wait on it; 0 when
        it has none."""
        with self._cv:
            if not (self._queue or self._busy) or self._since is None:
                return 0.0
            return max(0.0, self._clock() - self._since)

    def close(self) -> None:
        """Finish the queued calls, stop the thread; later calls run in place."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    # -- internals ------------------------------------------------------------------------------
    def _charge(self) -> _Charge | None:
        return getattr(self._local, "charge", None)

    def _submit(self, job: _Job) -> Any:
        with self._cv:
            if self._closed:
                raise RuntimeError("the model stage is closed")
            if not self._queue and not self._busy:
                self._since = self._clock()
            self._queue.append(job)
            self._cv.notify()
        return job.future.result()

    def _take(self) -> list[_Job] | None:
        with self._cv:
            while not self._queue:
                if self._closed:
                    return None
                self._cv.wait()
            first = self._queue.popleft()
            jobs = [first]
            if first.fn is None and first.budget is not None:
                # The oldest call always goes (alone if it is larger than the budget); then
                # every waiting call of this model, in order, that still fits. One that does
                # not fit keeps its place at the head for the next call.
                limit = first.budget
                items, tokens = len(first.encodings), first.tokens
                for job in list(self._queue):
                    if (
                        job.model is not first.model
                        or items + len(job.encodings) > limit.items
                        or tokens + job.tokens > limit.tokens
                    ):
                        continue
                    self._queue.remove(job)
                    jobs.append(job)
                    items += len(job.encodings)
                    tokens += job.tokens
            self._busy = len(jobs)
            return jobs

    def _loop(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            t0 = self._clock()
            try:
                if jobs[0].fn is not None:
                    results = [jobs[0].fn()]
                else:
                    results = _call(
                        jobs[0].model, [j.encodings for j in jobs], [j.clipped for j in jobs]
                    )
                error: BaseException | None = None
            except BaseException as exc:  # noqa: BLE001 - handed to every caller of the call
                error, results = exc, []
            now = self._clock()
            spent = now - t0
            with self._cv:
                self._busy = 0
                self._since = now
                self.forwards += 1
                self.busy_s += spent
                self.merged += len(jobs) - 1
                self.tokens += sum(j.tokens for j in jobs)
            # Each caller pays its share of the call's tokens (what the forward's time tracks);
            # a call without tokens (a plain ``run``) pays it all.
            total = sum(max(1, j.tokens) for j in jobs)
            for i, job in enumerate(jobs):
                if job.charge is not None:
                    job.charge.seconds += spent * max(1, job.tokens) / total
                if error is not None:
                    job.future.set_exception(error)
                else:
                    job.future.set_result(results[i])


def _call(model: Any, parts: list[list[Any]], clipped: list[int]) -> list[Any]:
    """One model call over every part's encodings; the output rows split back per part."""
    flat = [e for part in parts for e in part]
    prepared = model.bucket(flat, clipped=sum(clipped))
    rows = model.postprocess(model.forward(prepared), prepared)
    out, start = [], 0
    for part in parts:
        out.append(rows[start : start + len(part)])
        start += len(part)
    return out


def _task(model: Any) -> str:
    """The manifest task of a runtime (``nli`` or ``embedding``); "" for one without."""
    return str(getattr(getattr(model, "manifest", None), "task", ""))


_STATIC = ("manifest", "dim", "contradiction_index", "entailment_index", "labels")
"""A runtime's fixed description (from its manifest), copied onto its :class:`Staged`."""


class Staged:
    """A runtime (embedder or NLI scorer) whose model work runs on a :class:`ModelStage`.

    ``embed`` and ``score`` tokenise on the calling thread and send the tokens to the model
    thread in pieces of at most ``budget.chunk_tokens`` tokens and ``budget.chunk_items`` items
    (``budget``: the stage's budget for the model's manifest task unless given); every other
    attribute (``dim``, ``manifest``, labels, ``token_lengths``) is the wrapped runtime's
    own."""

    def __init__(self, model: Any, stage: ModelStage, *, budget: Budget | None = None) -> None:
        self._model = model
        self._stage = stage
        self.budget = budget or stage.settings.budget(_task(model))
        steps = ("tokenize", "bucket", "forward", "postprocess")
        self._split = all(callable(getattr(model, name, None)) for name in steps)
        # what the gate reads on every batch, as plain attributes (no __getattr__ hop)
        for name in _STATIC:
            if hasattr(model, name):
                setattr(self, name, getattr(model, name))

    @property
    def wrapped(self) -> Any:
        return self._model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def _call(self, whole: str, items: Sequence[Any], encoded: Sequence[Any] | None = None) -> Any:
        if not items:
            return getattr(self._model, whole)(items)
        if not self._split:
            return self._stage.run(getattr(self._model, whole), items)
        # ``encoded``: items the edge tokenised for the batch budget, not tokenised again
        encodings, clipped = (
            self._model.tokenize(items) if encoded is None else self._model.tokenize(items, encoded)
        )
        lengths = [length(e) for e in encodings]
        b = self.budget
        parts = [
            self._stage.rows(
                self._model,
                encodings[start:end],
                clipped if start == 0 else 0,
                tokens=sum(lengths[start:end]),
                budget=b,
            )
            for start, end in pieces(lengths, b.chunk_tokens, b.chunk_items)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def embed(self, texts: Sequence[str], *, encoded: Sequence[Any] | None = None) -> Any:
        """The wrapped embedder's vectors; ``encoded`` (one entry per text, or None for a text
        still to tokenise) as in ``Embedder.embed``."""
        return self._call("embed", texts, encoded)

    def score(self, pairs: Sequence[tuple[str, str]]) -> Any:
        return self._call("score", pairs)

    def contradiction(self, pairs: Sequence[tuple[str, str]]) -> Any:
        return self.score(pairs)[:, self._model.contradiction_index]
