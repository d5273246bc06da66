"""Aggregate table of `memgate eval --json` runs on the outside sets (issue 31).

Reads ``<dir>/<set>.<arm>.json`` files written by ``python -m engine eval ... --json`` and prints
one Markdown row per (set, arm): wrongful overwrites, update recall, accuracy, and the review
measures (true updates queued with the right target / adds and skips queued). Aggregates only:
nothing per case is printed, so nothing can be fitted from the output.

    python benchmarks/outside/table.py /tmp/outside_runs/m
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ARMS = ("seed", "seedlike", "strict", "strict-nojudge", "seed-review", "seedlike-review", "review")
CATEGORIES = (
    "state_update",
    "earlier_dated",
    "explicit_update",
    "duplicate",
    "restated",
    "other_relation",
    "other_attribute",
    "lookalike",
)


def _row(name: str, arm: str, m: dict[str, Any]) -> str:
    rm = m["review_measures"]
    cats = m.get("accuracy_by_category", {})
    per_cat = " / ".join(f"{cats[c]:.2f}" if c in cats else "-" for c in CATEGORIES)
    return (
        f"| {name} | {arm} | {m['cases']} | {m['wrongful_overwrites']} "
        f"({100 * m['wrongful_overwrite_rate']:.1f}%) | {m['update_recall']:.3f} | "
        f"{m['accuracy']:.3f} | {rm['updates_queued_right_target']:.3f} / "
        f"{100 * rm['adds_skips_queued']:.1f}% | {per_cat} |"
    )


def main(argv: list[str]) -> int:
    folder = Path(argv[1] if len(argv) > 1 else ".")
    print(
        "| set | arm | cases | wrongful overwrites | update recall | accuracy | "
        "review: updates queued right / adds+skips queued | accuracy by category "
        "(" + " / ".join(CATEGORIES) + ") |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|")
    for path in sorted({p.name.split(".")[0] for p in folder.glob("*.json")}):
        for arm in ARMS:
            f = folder / f"{path}.{arm}.json"
            if f.is_file() and f.stat().st_size:
                print(_row(path, arm, json.loads(f.read_text(encoding="utf-8"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
