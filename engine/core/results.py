"""What the engine answers: typed results with per-phase timings. Pure dataclasses.

Every model call is timed phase by phase on the worker (the gate reports embed, search, nli,
decide and store; the rest of the call, normalisation, key inference and relations today, is
``other``), and the engine adds what happens around it: counting tokens for the batch budget,
waiting in the queue, and the whole call. ``batch_facts`` / ``batch_entries`` say what the
model call that served a request looked like, so a load test can read batching back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from engine.lifecycle import Hidden
from engine.types import Decision, Memory

__all__ = ["GATE_PHASES", "Recalled", "Streamed", "Timings", "Triaged"]

GATE_PHASES: tuple[str, ...] = ("embed", "search", "keys", "nli", "decide", "store")
"""Phases of a request's timings; ``keys`` is the gate's ``identify`` + ``relate`` (parsing the
texts and comparing their claims)."""
_KEY_STEPS = ("identify", "relate")


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds per phase of one request (model phases are those of the batch that served it)."""

    tokenize: float = 0.0
    """Counting the request's tokens with the embedder's tokenizer (the batch budget)."""
    queue: float = 0.0
    """From submit to the start of the model call that served it."""
    embed: float = 0.0
    search: float = 0.0
    keys: float = 0.0
    """Key inference and relations: parsing the texts and comparing their claims (the gate's
    ``identify`` and ``relate`` steps)."""
    nli: float = 0.0
    decide: float = 0.0
    store: float = 0.0
    """The store transaction and index updates (or the read, for store work)."""
    other: float = 0.0
    """Model-thread time of the call that no gate phase covers."""
    total: float = 0.0
    """The whole request as the engine saw it, admission to result."""
    batch_facts: int = 0
    """Facts in the model call that served this request."""
    batch_entries: int = 0
    """Requests (entries) that shared that model call."""

    @property
    def model(self) -> float:
        """Seconds of the model call that served this request (every gate phase + other)."""
        return (
            self.embed + self.search + self.keys + self.nli + self.decide + self.store + self.other
        )

    @classmethod
    def of_run(cls, phases: Mapping[str, float], run_s: float) -> Timings:
        """The gate's phases of one call that took ``run_s`` seconds on the worker."""
        p = {k: float(phases.get(k, 0.0)) for k in GATE_PHASES}
        p["keys"] = sum(float(phases.get(k, 0.0)) for k in _KEY_STEPS)
        return cls(
            embed=p["embed"],
            search=p["search"],
            keys=p["keys"],
            nli=p["nli"],
            decide=p["decide"],
            store=p["store"],
            other=max(0.0, run_s - sum(p.values())),
        )

    def around(
        self, *, tokenize: float, queue: float, total: float, batch_facts: int, batch_entries: int
    ) -> Timings:
        """These model phases with the engine's own phases of one request."""
        return replace(
            self,
            tokenize=tokenize,
            queue=queue,
            total=total,
            batch_facts=batch_facts,
            batch_entries=batch_entries,
        )

    def as_dict(self) -> dict[str, float]:
        """Every phase by name (counts as floats), for logs, JSON and protobuf encoders."""
        return {
            "tokenize": self.tokenize,
            "queue": self.queue,
            "embed": self.embed,
            "search": self.search,
            "keys": self.keys,
            "nli": self.nli,
            "decide": self.decide,
            "store": self.store,
            "other": self.other,
            "total": self.total,
            "batch_facts": float(self.batch_facts),
            "batch_entries": float(self.batch_entries),
        }


@dataclass(frozen=True, slots=True)
class Triaged:
    """The decisions on one request's facts, in order, and how long each phase took."""

    decisions: tuple[Decision, ...]
    timings: Timings = field(default_factory=Timings)
    applied: bool = False
    """True when the decisions were committed (a Write); a dry run stores nothing."""


@dataclass(frozen=True, slots=True)
class Recalled:
    """The memories most similar to a query, best first, with their cosine similarity."""

    hits: tuple[tuple[Memory, float], ...]
    timings: Timings = field(default_factory=Timings)
    hidden: Hidden = field(default_factory=Hidden)
    """Inactive memories (superseded, expired, forgotten, undone) that matched and were left
    out: they would have ranked among the ``k`` best had every memory been eligible."""
    seq: int | None = None
    """The event seq the recall read at (as-of recalls); None: now."""


@dataclass(frozen=True, slots=True)
class Streamed:
    """One decision of a stream, released as soon as its fact's transaction committed."""

    index: int
    """The fact's position in the stream (0-based)."""
    decision: Decision
    timings: Timings
    applied: bool


def split(decisions: Sequence[Decision], sizes: Sequence[int]) -> list[tuple[Decision, ...]]:
    """Cut one batch's decisions back into the requests' slices, in order."""
    out: list[tuple[Decision, ...]] = []
    start = 0
    for n in sizes:
        out.append(tuple(decisions[start : start + n]))
        start += n
    if start != len(decisions):
        raise RuntimeError(f"the gate returned {len(decisions)} decisions for {start} facts")
    return out
