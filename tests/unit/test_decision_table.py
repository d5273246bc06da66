"""The decision table (engine.gate.table): one row per rule, examples that can run, and the
README's and docs/gate.md's rule tables rendered from it. The examples themselves run through
the real gate in tests/model/test_table_examples.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from engine.cli.tabledoc import BEGIN, END, full_table, main, readme_table, with_table
from engine.gate.names import Rule
from engine.gate.policy import POLICY_NAMES, policy_by_name
from engine.gate.table import ROWS, Row, row_for

ROOT = Path(__file__).resolve().parents[2]


def _block(path: Path) -> str:
    return path.read_text("utf-8").split(BEGIN, 1)[1].split(END, 1)[0].lstrip("\n")


def test_every_rule_has_exactly_one_row() -> None:
    counts = Counter(row.rule for row in ROWS)
    assert sorted(set(Rule) - set(counts)) == [], "rules without a row"
    assert [rule for rule, n in counts.items() if n > 1] == [], "rules with several rows"
    assert len(ROWS) == len(Rule)


def test_row_names_are_unique_members() -> None:
    names = [str(row.rule) for row in ROWS]
    assert len(set(names)) == len(names)
    assert all(isinstance(row.rule, Rule) for row in ROWS)


def test_rows_without_an_example_say_why() -> None:
    missing = {str(row.rule): row.why for row in ROWS if row.example is None}
    assert all(missing.values()), f"rows without an example nor a why: {missing}"
    assert all(not row.why for row in ROWS if row.example is not None)
    running = len(ROWS) - len(missing)
    print(f"{running} of {len(ROWS)} rows run an example; without one: {sorted(missing)}")


@pytest.mark.parametrize("row", ROWS, ids=[str(row.rule) for row in ROWS])
def test_every_example_can_run_and_agrees_with_its_row(row: Row) -> None:
    ex = row.example
    if ex is None:
        pytest.skip(row.why)
    assert ex.policy in POLICY_NAMES
    policy = policy_by_name(ex.policy).with_overrides(dict(ex.overrides))  # valid names, ranges
    assert ex.target is None or 0 <= ex.target < len(ex.memories)
    assert ex.fact.text.strip() and all(m.text.strip() for m in ex.memories)
    column = row.review if policy.mode == "review" else row.strict
    assert column == "recorded" or ex.action == column, (ex.action, column)


def test_a_composed_rule_finds_its_row_by_its_head() -> None:
    assert row_for("partial_contradiction:key_match").rule == Rule.PARTIAL_CONTRADICTION
    assert row_for("contradiction+confident").rule == Rule.CONTRADICTION
    with pytest.raises(KeyError):
        row_for("no_such_rule")


def test_the_readme_and_the_docs_hold_the_generated_tables() -> None:
    assert _block(ROOT / "README.md") == readme_table(), (
        "README's decision table is stale: run `python -m engine.cli.tabledoc --write`"
    )
    assert _block(ROOT / "docs" / "gate.md") == full_table(), (
        "docs/gate.md's decision table is stale: run `python -m engine.cli.tabledoc --write`"
    )


def test_the_tables_list_the_rows_in_order() -> None:
    lines = readme_table().splitlines()
    body = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert [line.split("`")[1] for line in body] == [str(row.rule) for row in ROWS]
    assert (
        len([line for line in full_table().splitlines() if line.startswith("| ")]) == len(ROWS) + 1
    )


def test_with_table_replaces_only_the_marked_block(tmp_path: Path) -> None:
    text = f"head\n{BEGIN}\nold\n{END}\ntail\n"
    assert with_table(text, "new\n") == f"head\n{BEGIN}\nnew\n{END}\ntail\n"
    with pytest.raises(ValueError):
        with_table("no markers", "new\n")
    readme, docs = tmp_path / "README.md", tmp_path / "gate.md"
    readme.write_text(text, "utf-8")
    docs.write_text(text, "utf-8")
    assert main(["--write", "--readme", str(readme), "--docs", str(docs)]) == 0
    assert readme.read_text("utf-8") == f"head\n{BEGIN}\n{readme_table()}{END}\ntail\n"
    assert docs.read_text("utf-8") == f"head\n{BEGIN}\n{full_table()}{END}\ntail\n"
