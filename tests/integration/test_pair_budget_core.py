"""One run of the real core (MiniLM + NLI on the model stage, SQLite) learning a dense
namespace's NLI pair ratio from its batches (the queue logic: tests/unit/test_pair_budget.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from engine.types import Fact


def test_the_real_core_learns_a_dense_namespaces_pair_ratio(
    make_gate: Callable[..., Any],
) -> None:
    from engine.app import build_engine
    from engine.core import CoreSettings

    gate = make_gate()
    base = "The shop's broadband router in the back office was replaced"
    gate.ingest([Fact("dense", f"{base} on day {i} of the month.") for i in range(30)])
    gate.ingest([Fact("sparse", "The cat's name is Miso.")])
    engine = build_engine(gate, CoreSettings(expiry_interval_s=None))

    async def main() -> tuple[float, dict[str, float]]:
        await engine.start()
        await engine.warm_up()
        q = engine.batcher._queue
        dense = [Fact("dense", f"{base} on day {i} of the year.") for i in range(4)]
        await engine.triage(dense, apply=True)
        await engine.triage([Fact("sparse", "The dog's name is Rex.")], apply=True)
        ratios = {next(iter(k.namespaces)): q.pair_ratio(k) for k in list(q._ratios)}
        await engine.close()
        return q.settings.prior_pair_ratio, ratios

    prior, ratios = asyncio.run(main())
    # Each namespace's writes are a group of their own: the dense one's facts each met many
    # near duplicates (pairs of about twice a fact's tokens), the sparse one's met few or none.
    assert ratios["dense"] > prior > ratios["sparse"]
