"""Real Graphiti collaborators for the adapter tests, with no network: a scripted ``LLMClient``
subclass (Graphiti's own ``generate_response`` runs; only the provider call is canned), an
``EmbedderClient`` and a ``CrossEncoderClient`` on memgate's MiniLM runtime."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from graphiti_core.cross_encoder.client import CrossEncoderClient
from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig, ModelSize
from graphiti_core.prompts.models import Message

Answer = Callable[[str], dict[str, Any]]


class ScriptedLLM(LLMClient):
    """Answers each call from ``script``, keyed by the response model's class name, given the
    user message as the provider would receive it. An unscripted call fails the test."""

    def __init__(self, script: Mapping[str, Answer]) -> None:
        super().__init__(LLMConfig(api_key="offline", model="scripted"), cache=False)
        self.script = dict(script)
        self.calls: list[tuple[str, str]] = []
        """(response model name, user message) per provider call, in order."""

    async def _generate_response(
        self,
        messages: list[Message],
        response_model: Any = None,
        max_tokens: int = 0,
        model_size: ModelSize = ModelSize.medium,
        *,
        model: str | None = None,
    ) -> dict[str, Any]:
        name = "text" if response_model is None else response_model.__name__
        user = next(m.content for m in messages if m.role == "user")
        self.calls.append((name, user))
        if name not in self.script:
            raise AssertionError(f"unscripted LLM call for {name}: {user[:300]}")
        return self.script[name](user)


def resolve_edge_answer(contradicted: Callable[[str], list[int]]) -> Answer:
    """An ``EdgeDuplicate`` answer: no duplicates, ``contradicted(user message)`` contradicted."""
    return lambda user: {"duplicate_facts": [], "contradicted_facts": contradicted(user)}


def all_listed(user: str) -> list[int]:
    """Every idx of the prompt: the careless LLM of getzep/graphiti #1728."""
    return [int(i) for i in re.findall(r"'idx': (\d+)", user)]


class MiniLMEmbedder(EmbedderClient):
    """Graphiti's embedder interface over memgate's embedder runtime (L2-normalised rows)."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    async def create(self, input_data: str | list[str] | Iterable[Any]) -> list[float]:
        text = input_data if isinstance(input_data, str) else " ".join(map(str, input_data))
        return [float(x) for x in self.embedder.embed([text])[0]]

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self.embedder.embed(input_data_list)]


class CosineReranker(CrossEncoderClient):
    """Ranks passages by MiniLM cosine similarity to the query."""

    def __init__(self, embedder: Any) -> None:
        self.embedder = embedder

    async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
        if not passages:
            return []
        vecs = self.embedder.embed([query, *passages])
        sims = vecs[1:] @ vecs[0]
        order = np.argsort(-sims)
        return [(passages[i], float(sims[i])) for i in order]


def block(user: str, *names: str) -> str:
    """The text of the first ``<NAME>...</NAME>`` block of the prompt among ``names``."""
    for name in names:
        found = re.search(rf"<{name}>\s*(.*?)\s*</{name}>", user, re.S)
        if found is not None:
            return found.group(1)
    raise AssertionError(f"no {names} block in the prompt: {user[:300]}")


class Episodes:
    """Scripted extraction for a few episodes: each episode text -> its entity names and its
    (source, target, relation, fact) edges. The current episode is read from the prompt's
    CURRENT MESSAGE block; each fact is valid from the prompt's reference time."""

    def __init__(self, episodes: Mapping[str, tuple[list[str], list[tuple[str, str, str, str]]]]):
        self.episodes = dict(episodes)

    def _current(self, user: str) -> tuple[list[str], list[tuple[str, str, str, str]]]:
        text = block(user, "CURRENT MESSAGE", "CURRENT_MESSAGE")
        return self.episodes[text.strip()]

    def entities(self, user: str) -> dict[str, Any]:
        names, _ = self._current(user)
        return {"extracted_entities": [{"name": n, "entity_type_id": 0} for n in names]}

    def edges(self, user: str) -> dict[str, Any]:
        _, edges = self._current(user)
        return {
            "edges": [
                {"source_entity_name": s, "target_entity_name": t, "relation_type": r, "fact": f}
                for s, t, r, f in edges
            ]
        }

    @staticmethod
    def timestamps(user: str) -> dict[str, Any]:
        return {"valid_at": block(user, "REFERENCE TIME").strip(), "invalid_at": None}

    def script(self, contradicted: Callable[[str], list[int]]) -> dict[str, Answer]:
        return {
            "ExtractedEntities": self.entities,
            "ExtractedEdges": self.edges,
            "EdgeTimestamps": self.timestamps,
            "EdgeDuplicate": resolve_edge_answer(contradicted),
        }
