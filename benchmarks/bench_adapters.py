"""Adapter overhead: the same facts through GatedStore and straight through the gate.

Each round seeds two fresh namespaces alike (N memories, untimed; the store's namespace also
gets its inner items), then writes the same M incoming facts (updates, duplicates, unrelated
facts) in batches of B, once with ``Gate.triage(apply=True)`` and once with
``GatedStore.batch([PutOp, ...])`` over an ``InMemoryStore``, in alternating order (ABBA), on
one engine. The overhead is the median over rounds of (store time / gate time) - 1: what the
adapter adds beyond the gate's own cost (the read of the put keys, the key mapping, the inner
writes). Target: <= 5 %.

    PYTHONPATH=. MEMGATE_HOME=~/.cache/memgate python benchmarks/bench_adapters.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Corpus,
    add_common_args,
    interleaved,
    run_header,
    save_results,
    table,
)

NAME = "bench_adapters"
TARGET = 0.05


class _TimedEngine:
    """The store's engine, timing its writes: the store's time minus this is the adapter's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.write_s = 0.0

    def write(self, facts: Any, policy: str, overrides: Any = None) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.write(facts, policy, overrides)
        finally:
            self.write_s += time.perf_counter() - t0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _seed(gate: Any, store: Any, corpus: Corpus, n: int, rnd: int) -> tuple[list[Any], Any]:
    """Two namespaces holding the same N memories; returns (incoming facts' slots, labels)."""
    from langgraph.store.base import PutOp

    from engine.types import Fact

    direct_ns = f"bench/direct-{rnd}"
    labels = ("bench", f"store-{rnd}")
    store_ns = store.memgate_namespace(labels)
    slots = corpus.memories(n, namespace=direct_ns, salt=rnd)
    gate.ingest([Fact(direct_ns, s.text) for s in slots])
    meta = [
        {
            "langgraph": {
                "key": f"seed-{i}",
                "occupant": None,
                "alt_key": None,
                "value": {"content": s.text},
            }
        }
        for i, s in enumerate(slots)
    ]
    stored = gate.ingest(
        [Fact(store_ns, s.text, metadata=m) for s, m in zip(slots, meta, strict=True)]
    )
    store.inner.batch(
        [
            PutOp(labels, f"seed-{i}", {"content": s.text, "_memgate_id": d.memory_id})
            for i, (s, d) in enumerate(zip(slots, stored, strict=True))
        ]
    )
    return slots, labels


def _round(
    gate: Any,
    store: Any,
    corpus: Corpus,
    args: argparse.Namespace,
    rnd: int,
    order: Sequence[str],
) -> dict[str, Any]:
    from langgraph.store.base import PutOp

    from engine.types import Fact

    slots, labels = _seed(gate, store, corpus, args.memories, rnd)
    incoming = corpus.incoming(slots, args.facts, salt=100 + rnd)
    texts = [f.text for f in incoming]
    chunks = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]
    direct_ns = f"bench/direct-{rnd}"

    def direct() -> tuple[float, list[str]]:
        actions: list[str] = []
        t0 = time.perf_counter()
        for chunk in chunks:
            res = gate.triage([Fact(direct_ns, t) for t in chunk], "strict", apply=True)
            actions += [d.action for d in res.decisions]
        return time.perf_counter() - t0, actions

    def through_store() -> tuple[float, list[str]]:
        actions: list[str] = []
        store.engine.write_s = 0.0
        t0 = time.perf_counter()
        for c, chunk in enumerate(chunks):
            store.batch(
                [PutOp(labels, f"r{rnd}-{c}-{i}", {"content": t}) for i, t in enumerate(chunk)]
            )
            actions += [d.action for d in store.decisions]
        return time.perf_counter() - t0, actions

    arms = {"gate": direct, "store": through_store}
    measured = {arm: arms[arm]() for arm in order}
    (gate_s, gate_actions), (store_s, store_actions) = measured["gate"], measured["store"]
    return {
        "round": rnd,
        "order": f"{order[0]} first",
        "gate_s": gate_s,
        "store_s": store_s,
        "ratio": store_s / gate_s,
        "store_engine_s": store.engine.write_s,
        "adapter_s": store_s - store.engine.write_s,
        "adapter_share": (store_s - store.engine.write_s) / store.engine.write_s,
        "same_decisions": gate_actions == store_actions,
        "actions": {a: store_actions.count(a) for a in sorted(set(store_actions))},
    }


def _row(r: dict[str, Any]) -> list[Any]:
    return [
        r["round"],
        r["order"],
        f"{r['gate_s']:.2f}",
        f"{r['store_s']:.2f}",
        f"{r['ratio']:.3f}",
        f"{r['adapter_share'] * 100:.2f} %",
        r["same_decisions"],
    ]


def _draw(rows: list[dict[str, Any]], overhead: float, title: str) -> Any:
    def draw(plt: Any) -> Any:
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [r["round"] for r in rows]
        ax.bar([x - 0.2 for x in xs], [r["gate_s"] for r in rows], 0.4, label="gate.triage")
        ax.bar([x + 0.2 for x in xs], [r["store_s"] for r in rows], 0.4, label="GatedStore.batch")
        ax.set_xlabel("round")
        ax.set_ylabel("seconds for the round's facts")
        ax.set_title(f"adapter overhead (median) {overhead * 100:+.1f} %  (target <= 5 %)")
        ax.legend()
        ax.grid(True, axis="y", alpha=0.3)
        fig.suptitle(title, fontsize=8)
        fig.tight_layout()
        return fig

    return draw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--memories", type=int, default=300, help="memories seeded per namespace")
    parser.add_argument("--facts", type=int, default=100, help="incoming facts per round and arm")
    parser.add_argument("--batch", type=int, default=50, help="facts per call")
    parser.add_argument("--rounds", type=int, default=6, help="rounds (alternating order)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.memories, args.facts, args.batch, args.rounds = 30, 10, 5, 2
    elif args.quick:
        args.memories, args.facts, args.rounds = 200, 50, 4
    os.environ["OMP_NUM_THREADS"] = str(args.threads)

    from langgraph.store.memory import InMemoryStore

    from engine.adapters import LocalEngine
    from engine.adapters.langgraph import GatedStore
    from engine.app import EngineSettings, open_engine
    from engine.runtime.session import SessionSettings

    result: dict[str, Any] = run_header(NAME, args)
    m = result["machine"]
    print(f"{NAME}: {m['cpu']} ({m['usable_cores']} cores), load {os.getloadavg()[0]:.2f}")
    corpus = Corpus(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as tmp:
        settings = EngineSettings(
            data_dir=Path(tmp),
            cache_dir=Path(args.cache_dir),
            session=SessionSettings(intra_op_threads=args.threads),
            snapshots=False,
        )
        with open_engine(settings) as engine:
            store = GatedStore(InMemoryStore(), _TimedEngine(LocalEngine(engine.gate)))
            warm = argparse.Namespace(**{**vars(args), "facts": 10})
            _round(engine.gate, store, corpus, warm, -1, ["store", "gate"])
            rows = []
            for r, order in interleaved(["gate", "store"], args.rounds):
                rows.append(_round(engine.gate, store, corpus, args, r, order))
                print(
                    f"  round {r}: store/gate {rows[-1]['ratio']:.3f}, adapter's own "
                    f"{rows[-1]['adapter_share'] * 100:.2f} %",
                    flush=True,
                )
    overhead = statistics.median(r["ratio"] for r in rows) - 1.0
    total = sum(r["store_s"] for r in rows) / sum(r["gate_s"] for r in rows) - 1.0
    own = sum(r["adapter_s"] for r in rows) / sum(r["store_engine_s"] for r in rows)
    print(
        table(
            ["round", "order", "gate s", "store s", "store/gate", "adapter's own", "same"],
            [_row(r) for r in rows],
            title=f"{args.facts} facts per arm and round, batches of {args.batch}, "
            f"{args.memories} memories seeded",
        )
    )
    verdict = "met" if overhead <= TARGET else "MISSED"
    print(
        f"overhead: median {overhead * 100:+.2f} %, totals {total * 100:+.2f} %  "
        f"(target <= {TARGET * 100:.0f} %: {verdict}); the adapter's own time, measured "
        f"inside the store calls: {own * 100:.2f} % of the gate's"
    )
    result.update(
        {
            "rounds": rows,
            "overhead_median": overhead,
            "overhead_totals": total,
            "adapter_own_share": own,
            "target": TARGET,
            "met": overhead <= TARGET,
        }
    )
    title = f"{m['cpu']}, {m['usable_cores']} cores; git {result['git']['sha'][:10]}"
    save_results(Path(args.out), NAME, result, _draw(rows, overhead, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
