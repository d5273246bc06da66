"""The backfill at scale: 100,000 facts over 1,000 namespaces, killed with SIGKILL and resumed.

What issue #6 asks to be shown, end to end, with the real command line:

1. writes the synthetic file (``bench_backfill.build_rows``: per namespace, statements first,
   then updates, repeats and additions about them; namespaces interleaved);
2. runs ``memgate backfill --input FILE --progress on`` in a subprocess (its live progress bar
   goes to this terminal), and ``--kills`` times sends it SIGKILL at a random moment (after a
   random share of the rows, plus a random delay so the kill lands inside a batch);
3. starts the same command again after each kill until the job reports it finished;
4. verifies exactly-once from the artefacts alone: the audit file holds one line per input line
   (no duplicate, none missing); every memory the audit names exists in the store in the
   audited namespace, and the store holds no memory the audit does not name; one idempotency
   record per row; one review item per audited review; no memory superseded twice; SQLite's
   integrity_check is ok.

Prints a table and writes JSON to ``benchmarks/results/``. The facts/s here are absolute (one
process, no baseline in the same run): the ratio to plain batch triage is bench_backfill.py's.

    python benchmarks/backfill_scale.py                       # 100,000 facts, 3 kills
    python benchmarks/backfill_scale.py --facts 5000 --namespaces 50 --kills 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, add_common_args, run_header, table, write_json  # noqa: E402
from bench_backfill import build_rows  # noqa: E402


def write_input(path: Path, facts: int, namespaces: int, seed: int) -> None:
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in build_rows(facts, namespaces, seed):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.rename(path)


def read_checkpoint(data_dir: Path) -> dict[str, Any] | None:
    for path in (data_dir / "backfill").glob("*.checkpoint.json"):
        try:
            return dict(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            return None  # being replaced right now; read it again on the next poll
    return None


def run_segment(cmd: list[str], data_dir: Path, kill_at: int | None, rng: random.Random) -> dict:
    """One start of the command; SIGKILL it once the checkpoint passes ``kill_at`` rows."""
    t0 = time.perf_counter()
    before = (read_checkpoint(data_dir) or {}).get("rows", 0)
    proc = subprocess.Popen(cmd, cwd=ROOT)
    killed = False
    while proc.poll() is None:
        time.sleep(0.5)
        if kill_at is None or killed:
            continue
        if (read_checkpoint(data_dir) or {}).get("rows", 0) >= kill_at:
            time.sleep(rng.uniform(0.0, 4.0))  # land inside a batch, not on its boundary
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                killed = True
    proc.wait()
    after = read_checkpoint(data_dir) or {}
    return {
        "seconds": time.perf_counter() - t0,
        "killed": killed,
        "returncode": proc.returncode,
        "rows_before": before,
        "rows_after": after.get("rows", 0),
        "finished": bool(after.get("finished")),
    }


def verify(data_dir: Path, facts: int) -> dict[str, Any]:
    """Exactly-once, from the audit file and the store alone."""
    [audit_path] = list((data_dir / "backfill").glob("*.audit.jsonl"))
    lines: Counter[int] = Counter()
    ids: Counter[str] = Counter()
    memories: dict[str, str] = {}
    reviews = 0
    actions: Counter[str] = Counter()
    replayed = 0
    with audit_path.open(encoding="utf-8") as f:
        for raw in f:
            rec = json.loads(raw)
            lines[rec["line"]] += 1
            ids[rec["id"]] += 1
            actions[rec["action"]] += 1
            replayed += bool(rec.get("replayed"))
            if rec.get("memory_id"):
                memories[rec["memory_id"]] = rec["namespace"]
            reviews += rec.get("review_id") is not None
    db = sqlite3.connect(f"file:{data_dir / 'memgate.db'}?mode=ro", uri=True)
    try:
        stored = dict(db.execute("SELECT id, namespace FROM memories").fetchall())
        idem = db.execute("SELECT COUNT(*) FROM idempotency").fetchone()[0]
        review_rows = db.execute("SELECT COUNT(*) FROM reviews").fetchone()[0]
        forks = db.execute(
            "SELECT COUNT(*) FROM (SELECT supersedes FROM memories WHERE supersedes IS NOT NULL"
            " AND status != 'undone' GROUP BY supersedes HAVING COUNT(*) > 1)"
        ).fetchone()[0]
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()
    missing_memories = sum(1 for m in memories if m not in stored)
    wrong_namespace = sum(1 for m, ns in memories.items() if m in stored and stored[m] != ns)
    unaudited = sum(1 for m in stored if m not in memories)
    checks = {
        "audit_lines": sum(lines.values()),
        "duplicate_lines": sum(n - 1 for n in lines.values() if n > 1),
        "missing_lines": sum(1 for line in range(1, facts + 1) if line not in lines),
        "duplicate_ids": sum(n - 1 for n in ids.values() if n > 1),
        "audited_memories_missing": missing_memories,
        "audited_memories_in_wrong_namespace": wrong_namespace,
        "stored_memories_not_audited": unaudited,
        "idempotency_records": idem,
        "review_items": review_rows,
        "audited_reviews": reviews,
        "forked_chains": forks,
        "integrity_check": integrity,
        "replayed_decisions": replayed,
    }
    checks["exactly_once"] = (
        checks["audit_lines"] == facts
        and not checks["duplicate_lines"]
        and not checks["missing_lines"]
        and not checks["duplicate_ids"]
        and not missing_memories
        and not wrong_namespace
        and not unaudited
        and idem == facts
        and review_rows == reviews
        and not forks
        and integrity == "ok"
    )
    return {"checks": checks, "actions": dict(actions)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(p)
    p.add_argument("--facts", type=int, default=100_000)
    p.add_argument("--namespaces", type=int, default=1_000)
    p.add_argument("--kills", type=int, default=3, help="SIGKILLs at random moments (default 3)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--work", type=Path, help="work directory (default: results/backfill-scale)")
    p.add_argument("--nli", default="nli-deberta-v3-small")
    p.add_argument("--nli-variant", default="int8")
    p.add_argument("--fresh", action="store_true", help="remove the store of an earlier run")
    args = p.parse_args(argv)
    header = run_header("backfill_scale", args)
    rng = random.Random(args.seed)
    work = args.work or Path(args.out) / "backfill-scale"
    work.mkdir(parents=True, exist_ok=True)
    src = work / f"facts-{args.facts}-{args.namespaces}-{args.seed}.jsonl"
    data_dir = work / "data"
    if args.fresh and data_dir.exists():
        shutil.rmtree(data_dir)
    write_input(src, args.facts, args.namespaces, args.seed)
    cmd = [
        sys.executable, "-m", "engine", "--cache-dir", str(args.cache_dir), "backfill",
        "--input", str(src), "--data-dir", str(data_dir), "--batch", str(args.batch),
        "--threads", str(args.threads), "--nli", args.nli, "--nli-variant", args.nli_variant,
        "--progress", "on",
    ]  # fmt: skip
    if args.nli != "aegis-nli":
        cmd.append("--allow-random-weights")
    kill_points = sorted(rng.uniform(0.05, 0.95) * args.facts for _ in range(args.kills))
    segments = []
    for point in [*kill_points, None]:
        seg = run_segment(cmd, data_dir, None if point is None else int(point), rng)
        segments.append(seg)
        if seg["finished"]:
            break
    while not segments[-1]["finished"]:  # a kill landed after the end, or a crash: resume
        segments.append(run_segment(cmd, data_dir, None, rng))
        if len(segments) > args.kills + 5:
            raise SystemExit("the job does not finish; see its output above")
    result = verify(data_dir, args.facts)
    seconds = sum(s["seconds"] for s in segments)
    rows = [
        [
            str(i),
            "SIGKILL" if s["killed"] else f"exit {s['returncode']}",
            f"{s['rows_before']:,}",
            f"{s['rows_after']:,}",
            f"{s['seconds']:.0f}",
        ]
        for i, s in enumerate(segments, 1)
    ]
    print()
    print(table(["run", "ended by", "rows before", "rows after", "seconds"], rows))
    print()
    checks = result["checks"]
    print(table(["check", "value"], [[k, str(v)] for k, v in checks.items()]))
    print(
        f"\n{args.facts:,} facts over {args.namespaces:,} namespaces, "
        f"{sum(s['killed'] for s in segments)} kills: {seconds:.0f} s in all "
        f"({args.facts / seconds:.1f} facts/s incl. restarts); exactly once: "
        f"{checks['exactly_once']}"
    )
    path = write_json(
        args.out,
        "backfill_scale",
        {
            **header,
            "scale": {"facts": args.facts, "namespaces": args.namespaces, "batch": args.batch},
            "segments": segments,
            "seconds": seconds,
            "facts_per_s": args.facts / seconds,
            **result,
        },
    )
    print(f"written to {path}")
    return 0 if checks["exactly_once"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
