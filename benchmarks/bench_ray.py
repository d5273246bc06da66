"""Ray backfill (1 and 2 actors x 1 ONNX thread) vs the local backfill (2 threads), one file,
one run, rounds interleaved so that a neighbour's load hits every variant alike.

Each variant starts from an empty data directory and is timed end to end: models loaded
(local: one engine; Ray: one engine per actor), the file read, every row decided and committed,
audit and checkpoint written. Ray itself is started once before the rounds (``ray.init``).
Decisions are compared per input line with the local run of the same round.

    python benchmarks/bench_ray.py [--facts 300] [--rounds 2] [--quick | --smoke]

Writes ``benchmarks/results/bench_ray-<utc>.json`` and ``.png``. Target (issue 14): Ray with
2 actors >= 0.9x the local backfill with 2 threads on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import add_common_args, pyplot, run_header, shared_machine_note, table, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.app import EngineSettings, open_engine  # noqa: E402
from engine.backfill import BackfillSettings, GateDecider, Job, Source  # noqa: E402
from engine.backfill.audit import read_records  # noqa: E402
from engine.backfill.ray_engine import RayBackfill, RaySettings  # noqa: E402
from engine.runtime.session import SessionSettings  # noqa: E402

PEOPLE = ["Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid"]
ATTRS = {
    "plan": ["Starter", "Growth", "Business"],
    "city": ["Denver", "Chicago", "Lisbon"],
    "manager": ["Priya", "Marco", "Yuki"],
}
FREE = [
    "The customer's office is in {}.",
    "The customer prefers {} for invoices.",
    "The customer's renewal is in {}.",
]
VALUES = ["Denver", "Chicago", "email", "paper", "March", "October"]


def facts_file(path: Path, n: int, seed: int) -> Path:
    """``n`` rows over 20 namespaces: keyed updates (decided without the NLI model), episodic
    notes and free-text facts (the NLI model decides them against look-alikes)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1, n + 1):
            ns = f"tenant{rng.randrange(20)}/crm"
            roll = rng.random()
            row: dict[str, Any] = {"id": f"r{i}", "namespace": ns}
            if roll < 0.4:
                who, attr = rng.choice(PEOPLE), rng.choice(list(ATTRS))
                row |= {
                    "text": f"{who}'s {attr} is {rng.choice(ATTRS[attr])}.",
                    "key": f"{who}.{attr}",
                }
            elif roll < 0.7:
                row |= {"kind": "episodic", "text": f"Call {i} with {rng.choice(PEOPLE)}."}
            else:
                row |= {"text": rng.choice(FREE).format(rng.choice(VALUES))}
            f.write(json.dumps(row) + "\n")
    return path


def job_for(src: Path, data: Path) -> Job:
    return Job(
        Source.open(src),
        BackfillSettings(batch=32),
        destination=f"local:{data}",
        audit=data / "audit.jsonl",
        checkpoint=data / "checkpoint.json",
    )


def run_local(cache: Path, src: Path, data: Path, threads: int) -> float:
    t0 = time.perf_counter()
    settings = EngineSettings(
        data_dir=data, cache_dir=cache, session=SessionSettings(intra_op_threads=threads)
    )
    with open_engine(settings) as eng:
        result = job_for(src, data).run(GateDecider(eng.gate, "strict", apply=True))
    assert result.status == "finished"
    return time.perf_counter() - t0


def run_ray(cache: Path, src: Path, data: Path, actors: int) -> float:
    t0 = time.perf_counter()
    settings = EngineSettings(data_dir=data, cache_dir=cache)
    runner = RayBackfill(
        job_for(src, data), settings, str(data / "memgate.db"), RaySettings(actors=actors)
    )
    assert runner.run().status == "finished"
    return time.perf_counter() - t0


def actions(data: Path) -> dict[int, str]:
    return {r["line"]: r["action"] for r in read_records(data / "audit.jsonl")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(p)
    p.add_argument("--facts", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    if args.smoke:
        args.facts, args.rounds = 40, 1
    elif args.quick:
        args.facts, args.rounds = 200, 1
    header = run_header("bench_ray", args)
    import os

    import ray

    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        logging_level="WARNING",
    )
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    variants = {
        f"local {args.threads} threads": lambda d: run_local(args.cache_dir, src, d, args.threads),
        "ray 1 actor x 1 thread": lambda d: run_ray(args.cache_dir, src, d, 1),
        "ray 2 actors x 1 thread": lambda d: run_ray(args.cache_dir, src, d, 2),
    }
    seconds: dict[str, list[float]] = {k: [] for k in variants}
    same: dict[str, list[int]] = {k: [] for k in variants}
    try:
        src = facts_file(work / "facts.jsonl", args.facts, args.seed)
        for r in range(args.rounds):
            reference: dict[int, str] | None = None
            for name, fn in variants.items():
                data = work / f"r{r}-{name.replace(' ', '_')}"
                seconds[name].append(fn(data))
                got = actions(data)
                reference = reference or got
                same[name].append(sum(got.get(k) == v for k, v in reference.items()))
                print(f"  round {r + 1}: {name}: {seconds[name][-1]:.1f} s", flush=True)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    base = f"local {args.threads} threads"
    best = {k: min(v) for k, v in seconds.items()}
    rows = [
        [k, args.facts / best[k], best[k], best[base] / best[k], f"{min(same[k])}/{args.facts}"]
        for k in variants
    ]
    print(
        table(
            ["variant", "facts/s", "s (best)", "x local", "same decisions"],
            rows,
            title=f"Ray backfill vs local, {args.facts} facts, real models, best of {args.rounds}",
        )
    )
    note = shared_machine_note()
    if note:
        print(note)
    ratio = best[base] / best["ray 2 actors x 1 thread"]
    print(
        f"target: ray 2 actors >= 0.9x local: {ratio:.2f}x ({'met' if ratio >= 0.9 else 'MISSED'})"
    )
    payload = {
        **header,
        "facts": args.facts,
        "seconds": seconds,
        "same_decisions": same,
        "ratio_ray2_vs_local": ratio,
        "target_met": ratio >= 0.9,
    }
    path = write_json(args.out, "bench_ray", payload)
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.barh(list(best), [args.facts / best[k] for k in best])
        ax.set_xlabel("facts/s (end to end, best round)")
        ax.set_title(f"Ray backfill vs local ({args.facts} facts)")
        fig.tight_layout()
        fig.savefig(path.with_suffix(".png"), dpi=120)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
