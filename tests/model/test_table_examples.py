"""Every row of the decision table (engine.gate.table) runs its example through the real gate:
MiniLM fp32, the NLI model and the judge fitted for them, as the engine loads them. The decision
must report the row's rule (its head: ``partial_contradiction:key_match`` is the
``partial_contradiction`` row) and the row's action, and, where the row names one, its target."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.gate.gate import Gate
from engine.gate.judge import Judge
from engine.gate.judge.store import find_judge
from engine.gate.table import ROWS, Entry, Row
from engine.types import Fact

pytestmark = pytest.mark.model

NS = "table/example"
RUNNING = [row for row in ROWS if row.example is not None]


@pytest.fixture(scope="module")
def judge(cache_dir: Path, models: tuple[object, object]) -> Judge:
    found = find_judge(cache_dir, *models)
    if found is None:
        pytest.fail(f"no judge for the served models in {cache_dir}: run `make models`")
    return found


def _fact(entry: Entry) -> Fact:
    return Fact(NS, entry.text, entry.kind, entry.key, idempotency_key=entry.idempotency_key)


@pytest.mark.parametrize("row", RUNNING, ids=[str(row.rule) for row in RUNNING])
def test_the_row_s_example_decides_as_the_row_says(
    row: Row, make_gate: Callable[..., Gate], judge: Judge
) -> None:
    ex = row.example
    assert ex is not None
    gate = make_gate(judge=judge)
    stored = gate.ingest([_fact(m) for m in ex.memories])
    ids = [d.memory_id for d in stored]
    d = gate.triage([_fact(ex.fact)], ex.policy, overrides=dict(ex.overrides)).decisions[0]
    head = d.rule.partition(":")[0].partition("+")[0]
    target = ids.index(d.target_id) if d.target_id in ids else d.target_id
    got = (d.action, head)
    assert got == (ex.action, row.rule), f"{d.rule}, target {target}"
    if ex.target is not None:
        assert target == ex.target, d.rule


@pytest.mark.parametrize("row", RUNNING, ids=[str(row.rule) for row in RUNNING])
def test_under_the_other_policy_the_row_s_rule_leads_to_its_column(
    row: Row, make_gate: Callable[..., Gate], judge: Judge
) -> None:
    """The row's strict and review columns are claims too: the example run under the other
    one (review for a strict example, strict for a review one) must, where that policy still
    reports the row's rule, take that column's action (``-``: the rule must not be reported)."""
    ex = row.example
    assert ex is not None
    other, column = ("strict", row.strict) if ex.policy != "strict" else ("review", row.review)
    gate = make_gate(judge=judge)
    gate.ingest([_fact(m) for m in ex.memories])
    d = gate.triage([_fact(ex.fact)], other, overrides=dict(ex.overrides)).decisions[0]
    if d.rule.partition(":")[0].partition("+")[0] != row.rule:
        pytest.skip(f"under {other} the example is decided by {d.rule}")
    assert column != "-", f"{row.rule} is reported under {other}"
    assert column == "recorded" or d.action == column, (d.action, d.rule)
