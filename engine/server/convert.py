"""Converters between the protobuf messages and the domain types, both ways.

Pure (protobuf messages in, dataclasses out): the server decodes requests with them, the client
decodes responses. Every request field is checked here or by the gate's own validation; a bad one
raises :class:`~engine.errors.InvalidInput` naming the field and, for facts, its position.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidInput
from engine.server.proto import pb
from engine.types import Candidate, Decision, Fact, Memory, ReviewItem

__all__ = [
    "Limits",
    "decision_from_pb",
    "decision_to_pb",
    "fact_from_pb",
    "fact_to_pb",
    "memory_from_pb",
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
POLICY_TO_PB: dict[str, Any] = {"strict": pb.STRICT, "review": pb.REVIEW_POLICY}
PB_TO_POLICY: dict[int, str] = {v: k for k, v in POLICY_TO_PB.items()} | {
    pb.POLICY_UNSPECIFIED: "strict"
}
RESOLUTION_TO_PB: dict[str, Any] = {
    "accept": pb.ACCEPT,
    "keep_both": pb.KEEP_BOTH,
    "reject": pb.REJECT,
}
PB_TO_RESOLUTION: dict[int, str] = {v: k for k, v in RESOLUTION_TO_PB.items()}

_FLOAT_OVERRIDES = (
    "floor",
    "contradiction",
    "key_match_contradiction",
    "duplicate_similarity",
    "duplicate_max_contradiction",
    "ambiguity_margin",
    "key_match_floor",
    "key_ambiguity_margin",
    "dominance_margin",
    "auto_floor",
)
_OTHER_OVERRIDES = ("top_k", "normalize", "keys", "review_scope")
TIMING_PHASES = ("tokenize", "queue", "embed", "search", "nli", "store", "total")


@dataclass(frozen=True)
class Limits:
    """Size limits checked while decoding, before any text is decoded or copied."""

    max_text_bytes: int = 32768
    """Longest fact text or query, in UTF-8 bytes (the gate then checks characters)."""
    max_metadata_bytes: int = 16384

    def __post_init__(self) -> None:
        if not 1 <= self.max_text_bytes <= 1 << 24:
            raise InvalidInput(
                f"max_text_bytes must be in [1, 16777216], got {self.max_text_bytes}"
            )
        if not 2 <= self.max_metadata_bytes <= 1 << 24:
            raise InvalidInput("max_metadata_bytes must be in [2, 16777216]")


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
    what = f"fact {index}"
    text = text_from_bytes(msg.text, f"{what}: text", limits)
    kind = PB_TO_KIND.get(msg.kind)
    if kind is None:
        raise InvalidInput(f"{what}: unknown kind {msg.kind}")
    metadata: dict[str, Any] = {}
    if msg.metadata_json:
        if len(msg.metadata_json.encode()) > limits.max_metadata_bytes:
            raise InvalidInput(f"{what}: metadata_json is over {limits.max_metadata_bytes} bytes")
        try:
            metadata = json.loads(msg.metadata_json)
        except ValueError:
            raise InvalidInput(f"{what}: metadata_json is not valid JSON") from None
        if not isinstance(metadata, dict):
            raise InvalidInput(f"{what}: metadata_json must be a JSON object")
    return Fact(
        namespace=msg.namespace,
        text=text,
        kind=kind,  # type: ignore[arg-type]
        key=msg.key or None,
        metadata=metadata,
        source=msg.source or None,
        idempotency_key=msg.idempotency_key or None,
    )


def fact_to_pb(fact: Fact) -> Any:
    return pb.Fact(
        namespace=fact.namespace,
        text=fact.text.encode("utf-8"),
        kind=KIND_TO_PB[fact.kind],
        key=fact.key or "",
        metadata_json=json.dumps(fact.metadata) if fact.metadata else "",
        source=fact.source or "",
        idempotency_key=fact.idempotency_key or "",
    )


def policy_from_pb(value: int) -> str:
    name = PB_TO_POLICY.get(value)
    if name is None:
        raise InvalidInput(f"unknown policy {value}")
    return name


def policy_to_pb(name: str) -> Any:
    try:
        return POLICY_TO_PB[name]
    except KeyError:
        raise InvalidInput(f"unknown policy {name!r}: choose strict or review") from None


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
    for name in _OTHER_OVERRIDES:
        if msg.HasField(name):
            value = getattr(msg, name)
            if name == "top_k":
                out[name] = int(value)
            elif name == "review_scope":
                out[name] = str(value)
            else:
                out[name] = bool(value)
    return out


def overrides_to_pb(overrides: Mapping[str, Any] | None) -> Any:
    msg = pb.PolicyOverrides()
    for name, value in (overrides or {}).items():
        if name not in _FLOAT_OVERRIDES and name not in _OTHER_OVERRIDES:
            raise InvalidInput(f"unknown policy override {name!r}")
        setattr(msg, name, value)
    return msg


def resolution_from_pb(value: int) -> str:
    name = PB_TO_RESOLUTION.get(value)
    if name is None:
        raise InvalidInput("resolution must be ACCEPT, KEEP_BOTH or REJECT")
    return name


def resolution_to_pb(name: str) -> Any:
    try:
        return RESOLUTION_TO_PB[name]
    except KeyError:
        raise InvalidInput("resolution must be accept, keep_both or reject") from None


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
    )


def memory_from_pb(msg: Any) -> Memory:
    return Memory(
        id=msg.id,
        namespace=msg.namespace,
        kind=PB_TO_KIND.get(msg.kind, "semantic"),  # type: ignore[arg-type]
        text=msg.text,
        key=msg.key or None,
        metadata=json.loads(msg.metadata_json) if msg.metadata_json else {},
        source=msg.source or None,
        created_at=msg.created_at,
        status=msg.status,
        supersedes=msg.supersedes or None,
        superseded_by=msg.superseded_by or None,
        scores=json.loads(msg.scores_json) if msg.scores_json else {},
        inferred_key=msg.inferred_key or None,
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
        scores=json.loads(msg.scores_json) if msg.scores_json else {},
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
