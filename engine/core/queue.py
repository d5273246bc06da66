"""The engine's queue: pure token-budget batch assembly. No asyncio, no clock, no model.

Requests arrive as :class:`Entry` objects (a payload the queue never looks at, a *group*, a fact
count, a token count, an arrival time and an optional deadline). Only entries of one group can
share a model call (the server's groups are ``(policy, overrides, apply)`` for triage and
``recall``). :meth:`TokenBudgetQueue.take` hands out one :class:`Batch` at a time:

* entries that were cancelled or whose deadline passed are dropped first, so they never reach
  the model (the caller fails expired ones with ``DeadlineExceeded``);
* a group is *ready* when it holds a full batch (``max_batch_tokens`` or ``max_batch_facts``),
  or when its oldest entry has waited ``max_wait_s``; the group holding the oldest entry goes
  first, so no group starves;
* a batch takes the group's entries in arrival order while they fit the budgets: fact tokens
  (``max_batch_tokens``), facts (``max_batch_facts``) and *estimated work tokens*
  (``max_batch_work_tokens``, below); the first entry always goes, so a request larger than
  the budget is served alone and never split (a Write commits in one transaction);
* **work tokens** estimate what a batch costs the model before its NLI pairs are known (they
  are known only after recall): an entry's fact tokens x (1 + its group's *pair ratio*, the
  NLI pair tokens per fact token of the group's finished batches, an exponentially weighted
  mean seeded by ``prior_pair_ratio``). The driver reports each finished batch's pair tokens
  with :meth:`TokenBudgetQueue.observe`. So a namespace whose facts each meet 20 near
  duplicates (40-65 pair tokens per fact token) gets batches of one or two dozen facts, while
  one whose facts meet nothing still gets the fact-token budget's batches;
* an entry may name a *source* (one Backfill stream): a batch holds at most
  ``max_source_facts`` facts of one source, and the cut stops at the first entry over that
  cap. A stream's batch commits in one transaction and its decisions are released together,
  so this bounds the gap between two decisions of one stream to one small batch's model time,
  while concurrent streams and requests still share every model call;
* an entry may name *locks* (the namespaces it writes, and its stream): batches run
  concurrently (one per lane), but an entry starts only when no running batch holds one of its
  locks and no older queued entry claims one. Writes to one namespace, and the facts of one
  stream, therefore start in arrival order and never overlap, while other namespaces go by.
  The driver hands a finished batch back with :meth:`TokenBudgetQueue.finished`.

Arrival order is kept on purpose: writes to one namespace commit in the order they arrived.
Padding is cut one layer down, where the runtime sorts a call's texts by token length and pads
each length bucket only to its own longest text (``engine.runtime.base``).

Time is whatever clock the caller passes in (the asyncio driver uses ``loop.time()``), which is
what lets the unit tests drive the queue with synthetic requests and a fake clock.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from engine.errors import InvalidInput

__all__ = ["Batch", "Entry", "QueueSettings", "TokenBudgetQueue", "estimate_tokens"]

RATIOS_KEPT = 4096
"""Groups whose pair ratio the queue remembers (least recently used forgotten first; a
forgotten group starts again from the prior)."""

P = TypeVar("P")


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token count for the budget: ~4 characters per WordPiece token, plus
    ``[CLS]`` and ``[SEP]``. Cheap enough to run on the event loop for every fact."""
    return len(text) // 4 + 2


@dataclass(frozen=True)
class QueueSettings:
    """How the dynamic batcher cuts batches. Every field is range-checked."""

    max_batch_tokens: int = 16384
    """Most (estimated) tokens in one model call. The runtime then cuts the call into padded
    buckets of its own ``BatchSettings``; this bounds the latency one call adds to the queue."""
    max_batch_facts: int = 256
    """Most facts in one model call (and so in one ``Gate.triage`` call)."""
    max_wait_s: float = 0.002
    """How long the oldest entry may wait for company before a partial batch goes. The model
    being busy is the main batching window; this only helps when it is idle."""
    max_source_facts: int = 1
    """Most facts of one source (one Backfill stream) in one model call. A stream's decisions
    come back as its batch commits: 1 releases them fact by fact, so the gap between two
    decisions is one fact's model time. Larger values trade that gap for fewer model calls
    when one stream is alone on the server."""

    max_batch_work_tokens: int = 16384
    """Most estimated *work tokens* in one batch: fact tokens x (1 + the group's pair ratio),
    i.e. the facts' own tokens (the embedder's work) plus the NLI pair tokens they are expected
    to bring (the model's main cost, known only after recall). The rule that set the default
    (written before measuring): the same number as ``max_batch_tokens``, so a batch whose facts
    bring no pairs is cut exactly as by the fact-token budget, and one whose facts bring pairs
    is cut in proportion to them; 16,384 pair tokens are four of the model stage's merged NLI
    calls (4 x 4,096). ``max_batch_tokens`` and ``max_batch_facts`` still cap every batch."""
    prior_pair_ratio: float = 8.0
    """NLI pair tokens per fact token expected of a group with no finished batch yet: about 4
    pairs per fact, each a premise and a hypothesis about as long as the fact (4 x 2)."""
    pair_ratio_weight: float = 0.3
    """Weight of the newest batch in a group's running pair ratio (an exponentially weighted
    mean: 1 keeps only the last batch)."""

    def __post_init__(self) -> None:
        if not 16 <= self.max_batch_work_tokens <= 1 << 30:
            raise InvalidInput(
                "max_batch_work_tokens must be in [16, 1073741824], "
                f"got {self.max_batch_work_tokens}"
            )
        if not 0.0 <= self.prior_pair_ratio <= 10_000.0:
            raise InvalidInput(
                f"prior_pair_ratio must be in [0, 10000], got {self.prior_pair_ratio}"
            )
        if not 0.0 < self.pair_ratio_weight <= 1.0:
            raise InvalidInput(f"pair_ratio_weight must be in (0, 1], got {self.pair_ratio_weight}")
        if not 16 <= self.max_batch_tokens <= 1 << 22:
            raise InvalidInput(
                f"max_batch_tokens must be in [16, 4194304], got {self.max_batch_tokens}"
            )
        if not 1 <= self.max_batch_facts <= 100_000:
            raise InvalidInput(
                f"max_batch_facts must be in [1, 100000], got {self.max_batch_facts}"
            )
        if not 0.0 <= self.max_wait_s <= 1.0:
            raise InvalidInput(f"max_wait_s must be in [0, 1] seconds, got {self.max_wait_s}")
        if not 1 <= self.max_source_facts <= 100_000:
            raise InvalidInput(
                f"max_source_facts must be in [1, 100000], got {self.max_source_facts}"
            )


@dataclass(eq=False)
class Entry(Generic[P]):
    """One request waiting for the model."""

    payload: P
    group: Hashable
    """Entries of one group may share a model call; different groups never do."""
    facts: int
    tokens: int
    enqueued: float
    deadline: float | None = None
    """Absolute time on the queue's clock after which the entry is dropped; None: no deadline."""
    source: Hashable | None = None
    """The stream this entry belongs to (at most ``max_source_facts`` of its facts per batch);
    None: a request of its own."""
    locks: frozenset[Hashable] = frozenset()
    """What the entry's batch holds while it runs (its namespaces, its stream): no other
    batch holding one of them runs at the same time, and older entries that claim one go
    first."""
    cancelled: bool = False
    seq: int = 0
    """Arrival order, set by :meth:`TokenBudgetQueue.push`."""

    def __post_init__(self) -> None:
        if self.facts < 1 or self.tokens < 0:
            raise InvalidInput("an entry needs at least one fact and a non-negative token count")

    def cancel(self) -> None:
        """The caller gave up (client cancelled, deadline hit): skip it before the model."""
        self.cancelled = True

    def expired(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline


@dataclass
class Batch(Generic[P]):
    """Entries of one group that go to the model together, in arrival order."""

    group: Hashable
    entries: list[Entry[P]]
    facts: int
    tokens: int
    started: float
    work: int = 0
    """The batch's estimated work tokens when it was cut (fact tokens x (1 + pair ratio))."""

    @property
    def locks(self) -> frozenset[Hashable]:
        """Every lock the batch holds while it runs."""
        return frozenset().union(*(e.locks for e in self.entries))


@dataclass
class _Group(Generic[P]):
    entries: deque[Entry[P]] = field(default_factory=deque)
    facts: int = 0
    tokens: int = 0


class TokenBudgetQueue(Generic[P]):
    """Single-owner FIFO of entries per group, cut into batches by a token budget.

    Not thread-safe: one owner (the asyncio driver) pushes and takes.
    """

    def __init__(self, settings: QueueSettings | None = None) -> None:
        self.settings = settings or QueueSettings()
        self._groups: OrderedDict[Hashable, _Group[P]] = OrderedDict()
        self._facts = 0
        self._tokens = 0
        self._entries = 0
        self._seq = 0
        self._held: dict[Hashable, int] = {}
        """Locks held by running batches (a count: two batches may share a free lock)."""
        self._ratios: OrderedDict[Hashable, float] = OrderedDict()
        """Each group's running NLI pair tokens per fact token (at most ``RATIOS_KEPT``)."""

    # -- observation ------------------------------------------------------------------------
    def __len__(self) -> int:
        """Entries queued (cancelled ones included until the next ``take``)."""
        return self._entries

    @property
    def pending_facts(self) -> int:
        return self._facts

    @property
    def pending_tokens(self) -> int:
        return self._tokens

    # -- producer ---------------------------------------------------------------------------
    def push(self, entry: Entry[P]) -> None:
        self._seq += 1
        entry.seq = self._seq
        group = self._groups.get(entry.group)
        if group is None:
            group = self._groups[entry.group] = _Group()
        group.entries.append(entry)
        group.facts += entry.facts
        group.tokens += entry.tokens
        self._facts += entry.facts
        self._tokens += entry.tokens
        self._entries += 1

    # -- consumer ---------------------------------------------------------------------------
    def wake_at(self) -> float | None:
        """When the oldest entry's wait runs out (a partial batch becomes ready); None if empty.

        A full group is ready at once; the driver calls :meth:`take` after every push anyway.
        Groups whose head waits for a lock are left out: :meth:`finished` wakes the driver.
        """
        oldest = self._oldest(self._startable())
        return None if oldest is None else oldest[1].enqueued + self.settings.max_wait_s

    def take(self, now: float, flush: bool = False) -> tuple[Batch[P] | None, list[Entry[P]]]:
        """The next ready batch (or None), and the entries dropped as cancelled or expired.
        The batch's locks are held until :meth:`finished` is called with it.

        ``flush``: every group is ready, waited or not (the server is draining)."""
        dropped = self._purge(now)
        startable = self._startable()
        oldest = self._oldest(startable)
        if oldest is None:
            return None, dropped
        key, head = oldest
        waited = now - head.enqueued >= self.settings.max_wait_s
        if flush or waited or self._full(key, self._groups[key]):
            return self._cut(key, now, startable), dropped
        full = next(
            (
                k
                for k, g in self._groups.items()
                if g.entries[0].seq in startable and self._full(k, g)
            ),
            None,
        )
        if full is not None:
            return self._cut(full, now, startable), dropped
        return None, dropped

    def finished(self, batch: Batch[P]) -> None:
        """``batch`` (from :meth:`take`) ran: its locks are free again."""
        for entry in batch.entries:
            for lock in entry.locks:
                left = self._held.get(lock, 0) - 1
                if left > 0:
                    self._held[lock] = left
                else:
                    self._held.pop(lock, None)

    def observe(self, group: Hashable, tokens: int, pair_tokens: int) -> None:
        """A finished batch of ``group`` ran ``pair_tokens`` NLI pair tokens for ``tokens``
        fact tokens: move the group's pair ratio toward it."""
        if tokens <= 0 or pair_tokens < 0:
            return
        seen = pair_tokens / tokens
        old = self._ratios.pop(group, None)
        w = self.settings.pair_ratio_weight
        self._ratios[group] = seen if old is None else (1.0 - w) * old + w * seen
        while len(self._ratios) > RATIOS_KEPT:
            self._ratios.popitem(last=False)

    def pair_ratio(self, group: Hashable) -> float:
        """The group's expected NLI pair tokens per fact token (the prior before any batch)."""
        ratio = self._ratios.get(group)
        if ratio is None:
            return self.settings.prior_pair_ratio
        self._ratios.move_to_end(group)
        return ratio

    def work(self, group: Hashable, tokens: int) -> int:
        """Estimated work tokens of ``tokens`` fact tokens of ``group``."""
        return round(tokens * (1.0 + self.pair_ratio(group)))

    @property
    def held(self) -> frozenset[Hashable]:
        """Locks held by running batches."""
        return frozenset(self._held)

    def drain(self) -> list[Entry[P]]:
        """Remove and return every queued entry (the worker died; fail them all)."""
        out = [e for g in self._groups.values() for e in g.entries]
        self._groups.clear()
        self._facts = self._tokens = self._entries = 0
        return out

    # -- internals --------------------------------------------------------------------------
    def _full(self, key: Hashable, group: _Group[P]) -> bool:
        s = self.settings
        return (
            group.facts >= s.max_batch_facts
            or group.tokens >= s.max_batch_tokens
            or self.work(key, group.tokens) >= s.max_batch_work_tokens
        )

    def _startable(self) -> set[int]:
        """Sequence numbers of the queued entries that may start now: none of their locks is
        held by a running batch or claimed by an older queued entry of another group (FIFO per
        lock; older entries of the same group go in the same batch, or first)."""
        entries = [e for g in self._groups.values() for e in g.entries]
        if not self._held and not any(e.locks for e in entries):
            return {e.seq for e in entries}
        entries.sort(key=lambda e: e.seq)
        claimed: dict[Hashable, set[Hashable]] = {}
        out: set[int] = set()
        for e in entries:
            if all(
                lock not in self._held and claimed.get(lock, set()) <= {e.group} for lock in e.locks
            ):
                out.add(e.seq)
            for lock in e.locks:
                claimed.setdefault(lock, set()).add(e.group)
        return out

    def _oldest(self, startable: set[int]) -> tuple[Hashable, Entry[P]] | None:
        best: tuple[Hashable, Entry[P]] | None = None
        for key, group in self._groups.items():
            head = group.entries[0]
            if head.seq not in startable:
                continue
            if best is None or head.enqueued < best[1].enqueued:
                best = (key, head)
        return best

    def _remove(self, group: _Group[P], entry: Entry[P]) -> None:
        group.facts -= entry.facts
        group.tokens -= entry.tokens
        self._facts -= entry.facts
        self._tokens -= entry.tokens
        self._entries -= 1

    def _purge(self, now: float) -> list[Entry[P]]:
        dropped: list[Entry[P]] = []
        for key in list(self._groups):
            group = self._groups[key]
            if any(e.cancelled or e.expired(now) for e in group.entries):
                keep: deque[Entry[P]] = deque()
                for e in group.entries:
                    if e.cancelled or e.expired(now):
                        self._remove(group, e)
                        dropped.append(e)
                    else:
                        keep.append(e)
                group.entries = keep
            if not group.entries:
                del self._groups[key]
        return dropped

    def _cut(self, key: Hashable, now: float, startable: set[int]) -> Batch[P]:
        s = self.settings
        group = self._groups[key]
        taken: list[Entry[P]] = []
        facts = tokens = 0
        per_token = 1.0 + self.pair_ratio(key)
        per_source: dict[Hashable, int] = {}
        while group.entries:
            e = group.entries[0]
            mine = per_source.get(e.source, 0) if e.source is not None else 0
            if taken and (
                e.seq not in startable
                or facts + e.facts > s.max_batch_facts
                or tokens + e.tokens > s.max_batch_tokens
                or (tokens + e.tokens) * per_token > s.max_batch_work_tokens
                or (e.source is not None and mine + e.facts > s.max_source_facts)
            ):
                break
            group.entries.popleft()
            self._remove(group, e)
            taken.append(e)
            facts += e.facts
            tokens += e.tokens
            if e.source is not None:
                per_source[e.source] = mine + e.facts
        if not group.entries:
            del self._groups[key]
        for e in taken:
            for lock in e.locks:
                self._held[lock] = self._held.get(lock, 0) + 1
        return Batch(
            group=key,
            entries=taken,
            facts=facts,
            tokens=tokens,
            started=now,
            work=self.work(key, tokens),
        )
