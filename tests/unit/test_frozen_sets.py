"""heldout4 to heldout24.jsonl are frozen: each one's sha256 is the one in its section of
benchmarks/data/README.md, the category table there matches the file, and it passes the
structure and `[trap]` checks of check_traps.py (standard library only, no model)."""

from __future__ import annotations

import collections
import hashlib
import json
import runpy
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"

# file stem, id prefix, sha256 (as in its README section), fewest [trap] cases
FROZEN = [
    ("heldout4", "h4", "13345ccc0aa4d56267bbdbe859546c40ccab5d8575c812af342436826057ad82", 32),
    ("heldout5", "h5", "0ecb4100331483e6ac0cb08346e2058502def48c1cc5698f6d8f3af826d912c3", 34),
    ("heldout6", "h6", "736ded280f55ae75befb5e200a2c565676805c6e2371eceeb1cb24c6a5779a20", 34),
    ("heldout7", "h7", "19f61e8cde68bda52fa9d3846254ed659b608eb700fdf71c7cfa16e7179ceab7", 35),
    ("heldout8", "h8", "e76c771edcccc840163185f7926f6f154986d91669ac2acb6356df811eae687b", 34),
    ("heldout9", "h9", "50dbd7d68f10799c22ba20a443525dc4fb41c8b9a4737470837752c774cf50c2", 34),
    ("heldout10", "h10", "4bb6c76d8cf6dd654db29565a185549b65dd607117b60ef506a3e025e30582d4", 34),
    ("heldout11", "h11", "c7ccef7099161760b3ce35ca98d90f203eefbf2e50e3d0de01049ca7bd3872b8", 34),
    ("heldout12", "h12", "dd11c68a8f873c258d57e1a950d1f824e661db0871883cc853bc39b8288b5f72", 34),
    ("heldout13", "h13", "6ca32972783110254f6762ee3e616ccf90081b22c880e5bcc28fe1ca2f225b08", 34),
    ("heldout14", "h14", "71788189f62c2ae864fd8edba60250cc44107ca5bbe61eca768e3d7a4be91c79", 34),
    ("heldout15", "h15", "fd27d1a57d0f16c08e5e57f08b7f33d2a2d1d4b237e5e80869a33c9b7f0ddbc9", 36),
    ("heldout16", "h16", "e6c1367c95a7989b76aa2665d2f4dfeeb0a21960423a4090b36274714c5a3c42", 36),
    ("heldout17", "h17", "cd31c1635deab856d43024e4d1944030e79b4649baf29622147d41911e4fe444", 36),
    ("heldout18", "h18", "2dbf542dc0076cffd15667e11a8ea2a87da4dbd366a6421a6440e2b8967e2ac8", 36),
    ("heldout19", "h19", "9f1668c6a5ab6bf75f0f1dee837972e561fc76ab682c47d8e67abe2490c53e28", 36),
    ("heldout20", "h20", "c4ae3d5d4a3486640883535cba06949aca8c3e1722d1f9c615c857a5f468b5d6", 36),
    ("heldout21", "h21", "334804f45a3045010e1c43baaecd1ce13721b474c5901c82016daa04265434b5", 36),
    ("heldout22", "h22", "aa2a28ff61bfd1bd6dd669ff9d13184570506755a1dbed2950fdae5c7fc553a9", 36),
    ("heldout23", "h23", "061065b501c58e2f81824caefbe821cd1b952347e4e6228d2f8172f728bb59b8", 40),
    ("heldout24", "h24", "f3eaa4f406e3806040bccdecc50b268a3151521c23183d95a8ea08203372a6d5", 38),
]
pytestmark = pytest.mark.parametrize(
    ("stem", "prefix", "sha256", "min_traps"), FROZEN, ids=[f[0] for f in FROZEN]
)


def _section(stem: str) -> str:
    """The `## <stem>.jsonl` section of the data README (up to the next `## ` heading)."""
    text = (DATA / "README.md").read_text(encoding="utf-8")
    start = text.index(f"## {stem}.jsonl")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def _cases(stem: str) -> list[dict]:
    text = (DATA / f"{stem}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line]


def test_sha256_is_the_one_in_its_readme_section(
    stem: str, prefix: str, sha256: str, min_traps: int
) -> None:
    assert hashlib.sha256((DATA / f"{stem}.jsonl").read_bytes()).hexdigest() == sha256
    assert sha256 in _section(stem)


def test_readme_table_matches_the_file(stem: str, prefix: str, sha256: str, min_traps: int) -> None:
    rows: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case in _cases(stem):
        rows[case["category"]][case["expected"]["action"]] += 1
    section = _section(stem)
    for category, row in rows.items():
        cells = " | ".join(
            str(row[a]) if row[a] else "" for a in ("replace", "add", "skip", "review")
        )
        assert f"| {category} | {sum(row.values())} | {cells} |" in section, category


def test_ids_structure_and_traps(stem: str, prefix: str, sha256: str, min_traps: int) -> None:
    checks = runpy.run_path(str(DATA / "check_traps.py"))
    cases = _cases(stem)
    assert [c["id"] for c in cases] == [f"{prefix}-{n:04d}" for n in range(1, len(cases) + 1)]
    assert checks["structure_errors"](cases) == []
    n_traps, trap_errors = checks["trap_errors"](cases)
    assert trap_errors == []
    assert n_traps >= min_traps
