"""What "active" means, now and as of a point of the event log. Pure: no I/O.

A memory is *active* when its stored status is ``active`` and it has not expired
(``expires_at`` is unset or later than the time of the read): expiry is applied lazily, by the
reader's clock, before the sweep writes the ``expire`` event. Every other memory is inactive,
with one status: ``superseded`` (replaced), ``undone`` (a replacement that was undone),
``forgotten`` (erased on request) or ``expired``.

As-of reads answer "which memories were active at event ``seq`` S (time T)?". A memory's
status at S is rebuilt from its own events (:func:`status_at`), with two rules on top:

* **erasure wins**: a memory forgotten now is ``forgotten`` at every S at which it existed,
  because its text and embedding are gone (a forget is never undone by reading history);
* **expiry is by time**: a memory active at S whose ``expires_at`` <= T is ``expired`` then,
  whether or not the sweep had written its ``expire`` event by S.

:func:`parse_as_of` reads the wire form of ``as_of`` (an RFC 3339 time or an event seq).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from engine.errors import InvalidInput
from engine.types import Memory

__all__ = [
    "INACTIVE_STATUSES",
    "STATUSES",
    "AsOf",
    "Hidden",
    "Hits",
    "LogEvent",
    "State",
    "expiry_time",
    "is_active",
    "parse_as_of",
    "to_as_of",
    "status_at",
    "state_untouched",
    "status_now",
]

Status = Literal["active", "superseded", "forgotten", "undone", "expired"]
STATUSES: tuple[str, ...] = ("active", "superseded", "forgotten", "undone", "expired")
INACTIVE_STATUSES: tuple[str, ...] = ("superseded", "expired", "forgotten", "undone")

_SEQ = re.compile(r"[0-9]{1,19}")
_MAX_TTL_S = 100 * 365 * 86400.0


@dataclass(frozen=True, slots=True)
class AsOf:
    """A point of a namespace's history: an event ``seq``, or a ``time`` (Unix seconds).

    Exactly one is set. A time T means "after every event stamped <= T"."""

    seq: int | None = None
    time: float | None = None

    def __post_init__(self) -> None:
        if (self.seq is None) == (self.time is None):
            raise InvalidInput("as_of is either an event seq or a time, not both")
        if self.seq is not None and not 0 <= self.seq < 2**63:
            raise InvalidInput(f"as_of seq must be in [0, 2**63), got {self.seq}")
        if self.time is not None and not math.isfinite(self.time):
            raise InvalidInput("as_of time must be finite")


def parse_as_of(text: str) -> AsOf | None:
    """The wire form of ``as_of``: ``""`` (now: None), an event seq (digits only), or an
    RFC 3339 time with an offset (``2026-03-01T09:30:00Z``, ``...+01:00``)."""
    text = text.strip()
    if not text:
        return None
    if _SEQ.fullmatch(text):
        return AsOf(seq=int(text))
    if len(text) > 64:
        raise InvalidInput("as_of is too long for an RFC 3339 time")
    try:
        when = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise InvalidInput(
            f"as_of must be an RFC 3339 time (e.g. 2026-03-01T09:30:00Z) or an event seq, "
            f"got {text!r}"
        ) from None
    if when.tzinfo is None or "T" not in text.upper():
        raise InvalidInput("as_of time must be RFC 3339: a date, 'T', a time and an offset")
    return AsOf(time=when.timestamp())


def to_as_of(value: AsOf | str | int | float | datetime | None) -> AsOf | None:
    """``as_of`` as callers hand it in: an :class:`AsOf`, the wire string (:func:`parse_as_of`),
    an event seq (int), a Unix time (float) or an aware datetime; None: now."""
    if value is None or isinstance(value, AsOf):
        return value
    if isinstance(value, str):
        return parse_as_of(value)
    if isinstance(value, bool):
        raise InvalidInput("as_of must be a seq, a time or a datetime, not a bool")
    if isinstance(value, int):
        return AsOf(seq=value)
    if isinstance(value, float):
        return AsOf(time=value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInput("as_of datetime must be timezone-aware")
        return AsOf(time=value.timestamp())
    raise InvalidInput(f"as_of must be a seq, a time or a datetime, got {type(value).__name__}")


def expiry_time(
    now: float, expires_at: float | None, ttl_s: float | None, default_ttl_s: float | None
) -> float | None:
    """When a memory written at ``now`` expires: its fact's ``expires_at``, else ``now`` +
    its ``ttl_s``, else ``now`` + its kind's default TTL; None: never."""
    if expires_at is not None and ttl_s is not None:
        raise InvalidInput("a fact carries expires_at or ttl_s, not both")
    if expires_at is not None:
        if not math.isfinite(expires_at) or expires_at <= 0:
            raise InvalidInput("expires_at must be a positive Unix time")
        return float(expires_at)
    ttl = ttl_s if ttl_s is not None else default_ttl_s
    if ttl is None:
        return None
    if not math.isfinite(ttl) or not 0 < ttl <= _MAX_TTL_S:
        raise InvalidInput(f"ttl_s must be in (0, {_MAX_TTL_S:.0f}] seconds, got {ttl}")
    return now + float(ttl)


def is_active(status: str, expires_at: float | None, now: float) -> bool:
    """Whether a memory with this stored ``status`` and ``expires_at`` is active at ``now``."""
    return status == "active" and (expires_at is None or expires_at > now)


def status_now(status: str, expires_at: float | None, now: float) -> str:
    """The status a read at ``now`` reports: ``expired`` for an active memory past its time."""
    if status == "active" and expires_at is not None and expires_at <= now:
        return "expired"
    return status


@dataclass(frozen=True, slots=True)
class LogEvent:
    """The part of an event the lifecycle reads."""

    seq: int
    type: str
    memory_id: str | None
    target_id: str | None
    created_at: float
    accepted: bool = False
    """``review_resolved`` only: the resolution was accept (the target was superseded)."""


@dataclass(frozen=True, slots=True)
class State:
    """A memory's status at a point of the log, and since when it has been inactive."""

    status: str
    inactive_since: float | None = None
    """When it stopped being active (None while active)."""


def status_at(
    memory_id: str,
    events: Iterable[LogEvent],
    seq: int,
    time: float,
    *,
    expires_at: float | None,
    forgotten_now: bool,
) -> State | None:
    """The status of ``memory_id`` after the events with seq <= ``seq``, read at ``time``.

    ``events`` are every event naming the memory (as ``memory_id`` or ``target_id``), in any
    order; later ones are ignored. None when the memory did not exist yet at ``seq``.
    Erasure wins (``forgotten_now``) and expiry is by ``time`` (see the module)."""
    state: State | None = None
    for e in sorted(events, key=lambda e: e.seq):
        if e.seq > seq:
            break
        if e.memory_id == memory_id:
            if e.type in ("add", "replace") or (e.type == "review_resolved" and state is None):
                state = State("active")
            elif e.type == "undo":
                state = State("undone", e.created_at)
            elif e.type == "forget":
                state = State("forgotten", e.created_at)
            elif e.type == "expire":
                state = State("expired", e.created_at if expires_at is None else expires_at)
        elif e.target_id == memory_id and state is not None:
            superseding = e.type == "replace" or (e.type == "review_resolved" and e.accepted)
            if superseding and state.status == "active":
                state = State("superseded", e.created_at)
            elif e.type == "undo":
                state = State("active")
    if state is None:
        return None
    if forgotten_now:
        return State("forgotten", state.inactive_since)
    if state.status == "active" and expires_at is not None and expires_at <= time:
        return State("expired", expires_at)
    return state


@dataclass(frozen=True, slots=True)
class Hidden:
    """How many inactive memories a read matched and left out, by status."""

    superseded: int = 0
    expired: int = 0
    forgotten: int = 0
    undone: int = 0
    partial: bool = False
    """True when the scan of inactive memories stopped at its cap (counts are lower bounds)."""

    @classmethod
    def of(cls, statuses: Iterable[str], *, partial: bool = False) -> Hidden:
        counts = dict.fromkeys(INACTIVE_STATUSES, 0)
        for s in statuses:
            if s in counts:
                counts[s] += 1
        return cls(partial=partial, **counts)

    @property
    def total(self) -> int:
        return self.superseded + self.expired + self.forgotten + self.undone


def state_untouched(
    status: str, expires_at: float | None, inactive_since: float | None, time: float
) -> State:
    """The state at a point read at ``time`` of a memory no event after the point names: its
    stored status then was what it is now, and expiry is by ``time``."""
    if status in ("active", "expired") and expires_at is not None:
        return State("active") if expires_at > time else State("expired", expires_at)
    return State(status, None if status == "active" else inactive_since)


class Hits(list[tuple[Memory, float]]):
    """Recall hits, best first, as ``(memory, similarity)``, with what the read hid and the
    point it read at (``seq`` None: now)."""

    hidden: Hidden
    seq: int | None

    def __init__(
        self,
        hits: Iterable[tuple[Memory, float]] = (),
        hidden: Hidden | None = None,
        seq: int | None = None,
    ) -> None:
        super().__init__(hits)
        self.hidden = hidden or Hidden()
        self.seq = seq
