"""Model stage budgets (issue 34): item-count merging against token-budget merging, same run.

Lanes call the NLI model through one :class:`~engine.core.stage.ModelStage`, as the engine's
lanes do: ``--long-lanes`` lanes each send calls of ``--long-pairs`` long pairs (the premise a
paragraph, truncated at the model's 160 tokens), while ``--short-lanes`` lanes send calls of
``--short-pairs`` short, memory-like pairs (~25 tokens) in a closed loop until the long lanes
are done. Three arms, interleaved (A B, B A, ...) for ``--rounds`` rounds, medians reported:

* ``items``: the stage before this change: a lane's call in pieces of 64 pairs, merged calls
  of at most 256 pairs, whatever their length;
* ``tokens``: the shipped ``StageSettings`` (pieces of 2,048 pair tokens, merged calls of
  4,096; the item caps stay as safety bounds);
* ``tokens/2``: half of each (1,024 / 2,048), to show what a tighter budget trades.

Figures: pairs/s and pair tokens/s over the whole run, and the p50 / p99 latency of the short
calls (the ones that wait behind the long ones). A calibration first times 32 short and 32
long pairs alone, to show that a pair's cost follows its tokens, not its count, and records
the padded / real token ratio of the merged calls (the runtime sorts and buckets by length).

``--passes`` measures instead how the runtime cuts a merged call into forward passes
(``BatchSettings.length_split``): ``greedy`` fills each pass to the sub-batch in length order
(before), ``split`` cuts where the pass cost model says two passes cost less than padding
(:func:`engine.runtime.base.plan_passes`). Both run the shipped stage budget on three
workloads, arms interleaved per round: ``mixed`` (the lanes above: long calls beside short
calls, merged), ``short`` (every lane sends short pairs: lengths within a few tokens) and
``long`` (long calls only). Figures: padded / real tokens, pairs/s, pair tokens/s, and the
short calls' p50 / p99 where there are short calls.

Prints a table; writes JSON and a PNG to ``--out`` (default benchmarks/results/).

    MEMGATE_HOME=/root/.cache/memgate python benchmarks/bench_stage_budget.py --quick
    MEMGATE_HOME=/root/.cache/memgate python benchmarks/bench_stage_budget.py --quick --passes
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    add_common_args,
    interleaved,
    pyplot,
    run_header,
    shared_machine_note,
    table,
    utc_stamp,
    write_json,
)

from engine.core.stage import CHUNK, MERGE, Budget, ModelStage, Staged, StageSettings  # noqa: E402
from engine.runtime.base import BatchSettings  # noqa: E402
from engine.runtime.manifest import load_manifest  # noqa: E402
from engine.runtime.nli import NLIScorer  # noqa: E402
from engine.runtime.session import SessionSettings  # noqa: E402

NAME = "bench_stage_budget"
HUGE = 1 << 24
ARMS: dict[str, StageSettings] = {
    "items": StageSettings(
        nli=Budget(tokens=HUGE, chunk_tokens=HUGE, items=MERGE, chunk_items=CHUNK)
    ),
    "tokens": StageSettings(),
    "tokens/2": StageSettings(nli=Budget(tokens=2048, chunk_tokens=1024)),
}

_PEOPLE = ("Alice", "Bob", "Carmen", "Dmitri", "Emeka", "Fatima", "Grace", "Hiro")
_THINGS = ("tea", "coffee", "the Pro plan", "Berlin", "a bakery", "the night shift", "chess")
_VERBS = ("likes", "moved to", "switched to", "works at", "prefers", "gave up")


def short_pair(rng: random.Random) -> tuple[str, str]:
    p, q = rng.choice(_PEOPLE), rng.choice(_PEOPLE)
    return (
        f"{p} {rng.choice(_VERBS)} {rng.choice(_THINGS)} in {rng.randint(2001, 2025)}.",
        f"{q} {rng.choice(_VERBS)} {rng.choice(_THINGS)}.",
    )


def long_pair(rng: random.Random) -> tuple[str, str]:
    premise = " ".join(
        f"In {rng.randint(2001, 2025)} {rng.choice(_PEOPLE)} {rng.choice(_VERBS)} "
        f"{rng.choice(_THINGS)} after a long talk with {rng.choice(_PEOPLE)} about work."
        for _ in range(14)
    )
    return premise, short_pair(rng)[1]


def run_arm(
    nli: NLIScorer,
    settings: StageSettings,
    long_calls: list[list[tuple[str, str]]],
    short_pool: list[list[tuple[str, str]]],
    short_lanes: int,
    long_lanes: int,
) -> dict[str, Any]:
    stage = ModelStage(settings)
    staged = Staged(nli, stage)
    before = (nli.totals.real_tokens, nli.totals.padded_tokens, nli.totals.batches)
    done = threading.Event()
    lock = threading.Lock()
    short_lat: list[float] = []
    pairs = [0]

    def count(call: list[tuple[str, str]]) -> None:
        with lock:
            pairs[0] += len(call)

    def long_lane(calls: list[list[tuple[str, str]]]) -> None:
        for call in calls:
            staged.score(call)
            count(call)

    def short_lane(k: int) -> None:
        i = k
        while not done.is_set():
            call = short_pool[i % len(short_pool)]
            t0 = time.perf_counter()
            staged.score(call)
            dt = time.perf_counter() - t0
            with lock:
                short_lat.append(dt)
            count(call)
            i += short_lanes

    long_threads = [
        threading.Thread(target=long_lane, args=(long_calls[i::long_lanes],))
        for i in range(long_lanes)
    ]
    shorts = [threading.Thread(target=short_lane, args=(k,)) for k in range(short_lanes)]
    t0 = time.perf_counter()
    for t in shorts + long_threads:
        t.start()
    for t in long_threads:
        t.join()
    done.set()
    for t in shorts:
        t.join()
    wall = time.perf_counter() - t0
    stage.close()
    real = nli.totals.real_tokens - before[0]
    padded = nli.totals.padded_tokens - before[1]
    lat = sorted(short_lat)
    return {
        "wall_s": wall,
        "pairs": pairs[0],
        "pairs_per_s": pairs[0] / wall,
        "tokens_per_s": real / wall,
        "padded_over_real": padded / real if real else None,
        "passes": nli.totals.batches - before[2],
        "model_calls": stage.forwards,
        "merged": stage.merged,
        "short_calls": len(lat),
        "short_p50_s": statistics.median(lat) if lat else None,
        "short_p99_s": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
        "short_max_s": lat[-1] if lat else None,
    }


def calibrate(nli: NLIScorer, short: list[Any], long: list[Any], reps: int) -> dict[str, Any]:
    """Seconds per pair and per pair token of 32 short and 32 long pairs, alone (best rep)."""
    out: dict[str, Any] = {}
    for name, pairs in (("short", short), ("long", long)):
        tok = sum(len(e.ids) for e in nli.encode(pairs))
        best = min(_timed(nli, pairs) for _ in range(reps))
        out[name] = {
            "pairs": len(pairs),
            "tokens_per_pair": tok / len(pairs),
            "ms_per_pair": 1000 * best / len(pairs),
            "us_per_token": 1e6 * best / tok,
        }
    out["long_over_short_per_pair"] = out["long"]["ms_per_pair"] / out["short"]["ms_per_pair"]
    out["long_over_short_per_token"] = out["long"]["us_per_token"] / out["short"]["us_per_token"]
    return out


def _timed(nli: NLIScorer, pairs: list[Any]) -> float:
    t0 = time.perf_counter()
    nli.score(pairs)
    return time.perf_counter() - t0


def _cpu_model() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return "unknown"
    for line in text.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def fixed_calls(
    nli: NLIScorer, arms: dict[str, bool], rng: random.Random, reps: int
) -> dict[str, Any]:
    """One thread, no stage: fixed merged-like calls, each arm's best of ``reps`` interleaved
    (other processes only ever slow a rep down, so the best is the steadiest figure)."""
    sub = nli.max_batch
    shapes = {
        f"4 short + {sub - 4} long": (4, sub - 4),
        f"{sub // 2} short + {sub + sub // 2} long": (sub // 2, sub + sub // 2),
        f"{2 * sub} short": (2 * sub, 0),
        f"{sub} long": (0, sub),
    }
    out: dict[str, Any] = {}
    rows = []
    for name, (n_short, n_long) in shapes.items():
        pairs = [short_pair(rng) for _ in range(n_short)] + [long_pair(rng) for _ in range(n_long)]
        rng.shuffle(pairs)
        best: dict[str, float] = {}
        cut: dict[str, Any] = {}
        for rep in range(reps):
            for arm in arms if rep % 2 == 0 else list(arms)[::-1]:
                nli.batching = dataclasses.replace(nli.batching, length_split=arms[arm])
                prepared = nli.preprocess(pairs)
                cut[arm] = {
                    "passes": [len(b.index) for b in prepared.buckets],
                    "padded_over_real": prepared.stats.padded_tokens / prepared.stats.real_tokens,
                }
                best[arm] = min(best.get(arm, float("inf")), _timed(nli, pairs))
        out[name] = {
            "best_s": best,
            "cut": cut,
            "greedy_over_split": best["greedy"] / best["split"],
        }
        rows += [
            [
                name,
                arm,
                " ".join(map(str, cut[arm]["passes"])),
                f"{cut[arm]['padded_over_real']:.3f}",
                f"{1000 * best[arm]:.0f}",
                f"{len(pairs) / best[arm]:.1f}",
            ]
            for arm in arms
        ]
        print(f"  {name}: greedy / split time {out[name]['greedy_over_split']:.2f}x", flush=True)
    print(
        table(
            ["call", "arm", "passes", "padded/real", "ms", "pairs/s"],
            rows,
            f"fixed calls, one thread, best of {reps} interleaved reps",
        )
    )
    return out


def _fmt(key: str, value: float | None) -> Any:
    if value is None:
        return "-"
    return f"{value:.3f}" if key.endswith(("_s", "over_real")) else value


def run_passes(
    nli: NLIScorer,
    args: argparse.Namespace,
    rounds: int,
    long_calls: list[list[tuple[str, str]]],
    short_pool: list[list[tuple[str, str]]],
    header: dict[str, Any],
    cpu: str,
    load_start: list[float],
) -> int:
    """Greedy against split forward passes on three workloads, same run, interleaved."""
    rng = random.Random(args.seed + 1)
    short_long = [[short_pair(rng) for _ in range(len(c))] for c in long_calls]
    workloads: dict[str, tuple[list[list[tuple[str, str]]], int]] = {
        "mixed": (long_calls, args.short_lanes),
        "short": (short_long, args.short_lanes),
        "long": (long_calls, 0),
    }
    arms = {"greedy": False, "split": True}
    calls = fixed_calls(nli, arms, rng, 3 if args.smoke else 2 * rounds + 1)
    settings = StageSettings()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {a: [] for a in arms} for w in workloads}
    for r, order in interleaved(list(arms), rounds):
        for work, (calls, short_lanes) in workloads.items():
            for arm in order:
                nli.batching = dataclasses.replace(nli.batching, length_split=arms[arm])
                res = run_arm(nli, settings, calls, short_pool, short_lanes, args.long_lanes)
                res["round"] = r
                res["load_average"] = round(os.getloadavg()[0], 2)
                runs[work][arm].append(res)
                p99 = res["short_p99_s"]
                print(
                    f"  round {r} {work:>5} {arm:>6}: {res['pairs_per_s']:.1f} pairs/s, "
                    f"padded/real {res['padded_over_real']:.3f}, {res['passes']} passes, short p99 "
                    f"{'-' if p99 is None else f'{p99:.3f}s'}, load {res['load_average']}",
                    flush=True,
                )
    keys = (
        "padded_over_real",
        "passes",
        "pairs_per_s",
        "tokens_per_s",
        "short_p50_s",
        "short_p99_s",
    )

    def med(rs: list[dict[str, Any]], k: str) -> float | None:
        xs = [x[k] for x in rs if x[k] is not None]
        return statistics.median(xs) if xs else None

    medians = {
        w: {a: {k: med(rs, k) for k in keys} for a, rs in ar.items()} for w, ar in runs.items()
    }
    print(
        table(
            [
                "workload",
                "arm",
                "padded/real",
                "passes",
                "pairs/s",
                "tokens/s",
                "short p50 s",
                "short p99 s",
            ],
            [[w, a, *(_fmt(k, medians[w][a][k]) for k in keys)] for w in workloads for a in arms],
            f"forward passes, medians of {rounds} interleaved rounds (sub-batch {nli.max_batch})",
        )
    )
    summary: dict[str, dict[str, Any]] = {}
    for w in workloads:
        paired = list(zip(runs[w]["greedy"], runs[w]["split"], strict=True))
        speed = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in paired]
        summary[w] = {
            "tokens_per_s_split_over_greedy": statistics.median(speed),
            "per_round": speed,
        }
        print(
            f"  {w}: pair tokens/s split / greedy {statistics.median(speed):.2f}x "
            f"(rounds {', '.join(f'{x:.2f}' for x in speed)})"
        )
    load_end = [round(x, 2) for x in os.getloadavg()]
    print(f"  load average at start {load_start}, at end {load_end}")
    note = shared_machine_note()
    if note:
        print(note)
    stamp = utc_stamp()
    payload = {
        **header,
        "mode": "passes",
        "cpu_model": cpu,
        "load_average_at_start": load_start,
        "load_average_at_end": load_end,
        "sub_batch": nli.max_batch,
        "batching": {k: v for k, v in vars(nli.batching).items() if k != "length_split"},
        "calls": calls,
        "runs": runs,
        "medians": medians,
        "summary": summary,
    }
    path = write_json(args.out, f"{NAME}-passes", payload, stamp)
    print(f"  wrote {path}")
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
        for ax, key, label in (
            (axes[0], "padded_over_real", "padded / real tokens (lower is better)"),
            (axes[1], "tokens_per_s", "pair tokens/s (higher is better)"),
        ):
            for i, w in enumerate(workloads):
                for j, a in enumerate(arms):
                    x = i * 3 + j
                    ys = [r[key] for r in runs[w][a]]
                    ax.scatter([x] * len(ys), ys, color="grey", s=12, zorder=3)
                    ax.bar(x, medians[w][a][key], color=("#999999", "#3a7bd5")[j], width=0.8)
            ax.set_xticks(
                [i * 3 + j for i in range(len(workloads)) for j in range(2)],
                [f"{w}\n{a}" for w in workloads for a in arms],
                fontsize=7,
            )
            ax.set_title(label, fontsize=9)
        fig.suptitle(
            f"NLI forward passes: greedy vs split, {cpu}, load {load_start[0]}", fontsize=9
        )
        fig.tight_layout()
        png = Path(args.out) / f"{NAME}-passes-{stamp}.png"
        fig.savefig(png, dpi=110)
        print(f"  wrote {png}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_args(parser)
    parser.add_argument("--model", default="aegis-nli/int8", help="NLI artefact (name/variant)")
    parser.add_argument("--sub-batch", type=int, default=16, help="pairs per forward pass")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved A/B rounds")
    parser.add_argument("--long-lanes", type=int, default=2)
    parser.add_argument("--long-pairs", type=int, default=64, help="pairs of a long call")
    parser.add_argument("--long-calls", type=int, default=None, help="long calls per run")
    parser.add_argument("--short-lanes", type=int, default=2)
    parser.add_argument("--short-pairs", type=int, default=4, help="pairs of a short call")
    parser.add_argument(
        "--passes", action="store_true", help="greedy against split forward passes instead"
    )
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.smoke else 3 if args.quick else 5)
    long_calls_n = args.long_calls or (1 if args.smoke else 2 if args.quick else 4)
    long_pairs = 8 if args.smoke else args.long_pairs
    header = run_header(NAME, args)
    cpu = _cpu_model()
    load_start = [round(x, 2) for x in os.getloadavg()]

    manifest = load_manifest(args.cache_dir / "models" / args.model)
    nli = NLIScorer(
        manifest,
        SessionSettings(intra_op_threads=args.threads),
        BatchSettings(max_batch=args.sub_batch),
    )
    nli.warmup()
    rng = random.Random(args.seed)
    long_calls = [[long_pair(rng) for _ in range(long_pairs)] for _ in range(long_calls_n)]
    short_pool = [[short_pair(rng) for _ in range(args.short_pairs)] for _ in range(64)]
    print(f"{NAME}: {manifest.describe()}, sub-batch {nli.max_batch}; CPU {cpu}")
    print(f"  load average at start {load_start}", flush=True)
    if args.passes:
        return run_passes(nli, args, rounds, long_calls, short_pool, header, cpu, load_start)

    cal = calibrate(
        nli,
        [short_pair(rng) for _ in range(32)],
        [long_pair(rng) for _ in range(32)],
        1 if args.smoke else 3,
    )
    print(
        table(
            ["pairs", "tokens/pair", "ms/pair", "us/token"],
            [
                [
                    name,
                    cal[name]["tokens_per_pair"],
                    cal[name]["ms_per_pair"],
                    cal[name]["us_per_token"],
                ]
                for name in ("short", "long")
            ],
            "calibration: 32 pairs alone (best of reps)",
        )
    )
    print(
        f"  long / short: {cal['long_over_short_per_pair']:.2f}x per pair, "
        f"{cal['long_over_short_per_token']:.2f}x per token",
        flush=True,
    )

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ARMS}
    for r, order in interleaved(list(ARMS), rounds):
        for name in order:
            res = run_arm(
                nli, ARMS[name], long_calls, short_pool, args.short_lanes, args.long_lanes
            )
            res["round"] = r
            runs[name].append(res)
            print(
                f"  round {r} {name:>6}: {res['pairs_per_s']:.1f} pairs/s, short p99 "
                f"{res['short_p99_s']:.3f}s ({res['short_calls']} short calls, "
                f"{res['model_calls']} model calls)",
                flush=True,
            )

    keys = (
        "pairs_per_s",
        "tokens_per_s",
        "short_p50_s",
        "short_p99_s",
        "model_calls",
        "padded_over_real",
    )
    medians = {
        name: {k: statistics.median(x[k] for x in rs if x[k] is not None) for k in keys}
        for name, rs in runs.items()
    }
    print(
        table(
            ["arm", "pairs/s", "tokens/s", "short p50 s", "short p99 s", "model calls", "pad/real"],
            [[name, *(medians[name][k] for k in keys)] for name in ARMS],
            f"medians of {rounds} interleaved rounds ({args.long_lanes} long lanes x "
            f"{long_pairs}-pair calls, {args.short_lanes} short lanes x {args.short_pairs} pairs)",
        )
    )
    # Paired per-round ratios against the item-count arm: the load of a shared machine moves
    # every arm of a round alike, so these are steadier than the medians above.
    summary: dict[str, dict[str, Any]] = {}
    for name in list(ARMS)[1:]:
        paired = list(zip(runs["items"], runs[name], strict=True))
        p99 = [a["short_p99_s"] / b["short_p99_s"] for a, b in paired]
        tps = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in paired]
        summary[name] = {
            "short_p99_items_over_arm": statistics.median(p99),
            "short_p99_ratio_per_round": p99,
            "tokens_per_s_arm_over_items": statistics.median(tps),
            "tokens_per_s_ratio_per_round": tps,
        }
        print(
            f"  {name}: short-call p99 items / {name} {statistics.median(p99):.2f}x "
            f"(rounds {', '.join(f'{x:.2f}' for x in p99)}); tokens/s {name} / items "
            f"{statistics.median(tps):.2f}x (rounds {', '.join(f'{x:.2f}' for x in tps)})"
        )
    counts = [x["short_calls"] for rs in runs.values() for x in rs]
    print(
        f"  short calls per run: {min(counts)}-{max(counts)} (with fewer than 100, the p99 is "
        "the slowest call)"
    )
    note = shared_machine_note()
    if note:
        print(note)
    stamp = utc_stamp()
    payload = {
        **header,
        "cpu_model": cpu,
        "load_average_at_start": load_start,
        "model": manifest.describe(),
        "sub_batch": nli.max_batch,
        "arms": {name: {"nli": vars(s.nli)} for name, s in ARMS.items()},
        "calibration": cal,
        "runs": runs,
        "medians": medians,
        "summary": summary,
    }
    path = write_json(args.out, NAME, payload, stamp)
    print(f"  wrote {path}")
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
        names = list(ARMS)
        for ax, key, label in (
            (axes[0], "tokens_per_s", "pair tokens/s (higher is better)"),
            (axes[1], "short_p99_s", "short-call p99 latency, s (lower is better)"),
        ):
            for i, name in enumerate(names):
                ys = [x[key] for x in runs[name]]
                ax.scatter([i] * len(ys), ys, color="grey", s=12, zorder=3)
                ax.bar(
                    i, medians[name][key], color=("#999999", "#3a7bd5", "#8fb3e8")[i % 3], width=0.6
                )
            ax.set_xticks(range(len(names)), [f"{n} budget" for n in names])
            ax.set_title(label, fontsize=9)
        fig.suptitle(
            f"NLI stage merging: {manifest.name}/{manifest.variant}, {cpu}, load {load_start[0]}",
            fontsize=9,
        )
        fig.tight_layout()
        png = Path(args.out) / f"{NAME}-{stamp}.png"
        fig.savefig(png, dpi=110)
        print(f"  wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
