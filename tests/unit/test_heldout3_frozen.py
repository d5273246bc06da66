"""heldout3.jsonl is frozen: its sha256 is the one in benchmarks/data/README.md, and it passes
the structure and `[trap]` checks of check_traps.py (standard library only, no model)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data"
HELDOUT3 = DATA / "heldout3.jsonl"
FROZEN_SHA256 = "983d5c205d62bf29effab15ff65a1dcb6b907c8a4ebb1afe268ed88bf18171cd"


def _check_traps():
    spec = importlib.util.spec_from_file_location("check_traps", DATA / "check_traps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_heldout3_is_the_frozen_file() -> None:
    assert hashlib.sha256(HELDOUT3.read_bytes()).hexdigest() == FROZEN_SHA256
    assert FROZEN_SHA256 in (DATA / "README.md").read_text(encoding="utf-8")


def test_heldout3_structure_and_traps() -> None:
    ct = _check_traps()
    cases = [json.loads(line) for line in HELDOUT3.read_text(encoding="utf-8").splitlines()]
    assert [c["id"] for c in cases] == [f"h3-{k:04d}" for k in range(1, len(cases) + 1)]
    assert ct.structure_errors(cases) == []
    n_traps, errors = ct.trap_errors(cases)
    assert errors == []
    assert n_traps >= 32
