"""heldout6.jsonl is frozen: its sha256 is the one in its section of benchmarks/data/README.md,
the category table there matches the file, and it passes the structure and `[trap]` checks of
check_traps.py (standard library only, no model)."""

from __future__ import annotations

import collections
import hashlib
import json
import runpy
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
SET = DATA / "heldout6.jsonl"
SHA256 = "736ded280f55ae75befb5e200a2c565676805c6e2371eceeb1cb24c6a5779a20"


def _section() -> str:
    """The `## heldout6.jsonl` section of the data README (up to the next `## ` heading)."""
    text = (DATA / "README.md").read_text(encoding="utf-8")
    start = text.index("## heldout6.jsonl")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _cases() -> list[dict]:
    return [json.loads(line) for line in SET.read_text(encoding="utf-8").splitlines() if line]


def test_heldout6_sha256_is_the_one_in_its_readme_section() -> None:
    assert hashlib.sha256(SET.read_bytes()).hexdigest() == SHA256
    assert SHA256 in _section()


def test_heldout6_readme_table_matches_the_file() -> None:
    rows = collections.defaultdict(collections.Counter)
    for case in _cases():
        rows[case["category"]][case["expected"]["action"]] += 1
    section = _section()
    for category, row in rows.items():
        cells = " | ".join(
            str(row[a]) if row[a] else "" for a in ("replace", "add", "skip", "review")
        )
        assert f"| {category} | {sum(row.values())} | {cells} |" in section, category


def test_heldout6_ids_structure_and_traps() -> None:
    checks = runpy.run_path(str(DATA / "check_traps.py"))
    cases = _cases()
    assert [c["id"] for c in cases] == [f"h6-{n:04d}" for n in range(1, len(cases) + 1)]
    assert checks["structure_errors"](cases) == []
    n_traps, trap_errors = checks["trap_errors"](cases)
    assert trap_errors == []
    assert n_traps >= 34
