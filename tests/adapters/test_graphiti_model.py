"""GatedLLMClient on the real models (MiniLM + aegis NLI) inside a real Graphiti: add_episode
on an embedded Kuzu graph database (offline, its full-text extension is built in), and
Graphiti's own resolve_extracted_edge. The LLM is a scripted LLMClient subclass that marks
every listed fact contradicted, as the careless LLM of getzep/graphiti #1728 does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engine.adapters import LocalEngine

pytestmark = [
    pytest.mark.model,
    # Graphiti 0.31 deprecates its Kuzu driver (the upstream project stopped); it is the one
    # embedded driver that runs offline here, which is all this test asks of it.
    pytest.mark.filterwarnings("ignore:The Kuzu backend is deprecated:DeprecationWarning"),
]

pytest.importorskip("graphiti_core")
pytest.importorskip("kuzu")
from _graphiti_llm import (  # noqa: E402
    CosineReranker,
    Episodes,
    MiniLMEmbedder,
    ScriptedLLM,
    all_listed,
    resolve_edge_answer,
)
from graphiti_core import Graphiti  # noqa: E402
from graphiti_core.driver.kuzu_driver import KuzuDriver  # noqa: E402
from graphiti_core.edges import EntityEdge  # noqa: E402
from graphiti_core.nodes import EpisodeType, EpisodicNode  # noqa: E402
from graphiti_core.utils.maintenance.edge_operations import resolve_extracted_edge  # noqa: E402

from engine.adapters.graphiti import GatedLLMClient, GatedLLMSettings  # noqa: E402

HOME = "Alice lives in Denver. Alice works at Acme."
MOVE = "Alice moved to Austin."
EPISODES = Episodes(
    {
        HOME: (
            ["Alice", "Denver", "Acme"],
            [
                ("Alice", "Denver", "LIVES_IN", "Alice lives in Denver."),
                ("Alice", "Acme", "WORKS_AT", "Alice works at Acme."),
            ],
        ),
        MOVE: (["Alice", "Austin"], [("Alice", "Austin", "LIVES_IN", MOVE)]),
    }
)
T0, T1 = datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 6, 1, tzinfo=UTC)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("GRAPHITI_TELEMETRY_ENABLED", "false")  # no posthog from the tests
    yield


def _run_episodes(tmp_path: Path, llm: Any, embedder: Any) -> dict[str, EntityEdge]:
    """Add HOME then MOVE to a fresh Kuzu graph; returns the group's edges by fact."""

    async def run() -> dict[str, EntityEdge]:
        driver = KuzuDriver(db=str(tmp_path / "graph.kuzu"))
        graphiti = Graphiti(
            graph_driver=driver,
            llm_client=llm,
            embedder=MiniLMEmbedder(embedder),
            cross_encoder=CosineReranker(embedder),
        )
        try:
            # Graphiti 0.31.2's KuzuDriver.build_indices_and_constraints is a no-op; its
            # graph operations create the full-text indexes the edge search needs.
            await driver.graph_ops.build_indices_and_constraints(driver)
            # The default group: 0.31.2's Graphiti reads a database name off the driver for any
            # other group_id, which its KuzuDriver has not got.
            await graphiti.add_episode("home", HOME, "chat", T0)
            done = await graphiti.add_episode("move", MOVE, "chat", T1)
            edges = await EntityEdge.get_by_group_ids(driver, [done.episode.group_id])
        finally:
            await graphiti.close()
        return {e.fact: e for e in edges}

    return asyncio.run(run())


def _invalidated(edges: dict[str, EntityEdge]) -> set[str]:
    return {fact for fact, e in edges.items() if e.invalid_at is not None}


def test_bare_graphiti_invalidates_the_unrelated_fact(
    tmp_path: Path, models: tuple[Any, Any], offline: None
) -> None:
    """The baseline: with the careless LLM, Graphiti expires Acme along with Denver."""
    llm = ScriptedLLM(EPISODES.script(all_listed))
    edges = _run_episodes(tmp_path, llm, models[0])
    assert set(edges) == {"Alice lives in Denver.", "Alice works at Acme.", MOVE}
    assert _invalidated(edges) == {"Alice lives in Denver.", "Alice works at Acme."}


def test_gated_graphiti_invalidates_only_denver(
    tmp_path: Path, models: tuple[Any, Any], real_engine: LocalEngine, offline: None
) -> None:
    inner = ScriptedLLM(EPISODES.script(all_listed))
    llm = GatedLLMClient(inner, real_engine)
    edges = _run_episodes(tmp_path, llm, models[0])
    assert set(edges) == {"Alice lives in Denver.", "Alice works at Acme.", MOVE}
    assert _invalidated(edges) == {"Alice lives in Denver."}
    denver = edges["Alice lives in Denver."]
    assert denver.invalid_at == edges[MOVE].valid_at and denver.expired_at is not None
    assert edges["Alice works at Acme."].expired_at is None
    # The LLM marked both; each is recorded with the gate's scores.
    records = {r.existing_fact: r for r in llm.decisions}
    assert set(records) == {"Alice lives in Denver.", "Alice works at Acme."}
    kept, dropped = records["Alice lives in Denver."], records["Alice works at Acme."]
    assert kept.outcome == "kept" and kept.new_fact == MOVE
    assert kept.contradiction is not None and kept.contradiction > 0.9
    assert dropped.outcome == "dropped" and dropped.reason != ""
    assert dropped.similarity is not None and dropped.similarity < kept.similarity
    assert kept.decision.target_id == f"idx:{kept.idx}"
    assert "EdgeDuplicate" in [name for name, _ in inner.calls]


def test_review_policy_invalidates_nothing(
    tmp_path: Path, models: tuple[Any, Any], cache_dir: Path, offline: None
) -> None:
    llm = GatedLLMClient.local(
        ScriptedLLM(EPISODES.script(all_listed)), policy="review", cache_dir=cache_dir
    )
    edges = _run_episodes(tmp_path, llm, models[0])
    assert _invalidated(edges) == set()
    outcomes = {r.existing_fact: r.outcome for r in llm.decisions}
    assert outcomes == {"Alice lives in Denver.": "review", "Alice works at Acme.": "dropped"}
    # the client found the judge fitted for these models in the cache, as the engine does,
    # and decides under its bars
    from engine.gate.gate import policy_for
    from engine.gate.judge.store import find_judge

    fitted = find_judge(cache_dir, *models)
    assert (llm.verdict_judge is None) == (fitted is None)
    assert llm._policy == policy_for("review", models[1], models[0], fitted)


def _edge(fact: str, at: datetime, target: str) -> EntityEdge:
    return EntityEdge(
        source_node_uuid="alice",
        target_node_uuid=target,
        name="RELATES_TO",
        fact=fact,
        group_id="g",
        created_at=at,
        valid_at=at,
    )


@pytest.mark.parametrize(
    ("new", "related", "candidates", "expected"),
    [
        (
            "Alice moved to Austin.",
            ["Alice lives in Denver."],
            [
                "Alice works at Acme.",
                "Alice has a dog named Rex.",
                "Bob lives in Denver.",
                "Alice was born in Denver.",
            ],
            "Alice lives in Denver.",
        ),
        (
            "Alice now works at Globex.",
            ["Alice met Bob at Acme."],
            ["Alice lives in Denver.", "Alice works at Acme.", "Bob works at Acme."],
            "Alice works at Acme.",
        ),
        (
            "Alice's favourite colour is green.",
            [],
            ["Alice's favourite food is pasta.", "Alice's favourite colour is blue."],
            "Alice's favourite colour is blue.",
        ),
    ],
)
def test_graphitis_resolve_keeps_the_one_real_contradiction(
    real_engine: LocalEngine, new: str, related: list[str], candidates: list[str], expected: str
) -> None:
    """Graphiti's own resolve_extracted_edge, the LLM claiming every listed fact."""
    episode = EpisodicNode(
        name="e",
        group_id="g",
        source=EpisodeType.message,
        source_description="chat",
        content=new,
        created_at=T1,
        valid_at=T1,
    )
    llm = GatedLLMClient(
        ScriptedLLM({"EdgeDuplicate": resolve_edge_answer(all_listed)}), real_engine
    )
    _, invalidated, _ = asyncio.run(
        resolve_extracted_edge(
            llm,
            _edge(new, T1, "new"),
            [_edge(f, T0, "new") for f in related],
            [_edge(f, T0, f"x{i}") for i, f in enumerate(candidates)],
            episode,
        )
    )
    assert [e.fact for e in invalidated] == [expected]
    assert [r.outcome for r in llm.decisions].count("kept") == 1
    assert len(llm.decisions) == len(related) + len(candidates)


def test_strict_bars_come_from_the_settings(real_engine: LocalEngine) -> None:
    """An override no contradiction can clear keeps every fact valid."""
    settings = GatedLLMSettings(overrides=(("dated_contradiction", 1.0), ("contradiction", 1.0)))
    llm = GatedLLMClient(
        ScriptedLLM({"EdgeDuplicate": resolve_edge_answer(all_listed)}),
        real_engine,
        settings=settings,
    )
    episode = EpisodicNode(
        name="e",
        group_id="g",
        source=EpisodeType.message,
        source_description="chat",
        content=MOVE,
        created_at=T1,
        valid_at=T1,
    )
    _, invalidated, _ = asyncio.run(
        resolve_extracted_edge(
            llm, _edge(MOVE, T1, "austin"), [], [_edge("Alice lives in Denver.", T0, "d")], episode
        )
    )
    assert invalidated == []
    [record] = llm.decisions
    assert (record.outcome, record.reason) == ("dropped", "low_contradiction")
