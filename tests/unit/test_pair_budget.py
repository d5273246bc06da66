"""The lanes' batches cut by estimated work tokens (fact tokens x (1 + the group's NLI pair
ratio)): pure queue logic with synthetic entries and a fake clock, the batcher feeding the
queue what a finished batch ran. The real core learning a ratio is in
tests/integration/test_pair_budget_core.py (it needs the models)."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from engine.core import Entry, QueueSettings, TokenBudgetQueue
from engine.core.batcher import Batcher
from engine.core.queue import RATIOS_KEPT
from engine.errors import InvalidInput


def _push(q: TokenBudgetQueue[str], group: str, n: int, tokens: int, t: float = 0.0) -> None:
    for i in range(n):
        q.push(Entry(f"{group}{i}", group, 1, tokens, t, locks=frozenset({group})))


def _drain(q: TokenBudgetQueue[str], now: float = 1.0) -> list[Any]:
    batches = []
    while True:
        batch, _ = q.take(now, flush=True)
        if batch is None:
            return batches
        batches.append(batch)
        q.finished(batch)


def test_a_dense_groups_batches_get_fewer_facts_than_a_sparse_ones_under_one_budget() -> None:
    s = QueueSettings(max_wait_s=0.0, max_batch_work_tokens=4096)
    q: TokenBudgetQueue[str] = TokenBudgetQueue(s)
    q.observe("dense", 100, 4000)  # 40 pair tokens a fact token: 20 pairs of twice its length
    q.observe("sparse", 100, 50)
    _push(q, "dense", 64, 16)
    _push(q, "sparse", 64, 16)
    batches = _drain(q)
    dense = [b.facts for b in batches if b.group == "dense"]
    sparse = [b.facts for b in batches if b.group == "sparse"]
    assert sum(dense) == sum(sparse) == 64
    # 4096 / (16 x 41) = 6.2 dense facts a batch; 4096 / (16 x 1.5) = 170 > 64 sparse ones.
    assert max(dense) == 6 and sparse == [64]
    assert all(b.work <= s.max_batch_work_tokens for b in batches)
    # arrival order within a group is kept across the cut
    order = [e.payload for b in batches if b.group == "dense" for e in b.entries]
    assert order == [f"dense{i}" for i in range(64)]


def test_the_estimate_moves_toward_the_observed_ratio_from_the_prior() -> None:
    s = QueueSettings(prior_pair_ratio=8.0, pair_ratio_weight=0.5)
    q: TokenBudgetQueue[str] = TokenBudgetQueue(s)
    assert q.pair_ratio("g") == 8.0  # no history: the prior
    q.observe("g", 100, 4000)
    assert q.pair_ratio("g") == 40.0  # the first batch replaces the prior
    q.observe("g", 100, 0)
    assert q.pair_ratio("g") == 20.0
    q.observe("g", 100, 0)
    assert q.pair_ratio("g") == 10.0
    assert q.work("g", 10) == 110 and q.work("other", 10) == 90
    q.observe("g", 0, 500)  # a batch without tokens teaches nothing
    assert q.pair_ratio("g") == 10.0


def test_a_batch_that_learned_its_ratio_cuts_the_next_one_differently() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(
        QueueSettings(max_wait_s=0.0, max_batch_work_tokens=2048, prior_pair_ratio=0.0)
    )
    _push(q, "g", 40, 16)
    [first] = _drain(q)
    assert first.facts == 40  # the prior expects no pairs: 640 work tokens
    q.observe("g", first.tokens, first.tokens * 30)
    _push(q, "g", 40, 16)
    batches = _drain(q)
    assert [b.facts for b in batches][0] == 2048 // (16 * 31)


def test_the_fact_token_and_fact_caps_still_hold() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(
        QueueSettings(
            max_wait_s=0.0,
            max_batch_facts=5,
            max_batch_tokens=64,
            max_batch_work_tokens=1 << 30,
            prior_pair_ratio=0.0,
        )
    )
    _push(q, "few", 12, 4)  # the fact cap binds: 5, 5, 2
    _push(q, "long", 6, 30)  # the fact-token cap binds: 2, 2, 2
    batches = _drain(q)
    assert [b.facts for b in batches if b.group == "few"] == [5, 5, 2]
    assert [b.facts for b in batches if b.group == "long"] == [2, 2, 2]


def test_an_oversize_entry_goes_alone_and_nothing_starves() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(
        QueueSettings(max_wait_s=0.0, max_batch_work_tokens=1000)
    )
    q.observe("g", 10, 400)  # ratio 40: a 64-fact write of 1,024 tokens is ~42,000 work tokens
    q.push(Entry("big", "g", 64, 1024, 0.0, locks=frozenset({"g"})))
    _push(q, "g", 3, 4, t=0.1)
    batches = _drain(q)
    assert [[e.payload for e in b.entries] for b in batches] == [["big"], ["g0", "g1", "g2"]]
    assert batches[0].work > 1000  # served whole, never split


def test_a_group_over_its_work_budget_is_ready_without_waiting() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(
        QueueSettings(max_wait_s=1.0, max_batch_work_tokens=1000)
    )
    q.observe("dense", 10, 400)
    _push(q, "dense", 2, 16)  # 2 x 16 x 41 = 1,312 work tokens: a full batch
    _push(q, "sparse", 2, 16)
    batch, _ = q.take(0.0)  # before max_wait_s: only the full group goes
    assert batch is not None and batch.group == "dense" and batch.facts == 1
    assert q.take(0.0)[0] is None


def test_the_ratios_kept_are_bounded() -> None:
    q: TokenBudgetQueue[str] = TokenBudgetQueue(QueueSettings(prior_pair_ratio=1.0))
    for i in range(RATIOS_KEPT + 10):
        q.observe(i, 10, 100)
    assert q.pair_ratio(0) == 1.0 and q.pair_ratio(RATIOS_KEPT + 9) == 10.0


@pytest.mark.parametrize(
    "bad",
    [
        {"max_batch_work_tokens": 8},
        {"max_batch_work_tokens": 1 << 31},
        {"prior_pair_ratio": -1.0},
        {"pair_ratio_weight": 0.0},
        {"pair_ratio_weight": 1.5},
    ],
)
def test_the_new_settings_are_range_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput, match=next(iter(bad))):
        QueueSettings(**bad)


def test_the_batcher_teaches_the_queue_each_finished_batchs_pair_tokens() -> None:
    seen: list[tuple[Hashable, int]] = []

    def run(group: Hashable, payloads: list[int]) -> Sequence[int]:
        seen.append((group, len(payloads)))
        return payloads

    async def main() -> list[float]:
        with ThreadPoolExecutor(1) as pool:
            b: Batcher[int, int] = Batcher(
                run,
                QueueSettings(max_wait_s=0.0, prior_pair_ratio=0.0),
                executor=pool,
                pairs=lambda results: 30 * sum(results),  # 30 pair tokens per fact token
            )
            b.start()
            await asyncio.gather(*(b.submit(1, group="g", facts=1, tokens=1) for _ in range(3)))
            await b.close()
            return [b._queue.pair_ratio("g")]

    [ratio] = asyncio.run(main())
    assert sum(n for _, n in seen) == 3 and ratio == pytest.approx(30.0)


def test_the_serve_flag_sets_the_work_token_budget() -> None:
    from engine.cli import build_parser
    from engine.cli.serve import settings_from_args

    def batching(*flags: str) -> QueueSettings:
        return settings_from_args(build_parser().parse_args(["serve", *flags]))[1].batching

    assert batching().max_batch_work_tokens == QueueSettings().max_batch_work_tokens
    assert batching("--max-batch-work-tokens", "2048").max_batch_work_tokens == 2048
    with pytest.raises((SystemExit, InvalidInput)):
        batching("--max-batch-work-tokens", "4")
