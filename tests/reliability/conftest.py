"""The reliability and security suite: shared fixtures.

Every test here is marked ``reliability`` (``make reliability`` runs them alone; ``make test``
runs them with everything else). Tests record the figure they measured with the ``figures``
fixture: ``figures.record("kill -9 durability", lost_acked=0, cycles=50, ...)``. At the end of
the session the figures are printed as a table and written to
``$MEMGATE_RELIABILITY_OUT`` (default ``benchmarks/results/reliability-<utc>.json``).

Time bounds the contract states (SERVING again within 5 s, NOT_SERVING within 1 s) are asserted
as ``bound * SLACK``: ``MEMGATE_RELIABILITY_SLACK`` (default 4) absorbs a loaded CI machine;
the measured value is always recorded, so the report shows how far from the bound it was.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SLACK = float(os.environ.get("MEMGATE_RELIABILITY_SLACK", "4"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


class Figures:
    """What each reliability test measured, keyed by the test's name in the issue."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def record(self, test: str, **figures: Any) -> None:
        self.rows.setdefault(test, {}).update(figures)


_FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Iterator[Figures]:
    yield _FIGURES


def within(seconds: float, bound: float) -> bool:
    """``seconds`` is within the contract's ``bound`` times the slack factor."""
    return seconds <= bound * SLACK


def _item_order(name: str) -> tuple[int, str]:
    """Sort "2 crash points" before "10 deadlines": by the issue's item number, then name."""
    head = name.split(" ", 1)[0]
    return (int(head) if head.isdigit() else 1_000, name)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES.rows:
        return
    out = os.environ.get("MEMGATE_RELIABILITY_OUT")
    path = (
        Path(out)
        if out
        else ROOT
        / "benchmarks"
        / "results"
        / f"reliability-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"slack": SLACK, "figures": _FIGURES.rows}, indent=2, default=str))
    tr = terminalreporter
    tr.section("reliability figures")
    for test, row in sorted(_FIGURES.rows.items(), key=lambda kv: _item_order(kv[0])):
        tr.write_line(f"{test}: " + ", ".join(f"{k}={v}" for k, v in row.items()))
    tr.write_line(f"written to {path}")
