"""Forward passes split at a length jump (:func:`engine.runtime.base.plan_passes`): pure logic,
no model."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.errors import InvalidInput
from engine.runtime.base import BatchSettings, plan_passes

SHORT, LONG = 16, 160


def _cost(widths: list[int], ends: list[int], overhead: int = 48, attention: int = 128) -> int:
    starts = [0, *ends[:-1]]
    return sum(
        overhead * attention + (e - s) * widths[e - 1] * (attention + widths[e - 1])
        for s, e in zip(starts, ends, strict=True)
    )


def _greedy(n: int, max_items: int) -> list[int]:
    return [min(n, k) for k in range(max_items, n + max_items, max_items)]


def test_a_few_short_items_beside_long_ones_get_their_own_pass() -> None:
    # 4 short + 12 long in one sub-batch of 16: whole, the short ones pad to 160 tokens
    assert plan_passes([SHORT] * 4 + [LONG] * 12, 16, 8192) == [4, 16]
    # 4 short + 13 long: greedy cut [16, 17] pads 4 short and leaves 1 long alone
    assert plan_passes([SHORT] * 4 + [LONG] * 13, 16, 8192) == [4, 17]


@pytest.mark.parametrize("n", [1, 5, 16, 17, 40, 256])
@pytest.mark.parametrize("width", [SHORT, 64, LONG])
def test_items_of_one_width_are_cut_as_the_greedy_fill_cuts_them(n: int, width: int) -> None:
    assert plan_passes([width] * n, 16, 1 << 20) == _greedy(n, 16)


def test_a_small_length_step_is_not_worth_a_pass() -> None:
    assert plan_passes([SHORT] * 15 + [SHORT + 2], 16, 8192) == [16]
    # with no per-pass cost every width change is a pass
    assert plan_passes([SHORT] * 15 + [SHORT + 2], 16, 8192, overhead=0) == [15, 16]


def test_passes_respect_the_item_and_token_caps() -> None:
    assert plan_passes([LONG] * 20, 16, 1000) == [6, 12, 18, 20]  # 6 x 160 <= 1000
    assert plan_passes([5000, 6000], 16, 1000) == [1, 2]  # an item over the cap goes alone
    rng = random.Random(0)
    widths = sorted(rng.randint(8, 200) for _ in range(256))
    ends = plan_passes(widths, 8, 4096)
    starts = [0, *ends[:-1]]
    assert ends[-1] == 256 and all(s < e for s, e in zip(starts, ends, strict=True))
    assert all(
        e - s <= 8 and ((e - s) * widths[e - 1] <= 4096 or e - s == 1)
        for s, e in zip(starts, ends, strict=True)
    )


def test_the_plan_is_the_cheapest_cut() -> None:
    rng = random.Random(1)
    for _ in range(50):
        n = rng.randint(1, 9)
        widths = sorted(rng.choice((12, 16, 20, 48, 90, 160)) for _ in range(n))
        ends = plan_passes(widths, 4, 8192)
        # every cut into contiguous passes of at most 4 items (brute force)
        best = min(
            _cost(widths, [*(i + 1 for i, c in enumerate(cuts) if c), n])
            for cuts in itertools.product((0, 1), repeat=n - 1)
            if all(
                e - s <= 4
                for s, e in itertools.pairwise([0, *(i + 1 for i, c in enumerate(cuts) if c), n])
            )
        )
        assert _cost(widths, ends) == best, widths


def test_settings_are_range_checked() -> None:
    with pytest.raises(InvalidInput, match="pass_overhead_tokens"):
        BatchSettings(pass_overhead_tokens=-1)
    with pytest.raises(InvalidInput, match="attention_tokens"):
        BatchSettings(attention_tokens=0)
    assert plan_passes([], 16, 8192) == []
