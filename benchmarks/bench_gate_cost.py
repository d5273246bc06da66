"""Gate cost per fact: this tree against an earlier revision, same run, interleaved rounds.

Issue 12's cost target: "per fact at most 1.3x today's in bench_gate, at N = 1,000 and 10,000,
with the parser included", where "today's" is the gate before the gate-v2 rewrite. The default
``--against`` is the first parent of the newest merge whose subject names gate-v2 (the main line
just before the rewrite landed); any revision can be named instead.

The older revision is checked out into a temporary detached ``git worktree`` (removed at the
end). Each side runs in its own subprocess with ``PYTHONPATH`` at its tree, which ``_common``
keeps ahead of this checkout (checked: a worker that imports another tree's ``engine`` fails),
so each measures its own ``engine`` with
the same driver code and the same synthetic data (bench_gate's scenario: one
namespace of N memories, M incoming facts - about half updates, a quarter duplicates, a quarter
unrelated - triaged as strict dry runs in batches, fp32 MiniLM, ONNX Runtime int8 NLI:
``nli-deberta-v3-small`` int8 with random weights, bench_gate's default and target
architecture, and ``aegis-nli``, the real contradiction model).

Each side ingests its own stores once (its own schema), then the rounds alternate
old, new, old, new ... (a fresh subprocess per side per round: models load, indexes load cold
from the store, one untimed pass). Timed passes:

* **uncached** (the headline, "parser included"): every memo cache of ``engine.gate`` (claim
  parses, keys, overlaps) is cleared before the pass, so each fact and each candidate memory
  pays its parse as if seen for the first time;
* **cached**: the same facts again with the caches warm (what bench_gate's warm pass measures).

The claim parser's share of the new cost is the time inside spaCy's ``Language.__call__``
during the uncached passes (direct), and the uncached - cached difference (everything the
caches save: spaCy plus claim extraction and canonicalisation).

Prints per-fact time medians (min-max over rounds) for each side, the ratio new / old (median
of per-round ratios, min-max), the parser share; writes JSON and a PNG to ``--out``.

    python benchmarks/bench_gate_cost.py --quick            # ~5 min: 2 rounds, M = 100
    python benchmarks/bench_gate_cost.py                    # 4 rounds, M = 200
    python benchmarks/bench_gate_cost.py --against <rev>    # any older revision
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

NAME = "bench_gate_cost"
TARGET = 1.3
SIDES = ("old", "new")
MODES = ("uncached", "cached")


# -- worker: runs inside one tree (PYTHONPATH) --------------------------------------------------
def clear_gate_caches() -> int:
    """Clear every memo cache defined in ``engine.gate`` (not the one-slot model loaders)."""
    cleared = 0
    for name, module in list(sys.modules.items()):
        if not name.startswith("engine.gate") or module is None:
            continue
        for obj in vars(module).values():
            params = None if isinstance(obj, type) else getattr(obj, "cache_parameters", None)
            if params is None or getattr(obj, "__module__", None) != name:
                continue
            if params().get("maxsize") == 1:
                continue  # the spaCy pipeline: loaded once, not a per-text cost
            obj.cache_clear()
            cleared += 1
    return cleared


def ms_per_fact(p: Any, phase: str | None = None) -> float:
    """A pass's (``bench_gate.Pass``) milliseconds per fact, in all or in one ``phase``."""
    seconds = p.seconds if phase is None else p.phases.get(phase, 0.0)
    return 1000 * seconds / p.facts


def per_round(passes: dict[str, list[Any]], phase: str | None = None) -> dict[str, list[float]]:
    """Each arm's ms per fact (or ``phase``'s), one value per round of :func:`cleared_passes`."""
    return {arm: [ms_per_fact(p, phase) for p in ps] for arm, ps in passes.items()}


def cleared_passes(
    arms: dict[str, Callable[[], Any]], rounds: int, label: str, phase: str
) -> dict[str, list[Any]]:
    """Interleaved rounds of each arm's pass (a ``bench_gate.Pass``), the gate's memo caches
    cleared before each, so every arm pays the parser; a line per pass with its ms per fact and
    ``phase``'s. The one-store A/B scripts (bench_parse, bench_judge) share it."""
    from _common import interleaved

    passes: dict[str, list[Any]] = {arm: [] for arm in arms}
    for r, order in interleaved(list(arms), rounds):
        for arm in order:
            clear_gate_caches()
            p = arms[arm]()
            passes[arm].append(p)
            print(
                f"  {label} round {r + 1} {arm}: {ms_per_fact(p):.1f} ms/fact, "
                f"{phase} {ms_per_fact(p, phase):.2f}",
                flush=True,
            )
    return passes


class SpacyClock:
    """Seconds spent inside spaCy ``Language.__call__`` and ``Language.pipe`` (0 when the tree
    never imports spaCy); ``calls`` counts the texts parsed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._installed = False

    def install(self) -> None:
        if "spacy" not in sys.modules or self._installed:
            return
        from spacy.language import Language

        original: Callable[..., Any] = Language.__call__
        clock = self

        def timed(nlp: Any, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(nlp, *args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - t0
                clock.calls += 1

        piped: Callable[..., Any] = Language.pipe

        def timed_pipe(nlp: Any, *args: Any, **kwargs: Any) -> Any:
            docs = piped(nlp, *args, **kwargs)
            while True:  # the parsing happens as the generator is drawn on
                t0 = time.perf_counter()
                try:
                    doc = next(docs)
                except StopIteration:
                    return
                finally:
                    clock.seconds += time.perf_counter() - t0
                clock.calls += 1
                yield doc

        Language.__call__ = timed  # type: ignore[method-assign,assignment]
        Language.pipe = timed_pipe  # type: ignore[method-assign,assignment]
        self._installed = True


def worker(args: argparse.Namespace) -> int:
    """Ingest (``--prepare``) or measure one round of one tree; writes JSON to ``--result``."""
    from _common import Corpus
    from bench_gate import Scenario, ingest, load_memgate, memgate_pass

    import engine
    from engine.gate.gate import Gate
    from engine.index import IndexManager, IndexSettings
    from engine.store import SQLiteStore
    from engine.types import Fact

    where = Path(engine.__file__).resolve().parent
    tree = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0] or ROOT  # run_side's
    want = Path(tree).resolve() / "engine"
    if where != want:
        raise SystemExit(f"worker imported {where}, not its tree's {want}")
    out: dict[str, Any] = {"engine": str(where), "sizes": {}}
    t0 = time.perf_counter()
    embedder, scorers = load_memgate(Path(args.cache_dir), args.threads)
    out["load_s"] = round(time.perf_counter() - t0, 2)
    wanted = {"deberta": "deberta-v3-small int8", "aegis": "aegis int8"}
    scorers = {k: scorers[wanted[k]] for k in args.models.split(",")}
    corpus = Corpus(args.seed)
    clock = SpacyClock()
    for n in (int(x) for x in args.sizes.split(",")):
        sc = Scenario(f"N = {n:,}", 1, n)
        db = Path(args.stores) / f"n{n}" / "memgate.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        store = SQLiteStore(db)
        index = IndexManager(store.iter_active_embeddings, IndexSettings(threads=1))
        gates = {k: Gate(store, index, embedder, nli) for k, nli in scorers.items()}
        first = next(iter(gates.values()))
        if args.prepare:
            slots, secs = ingest(first, sc, corpus, 1000)
            out["sizes"][str(n)] = {"ingest_s": round(secs, 2), "memories": len(slots)}
            store.close()
            continue
        slots = []
        for ns in sc.names():  # the same slots ingest stored: the corpus is deterministic
            slots.extend(corpus.memories(sc.per_namespace, namespace=ns))
        incoming = corpus.incoming(slots, args.facts, salt=sc.memories)
        facts = [Fact(f.namespace, f.text) for f in incoming]
        memgate_pass(first, facts, args.batch)  # cold: indexes load, spaCy loads (new)
        clock.install()
        rec: dict[str, Any] = {}
        for key, gate in gates.items():
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
            for _ in range(args.passes):
                clear_gate_caches()
                s0, c0 = clock.seconds, clock.calls
                p = memgate_pass(gate, facts, args.batch)
                runs["uncached"].append(
                    {
                        "s_per_fact": p.seconds / p.facts,
                        "cpu_s_per_fact": p.cpu_seconds / p.facts,
                        "spacy_s_per_fact": (clock.seconds - s0) / p.facts,
                        "spacy_calls_per_fact": (clock.calls - c0) / p.facts,
                        "phases_s": dict(p.phases),
                        "pairs_per_fact": p.pairs / p.facts,
                        "actions": dict(p.actions),
                    }
                )
                p = memgate_pass(gate, facts, args.batch)
                runs["cached"].append(
                    {"s_per_fact": p.seconds / p.facts, "cpu_s_per_fact": p.cpu_seconds / p.facts}
                )
            rec[key] = runs
        out["sizes"][str(n)] = rec
        store.close()
    Path(args.result).write_text(json.dumps(out))
    return 0


# -- orchestrator -----------------------------------------------------------------------------
def git(*cmd: str, cwd: Path = ROOT) -> str:
    res = subprocess.run(["git", *cmd], cwd=cwd, capture_output=True, text=True, check=True)
    return res.stdout.strip()


def default_against() -> tuple[str, str]:
    """The first parent of the newest merge whose subject names gate-v2."""
    line = git("log", "--merges", "--format=%H %s", "-i", "--grep=gate-v2", "-n", "1")
    if not line:
        raise SystemExit("no gate-v2 merge in this history: pass --against REV")
    merge, subject = line.split(" ", 1)
    return git("rev-parse", f"{merge}^1"), f"first parent of {merge[:10]} ({subject[:60]})"


def run_side(
    tree: Path, cache: Path, stores: Path, args: argparse.Namespace, prepare: bool, log: Path
) -> dict[str, Any]:
    result = stores / "result.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--threads",
        str(args.threads),
        "--seed",
        str(args.seed),
        "--cache-dir",
        str(cache),
        "--stores",
        str(stores),
        "--result",
        str(result),
        "--sizes",
        args.sizes,
        "--models",
        args.models,
        "--facts",
        str(args.facts),
        "--batch",
        str(args.batch),
        "--passes",
        str(args.passes),
    ] + (["--prepare"] if prepare else [])
    env = {**os.environ, "PYTHONPATH": str(tree), "MEMGATE_HOME": str(cache)}
    with log.open("a") as fh:
        fh.write(f"\n$ PYTHONPATH={tree} {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed in {tree} (rc {proc.returncode}): see {log}")
    data: dict[str, Any] = json.loads(result.read_text())
    result.unlink()
    return data


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def summarise(
    rounds: list[dict[str, Any]], sizes: list[str], models: list[str]
) -> list[dict[str, Any]]:
    """Per size and model: per-fact medians of each side and mode, and the new / old ratios."""
    rows = []
    for n in sizes:
        for model in models:
            row: dict[str, Any] = {"memories": int(n), "model": model}
            per_round: dict[str, list[float]] = {}
            for side in SIDES:
                for mode in MODES:
                    vals = [
                        statistics.median(p["s_per_fact"] for p in r[side]["sizes"][n][model][mode])
                        for r in rounds
                    ]
                    per_round[f"{side}_{mode}"] = vals
                    row[f"{side}_{mode}_ms"] = {k: v * 1000 for k, v in spread(vals).items()}
                    row[f"{side}_{mode}_ms"]["n"] = len(vals)
            for mode in MODES:
                ratios = [
                    new / old
                    for new, old in zip(
                        per_round[f"new_{mode}"], per_round[f"old_{mode}"], strict=True
                    )
                ]
                row[f"ratio_{mode}"] = spread(ratios)
                cpu = {
                    sd: [
                        statistics.median(
                            p["cpu_s_per_fact"] for p in r[sd]["sizes"][n][model][mode]
                        )
                        for r in rounds
                    ]
                    for sd in SIDES
                }
                row[f"ratio_{mode}_cpu"] = spread(
                    [a / b for a, b in zip(cpu["new"], cpu["old"], strict=True)]
                )
            new_runs = [p for r in rounds for p in r["new"]["sizes"][n][model]["uncached"]]
            spacy = statistics.median(p["spacy_s_per_fact"] for p in new_runs)
            new_unc = statistics.median(per_round["new_uncached"])
            new_cac = statistics.median(per_round["new_cached"])
            row["parser"] = {
                "spacy_ms_per_fact": spacy * 1000,
                "spacy_share": spacy / new_unc if new_unc else None,
                "spacy_calls_per_fact": statistics.median(
                    p["spacy_calls_per_fact"] for p in new_runs
                ),
                "uncached_minus_cached_ms": (new_unc - new_cac) * 1000,
                "uncached_minus_cached_share": (new_unc - new_cac) / new_unc if new_unc else None,
            }
            row["pairs_per_fact"] = {
                side: statistics.median(
                    p["pairs_per_fact"]
                    for r in rounds
                    for p in r[side]["sizes"][n][model]["uncached"]
                )
                for side in SIDES
            }
            row["met"] = row["ratio_uncached"]["median"] <= TARGET
            rows.append(row)
    return rows


def draw(plt: Any, rows: list[dict[str, Any]], title: str) -> Any:
    """The per-fact bars of both trees, ratio above each group (for ``save_results``)."""
    fig, ax = plt.subplots(figsize=(10, 4.8))
    labels = [f"N={r['memories']:,}\n{r['model']}" for r in rows]
    width = 0.2
    series = [
        ("old, uncached", "old_uncached_ms", "#7f8c8d"),
        ("new, uncached (parser included)", "new_uncached_ms", "#c0392b"),
        ("old, cached", "old_cached_ms", "#bdc3c7"),
        ("new, cached", "new_cached_ms", "#e6b0aa"),
    ]
    for i, (label, key, colour) in enumerate(series):
        xs = [j + (i - 1.5) * width for j in range(len(rows))]
        med = [r[key]["median"] for r in rows]
        err = [
            [r[key]["median"] - r[key]["min"] for r in rows],
            [r[key]["max"] - r[key]["median"] for r in rows],
        ]
        ax.bar(xs, med, width, yerr=err, capsize=3, label=label, color=colour)
    highest = 0.0
    for j, r in enumerate(rows):
        top = max(r[k]["max"] for _, k, _ in series)
        highest = max(highest, top)
        ax.text(j, top * 1.04, f"{r['ratio_uncached']['median']:.2f}x", ha="center", fontsize=9)
    ax.set_ylim(0, highest * 1.15)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("ms per fact (median over rounds, min-max bars)")
    ax.set_title(f"new / old per fact above the bars; target <= {TARGET:g}x", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from _common import add_common_args

    add_common_args(parser)
    parser.add_argument("--against", default=None, help="older revision (default: pre-gate-v2)")
    parser.add_argument(
        "--new", default=None, help="newer revision (default: this checkout's working tree)"
    )
    parser.add_argument(
        "--against-cache-dir",
        type=Path,
        default=None,
        help="MEMGATE_HOME for the older tree, if its manifest check refuses --cache-dir's",
    )
    parser.add_argument("--rounds", type=int, default=None, help="old/new rounds (4; quick 2)")
    parser.add_argument("--facts", type=int, default=None, help="M facts (200; quick 100)")
    parser.add_argument("--passes", type=int, default=None, help="timed passes per round (2/1)")
    parser.add_argument("--batch", type=int, default=100, help="facts per triage call")
    parser.add_argument("--sizes", default="1000,10000", help="N values, comma-separated")
    parser.add_argument("--models", default="deberta,aegis", help="deberta and/or aegis")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stores", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.models = "300", "aegis"
        defaults = (1, 10, 1)
    elif args.quick:
        defaults = (2, 100, 1)
    else:
        defaults = (4, 200, 2)
    args.rounds = args.rounds or defaults[0]
    args.facts = args.facts or defaults[1]
    args.passes = args.passes or defaults[2]
    bad = set(args.models.split(",")) - {"deberta", "aegis"}
    if bad:
        parser.error(f"--models: unknown {sorted(bad)}")
    if args.worker:
        return worker(args)

    from _common import run_header, save_results, table, utc_stamp

    cache = Path(args.cache_dir)
    old_cache = Path(args.against_cache_dir or cache)
    if args.against:
        old_rev, why = git("rev-parse", args.against), f"--against {args.against}"
    else:
        old_rev, why = default_against()
    work = Path(tempfile.mkdtemp(prefix="memgate-cost-"))
    trees = {"old": work / "old-tree", "new": ROOT}
    new_rev = git("rev-parse", args.new) if args.new else git("rev-parse", "HEAD")
    result = run_header(NAME, args)
    m = result["machine"]
    log = Path(args.out) / f"{NAME}-{utc_stamp()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"{NAME}: {m['cpu']} ({m['usable_cores']} cores), load {m['load_average_at_start']}\n"
        f"  old = {old_rev[:10]} ({why})\n"
        f"  new = {new_rev[:10]}{'' if args.new else ' + working tree'}\n"
        f"  N = {args.sizes}; models {args.models}; M = {args.facts} in batches of {args.batch};"
        f" {args.rounds} rounds x {args.passes} pass(es); {args.threads} threads; log {log}",
        flush=True,
    )
    try:
        git("worktree", "add", "--detach", str(trees["old"]), old_rev)
        if args.new:
            trees["new"] = work / "new-tree"
            git("worktree", "add", "--detach", str(trees["new"]), new_rev)
        caches = {"old": old_cache, "new": cache}
        prep: dict[str, Any] = {}
        for side in SIDES:
            t0 = time.perf_counter()
            prep[side] = run_side(trees[side], caches[side], work / side, args, True, log)
            print(f"  {side}: stores ingested in {time.perf_counter() - t0:.0f} s", flush=True)
        rounds: list[dict[str, Any]] = []
        for i in range(args.rounds):
            rnd: dict[str, Any] = {}
            for side in SIDES:
                t0 = time.perf_counter()
                rnd[side] = run_side(trees[side], caches[side], work / side, args, False, log)
                took = time.perf_counter() - t0
                brief = ", ".join(
                    f"N={int(n):,} {k} "
                    f"{1000 * statistics.median(p['s_per_fact'] for p in v['uncached']):.1f} ms"
                    for n, per in rnd[side]["sizes"].items()
                    for k, v in per.items()
                )
                print(f"  round {i + 1} {side}: {brief} ({took:.0f} s)", flush=True)
            rounds.append(rnd)
    finally:
        for side in SIDES:
            if trees[side] != ROOT and trees[side].exists():
                git("worktree", "remove", "--force", str(trees[side]))
        shutil.rmtree(work, ignore_errors=True)

    sizes = args.sizes.split(",")
    models = args.models.split(",")
    rows = summarise(rounds, sizes, models)

    def cell(r: dict[str, Any], key: str) -> str:
        s = r[key]
        return f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})"

    def ratio(r: dict[str, Any], key: str) -> str:
        s = r[key]
        return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"

    print()
    print(
        table(
            [
                "N",
                "NLI",
                "old ms/fact",
                "new ms/fact",
                "new / old",
                "met",
                "CPU new / old",
                "spaCy",
                "pairs o/n",
            ],
            [
                [
                    f"{r['memories']:,}",
                    r["model"],
                    cell(r, "old_uncached_ms"),
                    cell(r, "new_uncached_ms"),
                    ratio(r, "ratio_uncached"),
                    "yes" if r["met"] else "NO",
                    ratio(r, "ratio_uncached_cpu"),
                    f"{r['parser']['spacy_ms_per_fact']:.1f} ms ({r['parser']['spacy_share']:.0%})",
                    "{old:.1f} / {new:.1f}".format(**r["pairs_per_fact"]),
                ]
                for r in rows
            ],
            title=f"Per fact, parser included (memo caches cleared before each pass); "
            f"median (min-max) over {args.rounds} rounds; target new / old <= {TARGET:g}x",
        )
    )
    print()
    print(
        table(
            ["N", "NLI", "old ms/fact", "new ms/fact", "new / old", "caches save (new)"],
            [
                [
                    f"{r['memories']:,}",
                    r["model"],
                    cell(r, "old_cached_ms"),
                    cell(r, "new_cached_ms"),
                    ratio(r, "ratio_cached"),
                    f"{r['parser']['uncached_minus_cached_ms']:.1f} ms "
                    f"({r['parser']['uncached_minus_cached_share']:.0%})",
                ]
                for r in rows
            ],
            title="Per fact, caches warm (the same facts again, as bench_gate's warm pass)",
        )
    )
    print(
        "  CPU new / old = the same ratio on the process's CPU time (less sensitive to other "
        "processes on a shared machine);\n  spaCy = time inside spaCy's Language.__call__ in "
        "the new tree's uncached passes "
        "(share of its per-fact time);\n  caches save = new uncached - new cached (spaCy plus "
        "claim extraction and canonicalisation)."
    )
    met = all(r["met"] for r in rows)
    print(f"  target new / old <= {TARGET:g}x at every N and model: {'met' if met else 'NOT met'}")
    result["revisions"] = {
        "old": old_rev,
        "old_why": why,
        "new": new_rev,
        "new_working_tree": not args.new,
        "caches": {k: str(v) for k, v in caches.items()},
    }
    result["prepare"] = prep
    result["rounds"] = rounds
    result["rows"] = rows
    result["target"] = {"ratio": TARGET, "met": met}
    title = (
        f"{m['cpu']}, {args.threads} threads, M = {args.facts}, old {old_rev[:10]} vs new "
        f"{new_rev[:10]}, {args.rounds} rounds"
    )
    save_results(Path(args.out), NAME, result, lambda plt: draw(plt, rows, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
