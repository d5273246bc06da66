"""The lanes' waits on the parse lock (issue 34): the parse memo with one lock, against two.

32 closed-loop writers (one fact per ``Write``, applied) over 10 namespaces, on the core engine
in-process (``engine.core.Engine``, 8 lanes, the model stage): every lane parses its batch's
texts (``claims.nlp.parse.many``) and reads them again and again in the weigh step.

* ``one lock``: the memo as it was, where a read of a memoised parse waited for spaCy's lock
  too, so a lane reading parses it had waited behind another lane's whole ``nlp.pipe``;
* ``two locks``: ``claims.nlp`` now, a short memo lock, spaCy's lock only around the pipeline.

Arms interleaved (A B, B A, ...) in one process on one store (the writes go on: each arm
writes other facts). Per arm: facts/s, the mean batch, p50/p99 latency, the lanes' seconds
and the seconds the lanes waited for spaCy's lock (share of lane time). Prints a table, writes
JSON and a PNG to ``benchmarks/results/``.

    MEMGATE_HOME=~/.cache/memgate python benchmarks/bench_parse_lock.py --seconds 10 --rounds 2
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
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402 - the path above makes the helpers importable
    RESULTS,
    default_cache_dir,
    pyplot,
    run_header,
    table,
    utc_stamp,
    write_json,
)

ARMS = ("one lock", "two locks")


class OneLock:
    """The parse memo before issue 34's split: one lock for the memo and spaCy alike."""

    def __init__(self, maxsize: int = 65536, batch_size: int = 64) -> None:
        from engine.gate.claims import nlp

        self._nlp = nlp
        self.maxsize = maxsize
        self.batch_size = batch_size
        self._docs: OrderedDict[str, Any] = OrderedDict()
        self.waited_s = 0.0
        self.parsed_s = 0.0

    def __call__(self, text: str) -> Any:
        t0 = time.perf_counter()
        with self._nlp._lock:
            self.waited_s += time.perf_counter() - t0
            doc = self._docs.get(text)
            if doc is not None:
                self._docs.move_to_end(text)
                return doc
            t1 = time.perf_counter()
            doc = self._nlp.pipeline()(text)
            self.parsed_s += time.perf_counter() - t1
            self._keep(text, doc)
            return doc

    def many(self, texts: Iterable[str]) -> int:
        t0 = time.perf_counter()
        with self._nlp._lock:
            self.waited_s += time.perf_counter() - t0
            todo = [t for t in dict.fromkeys(texts) if t not in self._docs]
            if not todo:
                return 0
            t1 = time.perf_counter()
            docs = list(self._nlp.pipeline().pipe(todo, batch_size=self.batch_size))
            self.parsed_s += time.perf_counter() - t1
            for text, doc in zip(todo, docs, strict=True):
                self._keep(text, doc)
            return len(todo)

    def _keep(self, text: str, doc: Any) -> None:
        self._docs[text] = doc
        if len(self._docs) > self.maxsize:
            self._docs.popitem(last=False)


def use(memo: Any) -> None:
    """Route the gate's parsing (evidence, frame, claim) through ``memo``."""
    import engine.gate.claims.claim as claim_mod
    import engine.gate.claims.frame as frame_mod
    import engine.gate.evidence as evidence_mod

    for mod in (evidence_mod, frame_mod, claim_mod):
        mod.parse = memo  # type: ignore[attr-defined]


async def writers(
    engine: Any, facts: list[Any], clients: int, seconds: float, cursor: list[int]
) -> tuple[list[tuple[float, int]], float]:
    out: list[tuple[float, int]] = []
    end = time.perf_counter() + seconds
    loop = asyncio.get_running_loop()

    async def client() -> None:
        while time.perf_counter() < end:
            fact = facts[cursor[0] % len(facts)]
            cursor[0] += 1
            t0 = time.perf_counter()
            done = await engine.triage([fact], apply=True, deadline=loop.time() + 30)
            out.append((time.perf_counter() - t0, done.timings.batch_facts))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return out, time.perf_counter() - t0


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    import bench_grpc

    from engine.app import build_engine, open_engine
    from engine.gate.claims import nlp

    stored, incoming = bench_grpc.build_data(
        args.namespaces, args.memories, args.incoming, args.seed
    )
    memos = {"one lock": OneLock(), "two locks": nlp.parse}
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-parse-lock-") as tmp:
        db = Path(tmp) / "memgate.db"
        with open_engine(bench_grpc.engine_settings(args, db.parent), db_path=db) as opened:
            gate = opened.gate
            for i in range(0, len(stored), 256):
                gate.ingest(stored[i : i + 256])
            engine = build_engine(gate)
            lane_s = [0.0]
            lane_lock = threading.Lock()
            run_batch = engine._run_batch

            def timed(group: Any, works: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return run_batch(group, works)
                finally:
                    with lane_lock:
                        lane_s[0] += time.perf_counter() - t0

            engine.batcher._run = timed

            async def run() -> None:
                await engine.start()
                await engine.warm_up()
                cursor = [0]
                use(memos["two locks"])
                await writers(engine, incoming, 8, 2.0, cursor)  # warm up
                for rnd in range(args.rounds):
                    for arm in ARMS if rnd % 2 == 0 else ARMS[::-1]:
                        memo = memos[arm]
                        use(memo)
                        w0, l0 = memo.waited_s, lane_s[0]
                        out, secs = await writers(
                            engine, incoming, args.clients, args.seconds, cursor
                        )
                        lat = sorted(x for x, _ in out)
                        lanes = lane_s[0] - l0
                        waited = memo.waited_s - w0
                        runs.append(
                            {
                                "round": rnd + 1,
                                "arm": arm,
                                "facts_per_s": len(out) / secs,
                                "mean_batch_facts": statistics.mean(b for _, b in out),
                                "p50_ms": lat[len(lat) // 2] * 1000,
                                "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
                                "lane_s": lanes,
                                "parse_lock_wait_s": waited,
                                "wait_share_of_lane_time": waited / lanes if lanes else 0.0,
                                "load_average": os.getloadavg()[0],
                            }
                        )
                        r = runs[-1]
                        print(
                            f"  round {rnd + 1} {arm}: {r['facts_per_s']:.1f} facts/s, "
                            f"waited {waited:.2f} s of {lanes:.1f} lane-s",
                            flush=True,
                        )
                await engine.close()

            asyncio.run(run())
    use(nlp.parse)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", default=str(default_cache_dir()))
    p.add_argument("--seconds", type=float, default=10.0, help="per arm and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--memories", type=int, default=1000)
    p.add_argument("--incoming", type=int, default=20000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    header = run_header("bench_parse_lock", args)
    runs = measure(args)
    rows = [
        [
            r["round"],
            r["arm"],
            f"{r['facts_per_s']:.1f}",
            f"{r['mean_batch_facts']:.1f}",
            f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f}",
            f"{r['lane_s']:.1f}",
            f"{r['parse_lock_wait_s']:.2f} ({r['wait_share_of_lane_time']:.1%})",
            f"{r['load_average']:.1f}",
        ]
        for r in runs
    ]
    print()
    print(
        table(
            ["round", "arm", "facts/s", "batch", "p50 / p99 ms", "lane-s", "lock wait s", "load"],
            rows,
        )
    )
    # The one ratio: the lanes' wait share, one lock over two (medians over rounds).
    share = {
        arm: statistics.median(r["wait_share_of_lane_time"] for r in runs if r["arm"] == arm)
        for arm in ARMS
    }
    speed = {
        arm: statistics.median(r["facts_per_s"] for r in runs if r["arm"] == arm) for arm in ARMS
    }
    print(
        f"\nparse-lock wait, share of lane time (median): one lock {share['one lock']:.1%}, "
        f"two locks {share['two locks']:.1%}; facts/s two / one locks "
        f"{speed['two locks'] / speed['one lock']:.2f}"
    )
    stamp = utc_stamp()
    path = write_json(
        args.out,
        "bench_parse_lock",
        {**header, "runs": runs, "median_wait_share": share, "median_facts_per_s": speed},
        stamp,
    )
    plt = pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for arm, colour in zip(ARMS, ("tab:red", "tab:blue"), strict=True):
            mine = [r for r in runs if r["arm"] == arm]
            ax.bar(
                [r["round"] + (0.2 if arm == "two locks" else -0.2) for r in mine],
                [100 * r["wait_share_of_lane_time"] for r in mine],
                width=0.4,
                color=colour,
                label=arm,
            )
        ax.set_xlabel("round")
        ax.set_ylabel("parse-lock wait, % of lane time")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / f"bench_parse_lock-{stamp}.png")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
