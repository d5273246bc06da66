"""A pass-through GateEngine for the wrapper's plumbing tests only: every fact is stored, and a
fact whose key held a memory replaces it (what a plain store's put does). No models."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from engine.errors import Conflict, NotFound
from engine.types import Decision, Fact, Memory, ReviewItem


class PassThroughEngine:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.memories: dict[tuple[str, str], Memory] = {}
        self.writes = 0

    def write(
        self, facts: Sequence[Fact], policy: str, overrides: Mapping[str, Any] | None = None
    ) -> list[Decision]:
        self.writes += 1
        out = []
        for fact in facts:
            occupant = fact.metadata.get("langgraph", {}).get("occupant")
            mid = f"mem_{next(self._ids):06d}"
            action = "replace" if occupant else "add"
            self.memories[(fact.namespace, mid)] = Memory(
                mid,
                fact.namespace,
                fact.kind,
                fact.text,
                None,
                dict(fact.metadata),
                None,
                0.0,
                "active",
                occupant,
                None,
                {},
            )
            out.append(Decision(action, fact, occupant, (), policy, "pass", memory_id=mid))
        return out

    def get(self, namespace: str, memory_id: str) -> Memory | None:
        return self.memories.get((namespace, memory_id))

    def forget(self, namespace: str, memory_id: str) -> None:
        if self.memories.pop((namespace, memory_id), None) is None:
            raise NotFound(memory_id)

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]:
        new = self.memories.get((namespace, memory_id))
        if new is None or new.supersedes is None:
            raise Conflict(f"{memory_id} replaced nothing")
        del self.memories[(namespace, memory_id)]
        restored = self.memories.get((namespace, new.supersedes))
        if restored is None:  # the pass-through keeps no superseded texts: rebuild the record
            restored = Memory(
                new.supersedes,
                namespace,
                "semantic",
                "",
                None,
                {},
                None,
                0.0,
                "active",
                None,
                None,
                {},
            )
        self.memories[(namespace, restored.id)] = restored
        return restored, new

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        return [self.memories[(namespace, memory_id)]]

    def list_review(self, namespace: str, limit: int = 100) -> list[ReviewItem]:
        return []

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> str | None:
        raise NotFound(review_id)

    def close(self) -> None:
        pass


class ScriptedEngine(PassThroughEngine):
    """Decides from a script instead: each write pops one (action, target id) per fact."""

    def __init__(self) -> None:
        super().__init__()
        self.script: list[tuple[str, str | None]] = []

    def write(
        self, facts: Sequence[Fact], policy: str, overrides: Mapping[str, Any] | None = None
    ) -> list[Decision]:
        out = []
        for fact in facts:
            action, target = self.script.pop(0)
            mid = None
            if action in ("add", "replace"):
                mid = f"mem_{next(self._ids):06d}"
                self.memories[(fact.namespace, mid)] = Memory(
                    mid,
                    fact.namespace,
                    fact.kind,
                    fact.text,
                    None,
                    dict(fact.metadata),
                    None,
                    0.0,
                    "active",
                    target,
                    None,
                    {},
                )
            review = "rev_1" if action == "review" else None
            out.append(
                Decision(
                    action,
                    fact,
                    target,
                    (),
                    policy,
                    "scripted",
                    memory_id=mid,  # type: ignore[arg-type]
                    review_id=review,
                )
            )
        return out
