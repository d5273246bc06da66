"""The lanes' batches cut by estimated work tokens, against the fact-token cut (issue 34).

One *dense* namespace holds many near-duplicate memories, so each of its facts meets ~20 of
them and brings ~20 NLI pairs; ``--dense-clients`` closed-loop writers send it writes of
``--dense-facts`` facts (applied). Beside them ``--sparse-clients`` closed-loop writers send
single facts (applied) to namespaces of a few memories each. The core engine runs in-process
(``engine.core.Engine``: 8 lanes, the model stage, real MiniLM + NLI, SQLite).

* ``fact cut``: ``QueueSettings.max_batch_work_tokens`` set so high it never binds: batches are
  cut by fact tokens and facts only (the cut before this change);
* ``work cut``: the shipped ``max_batch_work_tokens`` (fact tokens x (1 + the group's learned
  NLI pair tokens per fact token)).

Arms interleaved (A B, B A, ...) in one process on one store (the writes go on). Per arm: the
dense namespace's lane batches (facts, wall seconds, pair tokens: max and p99), the dense
writes' and the single-fact writes' latency (p50 / p99), facts/s, and the load average. Prints
a table, writes JSON and a PNG to ``benchmarks/results/``.

    MEMGATE_HOME=~/.cache/memgate python benchmarks/bench_pair_budget.py --seconds 20 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402 - the path above makes the helpers importable
    RESULTS,
    default_cache_dir,
    pyplot,
    run_header,
    shared_machine_note,
    table,
    utc_stamp,
    write_json,
)

ARMS = ("fact cut", "work cut")
DENSE = "bench/dense"
THINGS = ("broadband router", "coffee machine", "alarm panel", "label printer", "water heater")


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def dense_text(i: int, variant: str) -> str:
    thing = THINGS[i % len(THINGS)]
    return f"The shop's {thing} in the back office was {variant} on day {i % 28 + 1} of month {i}."


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import bench_grpc

    from engine.app import build_engine, open_engine
    from engine.core import CoreSettings
    from engine.types import Fact

    stored, sparse_in = bench_grpc.build_data(
        args.sparse_clients, 3 * args.sparse_clients, 20000, args.seed
    )
    stored += [Fact(DENSE, dense_text(i, "replaced")) for i in range(args.dense_memories)]
    runs: list[dict[str, Any]] = []
    learned: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pair-budget-") as tmp:
        db = Path(tmp) / "memgate.db"
        with open_engine(bench_grpc.engine_settings(args, db.parent), db_path=db) as opened:
            gate = opened.gate
            for i in range(0, len(stored), 256):
                gate.ingest(stored[i : i + 256])
            engine = build_engine(gate, CoreSettings(expiry_interval_s=None))
            shipped = engine.batcher._queue.settings
            cuts = {
                "fact cut": replace(shipped, max_batch_work_tokens=1 << 30),
                "work cut": shipped,
            }
            batches: list[tuple[frozenset[str], int, float, int]] = []
            lock = threading.Lock()
            run_batch = engine._run_batch

            def timed(group: Any, works: Any) -> Any:
                t0 = time.perf_counter()
                out = run_batch(group, works)
                secs = time.perf_counter() - t0
                pairs = next((r.pair_tokens or 0 for r in out if hasattr(r, "pair_tokens")), 0)
                with lock:
                    batches.append(
                        (group.namespaces, sum(len(w.facts) for w in works), secs, pairs)
                    )
                return out

            engine.batcher._run = timed
            cursor = [0, 0]

            async def arm(seconds: float, dense: int, small: int) -> dict[str, Any]:
                end = time.perf_counter() + seconds
                dense_lat: list[float] = []
                small_lat: list[float] = []

                async def dense_client() -> None:
                    while time.perf_counter() < end:
                        i = cursor[0]
                        cursor[0] += args.dense_facts
                        facts = [
                            Fact(DENSE, dense_text(i + j, "serviced"))
                            for j in range(args.dense_facts)
                        ]
                        t0 = time.perf_counter()
                        await engine.triage(facts, apply=True)
                        dense_lat.append(time.perf_counter() - t0)

                async def small_client() -> None:
                    while time.perf_counter() < end:
                        fact = sparse_in[cursor[1] % len(sparse_in)]
                        cursor[1] += 1
                        t0 = time.perf_counter()
                        await engine.triage([fact], apply=True)
                        small_lat.append(time.perf_counter() - t0)

                start = len(batches)
                t0 = time.perf_counter()
                await asyncio.gather(
                    *(dense_client() for _ in range(dense)),
                    *(small_client() for _ in range(small)),
                )
                wall = time.perf_counter() - t0
                mine = [b for b in batches[start:] if DENSE in b[0]]
                facts = [b[1] for b in mine]
                secs = [b[2] for b in mine]
                pairs = [b[3] for b in mine]
                return {
                    "dense_batches": len(mine),
                    "dense_batch_facts_max": max(facts, default=0),
                    "dense_batch_facts_p99": _pct([float(f) for f in facts], 0.99),
                    "dense_batch_facts_mean": statistics.mean(facts) if facts else 0.0,
                    "dense_batch_s_max": max(secs, default=0.0),
                    "dense_batch_s_p99": _pct(secs, 0.99),
                    "dense_batch_pair_tokens_max": max(pairs, default=0),
                    "dense_write_p50_s": _pct(dense_lat, 0.5),
                    "dense_write_p99_s": _pct(dense_lat, 0.99),
                    "dense_facts_per_s": len(dense_lat) * args.dense_facts / wall,
                    "small_calls": len(small_lat),
                    "small_p50_s": _pct(small_lat, 0.5),
                    "small_p99_s": _pct(small_lat, 0.99),
                    "small_facts_per_s": len(small_lat) / wall,
                    "wall_s": wall,
                    "load_average": os.getloadavg()[0],
                }

            async def run() -> None:
                await engine.start()
                await engine.warm_up()
                engine.batcher._queue.settings = shipped
                # warm: one client each, so the groups learn their pair ratios in small batches
                await arm(args.warm_seconds, 1, args.sparse_clients)
                for rnd in range(args.rounds):
                    for name in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                        engine.batcher._queue.settings = cuts[name]
                        r = {
                            "round": rnd + 1,
                            "arm": name,
                            **await arm(args.seconds, args.dense_clients, args.sparse_clients),
                        }
                        runs.append(r)
                        print(
                            f"  round {rnd + 1} {name}: dense batches max "
                            f"{r['dense_batch_facts_max']} facts / "
                            f"{r['dense_batch_s_max']:.1f} s, small p99 "
                            f"{r['small_p99_s']:.2f} s, load {r['load_average']:.1f}",
                            flush=True,
                        )
                q = engine.batcher._queue
                for key in list(q._ratios):
                    names = sorted(getattr(key, "namespaces", ()) or ["(no lock)"])
                    learned[",".join(names)] = round(q.pair_ratio(key), 2)
                await engine.close()

            asyncio.run(run())
            learned["max_batch_work_tokens"] = shipped.max_batch_work_tokens
            learned["prior_pair_ratio"] = shipped.prior_pair_ratio
    return runs, learned


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", default=str(default_cache_dir()))
    p.add_argument("--seconds", type=float, default=20.0, help="per arm and round")
    p.add_argument("--warm-seconds", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=1, help="each round runs both arms")
    p.add_argument("--dense-clients", type=int, default=4)
    p.add_argument("--dense-facts", type=int, default=16, help="facts of one dense write")
    p.add_argument("--dense-memories", type=int, default=100)
    p.add_argument("--sparse-clients", type=int, default=8, help="one namespace each")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    header = run_header("bench_pair_budget", args)
    runs, learned = measure(args)
    rows = [
        [
            r["round"],
            r["arm"],
            r["dense_batches"],
            f"{r['dense_batch_facts_max']} / {r['dense_batch_facts_p99']:.0f}",
            f"{r['dense_batch_s_max']:.1f} / {r['dense_batch_s_p99']:.1f}",
            f"{r['dense_write_p50_s']:.1f} / {r['dense_write_p99_s']:.1f}",
            f"{r['dense_facts_per_s']:.1f}",
            f"{r['small_p50_s']:.2f} / {r['small_p99_s']:.2f}",
            r["small_calls"],
            f"{r['load_average']:.1f}",
        ]
        for r in runs
    ]
    print()
    print(
        table(
            [
                "round",
                "arm",
                "dense batches",
                "facts max / p99",
                "batch s max / p99",
                "dense write p50 / p99 s",
                "dense facts/s",
                "small p50 / p99 s",
                "small calls",
                "load",
            ],
            rows,
        )
    )
    med = {
        arm: {
            k: statistics.median(r[k] for r in runs if r["arm"] == arm)
            for k in ("dense_batch_s_max", "small_p99_s", "dense_facts_per_s")
        }
        for arm in ARMS
    }
    a, b = med["fact cut"], med["work cut"]
    print(
        f"\nmedians: dense batch max s fact / work cut {a['dense_batch_s_max']:.1f} / "
        f"{b['dense_batch_s_max']:.1f}; small p99 {a['small_p99_s']:.2f} / "
        f"{b['small_p99_s']:.2f} s; dense facts/s {a['dense_facts_per_s']:.1f} / "
        f"{b['dense_facts_per_s']:.1f}"
    )
    print(f"learned pair ratios (pair tokens per fact token): {learned}")
    note = shared_machine_note()
    if note:
        print(note)
    stamp = utc_stamp()
    path = write_json(
        args.out,
        "bench_pair_budget",
        {**header, "runs": runs, "medians": med, "learned": learned},
        stamp,
    )
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
        for arm, colour, dx in (("fact cut", "tab:red", -0.2), ("work cut", "tab:blue", 0.2)):
            mine = [r for r in runs if r["arm"] == arm]
            x = [r["round"] + dx for r in mine]
            axes[0].bar(x, [r["dense_batch_s_max"] for r in mine], 0.4, color=colour, label=arm)
            axes[1].bar(x, [r["small_p99_s"] for r in mine], 0.4, color=colour, label=arm)
        axes[0].set_ylabel("dense lane batch, max s")
        axes[1].set_ylabel("single-fact write p99 s")
        for ax in axes:
            ax.set_xlabel("round")
            ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / f"bench_pair_budget-{stamp}.png")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
