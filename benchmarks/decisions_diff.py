"""Decision identity: run the gate over the labelled sets and compare two runs line by line.

A refactor of the gate that claims "decisions unchanged" proves it here::

    python benchmarks/decisions_diff.py run --out /tmp/before      # on the unchanged tree
    # ... edit ...
    python benchmarks/decisions_diff.py run --out /tmp/after
    python benchmarks/decisions_diff.py diff /tmp/before /tmp/after

``run`` calls ``python -m engine eval --explain`` (each run in a fresh store under a temporary
folder) for every policy over benchmarks/data/heldout*.jsonl and benchmarks/data/outside/*.jsonl,
and writes one predictions file per (policy, set). ``diff`` compares every line: action, target,
rule and each candidate's text, similarity, contradiction and reason. It prints each flip with
the case's expected action, so a flip that loses a correct decision shows as such, and exits 1
when anything differs. Ids of memories stored during a run (``mem_<hex>``) are random and are
compared blanked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data"
POLICIES = ("strict", "review")
_MEM_ID = re.compile(r"mem_[0-9a-f]{8,}")


def case_sets(outside: Path) -> list[Path]:
    """Our held-out sets, then the outside ones (``outside`` may point at another checkout)."""
    return sorted(DATA.glob("heldout*.jsonl")) + sorted(outside.glob("*.jsonl"))


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MEMGATE_HOME": args.cache}
    for policy in args.policy:
        for cases in case_sets(Path(args.outside)):
            name = f"{policy}--{cases.parent.name}--{cases.stem}.jsonl"
            with tempfile.TemporaryDirectory(prefix="decisions-") as data_dir:
                cmd = [
                    sys.executable, "-m", "engine", "eval", "--cases", str(cases),
                    "--policy", policy, "--nli", args.nli, "--explain",
                    "--out", str(out / name), "--data-dir", data_dir,
                ]  # fmt: skip
                done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stderr[-2000:], file=sys.stderr)
                return done.returncode
            print(f"{name}: {sum(1 for _ in (out / name).open())} decisions", flush=True)
    return 0


def expected(outside: Path) -> dict[str, dict[str, object]]:
    """Case id -> the case's expected decision, for printing beside each flip."""
    found: dict[str, dict[str, object]] = {}
    for cases in case_sets(outside):
        for line in cases.open():
            if line.strip():
                case = json.loads(line)
                found[case["id"]] = case.get("expected", {})
    return found


def _lines(path: Path) -> list[dict[str, Any]]:
    """The decisions of one file, with the random ids of memories stored during the run
    (``mem_<hex>``, e.g. in ``dominated_by:``) blanked: they differ from run to run."""
    return [json.loads(_MEM_ID.sub("mem_*", x)) for x in path.open() if x.strip()]


def unscored_only(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """``b`` is ``a`` with some candidates' contradiction left unscored (None), each with the
    same text, similarity and reason: the decision and every reason are the same."""
    if any(a.get(k) != b.get(k) for k in ("action", "target", "rule")):
        return False
    ca, cb = a.get("candidates") or [], b.get("candidates") or []
    return len(ca) == len(cb) and all(
        x == y or (y[2] is None and [*x[:2], *x[3:]] == [*y[:2], *y[3:]])
        for x, y in zip(ca, cb, strict=True)
    )


def diff(args: argparse.Namespace) -> int:
    before, after = Path(args.before), Path(args.after)
    want = expected(Path(args.outside))
    files = sorted(p.name for p in before.glob("*.jsonl"))
    missing = sorted({p.name for p in after.glob("*.jsonl")} ^ set(files))
    flips = unscored = lines = 0
    for name in files:
        if name in missing:
            continue
        old, new = _lines(before / name), _lines(after / name)
        if len(old) != len(new):
            print(f"{name}: {len(old)} lines before, {len(new)} after")
            flips += 1
        for a, b in zip(old, new, strict=False):
            lines += 1
            if a == b:
                continue
            if args.allow_unscored and unscored_only(a, b):
                unscored += 1
                continue
            flips += 1
            exp = want.get(a["id"], {})
            print(f"{name} {a['id']} expected {exp.get('action')}/{exp.get('target')}")
            for key in ("action", "target", "rule"):
                if a.get(key) != b.get(key):
                    print(f"    {key}: {a.get(key)} -> {b.get(key)}")
            if a.get("candidates") != b.get("candidates"):
                print(f"    candidates: {a.get('candidates')}")
                print(f"            -> {b.get('candidates')}")
    for name in missing:
        print(f"{name}: only in one run")
    note = f", {unscored} the same but for unscored candidates" if args.allow_unscored else ""
    print(f"{lines} decisions compared over {len(files)} files, {flips} differ{note}")
    return 1 if flips or missing else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--outside", default=str(DATA / "outside"), help="folder of the outside sets")
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="write one predictions file per (policy, set) into --out")
    r.add_argument("--out", required=True)
    r.add_argument("--policy", nargs="+", default=list(POLICIES), choices=POLICIES)
    r.add_argument("--nli", default="aegis-nli")
    r.add_argument("--cache", default=os.environ.get("MEMGATE_HOME", "/root/.cache/memgate"))
    d = sub.add_parser("diff", help="compare two predictions folders line by line")
    d.add_argument("before")
    d.add_argument("after")
    d.add_argument(
        "--allow-unscored",
        action="store_true",
        help="count apart (not as differences) lines whose only change is candidates the "
        "model no longer scores (contradiction None, same reason)",
    )
    args = ap.parse_args(argv)
    return run(args) if args.command == "run" else diff(args)


if __name__ == "__main__":
    sys.exit(main())
