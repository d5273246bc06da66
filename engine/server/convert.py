"""Converters between the protobuf messages and the domain types, both ways.

Pure (protobuf messages in, dataclasses out): the server decodes requests with them, the client
decodes responses. Every request field is checked here or by the gate's own validation; a bad one
raises :class:`~engine.errors.InvalidInput` naming the field and, for facts, its position.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.errors import InvalidInput
from engine.lifecycle import AsOf, Hidden, parse_as_of
from engine.server.proto import pb
from engine.types import Candidate, Decision, Event, Fact, Memory, ReviewItem
from engine.validation import check_namespace

__all__ = [
    "UNDECODABLE",
    "Limits",
    "as_of_from_pb",
    "hidden_from_pb",
    "hidden_to_pb",
    "check_decoded",
    "decision_from_pb",
    "decision_to_pb",
    "event_from_pb",
    "events_request_from_pb",
    "events_to_pb",
    "fact_from_pb",
    "fact_to_pb",
    "guard_deserializer",
    "memory_from_pb",
    "metadata_from_json",
    "memory_to_pb",
    "overrides_from_pb",
    "overrides_to_pb",
    "policy_from_pb",
    "policy_to_pb",
    "resolution_from_pb",
    "resolution_to_pb",
    "review_from_pb",
    "review_to_pb",
    "text_from_bytes",
    "timings_from_pb",
    "timings_to_pb",
]

KIND_TO_PB: dict[str, Any] = {
    "semantic": pb.SEMANTIC,
    "episodic": pb.EPISODIC,
    "procedural": pb.PROCEDURAL,
}
PB_TO_KIND: dict[int, str] = {v: k for k, v in KIND_TO_PB.items()} | {
    pb.KIND_UNSPECIFIED: "semantic"
}
ACTION_TO_PB: dict[str, Any] = {
    "add": pb.ADD,
    "replace": pb.REPLACE,
    "skip": pb.SKIP,
    "review": pb.REVIEW,
}
PB_TO_ACTION: dict[int, str] = {v: k for k, v in ACTION_TO_PB.items()}
POLICY_TO_PB: dict[str, Any] = {
    "strict": pb.STRICT,
    "review": pb.REVIEW_POLICY,
    "review-uncertain": pb.REVIEW_UNCERTAIN,
    "seed": pb.SEED,
    "seed-review": pb.SEED_REVIEW,
}
PB_TO_POLICY: dict[int, str] = {v: k for k, v in POLICY_TO_PB.items()} | {
    pb.POLICY_UNSPECIFIED: "strict"
}
RESOLUTION_TO_PB: dict[str, Any] = {
    "accept": pb.ACCEPT,
    "keep_both": pb.KEEP_BOTH,
    "reject": pb.REJECT,
}
PB_TO_RESOLUTION: dict[int, str] = {v: k for k, v in RESOLUTION_TO_PB.items()}

_K = TypeVar("_K")
_V = TypeVar("_V")

_FLOAT_OVERRIDES = (
    "floor",
    "contradiction",
    "dated_contradiction",
    "duplicate_similarity",
    "duplicate_max_contradiction",
    "ambiguity_margin",
    "dominance_margin",
    "auto_floor",
)
_TTL_OVERRIDES = ("episodic_ttl_s", "semantic_ttl_s", "procedural_ttl_s")
_OTHER_OVERRIDES: dict[str, Callable[[Any], Any]] = {
    "top_k": int,
    "review_scope": str,
}
TIMING_PHASES = ("tokenize", "queue", "embed", "search", "nli", "store", "total")


@dataclass(frozen=True)
class Limits:
    """Size limits checked while decoding, before any text is decoded or copied."""

    max_text_bytes: int = 32768
    """Longest fact text or query, in UTF-8 bytes (the gate then checks characters)."""
    max_metadata_bytes: int = 16384
    max_metadata_depth: int = 32
    """Deepest nesting of arrays and objects in ``metadata_json`` (deeper: refused, so that no
    decoder or encoder downstream ever recurses without bound)."""
    max_source_chars: int = 1024
    """Longest ``source`` label."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_text_bytes <= 1 << 24:
            raise InvalidInput(
                f"max_text_bytes must be in [1, 16777216], got {self.max_text_bytes}"
            )
        if not 2 <= self.max_metadata_bytes <= 1 << 24:
            raise InvalidInput("max_metadata_bytes must be in [2, 16777216]")
        if not 1 <= self.max_metadata_depth <= 256:
            raise InvalidInput("max_metadata_depth must be in [1, 256]")
        if not 1 <= self.max_source_chars <= 1 << 20:
            raise InvalidInput("max_source_chars must be in [1, 1048576]")


# -- undecodable requests ------------------------------------------------------------------
class _Undecodable:
    """The request bytes were not a valid message of the method's type."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNDECODABLE"


UNDECODABLE: Any = _Undecodable()
"""What a :func:`guard_deserializer` parser returns for bytes it cannot parse."""


def guard_deserializer(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """Wrap a request deserializer so that bad bytes become :data:`UNDECODABLE`.

    Left to grpcio, a message that does not parse (corrupt wire format, a ``string`` field that
    is not UTF-8) is answered UNKNOWN with the decoder's exception text, before any handler or
    interceptor runs. With this wrapper the handler receives the marker and
    :func:`check_decoded` turns it into :class:`~engine.errors.InvalidInput`.
    """

    def parse_or_mark(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception:  # protobuf's DecodeError (and whatever a future parser raises)
            return UNDECODABLE

    return parse_or_mark


def check_decoded(msg: Any) -> Any:
    """``msg``, or ``InvalidInput`` when the deserializer could not parse it."""
    if msg is UNDECODABLE:
        raise InvalidInput(
            "the request is not a valid message: corrupt wire format, or a string field "
            "that is not UTF-8"
        )
    return msg


# -- requests ------------------------------------------------------------------------------
def text_from_bytes(raw: bytes, what: str, limits: Limits) -> str:
    """Decode a text field strictly: oversize or invalid UTF-8 is the caller's error."""
    if len(raw) > limits.max_text_bytes:
        raise InvalidInput(f"{what} has {len(raw)} bytes; the limit is {limits.max_text_bytes}")
    try:
        return raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} is not valid UTF-8 (byte {exc.start})") from None


def fact_from_pb(msg: Any, index: int, limits: Limits) -> Fact:
    """Decode one fact (sizes, UTF-8, kind, metadata JSON, expiry fields); the fact rule
    itself (namespace, text, key...) is the engine's, which the service runs next
    (:meth:`engine.core.Engine.check_fact`), once."""
    what = f"fact {index}"
    text = text_from_bytes(msg.text, f"{what}: text", limits)
    kind = PB_TO_KIND.get(msg.kind)
    if kind is None:
        raise InvalidInput(f"{what}: unknown kind {msg.kind}")
    metadata = metadata_from_json(msg.metadata_json, what, limits) if msg.metadata_json else {}
    if len(msg.source) > limits.max_source_chars:
        raise InvalidInput(f"{what}: source is over {limits.max_source_chars} characters")
    expiry: dict[str, float] = {}
    for name in ("expires_at", "ttl_s"):
        if msg.HasField(name):
            value = float(getattr(msg, name))
            if not math.isfinite(value) or value <= 0:
                raise InvalidInput(f"{what}: {name} must be a positive number")
            expiry[name] = value
    if len(expiry) == 2:
        raise InvalidInput(f"{what}: a fact carries expires_at or ttl_s, not both")
    return Fact(
        namespace=msg.namespace,
        text=text,
        kind=kind,  # type: ignore[arg-type]
        key=msg.key or None,
        metadata=metadata,
        source=msg.source or None,
        idempotency_key=msg.idempotency_key or None,
        **expiry,
    )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _depth(text: str) -> int:
    """Deepest bracket nesting outside strings (a scan, so no recursion however deep)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def metadata_from_json(text: str, what: str, limits: Limits) -> dict[str, Any]:
    """A fact's ``metadata_json``: a JSON object within the size and depth limits, strict JSON
    only (``NaN``, ``Infinity`` and numbers that overflow to them are refused), so that what
    is accepted here is exactly what the store can write back."""
    if len(text.encode("utf-8")) > limits.max_metadata_bytes:
        raise InvalidInput(f"{what}: metadata_json is over {limits.max_metadata_bytes} bytes")
    if _depth(text) > limits.max_metadata_depth:
        raise InvalidInput(f"{what}: metadata_json nests deeper than {limits.max_metadata_depth}")
    try:
        value = json.loads(text, parse_constant=_reject_constant)
        json.dumps(value, allow_nan=False)  # 1e999 parses to inf: not storable JSON
    except (ValueError, RecursionError):
        raise InvalidInput(f"{what}: metadata_json is not valid JSON") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{what}: metadata_json must be a JSON object")
    return value


def fact_to_pb(fact: Fact) -> Any:
    return pb.Fact(
        namespace=fact.namespace,
        text=fact.text.encode("utf-8"),
        kind=KIND_TO_PB[fact.kind],
        key=fact.key or "",
        metadata_json=json.dumps(fact.metadata) if fact.metadata else "",
        source=fact.source or "",
        idempotency_key=fact.idempotency_key or "",
        expires_at=fact.expires_at,
        ttl_s=fact.ttl_s,
    )


def _lookup(table: Mapping[_K, _V], key: _K, message: str) -> _V:
    try:
        return table[key]
    except KeyError:
        raise InvalidInput(message) from None


def policy_from_pb(value: int) -> str:
    return _lookup(PB_TO_POLICY, value, f"unknown policy {value}")


def policy_to_pb(name: str) -> Any:
    choices = ", ".join(POLICY_TO_PB)
    return _lookup(POLICY_TO_PB, name, f"unknown policy {name!r}: choose one of {choices}")


def overrides_from_pb(msg: Any) -> dict[str, Any]:
    """The overrides the request set (proto3 ``optional`` presence); floats are rounded to 6
    decimals so that 0.6 sent as float32 is 0.6 again."""
    out: dict[str, Any] = {}
    for name in _FLOAT_OVERRIDES:
        if msg.HasField(name):
            value = float(getattr(msg, name))
            if not math.isfinite(value):
                raise InvalidInput(f"override {name} must be finite")
            out[name] = round(value, 6)
    for name, cast in _OTHER_OVERRIDES.items():
        if msg.HasField(name):
            out[name] = cast(getattr(msg, name))
    for name in _TTL_OVERRIDES:  # seconds: not rounded; the policy range-checks them
        if msg.HasField(name):
            out[name] = float(getattr(msg, name))
    return out


def overrides_to_pb(overrides: Mapping[str, Any] | None) -> Any:
    msg = pb.PolicyOverrides()
    for name, value in (overrides or {}).items():
        if (
            name not in _FLOAT_OVERRIDES
            and name not in _OTHER_OVERRIDES
            and name not in _TTL_OVERRIDES
        ):
            raise InvalidInput(f"unknown policy override {name!r}")
        setattr(msg, name, value)
    return msg


def resolution_from_pb(value: int) -> str:
    return _lookup(PB_TO_RESOLUTION, value, "resolution must be ACCEPT, KEEP_BOTH or REJECT")


def resolution_to_pb(name: str) -> Any:
    return _lookup(RESOLUTION_TO_PB, name, "resolution must be accept, keep_both or reject")


MAX_EVENTS = 1000
"""Most events one ListEvents page returns."""
_MAX_SEQ = (1 << 63) - 1


def events_request_from_pb(msg: Any) -> tuple[str, int, int]:
    """(namespace, after_seq, limit) of a ListEvents request, each checked."""
    namespace = check_namespace(msg.namespace)
    if msg.after_seq > _MAX_SEQ:
        raise InvalidInput(f"after_seq must be at most {_MAX_SEQ}")
    limit = msg.limit or 100
    if not 1 <= limit <= MAX_EVENTS:
        raise InvalidInput(f"limit must be in [1, {MAX_EVENTS}]")
    return namespace, int(msg.after_seq), int(limit)


# -- responses -----------------------------------------------------------------------------
def decision_to_pb(d: Decision, index: int) -> Any:
    cands = []
    for c in d.candidates:
        kw: dict[str, Any] = {}
        if c.contradiction is not None:
            kw["contradiction"] = c.contradiction
        if c.entailment is not None:
            kw["entailment"] = c.entailment
        cands.append(
            pb.Candidate(
                memory_id=c.memory_id,
                text=c.text,
                similarity=c.similarity,
                passed=c.passed,
                reason=c.reason,
                key=c.key or "",
                **kw,
            )
        )
    return pb.Decision(
        action=ACTION_TO_PB[d.action],
        target_id=d.target_id or "",
        memory_id=d.memory_id or "",
        review_id=d.review_id or "",
        rule=d.rule,
        hypothesis=d.hypothesis or "",
        inferred_key=d.inferred_key or "",
        candidates=cands,
        replayed=d.replayed,
        index=index,
        policy=d.policy,
    )


def decision_from_pb(msg: Any, fact: Fact) -> Decision:
    cands = tuple(
        Candidate(
            memory_id=c.memory_id,
            text=c.text,
            similarity=float(c.similarity),
            contradiction=float(c.contradiction) if c.HasField("contradiction") else None,
            entailment=float(c.entailment) if c.HasField("entailment") else None,
            key=c.key or None,
            passed=c.passed,
            reason=c.reason,
        )
        for c in msg.candidates
    )
    return Decision(
        action=PB_TO_ACTION[msg.action],  # type: ignore[arg-type]
        fact=fact,
        target_id=msg.target_id or None,
        candidates=cands,
        policy=msg.policy,
        rule=msg.rule,
        hypothesis=msg.hypothesis or None,
        inferred_key=msg.inferred_key or None,
        memory_id=msg.memory_id or None,
        review_id=msg.review_id or None,
        replayed=msg.replayed,
    )


def _json(value: Mapping[str, Any]) -> str:
    return json.dumps(value, default=str, sort_keys=True) if value else ""


def _from_json(text: str) -> Any:
    return json.loads(text) if text else {}


def memory_to_pb(m: Memory) -> Any:
    return pb.Memory(
        id=m.id,
        namespace=m.namespace,
        kind=KIND_TO_PB.get(m.kind, pb.KIND_UNSPECIFIED),
        text=m.text,
        key=m.key or "",
        metadata_json=_json(m.metadata),
        source=m.source or "",
        created_at=m.created_at,
        status=m.status,
        supersedes=m.supersedes or "",
        superseded_by=m.superseded_by or "",
        scores_json=_json(m.scores),
        inferred_key=m.inferred_key or "",
        expires_at=m.expires_at or 0.0,
        inactive_since=m.inactive_since or 0.0,
    )


def memory_from_pb(msg: Any) -> Memory:
    return Memory(
        id=msg.id,
        namespace=msg.namespace,
        kind=PB_TO_KIND.get(msg.kind, "semantic"),  # type: ignore[arg-type]
        text=msg.text,
        key=msg.key or None,
        metadata=_from_json(msg.metadata_json),
        source=msg.source or None,
        created_at=msg.created_at,
        status=msg.status,
        supersedes=msg.supersedes or None,
        superseded_by=msg.superseded_by or None,
        scores=_from_json(msg.scores_json),
        inferred_key=msg.inferred_key or None,
        expires_at=msg.expires_at or None,
        inactive_since=msg.inactive_since or None,
    )


def review_to_pb(r: ReviewItem) -> Any:
    return pb.ReviewItem(
        id=r.id,
        namespace=r.namespace,
        text=r.fact.text,
        target_id=r.target_id or "",
        scores_json=_json(r.scores),
        status=r.status,
        created_at=r.created_at,
        kind=KIND_TO_PB.get(r.fact.kind, pb.KIND_UNSPECIFIED),
        key=r.fact.key or "",
        resolved_memory_id=r.resolved_memory_id or "",
    )


def review_from_pb(msg: Any) -> ReviewItem:
    fact = Fact(
        namespace=msg.namespace,
        text=msg.text,
        kind=PB_TO_KIND.get(msg.kind, "semantic"),  # type: ignore[arg-type]
        key=msg.key or None,
    )
    return ReviewItem(
        id=msg.id,
        namespace=msg.namespace,
        fact=fact,
        target_id=msg.target_id or None,
        scores=_from_json(msg.scores_json),
        status=msg.status,
        created_at=msg.created_at,
        resolved_memory_id=msg.resolved_memory_id or None,
    )


def timings_to_pb(timings: Mapping[str, float], batch_facts: int = 0) -> Any:
    return pb.Timings(
        **{k: float(timings[k]) for k in TIMING_PHASES if k in timings}, batch_facts=batch_facts
    )


def timings_from_pb(msg: Any) -> dict[str, float]:
    out = {k: float(getattr(msg, k)) for k in TIMING_PHASES}
    out["batch_facts"] = float(msg.batch_facts)
    return out


# The store's event names, and the API's (the words the issue and the docs use).
EVENT_TYPE_TO_PB: dict[str, str] = {
    "add": "add",
    "replace": "replace",
    "skip": "skip",
    "review_queued": "review",
    "review_resolved": "resolve",
    "forget": "forget",
    "undo": "undo",
    "expire": "expire",
}
PB_TO_EVENT_TYPE: dict[str, str] = {v: k for k, v in EVENT_TYPE_TO_PB.items()}


def event_to_pb(e: Event) -> Any:
    scores = e.scores or {}
    kw: dict[str, Any] = {}
    for name in ("similarity", "contradiction"):
        value = scores.get(name)
        if isinstance(value, int | float) and math.isfinite(value):
            kw[name] = float(value)
    return pb.Event(
        seq=e.seq,
        namespace=e.namespace,
        type=EVENT_TYPE_TO_PB.get(e.type, e.type),
        memory_id=e.memory_id or "",
        target_id=e.target_id or "",
        policy=e.policy or "",
        rule=str(scores.get("rule") or ""),
        review_id=str(scores.get("review_id") or ""),
        resolution=str(scores.get("resolution") or ""),
        scores_json=_json(scores),
        created_at=e.created_at,
        **kw,
    )


def events_to_pb(events: Sequence[Event], after_seq: int, timings: Any) -> Any:
    return pb.ListEventsResponse(
        events=[event_to_pb(e) for e in events],
        next_after_seq=events[-1].seq if events else after_seq,
        timings=timings,
    )


def event_from_pb(msg: Any) -> Event:
    """The event as the store holds it (``type`` in the store's words: ``review_queued``,
    ``review_resolved`` for the API's ``review``, ``resolve``)."""
    return Event(
        seq=int(msg.seq),
        namespace=msg.namespace,
        type=PB_TO_EVENT_TYPE.get(msg.type, msg.type),
        memory_id=msg.memory_id or None,
        target_id=msg.target_id or None,
        policy=msg.policy or None,
        scores=_from_json(msg.scores_json),
        created_at=msg.created_at,
    )


def as_of_from_pb(text: str) -> AsOf | None:
    """A request's ``as_of``: "" (now), an event seq, or an RFC 3339 time."""
    return parse_as_of(text)


def hidden_to_pb(hidden: Hidden) -> Any:
    return pb.Hidden(
        superseded=hidden.superseded,
        expired=hidden.expired,
        forgotten=hidden.forgotten,
        undone=hidden.undone,
        partial=hidden.partial,
    )


def hidden_from_pb(msg: Any) -> Hidden:
    return Hidden(
        superseded=int(msg.superseded),
        expired=int(msg.expired),
        forgotten=int(msg.forgotten),
        undone=int(msg.undone),
        partial=bool(msg.partial),
    )
