"""The model stage's budgets in the unit that costs (issue 34): a lane's call is cut, and calls
waiting together are merged, by tokens (pair tokens for NLI, text tokens for the embedder) with
an item cap as a safety bound. A fake model whose items are strings (an item's tokens: its
length) and whose forward advances a fake clock by its tokens."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.core import CoreSettings
from engine.core.stage import Budget, ModelStage, Staged, StageSettings, length, pieces
from engine.errors import InvalidInput


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TokenModel:
    """tokenize / bucket / forward / postprocess over strings; a forward costs 1 s per 100
    tokens of the fake clock. Each output row is (the item's length, its position)."""

    def __init__(self, clock: Clock, task: str = "nli") -> None:
        self.clock = clock
        self.manifest = SimpleNamespace(task=task)
        self.calls: list[list[str]] = []

    def tokenize(self, items: Sequence[str]) -> tuple[list[str], int]:
        return list(items), 0

    def bucket(self, encodings: Sequence[str], *, clipped: int = 0) -> list[str]:
        return list(encodings)

    def forward(self, prepared: list[str]) -> list[str]:
        self.calls.append(list(prepared))
        self.clock.now += sum(map(len, prepared)) / 100
        return prepared

    def postprocess(self, outputs: list[str], prepared: list[str]) -> np.ndarray:
        return np.asarray([[len(x), int(x.split(":")[0])] for x in outputs], dtype=np.float64)


def item(i: int, tokens: int) -> str:
    """An item of exactly ``tokens`` tokens that carries its index."""
    head = f"{i}:"
    return head + "x" * (tokens - len(head))


def _wait(until: Callable[[], bool]) -> None:
    for _ in range(5000):
        if until():
            return
        time.sleep(0.001)
    raise AssertionError("timed out")


def queued(stage: ModelStage, staged: Staged, calls: list[list[str]]) -> dict[int, Any]:
    """Hold the model thread, queue ``calls`` in this order (one lane thread each), release,
    and return each lane's rows and model seconds charged."""
    release = threading.Event()
    holder = threading.Thread(target=stage.run, args=(release.wait, 10))
    holder.start()
    _wait(lambda: stage.waiting >= 1)
    out: dict[int, Any] = {}

    def lane(k: int, texts: list[str]) -> None:
        with stage.charged() as charge:
            rows = staged.score(texts)  # type: ignore[arg-type]
        out[k] = (rows, charge.seconds)

    lanes = []
    for k, texts in enumerate(calls):
        t = threading.Thread(target=lane, args=(k, texts))
        t.start()
        lanes.append(t)
        _wait(lambda k=k: stage.waiting >= k + 2)  # queued in this order
    release.set()
    for t in (holder, *lanes):
        t.join(10)
    return out


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def stage(clock: Clock) -> Any:
    s = ModelStage(clock=clock)
    yield s
    s.close()


def test_pieces_cut_by_tokens_and_items_and_a_lone_giant_goes_alone() -> None:
    assert pieces([10] * 8, 25, 64) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert pieces([10] * 8, 1000, 3) == [(0, 3), (3, 6), (6, 8)]
    assert pieces([5, 500, 5, 5], 100, 64) == [(0, 1), (1, 2), (2, 4)]  # never starved
    assert pieces([], 100, 64) == []
    assert pieces([100, 1], 100, 64) == [(0, 1), (1, 2)]  # exactly the budget fits


def test_long_pairs_go_in_more_smaller_calls_than_short_pairs_of_the_same_count(
    clock: Clock, stage: ModelStage
) -> None:
    model = TokenModel(clock)
    staged = Staged(model, stage, budget=Budget(tokens=400, chunk_tokens=200))
    short = [item(i, 20) for i in range(40)]
    long = [item(i, 150) for i in range(40)]
    out_short = staged.score(short)  # type: ignore[arg-type]
    short_calls, model.calls = model.calls, []
    out_long = staged.score(long)  # type: ignore[arg-type]
    long_calls = model.calls
    assert [len(c) for c in short_calls] == [10, 10, 10, 10]
    assert [len(c) for c in long_calls] == [1] * 40  # 2 x 150 > 200
    assert all(sum(map(len, c)) <= 200 for c in short_calls + long_calls)
    # every row comes back to its caller, in order
    assert out_short[:, 1].tolist() == list(range(40)) and out_long[:, 0].tolist() == [150] * 40


def test_the_item_cap_still_bounds_a_trip_of_tiny_items(clock: Clock, stage: ModelStage) -> None:
    model = TokenModel(clock)
    staged = Staged(
        model, stage, budget=Budget(tokens=10_000, chunk_tokens=10_000, items=8, chunk_items=4)
    )
    staged.score([item(i, 3) for i in range(10)])  # type: ignore[arg-type]
    assert [len(c) for c in model.calls] == [4, 4, 2]


def test_merged_calls_stay_in_budget_except_a_lone_oversize_item(
    clock: Clock, stage: ModelStage
) -> None:
    rng = random.Random(7)
    budget = Budget(tokens=300, chunk_tokens=300, items=6, chunk_items=6)
    model = TokenModel(clock)
    staged = Staged(model, stage, budget=budget)
    calls = [[item(i, rng.randint(4, 90)) for i in range(rng.randint(1, 4))] for _ in range(20)]
    calls.insert(5, [item(0, 700)])  # larger than any budget: still served, alone
    out = queued(stage, staged, calls)
    for c in model.calls:
        tokens = sum(map(len, c))
        assert (tokens <= budget.tokens and len(c) <= budget.items) or len(c) == 1
    assert [700] in [[len(x) for x in c] for c in model.calls]
    assert any(len(c) > 1 for c in model.calls)  # and calls were merged
    for k, texts in enumerate(calls):
        rows, _ = out[k]
        assert rows[:, 0].tolist() == [len(t) for t in texts]
        assert rows[:, 1].tolist() == [int(t.split(":")[0]) for t in texts]


def test_the_oldest_call_goes_first_and_one_that_did_not_fit_leads_the_next_call(
    clock: Clock, stage: ModelStage
) -> None:
    model = TokenModel(clock)
    staged = Staged(model, stage, budget=Budget(tokens=100, chunk_tokens=100))
    a, b, c, d = [item(0, 60)], [item(1, 60)], [item(2, 30)], [item(3, 50)]
    queued(stage, staged, [a, b, c, d])
    # a leads; b does not fit beside it, c does; b then leads the next call (d does not fit)
    assert model.calls == [a + c, b, d]


def test_charges_follow_tokens_and_add_up_to_the_model_time(
    clock: Clock, stage: ModelStage
) -> None:
    model = TokenModel(clock)
    staged = Staged(model, stage, budget=Budget(tokens=1000, chunk_tokens=150))
    calls = [[item(0, 100), item(1, 100)], [item(2, 10)], [item(3, 40), item(4, 40)]]
    out = queued(stage, staged, calls)
    charged = sum(seconds for _, seconds in out.values())
    assert charged == pytest.approx(stage.busy_s) and stage.busy_s == pytest.approx(2.9)
    # 290 tokens at 1 s per 100: each lane pays for its own tokens, whatever it was merged with
    for k, texts in enumerate(calls):
        assert out[k][1] == pytest.approx(sum(map(len, texts)) / 100)
    assert stage.tokens == 290


def test_staged_reads_the_budget_of_its_models_task(clock: Clock) -> None:
    settings = StageSettings(
        nli=Budget(tokens=500, chunk_tokens=100), embedding=Budget(tokens=900, chunk_tokens=300)
    )
    stage = ModelStage(settings, clock=clock)
    try:
        assert Staged(TokenModel(clock, "nli"), stage).budget == settings.nli
        assert Staged(TokenModel(clock, "embedding"), stage).budget == settings.embedding
        model = TokenModel(clock, "embedding")
        Staged(model, stage).embed([item(i, 100) for i in range(9)])  # type: ignore[arg-type]
        assert [len(c) for c in model.calls] == [3, 3, 3]
    finally:
        stage.close()
    assert CoreSettings().stage == StageSettings()
    assert length(SimpleNamespace(ids=[1, 2, 3])) == 3 and length("abcd") == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tokens": 8, "chunk_tokens": 8}, "tokens must be in"),
        ({"tokens": 100, "chunk_tokens": 200}, "chunk_tokens must be in"),
        ({"tokens": 100, "chunk_tokens": 50, "items": 0}, "items must be in"),
        ({"tokens": 100, "chunk_tokens": 50, "items": 4, "chunk_items": 8}, "chunk_items"),
    ],
)
def test_budgets_are_range_checked(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        Budget(**kwargs)


def test_stage_settings_are_type_checked() -> None:
    with pytest.raises(InvalidInput, match="nli must be a Budget"):
        StageSettings(nli=8192)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="stage must be a StageSettings"):
        CoreSettings(stage=None)  # type: ignore[arg-type]


def test_the_serve_flag_sets_the_nli_budget_and_refuses_a_bad_one() -> None:
    from engine.cli import build_parser
    from engine.cli.serve import settings_from_args

    def server(*flags: str) -> Any:
        return settings_from_args(build_parser().parse_args(["serve", *flags]))[1]

    got = server("--nli-call-tokens", "1000")
    assert got.stage.nli == Budget(tokens=1000, chunk_tokens=500)
    assert got.stage.embedding == StageSettings().embedding
    assert server().stage == StageSettings()  # the flag's default is the shipped budget
    with pytest.raises(SystemExit):
        server("--nli-call-tokens", "8")
