"""A facade over a ``mem0.Memory`` whose ``add`` goes through memgate's gate.

::

    from mem0 import Memory
    from engine.adapters.mem0 import GatedMemory

    memory = GatedMemory.local(Memory.from_config(config), data_dir="memgate-data")
    memory.add("The user lives in Denver.", user_id="alice")
    memory.add("The user moved to Austin.", user_id="alice")   # event UPDATE: Denver replaced
    memory.search("where does the user live?", filters={"user_id": "alice"})

Each fact of ``add`` (a string, a message dict or a list of either; system messages are
skipped, as mem0 does) is decided by the gate, then drives mem0:

========= ====================================================================================
ADD       ``memory.add(text, ..., infer=False)``: mem0's own LLM extraction is not used
REPLACE   ``memory.update(target, text)``: the mem0 item keeps its id, memgate keeps the chain
SKIP      nothing (event ``NONE``)
REVIEW    queued in memgate (event ``REVIEW``); :meth:`GatedMemory.resolve_review` applies it
========= ====================================================================================

Ids are mapped both ways: each mem0 item carries the id of its current memgate memory in its
metadata (``GatedMemorySettings.id_field``); memgate ids are found back through this facade's
map, else by a metadata filter on ``get_all``. ``search``, ``get``, ``get_all`` and ``history``
pass straight through. The memgate namespace of a scope is ``mem0/user:<id>/agent:<id>/run:<id>``
(the parts given, escaped as in :func:`engine.adapters._common.encode_labels`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from engine.adapters._common import encode_labels, missing_extra
from engine.adapters._engine import GateEngine, as_gate_engine, open_local
from engine.errors import Conflict, InvalidInput, NotFound
from engine.gate.policy import policy_by_name
from engine.types import Action, Decision, Fact, Memory, ReviewItem

try:
    import mem0 as _mem0  # noqa: F401  (the facade drives a user's object; fail early if absent)
except ImportError as exc:  # pragma: no cover - exercised by the missing-extra test
    # mem0ai pins protobuf<7, which memgate cannot take: the extra brings its dependencies.
    raise missing_extra("mem0", "mem0ai", "pip install --no-deps 'mem0ai>=2.2,<2.3'") from exc

__all__ = ["GatedMemory", "GatedMemorySettings"]

_SCOPES = ("user_id", "agent_id", "run_id")
_EVENTS = {"add": "ADD", "replace": "UPDATE", "skip": "NONE", "review": "REVIEW"}
_META = "mem0"


@dataclass(frozen=True)
class GatedMemorySettings:
    """How a :class:`GatedMemory` gates. Every field is checked."""

    policy: str = "strict"
    """The gate policy: ``strict`` (replace or refuse), ``review`` (queue conflicts), or any
    other of :data:`engine.gate.policy.POLICY_NAMES` (``seed``: the seed's plain rule)."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """Policy settings overridden for every fact, e.g. ``(("review_scope", "all"),)``."""
    namespace_prefix: str = "mem0"
    id_field: str = "memgate_id"
    """mem0 metadata field holding the current memgate memory id."""
    expires_field: str = "memgate_expires_at"
    """mem0 metadata field holding an item's expiry (Unix seconds, from ``expiration_date``);
    an item past it is never read back through this facade."""

    def __post_init__(self) -> None:
        policy_by_name(self.policy).with_overrides(dict(self.overrides))
        encode_labels(self.namespace_prefix, ("x",))
        if not self.id_field or not self.expires_field:
            raise InvalidInput("id_field and expires_field must be non-empty")


class GatedMemory:
    """``add`` through the gate; everything else of ``mem0.Memory`` as it is (see the module)."""

    def __init__(
        self,
        memory: Any,
        engine: Any,
        *,
        settings: GatedMemorySettings | None = None,
        on_decision: Callable[[Decision], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name in ("add", "update", "delete", "get", "get_all", "search"):
            if not callable(getattr(memory, name, None)):
                raise InvalidInput(f"memory must be a mem0.Memory (no {name}())")
        self.memory = memory
        self.engine: GateEngine = as_gate_engine(engine)
        self.settings = settings or GatedMemorySettings()
        self.on_decision = on_decision
        self._overrides = dict(self.settings.overrides)
        self._mem0_ids: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._clock = clock

    @classmethod
    def local(
        cls,
        memory: Any,
        *,
        data_dir: str | Path,
        policy: str = "strict",
        cache_dir: str | Path | None = None,
        settings: GatedMemorySettings | None = None,
    ) -> GatedMemory:
        """Open an in-process engine over ``data_dir`` on the default models in
        ``$MEMGATE_HOME`` (or ``cache_dir``); :meth:`close` closes it."""
        base = settings or GatedMemorySettings()
        settings = GatedMemorySettings(**{**base.__dict__, "policy": policy})
        return cls(memory, open_local(data_dir, cache_dir=cache_dir), settings=settings)

    def close(self) -> None:
        self.engine.close()

    # -- mapping --------------------------------------------------------------------------
    def namespace(
        self, user_id: str | None = None, agent_id: str | None = None, run_id: str | None = None
    ) -> str:
        """The memgate namespace of a mem0 scope (at least one id, as mem0 requires)."""
        scope = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
        labels = tuple(f"{k.split('_')[0]}:{v}" for k, v in scope.items() if v)
        if not labels:
            raise InvalidInput("one of user_id, agent_id, run_id is required")
        return encode_labels(self.settings.namespace_prefix, labels)

    def memgate_id(self, mem0_id: str) -> str | None:
        """The current memgate memory of a mem0 item (None: not a gated item)."""
        item = self.memory.get(mem0_id)
        if item is None:
            raise NotFound(f"no mem0 memory {mem0_id}")
        found = (item.get("metadata") or {}).get(self.settings.id_field)
        return None if found is None else str(found)

    def mem0_id(self, namespace: str, memgate_id: str, scope: Mapping[str, str]) -> str | None:
        """The mem0 item holding ``memgate_id`` (None: none does)."""
        with self._lock:
            known = self._mem0_ids.get((namespace, memgate_id))
        if known is not None:
            return known
        filters = {**scope, self.settings.id_field: memgate_id}
        hits = self.memory.get_all(filters=filters, top_k=1).get("results", [])
        return str(hits[0]["id"]) if hits else None

    # -- writes ---------------------------------------------------------------------------
    def add(
        self,
        messages: str | Mapping[str, Any] | Sequence[str | Mapping[str, Any]],
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = False,
        expiration_date: str | date | datetime | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """Gate each fact, then drive mem0 (the module's table). Returns mem0's shape,
        ``{"results": [{"id", "memory", "event", ...}]}``, one entry per fact, with the
        memgate decision (``memgate_id``, ``target_memgate_id``, ``rule``, ``review_id``).

        ``expiration_date`` (Mem0's: ``"YYYY-MM-DD"``, the last day the memory holds; or an
        aware datetime / RFC 3339 time): the memories expire then, in memgate (never recalled
        nor matched again) and in this facade's reads (search, get_all, get)."""
        if infer:
            raise InvalidInput(
                "GatedMemory gates the facts it is given; mem0's LLM extraction (infer=True) "
                "would write past the gate: pass the facts themselves"
            )
        scope = {k: v for k, v in zip(_SCOPES, (user_id, agent_id, run_id), strict=True) if v}
        ns = self.namespace(user_id, agent_id, run_id)
        texts = _texts(messages)
        extra = dict(metadata or {})
        expires_at = _expiry(expiration_date)
        if expires_at is not None:
            extra[self.settings.expires_field] = expires_at
        meta = {_META: {"scope": scope, "metadata": extra}}
        facts = [Fact(ns, text, metadata=meta, expires_at=expires_at) for text in texts]
        decisions = self.engine.write(facts, self.settings.policy, self._overrides) if facts else []
        return {"results": [self._apply(ns, scope, extra, d) for d in decisions]}

    def _apply(
        self, ns: str, scope: Mapping[str, str], extra: Mapping[str, Any], d: Decision
    ) -> dict[str, Any]:
        text = d.fact.text
        mem0_id: str | None = None
        event = _EVENTS[d.action]
        if d.action == "replace" and d.memory_id is not None and d.target_id is not None:
            mem0_id = self.mem0_id(ns, d.target_id, scope)
            if mem0_id is not None:
                self.memory.update(
                    mem0_id,
                    text=text,
                    metadata={
                        self.settings.id_field: d.memory_id,
                        self.settings.expires_field: extra.get(self.settings.expires_field),
                    },
                )
            else:  # the superseded memory has no mem0 item (deleted there): store the new one
                event = "ADD"
        if event == "ADD" and d.memory_id is not None:
            added = self.memory.add(
                text, **scope, metadata={**extra, self.settings.id_field: d.memory_id}, infer=False
            )
            mem0_id = str(added["results"][0]["id"])
        if mem0_id is not None and d.memory_id is not None:
            with self._lock:
                self._mem0_ids[(ns, d.memory_id)] = mem0_id
        if self.on_decision is not None:
            self.on_decision(d)
        return {
            "id": mem0_id,
            "memory": text,
            "event": event,
            "memgate_id": d.memory_id,
            "target_memgate_id": d.target_id,
            "rule": d.rule,
            "review_id": d.review_id,
        }

    def delete(self, memory_id: str) -> dict[str, str]:
        """Forget the memory in memgate (text erased) and delete the mem0 item."""
        ns, _ = self._scope_of(memory_id)
        memgate_id = self.memgate_id(memory_id)
        if memgate_id is not None:
            try:
                self.engine.forget(ns, memgate_id)
            except (NotFound, Conflict):
                pass  # already forgotten in memgate: the mem0 delete still happens
        out: dict[str, str] = self.memory.delete(memory_id)
        return out

    def undo(self, memory_id: str) -> Memory:
        """Undo the replacement the mem0 item's current text made: the item gets the old text
        back and memgate makes the old memory active again. Returns the restored memory."""
        ns, _ = self._scope_of(memory_id)
        memgate_id = self.memgate_id(memory_id)
        if memgate_id is None:
            raise NotFound(f"mem0 memory {memory_id} was not written through the gate")
        restored, _undone = self.engine.undo(ns, memgate_id)
        self.memory.update(
            memory_id, text=restored.text, metadata={self.settings.id_field: restored.id}
        )
        with self._lock:
            self._mem0_ids[(ns, restored.id)] = memory_id
        return restored

    def gate_history(self, memory_id: str) -> list[Memory]:
        """memgate's supersedes chain of the mem0 item, oldest first."""
        ns, _ = self._scope_of(memory_id)
        memgate_id = self.memgate_id(memory_id)
        if memgate_id is None:
            raise NotFound(f"mem0 memory {memory_id} was not written through the gate")
        return self.engine.history(ns, memgate_id)

    def list_review(
        self,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
        limit: int = 100,
    ) -> list[ReviewItem]:
        return self.engine.list_review(self.namespace(user_id, agent_id, run_id), limit)

    def resolve_review(
        self,
        review_id: str,
        resolution: str,
        *,
        user_id: str | None = None,
        agent_id: str | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """``accept`` (update the target's mem0 item), ``keep_both`` (add) or ``reject``."""
        ns = self.namespace(user_id, agent_id, run_id)
        memgate_id = self.engine.resolve_review(ns, review_id, resolution)
        if memgate_id is None:
            return {"id": None, "event": "NONE", "review_id": review_id}
        memory = self.engine.get(ns, memgate_id)
        if memory is None:
            raise NotFound(f"memory {memgate_id} of review {review_id} is not in {ns}")
        stored = memory.metadata.get(_META, {})
        action: Action = "replace" if memory.supersedes is not None else "add"
        decision = Decision(
            action,
            Fact(ns, memory.text, metadata=memory.metadata),
            memory.supersedes,
            (),
            self.settings.policy,
            "review_" + resolution,
            memory_id=memgate_id,
            review_id=review_id,
        )
        return self._apply(ns, stored.get("scope", {}), stored.get("metadata", {}), decision)

    # -- reads: straight through, expired items left out ------------------------------------
    def search(self, query: str, **kwargs: Any) -> Any:
        return self._live(self.memory.search(query, **kwargs))

    def get_all(self, **kwargs: Any) -> Any:
        return self._live(self.memory.get_all(**kwargs))

    def get(self, memory_id: str) -> Any:
        item = self.memory.get(memory_id)
        return None if item is not None and self._expired(item) else item

    def _expired(self, item: Mapping[str, Any]) -> bool:
        when = (item.get("metadata") or {}).get(self.settings.expires_field)
        return isinstance(when, int | float) and when <= self._clock()

    def _live(self, found: Any) -> Any:
        if isinstance(found, Mapping) and isinstance(found.get("results"), list):
            return {**found, "results": [r for r in found["results"] if not self._expired(r)]}
        return found

    def history(self, memory_id: str) -> Any:
        """mem0's own change log of the item (see :meth:`gate_history` for memgate's)."""
        return self.memory.history(memory_id)

    def _scope_of(self, memory_id: str) -> tuple[str, dict[str, str]]:
        item = self.memory.get(memory_id)
        if item is None:
            raise NotFound(f"no mem0 memory {memory_id}")
        scope = {k: item[k] for k in _SCOPES if item.get(k)}
        return self.namespace(**scope), scope


def _expiry(value: str | date | datetime | None) -> float | None:
    """Unix seconds of Mem0's ``expiration_date``: a date (or ``YYYY-MM-DD``) expires at the
    end of that day, UTC; an aware datetime (or an RFC 3339 time) at that instant."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = (
                date.fromisoformat(value)
                if len(value) == 10
                else datetime.fromisoformat(value.replace("z", "Z"))
            )
        except ValueError:
            raise InvalidInput(
                f"expiration_date must be YYYY-MM-DD or an RFC 3339 time, got {value!r}"
            ) from None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InvalidInput("expiration_date must carry a time zone")
        return value.timestamp()
    if isinstance(value, date):
        end = datetime.combine(value + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
        return end.timestamp()
    raise InvalidInput(f"expiration_date must be a date, got {type(value).__name__}")


def _texts(messages: Any) -> list[str]:
    items = [messages] if isinstance(messages, str | Mapping) else list(messages)
    texts = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, Mapping) and isinstance(item.get("content"), str):
            if item.get("role") != "system":
                texts.append(item["content"])
        else:
            raise InvalidInput(
                f"message {i}: expected a string or a {{'role', 'content'}} dict with text "
                f"content, got {type(item).__name__}"
            )
    return texts
