"""Past one machine: the PostgreSQL store against SQLite, measured in one run.

1. **Gate facts/s at N stored memories** (default N = 10,000, one namespace): the same
   memories (embedded once by the real MiniLM) are committed into a SQLite store and a
   PostgreSQL store; then the real gate (MiniLM fp32 + the offline NLI model ``aegis-nli``,
   ``--nli`` to change) decides and commits the same incoming facts on each, passes
   interleaved (SQLite, PostgreSQL, SQLite, ...) so drift in the machine's load hits both.
   The PostgreSQL gate runs as a replica would: the cross-replica namespace lock around each
   decision, and the index following the event log before each search. Target: PostgreSQL
   >= 0.9x SQLite.
2. **Store commits/s with 1..16 concurrent writers**: each writer thread commits one add
   (a 384-d float32 embedding, an idempotency key) per transaction, in its own namespace
   (separate) or all in one namespace (shared), for a fixed time per cell.

PostgreSQL: ``--dsn`` of an empty database, else a throwaway server is started with Debian's
binaries (tests/_pg.py: initdb + pg_ctl, 127.0.0.1, fsync on; as an unprivileged user when
run as root). SQLite: WAL, synchronous=FULL, on the same disk. Writes table + JSON + plot into
``--out``. The projection for K machines is in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from _common import (
    ROOT,
    Corpus,
    add_common_args,
    interleaved,
    manifest_summary,
    run_header,
    save_results,
    table,
)

NAME = "bench_scale"
NS = "scale"


def _cluster(args: argparse.Namespace) -> tuple[str, Any]:
    """``(dsn, cluster or None)``: the given database, or a throwaway server's."""
    if args.dsn:
        return args.dsn, None
    sys.path.insert(0, str(ROOT / "tests"))
    from _pg import PgCluster, find_bin

    bindir = find_bin()
    if bindir is None:
        raise SystemExit("no PostgreSQL binaries: install Debian's postgresql, or pass --dsn")
    cluster = PgCluster(bindir)
    return cluster.dsn(), cluster


def _fresh(dsn: str, cluster: Any, name: str) -> str:
    if cluster is not None:
        return str(cluster.create_database(name))
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for table_name in ("idempotency", "reviews", "events", "namespaces", "memories"):
            conn.execute(f"DROP TABLE IF EXISTS {table_name} CASCADE")
        conn.execute("DROP TABLE IF EXISTS memgate_meta")
    return dsn


def seed(store: Any, texts: list[str], vectors: Any, chunk: int = 1000) -> None:
    from engine.store import Write
    from engine.types import Fact

    for start in range(0, len(texts), chunk):
        store.commit(
            [
                Write("add", Fact(NS, texts[i]), embedding=vectors[i], policy="seed")
                for i in range(start, min(start + chunk, len(texts)))
            ]
        )


def gate_pass(gate: Any, facts: list[Any], batch: int) -> tuple[float, dict[str, int]]:
    from collections import Counter

    actions: Counter[str] = Counter()
    t0 = time.perf_counter()
    for start in range(0, len(facts), batch):
        res = gate.triage(facts[start : start + batch], "strict", apply=True)
        actions.update(d.action for d in res.decisions)
    return time.perf_counter() - t0, dict(actions)


def commits_per_s(store: Any, writers: int, seconds: float, shared: bool, tag: str) -> float:
    import numpy as np

    from engine.store import Write
    from engine.types import Fact

    vec = np.random.default_rng(0).normal(size=384).astype(np.float32)
    counts = [0] * writers
    errors: list[BaseException] = []
    barrier = threading.Barrier(writers + 1)
    stop = threading.Event()

    def work(w: int) -> None:
        ns = f"{tag}/shared" if shared else f"{tag}/w{w}"
        try:
            barrier.wait()
            n = 0
            while not stop.is_set():
                n += 1
                fact = Fact(ns, f"w{w} commit {n}", kind="episodic", idempotency_key=f"{w}-{n}")
                store.commit([Write("add", fact, embedding=vec, policy="bench")])
                counts[w] += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--n", type=int, default=10_000, help="stored memories (N)")
    parser.add_argument("--facts", type=int, default=128, help="incoming facts per pass")
    parser.add_argument("--batch", type=int, default=32, help="facts per triage call")
    parser.add_argument("--passes", type=int, default=2, help="timed passes per store")
    parser.add_argument("--nli", default="aegis-nli", help="NLI artefact (real: aegis-nli)")
    parser.add_argument("--writers", default="1,2,4,8,16", help="commit-bench writer counts")
    parser.add_argument("--cell-s", type=float, default=3.0, help="seconds per commit cell")
    parser.add_argument("--dsn", help="an empty PostgreSQL database (default: a throwaway one)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.n, args.facts, args.batch, args.passes, args.cell_s = 300, 16, 8, 1, 0.5
        args.writers = "1,4"
    elif args.quick:
        args.facts, args.passes, args.cell_s = min(args.facts, 64), 1, 1.5
    writer_counts = [int(w) for w in args.writers.split(",")]

    from engine.gate.gate import Gate
    from engine.index import IndexManager, IndexSettings
    from engine.runtime.loader import ModelChoice, load_models
    from engine.runtime.session import SessionSettings
    from engine.store import open_store
    from engine.types import Fact

    cache = Path(args.cache_dir)
    result: dict[str, Any] = run_header(NAME, args)
    result["manifests"] = manifest_summary(cache, [("minilm", "fp32"), (args.nli, "imported")])
    m = result["machine"]
    print(f"{NAME}: {m['cpu']} ({m['usable_cores']} cores), load {m['load_average_at_start']}")
    embedder, nli = load_models(
        cache,
        ModelChoice(nli=args.nli),
        SessionSettings(intra_op_threads=args.threads),
    )
    embedder.warmup()
    nli.warmup()
    corpus = Corpus(args.seed)
    slots = corpus.memories(args.n, namespace=NS)
    t0 = time.perf_counter()
    vectors = embedder.embed([s.text for s in slots])
    print(f"  embedded {args.n:,} memories in {time.perf_counter() - t0:.0f} s")
    incoming = corpus.incoming(slots, args.facts * args.passes)

    dsn, cluster = _cluster(args)
    tmp = Path(args.out) / f"{NAME}-work-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    stores: dict[str, Any] = {}
    gates: dict[str, Any] = {}
    try:
        specs = {"sqlite": str(tmp / "gate.db"), "postgres": _fresh(dsn, cluster, "gate")}
        for name, spec in specs.items():
            store = stores[name] = open_store(spec)
            seed(store, [s.text for s in slots], vectors)
            follow = store if getattr(store, "shared", False) else None
            index = IndexManager(store.iter_active_embeddings, IndexSettings(), follow=follow)
            gates[name] = Gate(store, index, embedder, nli)
            gate_pass(gates[name], [Fact(NS, "warm-up: the index loads here.")], 1)
        seconds: dict[str, float] = {"sqlite": 0.0, "postgres": 0.0}
        actions: dict[str, dict[str, int]] = {}
        for p, order in interleaved(["sqlite", "postgres"], args.passes):
            part = incoming[p * args.facts : (p + 1) * args.facts]
            facts = [Fact(i.namespace, i.text) for i in part]
            for name in order:
                s, acts = gate_pass(gates[name], facts, args.batch)
                seconds[name] += s
                for k, v in acts.items():
                    actions.setdefault(name, {})[k] = actions.get(name, {}).get(k, 0) + v
        total = args.facts * args.passes
        fps = {name: total / s for name, s in seconds.items()}
        ratio = fps["postgres"] / fps["sqlite"]
        result["gate"] = {
            "n": args.n,
            "facts": total,
            "batch": args.batch,
            "facts_per_s": fps,
            "actions": actions,
            "postgres_over_sqlite": ratio,
            "target": 0.9,
            "met": ratio >= 0.9,
            "same_decisions": actions.get("sqlite") == actions.get("postgres"),
        }
        print(
            table(
                ["store", "facts/s", "actions"],
                [[n, fps[n], str(actions.get(n))] for n in ("sqlite", "postgres")],
                title=f"gate, N = {args.n:,}, {total} facts (write), batch {args.batch}: "
                f"PostgreSQL / SQLite = {ratio:.2f} (target >= 0.9)",
            )
        )
        for store in stores.values():
            store.close()
        stores.clear()

        commits: dict[str, dict[str, dict[int, float]]] = {}
        for name in ("sqlite", "postgres"):
            spec = str(tmp / "commits.db") if name == "sqlite" else _fresh(dsn, cluster, "commits")
            with open_store(spec) as store:
                for mode in ("separate", "shared"):
                    for w in writer_counts:
                        rate = commits_per_s(store, w, args.cell_s, mode == "shared", f"{mode}{w}")
                        commits.setdefault(name, {}).setdefault(mode, {})[w] = rate
        result["commits_per_s"] = commits
        rows = [
            [f"{name} ({mode})", *(commits[name][mode][w] for w in writer_counts)]
            for name in ("sqlite", "postgres")
            for mode in ("separate", "shared")
        ]
        print(
            table(
                ["store (namespaces)", *(f"{w} writers" for w in writer_counts)],
                rows,
                title="store commits/s (one add per transaction)",
            )
        )
    finally:
        for store in stores.values():
            store.close()
        if cluster is not None:
            cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)

    def draw(plt: Any) -> Any:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        ax1.bar(["SQLite", "PostgreSQL"], [fps["sqlite"], fps["postgres"]], color=["C0", "C1"])
        ax1.set_title(f"gate facts/s, N = {args.n:,} (ratio {ratio:.2f})")
        ax1.set_ylabel("facts/s")
        for i, name in enumerate(("sqlite", "postgres")):
            for mode, style in (("separate", "-"), ("shared", "--")):
                ys = [commits[name][mode][w] for w in writer_counts]
                ax2.plot(
                    writer_counts, ys, style, marker="o", color=f"C{i}", label=f"{name} {mode}"
                )
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("concurrent writers")
        ax2.set_ylabel("commits/s")
        ax2.set_title("store commits/s")
        ax2.legend(fontsize=8)
        fig.tight_layout()
        return fig

    save_results(Path(args.out), NAME, result, draw, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
