"""Admission control: a bounded count of permits, one per fact queued or in the model.

A request takes one permit per fact before it is queued and gives them back when it is answered.
When the permits run out it is refused at the front door (``Overloaded`` -> RESOURCE_EXHAUSTED)
instead of waiting behind work it cannot overtake, so the queue, and with it the latency of the
requests that were accepted, stays bounded. Health checks and store reads never take permits.

The bound is the smaller of two numbers:

* ``limit``, a hard cap on facts in flight (memory, and the worst case before any measurement);
* when ``max_delay_s`` is set, the facts the worker can finish in ``max_delay_s`` at its measured
  rate (an exponentially weighted mean of facts per second over recent batches), but never
  fewer than ``min_limit``. This keeps the queueing delay of an accepted request near
  ``max_delay_s`` on any hardware (a fixed count that suits a GPU would queue minutes of work
  on a small CPU box), while the floor keeps batches large enough to use the model well when
  the machine is slow or busy.

An idle server admits any request within the hard cap, so a request larger than the
rate-derived bound is served (alone) rather than refused forever. Pure and single-owner (the
event loop): no locks, no clock; the batcher reports each batch's facts and seconds.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.errors import InvalidInput

__all__ = ["Permits"]


class Permits:
    """``limit`` permits, tightened to ``max_delay_s`` worth of measured throughput (at least
    ``min_limit``)."""

    def __init__(
        self,
        limit: int,
        *,
        max_delay_s: float | None = None,
        min_limit: int = 16,
        smoothing: float = 0.2,
    ) -> None:
        if not 1 <= limit <= 10_000_000:
            raise InvalidInput(f"permit limit must be in [1, 10000000], got {limit}")
        if max_delay_s is not None and not 0.0 < max_delay_s <= 3600.0:
            raise InvalidInput(f"max_delay_s must be in (0, 3600] seconds, got {max_delay_s}")
        if not 1 <= min_limit <= 10_000_000:
            raise InvalidInput(f"min_limit must be in [1, 10000000], got {min_limit}")
        if not 0.0 < smoothing <= 1.0:
            raise InvalidInput(f"smoothing must be in (0, 1], got {smoothing}")
        self.limit = limit
        self.max_delay_s = max_delay_s
        self.min_limit = min(min_limit, limit)
        self._smoothing = smoothing
        self._rate: float | None = None
        self._used = 0
        self._listeners: list[Callable[[], None]] = []

    @property
    def in_use(self) -> int:
        return self._used

    @property
    def available(self) -> int:
        return max(0, self.current_limit - self._used)

    @property
    def rate(self) -> float | None:
        """Measured facts per second of the worker; None before the first batch."""
        return self._rate

    @property
    def current_limit(self) -> int:
        """The bound in force now: the hard cap, or the delay budget's share of it."""
        if self.max_delay_s is None or self._rate is None:
            return self.limit
        return max(self.min_limit, min(self.limit, int(self._rate * self.max_delay_s)))

    def observe(self, facts: int, seconds: float) -> None:
        """One batch of ``facts`` took ``seconds`` on the worker."""
        if facts <= 0 or seconds <= 0:
            return
        rate = facts / seconds
        a = self._smoothing
        self._rate = rate if self._rate is None else (1 - a) * self._rate + a * rate

    def try_acquire(self, n: int) -> bool:
        """Take ``n`` permits if the bound allows; all or nothing, never waits."""
        if n < 0:
            raise InvalidInput("cannot acquire a negative number of permits")
        if n > self.limit:
            return False
        if self._used and self._used + n > self.current_limit:
            return False
        self._used += n
        return True

    def release(self, n: int) -> None:
        if not 0 <= n <= self._used:
            raise InvalidInput(f"releasing {n} permits but only {self._used} are held")
        self._used -= n
        for listener in list(self._listeners):
            listener()

    def on_release(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` after every release (a waiting stream re-tries); returns the undo."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)
