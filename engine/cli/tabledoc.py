"""The decision table of the docs, rendered from :data:`engine.gate.table.ROWS`, so the README's
"How the gate decides" cannot drift from the rules the tests run
(``tests/unit/test_decision_table.py`` compares them).

``python -m engine.cli.tabledoc`` prints the README's block, ``--full`` docs/gate.md's (with
each row's example); ``--write`` rewrites both between their ``<!-- decision-table:start -->``
and ``<!-- decision-table:end -->`` markers (``--readme`` / ``--docs`` name other files).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from engine.cli.flagdoc import between
from engine.gate.table import ROWS, Entry, Example, Row

__all__ = ["BEGIN", "END", "full_table", "main", "readme_table", "with_table"]

BEGIN = "<!-- decision-table:start -->"
END = "<!-- decision-table:end -->"
_NOTE = (
    "Each fact meets these rules in this order, and the first that applies decides "
    "(generated from `engine/gate/table.py` by `python -m engine.cli.tabledoc --write`; "
    "every row's example runs through the real gate in `tests/model/test_table_examples.py`; "
    "`-`: not reached under that policy):"
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def readme_table(rows: Sequence[Row] = ROWS) -> str:
    """The README's block: one line per rule, its actions under strict and review."""
    out = [_NOTE, "", "| # | rule | strict | review | when |", "|---|---|---|---|---|"]
    for n, row in enumerate(rows, 1):
        out.append(f"| {n} | `{row.rule}` | {row.strict} | {row.review} | {_cell(row.when)} |")
    return "\n".join(out) + "\n"


def _entry(entry: Entry) -> str:
    text = f'"{_cell(entry.text)}"'
    extra = [f"{name} `{value}`" for name, value in _extras(entry) if value]
    return f"{text} ({', '.join(extra)})" if extra else text


def _extras(entry: Entry) -> list[tuple[str, str | None]]:
    kind = None if entry.kind == "semantic" else entry.kind
    return [("kind", kind), ("key", entry.key), ("idempotency key", entry.idempotency_key)]


def _example(example: Example | None, why: str) -> str:
    if example is None:
        return f"none: {_cell(why)}"
    stored = " · ".join(f"[{i}] {_entry(m)}" for i, m in enumerate(example.memories))
    how = f"`{example.policy}`"
    if example.overrides:
        how += f" `{json.dumps(dict(example.overrides))}`"
    result = f"**{example.action}**"
    if example.target is not None:
        result += f", target [{example.target}]"
    return f"stored {stored}; fact {_entry(example.fact)}, {how} → {result}"


def full_table(rows: Sequence[Row] = ROWS) -> str:
    """docs/gate.md's block: the README's columns and each row's example (the memories stored
    first, numbered from 0; the fact; the policy; the action and, where checked, the target)."""
    out = [
        _NOTE,
        "",
        "| # | rule | strict | review | when | example |",
        "|---|---|---|---|---|---|",
    ]
    for n, row in enumerate(rows, 1):
        out.append(
            f"| {n} | `{row.rule}` | {row.strict} | {row.review} | {_cell(row.when)} | "
            f"{_example(row.example, row.why)} |"
        )
    return "\n".join(out) + "\n"


def with_table(text: str, table: str) -> str:
    """``text`` with the block between :data:`BEGIN` and :data:`END` replaced by ``table``."""
    return between(text, BEGIN, END, table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.cli.tabledoc")
    parser.add_argument("--full", action="store_true", help="print docs/gate.md's block")
    parser.add_argument("--write", action="store_true", help="rewrite the README and the docs")
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--docs", type=Path, default=Path("docs/gate.md"))
    args = parser.parse_args(argv)
    if args.write:
        for path, table in ((args.readme, readme_table()), (args.docs, full_table())):
            path.write_text(with_table(path.read_text("utf-8"), table), "utf-8")
        return 0
    print(full_table() if args.full else readme_table(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
