"""A LangGraph ``BaseStore`` whose writes go through memgate's gate.

::

    from langgraph.store.memory import InMemoryStore
    from engine.adapters.langgraph import GatedStore

    store = GatedStore.local(InMemoryStore(), data_dir="memgate-data")
    store.put(("memories", "alice"), "home", {"content": "Alice lives in Denver."})
    store.put(("memories", "alice"), "move", {"content": "Alice moved to Austin."})
    store.decisions[0].action      # "replace": the Denver item is gone, memgate keeps it

What each put does to the wrapped (inner) store:

======== ==================================================================================
add      the item is written (with ``_memgate_id`` in its value; reads strip it again)
replace  the item is written and the superseded one removed; :meth:`GatedStore.undo` puts
         the old one back and removes the new one, in memgate and in the inner store
skip     nothing is written
review   nothing is written until :meth:`GatedStore.resolve_review` accepts (or keeps both)
forget   ``PutOp(value=None)``: memgate forgets the memory, the inner item is deleted
======== ==================================================================================

A put never destroys a memory the gate did not decide to replace: when its key holds another
gated memory (an "update" that is really a sibling fact), that item is left alone and the new
one is written under ``<key>~<12 hex>`` (``PutDecision.refused_overwrite``). Get, search and
list-namespaces pass straight through. Episodic items (``value["kind"] == "episodic"``, or a
namespace under ``GateStoreSettings.episodic_namespaces``) are written as they are, never gated.

Namespaces map to memgate by :func:`engine.adapters._common.encode_labels`:
``("memories", "alice smith")`` <-> ``lg/memories/alice.20smith`` (prefix configurable).

Memory ids and inner keys are mapped durably: each item carries its memory id in its value
(``GateStoreSettings.id_field``), and each memory keeps its key, the value and the key's
occupant at decision time in its memgate metadata (``metadata["langgraph"]``). Reads strip
the id field, but an inner store that embeds whole values (its index ``fields`` left at the
default ``["$"]``) embeds the id too: give it the fields to embed (LangMem: ``["content"]``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple

from engine.adapters._common import decode_labels, encode_labels, missing_extra
from engine.adapters._engine import GateEngine, as_gate_engine, open_local
from engine.errors import Conflict, InvalidInput, NotFound
from engine.gate.policy import policy_by_name
from engine.types import Decision, Fact, Memory, ReviewItem

try:
    from langgraph.store.base import (
        BaseStore,
        GetOp,
        Item,
        Op,
        PutOp,
        Result,
        SearchItem,
        SearchOp,
        TTLConfig,
    )
except ImportError as exc:  # pragma: no cover - exercised by the missing-extra test
    raise missing_extra("langgraph", "langgraph") from exc

__all__ = ["GateStoreSettings", "GatedStore", "PutDecision", "Restored"]

PutAction = Literal["add", "replace", "skip", "review", "forget"]
_META = "langgraph"


@dataclass(frozen=True)
class GateStoreSettings:
    """How a :class:`GatedStore` turns puts into facts. Every field is checked."""

    policy: str = "strict"
    """The gate policy: ``strict`` (replace or refuse), ``review`` (queue conflicts), or any
    other of :data:`engine.gate.policy.POLICY_NAMES` (``seed``: the seed's plain rule)."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """Policy settings overridden for every put, e.g. ``(("review_scope", "all"),)``."""
    text_fields: tuple[str, ...] = ("content", "text")
    """Value fields tried in order for the fact text (LangMem writes ``content``). A string is
    used as it is; a dict (a LangMem schema) by its own text field, else as JSON; a list as
    JSON."""
    json_fallback: bool = True
    """With none of ``text_fields`` present, gate the JSON of the whole value."""
    ungated: bool = False
    """Store a value with no usable text as it is (rule ``ungated``) instead of raising."""
    kind_field: str = "kind"
    """Value field naming the memory kind: ``episodic`` items are appended ungated,
    ``procedural`` ones gated as procedural; anything else is semantic."""
    episodic_namespaces: tuple[tuple[str, ...], ...] = ()
    """Namespace prefixes whose items are all episodic (appended, never gated)."""
    namespace_prefix: str = "lg"
    """First part of every memgate namespace this store writes (see the module docstring)."""
    id_field: str = "_memgate_id"
    """Value field holding the memory id in the inner store; stripped from every read."""
    expires_field: str = "_memgate_expires_at"
    """Value field holding an item's expiry (Unix seconds, from the put's ``ttl``) in the
    inner store; stripped from every read, and an item past it is never read back."""

    def __post_init__(self) -> None:
        policy_by_name(self.policy).with_overrides(dict(self.overrides))
        encode_labels(self.namespace_prefix, ("x",))
        if not self.text_fields and not self.json_fallback and not self.ungated:
            raise InvalidInput("text_fields is empty and json_fallback is off: nothing to gate")
        if not self.id_field or not self.kind_field or not self.expires_field:
            raise InvalidInput("id_field, kind_field and expires_field must be non-empty")
        for prefix in self.episodic_namespaces:
            if not isinstance(prefix, tuple) or not prefix:
                raise InvalidInput("episodic_namespaces holds non-empty tuples of labels")


@dataclass(frozen=True)
class PutDecision:
    """What one put did, in memgate and in the inner store."""

    namespace: tuple[str, ...]
    key: str
    """The key the put asked for."""
    action: PutAction
    rule: str
    """The gate's rule (``keyed``, ``contradiction``...), or ``episodic`` / ``ungated``."""
    stored_key: str | None
    """Where the item was written; None when nothing was."""
    removed_key: str | None = None
    """The superseded item removed from the inner store (replace)."""
    memory_id: str | None = None
    target_id: str | None = None
    review_id: str | None = None
    refused_overwrite: bool = False
    """The put's key held another memory the gate did not replace: it was left in place."""
    decision: Decision | None = None


@dataclass(frozen=True)
class Restored:
    """An undone replacement: ``restored`` is back at ``restored_key``, ``removed_key`` gone."""

    restored: Memory
    undone: Memory
    restored_key: str
    removed_key: str | None


@dataclass
class _Put:
    op: PutOp
    namespace: str
    mode: Literal["gated", "forget", "episodic", "ungated"]
    text: str = ""
    kind: str = "semantic"
    occupant: str | None = None
    """Memory id of the gated item at ``op.key`` before this batch."""
    alt_key: str | None = None
    expires_at: float | None = None
    """When the put's ``ttl`` (minutes) runs out, in Unix seconds; None: never."""


class _Inner(NamedTuple):
    ops: list[Op]


class _Call(NamedTuple):
    fn: Callable[[], Any]


class _Done(NamedTuple):
    results: list[Result]


_Step = Generator[_Inner | _Call, Any, Any]


def _resume(steps: _Step, answer: Any, *, throw: bool = False) -> _Inner | _Call | _Done:
    """The next step of a batch, or its results when it is finished."""
    try:
        return steps.throw(answer) if throw else steps.send(answer)
    except StopIteration as done:
        return _Done(list(done.value))


def _home_key(meta: dict[str, Any], target: str | None) -> str:
    """Where a memory's item lives: its key, unless that key held another memory it did not
    replace (then the alternative key chosen before the gate decided)."""
    occupant = meta.get("occupant")
    if occupant is None or occupant == target or not meta.get("alt_key"):
        return str(meta["key"])
    return str(meta["alt_key"])


class GatedStore(BaseStore):
    """A ``BaseStore`` over ``inner`` whose puts go through memgate (see the module docstring).

    ``engine``: an ``engine.app.OpenedEngine``, its ``Gate``, an ``engine.client.MemgateClient`` or
    any :class:`~engine.adapters._engine.GateEngine`. Thread-safe as far as ``inner`` is;
    ``decisions`` is the last batch's, so read it from the thread that wrote.
    """

    def __init__(
        self,
        inner: BaseStore,
        engine: Any,
        *,
        settings: GateStoreSettings | None = None,
        on_decision: Callable[[PutDecision], None] | None = None,
        ttl_config: TTLConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(inner, BaseStore):
            raise InvalidInput(f"inner must be a langgraph BaseStore, got {type(inner).__name__}")
        self.inner = inner
        self.engine: GateEngine = as_gate_engine(engine)
        self.settings = settings or GateStoreSettings()
        self.on_decision = on_decision
        self.decisions: list[PutDecision] = []
        self._overrides = dict(self.settings.overrides)
        # TTL is honoured here whatever the inner store supports: a put's ttl (minutes, or
        # ttl_config's default_ttl) becomes the memory's expires_at in memgate and an expiry
        # stamp on the inner item, and expired items are never read back (omit_expired).
        self.supports_ttl = True
        self.ttl_config = ttl_config if ttl_config is not None else inner.ttl_config
        self._clock = clock

    @classmethod
    def local(
        cls,
        inner: BaseStore,
        *,
        data_dir: str | Path,
        policy: str = "strict",
        cache_dir: str | Path | None = None,
        settings: GateStoreSettings | None = None,
        on_decision: Callable[[PutDecision], None] | None = None,
    ) -> GatedStore:
        """Open an in-process engine over ``data_dir`` on the default models in
        ``$MEMGATE_HOME`` (or ``cache_dir``); :meth:`close` closes it."""
        base = settings or GateStoreSettings()
        settings = GateStoreSettings(**{**base.__dict__, "policy": policy})
        return cls(
            inner,
            open_local(data_dir, cache_dir=cache_dir),
            settings=settings,
            on_decision=on_decision,
        )

    def close(self) -> None:
        self.engine.close()

    # -- the mapping ----------------------------------------------------------------------
    def memgate_namespace(self, namespace: tuple[str, ...]) -> str:
        return encode_labels(self.settings.namespace_prefix, tuple(namespace))

    def store_namespace(self, memgate_namespace: str) -> tuple[str, ...]:
        return decode_labels(self.settings.namespace_prefix, memgate_namespace)

    def memory_id(self, namespace: tuple[str, ...], key: str) -> str | None:
        """The memory id of the item at ``key`` (None: no item, or an ungated one)."""
        item = self.inner.get(namespace, key)
        return None if item is None else item.value.get(self.settings.id_field)

    def key_of(self, namespace: tuple[str, ...], memory_id: str) -> str | None:
        """The inner key holding ``memory_id`` (None: not in the inner store)."""
        found = self.inner.batch([self._find(namespace, memory_id)])[0]
        return self._found_key(namespace, found)

    # -- BaseStore ------------------------------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        steps = self._run(list(ops))
        step: _Inner | _Call | _Done = next(steps)
        while not isinstance(step, _Done):
            try:
                answer = self.inner.batch(step.ops) if isinstance(step, _Inner) else step.fn()
            except Exception as exc:  # handed to the step that failed, which compensates
                step = _resume(steps, exc, throw=True)
            else:
                step = _resume(steps, answer)
        return step.results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        steps = self._run(list(ops))
        step: _Inner | _Call | _Done = next(steps)
        while not isinstance(step, _Done):
            try:
                if isinstance(step, _Inner):
                    answer = await self.inner.abatch(step.ops)
                else:
                    answer = await asyncio.to_thread(step.fn)
            except Exception as exc:
                step = _resume(steps, exc, throw=True)
            else:
                step = _resume(steps, answer)
        return step.results

    # -- as-of reads ------------------------------------------------------------------------
    def search_as_of(
        self,
        namespace: tuple[str, ...],
        query: str,
        *,
        as_of: Any,
        limit: int = 10,
    ) -> list[SearchItem]:
        """The items of ``namespace`` whose memories were active at ``as_of`` (an event seq, a
        Unix time, an aware datetime or an RFC 3339 string), most similar to ``query`` first,
        as memgate rebuilds them from its event log (``BaseStore.search`` has no as-of
        argument; the inner store only holds the present). Each item is the value as it was
        put, at the key it was written under; ``score`` is memgate's similarity."""
        recall = getattr(self.engine, "recall", None)
        if recall is None:
            raise InvalidInput("as-of search needs an engine with recall (local or remote)")
        hits = recall(self.memgate_namespace(namespace), query, limit, as_of=as_of)
        items: list[SearchItem] = []
        for memory, similarity in hits:
            meta = memory.metadata.get(_META)
            if not isinstance(meta, dict):
                continue  # written around this store: no item to show
            when = datetime.fromtimestamp(memory.created_at, tz=UTC)
            value = {
                k: v
                for k, v in dict(meta.get("value") or {}).items()
                if k not in (self.settings.id_field, self.settings.expires_field)
            }
            key = _home_key(meta, memory.supersedes)
            items.append(SearchItem(tuple(namespace), key, value, when, when, similarity))
        return items

    async def asearch_as_of(
        self, namespace: tuple[str, ...], query: str, *, as_of: Any, limit: int = 10
    ) -> list[SearchItem]:
        return await asyncio.to_thread(
            self.search_as_of, namespace, query, as_of=as_of, limit=limit
        )

    # -- corrections ----------------------------------------------------------------------
    def history(self, namespace: tuple[str, ...], key: str) -> list[Memory]:
        """The supersedes chain of the memory at ``key``, oldest first."""
        return self.engine.history(self.memgate_namespace(namespace), self._need_id(namespace, key))

    def undo(self, namespace: tuple[str, ...], key: str) -> Restored:
        """Undo the replacement the item at ``key`` made: memgate makes the old memory active
        again, and the inner store gets the old item back and loses the new one."""
        ns = self.memgate_namespace(namespace)
        memory_id = self._need_id(namespace, key)
        current = self.engine.get(ns, memory_id)
        target = None if current is None else current.supersedes
        old = None if target is None else self.engine.get(ns, target)
        if old is not None and not isinstance(old.metadata.get(_META), dict):
            raise Conflict(
                f"{memory_id} replaced {target}, which was not written through a GatedStore: "
                "its item cannot be restored (nothing was undone)"
            )
        restored, undone = self.engine.undo(ns, memory_id)  # Conflict if it replaced nothing
        home = _home_key(restored.metadata[_META], restored.supersedes)
        ops: list[Op] = []
        if home != key:
            ops.append(PutOp(namespace, key, None))
        ops.append(PutOp(namespace, home, self._stored_value(restored.metadata, restored.id)))
        self.inner.batch(ops)
        return Restored(restored, undone, home, None if home == key else key)

    def list_review(self, namespace: tuple[str, ...], limit: int = 100) -> list[ReviewItem]:
        return self.engine.list_review(self.memgate_namespace(namespace), limit)

    def resolve_review(
        self, namespace: tuple[str, ...], review_id: str, resolution: str
    ) -> PutDecision:
        """``accept`` (replace the target: its item is removed), ``keep_both`` (add) or
        ``reject``; an accepted or kept item is written now."""
        ns = self.memgate_namespace(namespace)
        memory_id = self.engine.resolve_review(ns, review_id, resolution)
        if memory_id is None:
            return PutDecision(
                tuple(namespace), "", "skip", "review_rejected", None, review_id=review_id
            )
        memory = self.engine.get(ns, memory_id)
        if memory is None:
            raise NotFound(f"memory {memory_id} of review {review_id} is not in {ns}")
        meta = memory.metadata[_META]
        home = _home_key(meta, memory.supersedes)
        action: PutAction = "add" if memory.supersedes is None else "replace"
        ops: list[Op] = []
        removed = None
        if memory.supersedes is not None:
            removed = self._recorded_home(ns, memory.supersedes) or self.key_of(
                namespace, memory.supersedes
            )
            if removed is not None and removed != home:
                ops.append(PutOp(namespace, removed, None))
        ops.append(PutOp(namespace, home, self._stored_value(memory.metadata, memory_id)))
        self.inner.batch(ops)
        out = PutDecision(
            tuple(namespace),
            str(meta["key"]),
            action,
            "review_" + resolution,
            home,
            removed if removed != home else None,
            memory_id,
            memory.supersedes,
            review_id,
        )
        self._emit([out])
        return out

    # -- the batch, as steps (driven by batch() or abatch()) --------------------------------
    def _run(self, ops: list[Op]) -> _Step:
        puts = [op for op in ops if isinstance(op, PutOp)]
        if not puts:
            return self._strip_results(ops, (yield _Inner(ops)))
        # The last put of a key wins, in the order keys were first seen: as LangGraph's stores.
        last: dict[tuple[tuple[str, ...], str], PutOp] = {}
        for put in puts:
            last[(put.namespace, put.key)] = put
        plans = [self._plan(put) for put in last.values()]

        looked = [p for p in plans if p.mode in ("gated", "forget")]
        if looked:
            found = yield _Inner([GetOp(p.op.namespace, p.op.key) for p in looked])
            for plan, item in zip(looked, found, strict=True):
                if item is not None:
                    plan.occupant = item.value.get(self.settings.id_field)
                if plan.mode == "gated" and plan.occupant is not None:
                    plan.alt_key = f"{plan.op.key}~{uuid.uuid4().hex[:12]}"

        gated = [p for p in plans if p.mode == "gated"]
        decided: list[Decision] = []
        if gated:
            facts = [self._fact(p) for p in gated]
            decided = yield _Call(
                lambda: self.engine.write(facts, self.settings.policy, self._overrides)
            )

        # Where the superseded memories live: this batch's own writes, the put's own key, the
        # key memgate recorded with the memory, or (a memory written around this store) the
        # inner item carrying its id.
        homes: dict[str, str] = {}
        lookups: list[tuple[_Put, str]] = []
        for plan, d in zip(gated, decided, strict=True):
            if d.memory_id is not None:
                homes[d.memory_id] = _home_key(self._meta(plan), d.target_id)
        for plan, d in zip(gated, decided, strict=True):
            if d.action == "replace" and d.target_id is not None:
                if d.target_id == plan.occupant:
                    homes[d.target_id] = plan.op.key
                elif d.target_id not in homes:
                    lookups.append((plan, d.target_id))
        if lookups:
            recorded = yield _Call(
                lambda: [self._recorded_home(p.namespace, m) for p, m in lookups]
            )
            unknown = [(p, m) for (p, m), key in zip(lookups, recorded, strict=True) if key is None]
            homes.update({m: key for (_, m), key in zip(lookups, recorded, strict=True) if key})
            if unknown:
                found = yield _Inner([self._find(p.op.namespace, m) for p, m in unknown])
                for (p, m), items in zip(unknown, found, strict=True):
                    key = self._found_key(p.op.namespace, items)
                    if key is not None:
                        homes[m] = key

        removals: list[Op] = []
        writes: list[Op] = []
        out: list[PutDecision] = []
        by_plan = dict(zip((id(p) for p in gated), decided, strict=True))
        for plan in plans:
            op = plan.op
            if plan.mode != "gated":
                writes.append(self._inner_put(op, op.key, op.value, plan.expires_at))
                action: PutAction = "forget" if plan.mode == "forget" else "add"
                stored = None if plan.mode == "forget" else op.key
                rule = "forget" if plan.mode == "forget" else plan.mode
                out.append(
                    PutDecision(
                        op.namespace,
                        op.key,
                        action,
                        rule,
                        stored,
                        memory_id=plan.occupant if action == "forget" else None,
                    )
                )
                continue
            d = by_plan[id(plan)]
            stored_key = removed = None
            if d.action in ("add", "replace") and d.memory_id is not None:
                stored_key = homes[d.memory_id]
                value = {**dict(op.value or {}), self.settings.id_field: d.memory_id}
                writes.append(self._inner_put(op, stored_key, value, plan.expires_at))
                if d.action == "replace" and d.target_id is not None:
                    removed = homes.get(d.target_id)
                    if removed == stored_key:
                        removed = None
                    elif removed is not None:
                        removals.append(PutOp(op.namespace, removed, None))
            refused = (
                plan.occupant is not None
                and d.action in ("add", "replace")
                and d.target_id != plan.occupant
            )
            out.append(
                PutDecision(
                    op.namespace,
                    op.key,
                    d.action,
                    d.rule,
                    stored_key,
                    removed,
                    d.memory_id,
                    d.target_id,
                    d.review_id,
                    refused,
                    d,
                )
            )

        reads = [op for op in ops if not isinstance(op, PutOp)]
        try:
            results = yield _Inner([*reads, *removals, *writes])
        except Exception:
            # The inner store refused the batch: take back what memgate committed for it, so
            # the two stay in step, and let the caller see the inner store's error.
            if decided:
                yield _Call(lambda: self._compensate(decided))
            raise
        forgets = [p for p in plans if p.mode == "forget" and p.occupant]
        if forgets:  # after the inner delete: a failed delete leaves the memory in memgate
            yield _Call(lambda: self._forget_all(forgets))
        self.decisions = out
        self._emit(out)
        answers = iter(self._strip_results(reads, results[: len(reads)]))
        return [None if isinstance(op, PutOp) else next(answers) for op in ops]

    # -- helpers ----------------------------------------------------------------------------
    def _plan(self, op: PutOp) -> _Put:
        plan = self._plan_mode(op)
        if op.value is not None and op.ttl is not None:
            if not isinstance(op.ttl, int | float) or not 0 < op.ttl <= 1e8:
                raise InvalidInput(f"put {op.namespace!r}/{op.key!r}: ttl must be > 0 minutes")
            plan.expires_at = self._clock() + 60.0 * float(op.ttl)
        return plan

    def _plan_mode(self, op: PutOp) -> _Put:
        ns = self.memgate_namespace(op.namespace)
        if op.value is None:
            return _Put(op, ns, "forget")
        value = op.value
        kind = value.get(self.settings.kind_field)
        if kind == "episodic" or any(
            op.namespace[: len(p)] == p for p in self.settings.episodic_namespaces
        ):
            return _Put(op, ns, "episodic")
        text = self._text(value)
        if text is None:
            if self.settings.ungated:
                return _Put(op, ns, "ungated")
            raise InvalidInput(
                f"put {op.namespace!r}/{op.key!r}: the value has no usable text (tried "
                f"{', '.join(self.settings.text_fields) or 'no fields'}"
                f"{', then its JSON' if self.settings.json_fallback else ''}); set "
                "GateStoreSettings(text_fields=...) or ungated=True to store it ungated"
            )
        return _Put(op, ns, "gated", text, "procedural" if kind == "procedural" else "semantic")

    def _text(self, value: Mapping[str, Any], nested: bool = True) -> str | None:
        for name in self.settings.text_fields:
            if name in value:
                field = value[name]
                if isinstance(field, str):
                    return field if field.strip() else None
                if isinstance(field, dict) and nested:
                    # LangMem's store manager writes {"kind": "Memory", "content": {"content":
                    # "..."}}: the text of the inner record, else its JSON.
                    inner = {f: field[f] for f in self.settings.text_fields if f in field}
                    text = self._text(inner, nested=False) if inner else None
                    return text if text is not None else (_json(field) if field else None)
                if isinstance(field, dict | list) and field:
                    return _json(field)
                return None
        rest = {k: v for k, v in value.items() if k != self.settings.id_field}
        return _json(rest) if rest and self.settings.json_fallback else None

    def _meta(self, plan: _Put) -> dict[str, Any]:
        value = {k: v for k, v in (plan.op.value or {}).items() if k != self.settings.id_field}
        return {
            "key": plan.op.key,
            "occupant": plan.occupant,
            "alt_key": plan.alt_key,
            "value": value,
        }

    def _fact(self, plan: _Put) -> Fact:
        return Fact(
            plan.namespace,
            plan.text,
            kind=plan.kind,  # type: ignore[arg-type]
            metadata={_META: self._meta(plan)},
            expires_at=plan.expires_at,
        )

    def _stored_value(self, metadata: dict[str, Any], memory_id: str) -> dict[str, Any]:
        return {**metadata[_META]["value"], self.settings.id_field: memory_id}

    def _inner_put(
        self, op: PutOp, key: str, value: Mapping[str, Any] | None, expires_at: float | None
    ) -> PutOp:
        """The inner store's put: the expiry stamped into the value, and the ttl passed on
        only to an inner store that supports it (this store enforces it either way)."""
        if value is not None and expires_at is not None:
            value = {**dict(value), self.settings.expires_field: expires_at}
        ttl = op.ttl if self.inner.supports_ttl else None
        return PutOp(op.namespace, key, value, op.index, ttl)

    def _expired(self, item: Any) -> bool:
        if not isinstance(item, Item):
            return False
        when = item.value.get(self.settings.expires_field)
        return isinstance(when, int | float) and when <= self._clock()

    def _forget_all(self, plans: Sequence[_Put]) -> None:
        for plan in plans:
            try:
                self.engine.forget(plan.namespace, str(plan.occupant))
            except (NotFound, Conflict):
                pass  # already forgotten or no longer active: the inner delete still happens

    def _recorded_home(self, namespace: str, memory_id: str) -> str | None:
        memory = self.engine.get(namespace, memory_id)
        if memory is None or not isinstance(memory.metadata.get(_META), dict):
            return None
        return _home_key(memory.metadata[_META], memory.supersedes)

    def _compensate(self, decided: Sequence[Decision]) -> None:
        for d in decided:
            if d.memory_id is None:
                continue  # skip, or review: pending in memgate, never written to the inner store
            if d.action == "replace":
                self.engine.undo(d.fact.namespace, d.memory_id)
            try:
                self.engine.forget(d.fact.namespace, d.memory_id)
            except (NotFound, Conflict):
                pass  # an undone memory may refuse it; it is out of recall either way

    def _find(self, namespace: tuple[str, ...], memory_id: str) -> SearchOp:
        return SearchOp(tuple(namespace), {self.settings.id_field: memory_id}, limit=10)

    @staticmethod
    def _found_key(namespace: tuple[str, ...], items: Any) -> str | None:
        return next((it.key for it in items if it.namespace == tuple(namespace)), None)

    def _need_id(self, namespace: tuple[str, ...], key: str) -> str:
        memory_id = self.memory_id(namespace, key)
        if memory_id is None:
            raise NotFound(f"no gated item at {namespace!r}/{key!r}")
        return memory_id

    def _strip(self, item: Any) -> Any:
        hidden = (self.settings.id_field, self.settings.expires_field)
        if not isinstance(item, Item) or not any(f in item.value for f in hidden):
            return item
        value = {k: v for k, v in item.value.items() if k not in hidden}
        if isinstance(item, SearchItem):
            return SearchItem(
                item.namespace, item.key, value, item.created_at, item.updated_at, item.score
            )
        return Item(
            value=value,
            key=item.key,
            namespace=item.namespace,
            created_at=item.created_at,
            updated_at=item.updated_at,
        )

    def _strip_results(self, ops: Sequence[Op], results: Sequence[Result]) -> list[Result]:
        out: list[Result] = []
        for op, res in zip(ops, results, strict=True):
            if isinstance(op, GetOp):
                out.append(None if self._expired(res) else self._strip(res))
            elif isinstance(op, SearchOp):
                out.append(
                    [self._strip(it) for it in res if not self._expired(it)]  # type: ignore[union-attr]
                )
            else:
                out.append(res)
        return out

    def _emit(self, decisions: Sequence[PutDecision]) -> None:
        if self.on_decision is not None:
            for d in decisions:
                self.on_decision(d)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"the value is not JSON: {exc}") from exc
