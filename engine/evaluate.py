"""``memgate eval``: run labelled or unlabelled write-gate cases through the gate.

Each case gets a fresh namespace: its memories are stored as they are, then its incoming fact is
triaged as a dry run. Only ``id``, ``memories`` and ``incoming`` are read, so unlabelled cases
work too. Predictions use the format of the shared evaluation README.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.gate.gate import Gate
from engine.gate.policy import Policy
from engine.types import Decision, Fact

__all__ = ["load_cases", "predict"]


def load_cases(path: Path) -> list[dict[str, Any]]:
    cases = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                case = json.loads(line)
                if not {"id", "memories", "incoming"} <= case.keys():
                    raise ValueError(f"{path}:{n}: a case needs id, memories and incoming")
                cases.append(case)
    return cases


def predict(
    gate: Gate, cases: Iterable[dict[str, Any]], policy: Policy | str, *, prefix: str = "eval"
) -> list[tuple[dict[str, Any], Decision]]:
    """Return (prediction, decision) per case, in order."""
    cases = list(cases)
    facts, owners = [], []
    for n, case in enumerate(cases):
        ns = f"{prefix}-{n}"
        for mem in case["memories"]:
            facts.append(Fact(namespace=ns, text=mem["text"]))
            owners.append(mem["id"])
    stored = gate.ingest(facts)
    to_case: dict[str, str] = {
        d.memory_id: owner for d, owner in zip(stored, owners, strict=True) if d.memory_id
    }
    incoming = [Fact(namespace=f"{prefix}-{n}", text=c["incoming"]) for n, c in enumerate(cases)]
    result = gate.triage(incoming, policy, apply=False)
    out = []
    for case, d in zip(cases, result.decisions, strict=True):
        target = to_case.get(d.target_id) if d.target_id else None
        pred = {
            "id": case["id"],
            "action": d.action,
            "target": target if d.action != "add" else None,
        }
        out.append((pred, d))
    return out
