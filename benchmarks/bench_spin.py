"""ONNX Runtime's spinning on and off, served: a lone writer, 32 dry-run clients, 32 writers.

``memgate serve --spin`` (ONNX Runtime's intra-op pool threads spin between operators, the
library's default) against ``--no-spin`` (they sleep, and the cores go to the parse and commit
stages beside the model). Both arms are this tree, the same models (MiniLM fp32 + aegis-nli int8,
the judge ``make models`` fitted) and the same data; only the flag differs.

Per arm, on a fresh store (SQLite, and PostgreSQL: a throwaway cluster from ``tests/_pg.py``)
holding ``--memories`` memories in each of ``--namespaces`` namespaces (``bench_stages``' data):

1. **lone writer**: ``--lone`` serial single-fact ``Write`` calls, one at a time after two
   unmeasured ones: p50 / p90 latency (what one request on an idle server costs);
2. **dry runs**: ``--clients`` closed-loop clients sending single-fact ``Triage`` dry runs
   (nothing stored) for ``--seconds`` after ``--warm``: facts/s;
3. **writers**: ``--clients`` closed-loop clients sending single-fact ``Write`` calls: facts/s,
   p50 / p99, the server's cores.

Arms are interleaved over ``--rounds`` (spin, no-spin; no-spin, spin; ...); per store and phase
the ratio no-spin / spin per round and its median. The adoption rule these figures judge is in
docs/experiments/2026-12-05-spinning-default.md. Prints a table, writes JSON and a PNG to
``--out``.

    MEMGATE_HOME=~/.cache/memgate python benchmarks/bench_spin.py --rounds 3 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402 - the path above makes the helpers importable
    RESULTS,
    ROOT,
    default_cache_dir,
    interleaved,
    run_header,
    save_results,
    table,
)
from bench_stages import (  # noqa: E402
    STORES,
    Postgres,
    Writers,
    build_data,
    codegen,
    ingest,
    measure,
    served_arm,
)

ARMS = {"spin": ("--spin",), "no-spin": ("--no-spin",)}
PHASES = ("lone_p50_ms", "dry_facts_per_s", "write_facts_per_s")


async def lone(port: int, incoming: Sequence[dict[str, str]], calls: int) -> dict[str, float]:
    """Serial single-fact writes, one in flight: latency percentiles (ms)."""
    async with Writers(port, incoming, 0) as w:
        lat = []
        for i in range(calls + 2):
            t0 = time.perf_counter()
            await w.call(w.requests[i % len(w.requests)], timeout=30)
            if i >= 2:
                lat.append((time.perf_counter() - t0) * 1000)
    return {
        "lone_p50_ms": float(np.percentile(lat, 50)),
        "lone_p90_ms": float(np.percentile(lat, 90)),
    }


def run_arm(
    arm: str,
    store: str,
    memories: Path,
    incoming: Sequence[dict[str, str]],
    pg: Postgres | None,
    work: Path,
    args: argparse.Namespace,
) -> dict[str, Any]:
    cache = Path(args.cache_dir)
    with served_arm(
        f"{arm}-{store}", ROOT, store, cache, memories, pg, work, args.threads, ARMS[arm]
    ) as (server, setup):
        result: dict[str, Any] = asyncio.run(lone(server.port, incoming, args.lone))
        # Dry runs and writes start at different places in the pool: the writes meet facts the
        # dry runs never stored, and the lone writer's first facts are behind both.
        third = len(incoming) // 3
        dry = measure(server, incoming, args, dry=True, start=third)
        write = measure(server, incoming, args, start=2 * third)
    result.update({f"dry_{k}": v for k, v in dry.items()})
    result.update({f"write_{k}": v for k, v in write.items()})
    return {"arm": arm, "store": store, "load_before": setup["load_before"], **result}


async def mcp_lone(
    arm: str, data_dir: Path, namespace: str, texts: Sequence[str], args: argparse.Namespace
) -> dict[str, float]:
    """``memgate mcp`` over stdio (MCP's own client): serial ``remember`` calls, p50 / p90 ms."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "engine",
            "mcp",
            "--namespace",
            namespace,
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(args.cache_dir),
            "--embedder-variant",
            "fp32",
            "--nli",
            "aegis-nli",
            "--nli-variant",
            "int8",
            *ARMS[arm],
        ],  # fmt: skip
        cwd=str(ROOT),
    )
    lat = []
    with (data_dir / "stderr.log").open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for i, text in enumerate(texts):
                t0 = time.perf_counter()
                result = await session.call_tool("remember", {"fact": text})
                if result.is_error:
                    raise SystemExit(f"remember failed: {result.content}")
                if i >= 2:
                    lat.append((time.perf_counter() - t0) * 1000)
    return {"p50_ms": float(np.percentile(lat, 50)), "p90_ms": float(np.percentile(lat, 90))}


def run_mcp(args: argparse.Namespace) -> int:
    """``--mcp``: four arms (spin, no-spin, no-spin, spin) of a lone MCP client."""
    stored, incoming = build_data(1, args.memories, args.facts, args.seed)
    namespace = stored[0]["namespace"]
    texts = [f["text"] for f in incoming if f["namespace"] == namespace][: args.lone + 2]
    payload = run_header("bench_spin_mcp", args)
    work = Path(tempfile.mkdtemp(prefix="bench-spin-mcp-"))
    runs = []
    try:
        memories = work / "memories.json"
        memories.write_text(json.dumps(stored), encoding="utf-8")
        for k, arm in enumerate(("spin", "no-spin", "no-spin", "spin")):
            data_dir = work / f"arm-{k}"
            data_dir.mkdir()
            ingest(ROOT, Path(args.cache_dir), memories, data_dir, "")
            got = asyncio.run(mcp_lone(arm, data_dir, namespace, texts, args))
            runs.append({"arm": arm, **got})
            print(f"  [{k + 1}/4] {arm:7}: p50 {got['p50_ms']:.0f} ms, p90 {got['p90_ms']:.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {
        arm: statistics.median(r["p50_ms"] for r in runs if r["arm"] == arm)
        for arm in ("spin", "no-spin")
    }
    ratio = med["no-spin"] / med["spin"]
    payload["runs"], payload["summary"] = runs, {"p50_ms_median": med, "ratio": ratio}
    print(
        f"memgate mcp, lone remember p50: no-spin {med['no-spin']:.0f} ms / spin "
        f"{med['spin']:.0f} ms = {ratio:.2f}x ({payload['machine']['cpu']})"
    )

    def draw_mcp(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.bar(range(len(runs)), [r["p50_ms"] for r in runs], color=["C0", "C1", "C1", "C0"])
        ax.set_xticks(range(len(runs)))
        ax.set_xticklabels([r["arm"] for r in runs])
        ax.set_ylabel("lone remember p50 (ms)")
        ax.set_title(f"memgate mcp over stdio: no-spin / spin {ratio:.2f}x", fontsize=9)
        fig.tight_layout()
        return fig

    save_results(args.out, "bench_spin_mcp", payload, draw_mcp)
    return 0


def summarise(runs: list[dict[str, Any]], stores: Sequence[str]) -> dict[str, Any]:
    """Per store and phase: no-spin / spin per round, and the median."""
    out: dict[str, Any] = {}
    for store in stores:
        out[store] = {}
        for phase in PHASES:
            by_round: dict[int, dict[str, float]] = {}
            for r in runs:
                if r["store"] == store:
                    by_round.setdefault(r["round"], {})[r["arm"]] = r[phase]
            ratios = [v["no-spin"] / v["spin"] for v in by_round.values() if len(v) == 2]
            out[store][phase] = {
                "ratios": ratios,
                "median": statistics.median(ratios) if ratios else None,
            }
    return out


def draw(plt: Any, summary: dict[str, Any], title: str) -> Any:
    fig, ax = plt.subplots(figsize=(7.5, 4))
    stores = list(summary)
    width = 0.8 / max(1, len(stores))
    for k, store in enumerate(stores):
        xs = [i + (k - (len(stores) - 1) / 2) * width for i in range(len(PHASES))]
        ys = [summary[store][p]["median"] or 0.0 for p in PHASES]
        ax.bar(xs, ys, width, label=store)
        for i, p in enumerate(PHASES):
            for r in summary[store][p]["ratios"]:
                ax.plot(xs[i], r, "k.", ms=4)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(PHASES)))
    ax.set_xticklabels(
        ["lone write p50 latency", "32 dry-run clients facts/s", "32 writers facts/s"]
    )
    ax.set_ylabel("--no-spin / --spin (median; dots: rounds)")
    ax.legend()
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--quick", action="store_true", help="1 round of 8 s windows, SQLite")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured closed-loop window")
    parser.add_argument("--warm", type=float, default=4.0, help="unmeasured window before it")
    parser.add_argument("--lone", type=int, default=30, help="serial writes of the lone writer")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop clients")
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--memories", type=int, default=200, help="stored memories per namespace")
    parser.add_argument("--facts", type=int, default=6000, help="incoming fact pool")
    parser.add_argument("--stores", default=",".join(STORES), help="sqlite,postgres")
    parser.add_argument("--threads", type=int, default=0, help="both servers' --threads")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--mcp",
        action="store_true",
        help="instead: a lone client of `memgate mcp` over stdio, four arms (spin, no-spin, "
        "no-spin, spin), --lone serial remember calls each",
    )
    args = parser.parse_args(argv)
    if args.mcp:
        codegen(ROOT)
        return run_mcp(args)
    if args.quick:
        args.rounds, args.seconds, args.warm, args.lone, args.stores = 1, 8.0, 2.0, 10, "sqlite"
    stores = [s for s in args.stores.split(",") if s]
    if not stores or any(s not in STORES for s in stores):
        parser.error(f"--stores: a comma-separated subset of {','.join(STORES)}")
    if not (Path(args.cache_dir) / "models" / "aegis-nli" / "int8").is_dir():
        raise SystemExit(f"{args.cache_dir}: no aegis-nli int8 artefact (run `make models`)")

    payload = run_header("bench_spin", args)
    work = Path(tempfile.mkdtemp(prefix="bench-spin-"))
    pg: Postgres | None = None
    runs: list[dict[str, Any]] = []
    try:
        codegen(ROOT)
        stored, incoming = build_data(args.namespaces, args.memories, args.facts, args.seed)
        memories = work / "memories.json"
        memories.write_text(json.dumps(stored), encoding="utf-8")
        if "postgres" in stores:
            pg = Postgres()
        total = args.rounds * len(stores) * 2
        print(
            f"bench_spin: {len(stored)} memories over {args.namespaces} namespaces, "
            f"{total} arms (load {', '.join(f'{x:.2f}' for x in os.getloadavg())})",
            flush=True,
        )
        t0 = time.perf_counter()
        for rnd, arms in interleaved(list(ARMS), args.rounds):
            for store in stores:
                for arm in arms:
                    run = run_arm(arm, store, memories, incoming, pg, work, args)
                    run["round"] = rnd
                    runs.append(run)
                    print(
                        f"  [{len(runs)}/{total} {time.perf_counter() - t0:.0f}s] round "
                        f"{rnd + 1} {store:8} {arm:7}: lone p50 {run['lone_p50_ms']:.0f} ms, "
                        f"dry {run['dry_facts_per_s']:.1f} facts/s, write "
                        f"{run['write_facts_per_s']:.1f} facts/s (server "
                        f"{run['write_server_cores']:.2f} cores), {run['write_statuses']}",
                        flush=True,
                    )
    finally:
        if pg is not None:
            pg.close()
        shutil.rmtree(work, ignore_errors=True)

    summary = summarise(runs, stores)
    payload["runs"], payload["summary"] = runs, summary
    headers = [
        "store", "round", "arm", "lone p50 ms", "lone p90 ms", "dry facts/s", "write facts/s",
        "write p99 ms", "server cores", "load before",
    ]  # fmt: skip
    rows = [
        [
            r["store"], r["round"] + 1, r["arm"], r["lone_p50_ms"], r["lone_p90_ms"],
            r["dry_facts_per_s"], r["write_facts_per_s"], r["write_p99_ms"],
            r["write_server_cores"], " ".join(str(x) for x in r["load_before"]),
        ]
        for r in runs
    ]  # fmt: skip
    title = (
        f"bench_spin: --no-spin / --spin, {payload['git']['sha'][:7]}, {payload['machine']['cpu']}"
    )
    print(table(headers, rows, title=title))
    for store, phases in summary.items():
        print(
            f"{store}: "
            + "; ".join(
                f"{p} median {v['median']:.2f} ({', '.join(f'{x:.2f}' for x in v['ratios'])})"
                for p, v in phases.items()
                if v["median"] is not None
            )
        )
    save_results(args.out, "bench_spin", payload, lambda plt: draw(plt, summary, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
