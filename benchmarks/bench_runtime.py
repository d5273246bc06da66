"""Runtime benchmark: ONNX Runtime embedder and NLI scorer against PyTorch, in the same run.

Measures, on synthetic memory-like sentences (8-30 words) and (memory, incoming fact) pairs:

1. **Embeddings/s** at batch sizes 1, 8, 32, 128: MiniLM ``fp32``, ``optimized`` (the offline
   O2-fused graph) and ``int8`` under ONNX Runtime, and sentence-transformers'
   ``SentenceTransformer.encode`` on the same real weights (PyTorch).
2. **NLI pairs/s** at the same batch sizes: nli-deberta-v3-small ``fp32`` with ONNX Runtime's
   online graph optimisation at level ``basic`` and at level ``all`` (the pipeline ships no
   offline-optimised DeBERTa graph: it fuses almost nothing and is no faster, see
   models/README.md), ``int8`` (level ``all``), and sentence-transformers'
   ``CrossEncoder.predict`` on the same random-initialised weights (PyTorch).
3. The steps behind the NLI int8 figure at batch 32: length bucketing on/off, batch size,
   intra-op threads and spinning, quantisation variants, and where a forward's time goes by
   operator (ONNX Runtime's profiler): the share in GEMMs bounds what any faster GEMM kernel
   can give (pairs/s with every GEMM free, and with GEMMs as fast as the per-tensor int8
   kernel of the GEMM ceiling).
4. int8-vs-fp32 MiniLM drift: cosine on 1,000 sentences, and how far the candidate sets at the
   0.60 similarity floor move on a 10,000-memory namespace (Jaccard over 200 queries).

Every engine is measured in interleaved rounds (each round visits every batch size and engine in
turn), so a load spike on a shared machine hits all of them alike; a figure is the best round
(other processes only ever slow a round down; the JSON also has the median). Ratios are
``engine / PyTorch`` at the same batch size in the same run. Peak RSS per engine is measured
while it loads and runs its largest batch.

Prints tables; writes JSON and a PNG to ``--out`` (default benchmarks/results/).

    python benchmarks/bench_runtime.py --quick      # ~3-4 minutes on 2 cores
    python benchmarks/bench_runtime.py              # more rounds, longer slices
    python benchmarks/bench_runtime.py --device cuda --quick   # the GPU section

``--device cuda`` measures the ``fp32`` and ``fp16`` variants on the CUDA provider with IO
binding (PyTorch on CUDA when torch has it, else on the CPU, said in the JSON); the drift is
fp16 vs fp32, and the CPU-only steps (threads, spinning, int8 variants) and targets are skipped.
"""

from __future__ import annotations

import os

# numpy's BLAS pool would be a third busy pool next to torch's and ONNX Runtime's.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402 - the path above makes the helpers importable
    Corpus,
    Peak,
    Progress,
    add_common_args,
    manifest_summary,
    pyplot,
    release_memory,
    run_header,
    shared_machine_note,
    table,
    torch_cross_encoder,
    torch_embedder,
    utc_stamp,
    write_json,
)

NAME = "bench_runtime"
SIZES = (1, 8, 32, 128)
TORCH = "pytorch"
BIG = 1 << 22  # a token budget that never splits a call: one forward per call
TARGET_NLI_RATIO = 5.0
TARGET_NLI_RATE = 100.0
TARGET_EMB_RATIO = 1.3
TARGET_NLI_CEILING = 0.25
"""NLI int8 pairs/s as a fraction of what the int8 GEMM ceiling allows (issue 16)."""


# -- measurement ------------------------------------------------------------------------------
@dataclass
class Engine:
    name: str
    kind: str
    """``ort`` or ``torch``."""
    run: Callable[[Sequence[Any], int], Any]
    """``run(items, batch_size)``: one call over ``items``."""
    note: str = ""
    memory: dict[str, Any] = field(default_factory=dict)
    load_s: float = 0.0
    skip: set[int] = field(default_factory=set)
    """Batch sizes not measured (said in the table)."""


@dataclass
class Point:
    rates: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    items: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    """CPU time of this process over the slices (all its threads, spinning included)."""

    @property
    def rate(self) -> float | None:
        """The best round: other processes only ever slow a round down."""
        return max(self.rates) if self.rates else None

    @property
    def cpu_rate(self) -> float | None:
        """Items per CPU-second: with one thread, a figure that other processes barely move."""
        return self.items / self.cpu_seconds if self.cpu_seconds else None

    def record(self) -> dict[str, Any]:
        return {
            "items_per_s": self.rate,
            "items_per_s_median": statistics.median(self.rates) if self.rates else None,
            "rounds": [round(r, 2) for r in self.rates],
            "items": self.items,
            "seconds": round(self.seconds, 3),
            "items_per_cpu_s": self.cpu_rate,
            "call_p50_ms": round(1000 * statistics.median(self.latencies), 2)
            if self.latencies
            else None,
        }


def run_slice(
    engine: Engine, pool: Sequence[Any], batch: int, seconds: float, offset: int, point: Point
) -> None:
    """Calls of ``batch`` items from ``pool`` (cycling from ``offset``) for at least
    ``seconds`` and at least one call; adds the rate to ``point``."""
    items, calls, t0, cpu0 = 0, 0, time.perf_counter(), time.process_time()
    while True:
        start = (offset + calls * batch) % len(pool)
        chunk = [pool[(start + i) % len(pool)] for i in range(batch)]
        c0 = time.perf_counter()
        engine.run(chunk, batch)
        point.latencies.append(time.perf_counter() - c0)
        items += batch
        calls += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    point.rates.append(items / elapsed)
    point.items += items
    point.seconds += elapsed
    point.cpu_seconds += time.process_time() - cpu0


def sweep(
    engines: list[Engine],
    pool: Sequence[Any],
    sizes: Sequence[int],
    rounds: int,
    seconds: float,
    label: str,
) -> dict[str, dict[int, Point]]:
    """Interleaved rounds: every (batch size, engine) once per round, same chunks for all."""
    points = {e.name: {b: Point() for b in sizes} for e in engines}
    todo = sum(1 for e in engines for b in sizes if b not in e.skip) * rounds
    bar = Progress(label, todo, unit="slice")
    for r in range(rounds):
        offset = (r * 997) % len(pool)
        for b in sizes:
            for e in engines:
                if b in e.skip:
                    continue
                if r == 0 and b <= 32:  # untimed: first call at a new shape
                    e.run([pool[(offset + i) % len(pool)] for i in range(b)], b)
                run_slice(e, pool, b, seconds, offset, points[e.name][b])
                bar.update()
    bar.close()
    return points


def load(
    name: str,
    kind: str,
    build: Callable[[], Callable[[Sequence[Any], int], Any]],
    warm: Sequence[Any],
    note: str = "",
) -> Engine:
    """Build an engine inside a memory window that also covers one call at the largest batch."""
    with Peak() as peak:
        t0 = time.perf_counter()
        run = build()
        load_s = time.perf_counter() - t0
        run(list(warm), len(warm))
    engine = Engine(name, kind, run, note=note, memory=peak.record(), load_s=load_s)
    print(
        f"  loaded {name}: {load_s:.1f}s, peak RSS +{peak.delta_mb:,.0f} MB "
        f"(batch {len(warm)} included)",
        flush=True,
    )
    return engine


# -- engines ----------------------------------------------------------------------------------
def ort_embedder(
    cache: Path, variant: str, threads: int, sizes: Sequence[int], device: str = "cpu"
) -> Any:
    from engine.runtime.base import BatchSettings
    from engine.runtime.embedder import Embedder
    from engine.runtime.layout import artefact_dir
    from engine.runtime.manifest import load_manifest
    from engine.runtime.session import SessionSettings

    manifest = load_manifest(artefact_dir(cache, "minilm", variant))
    return Embedder(
        manifest,
        SessionSettings(device=device, intra_op_threads=threads),  # type: ignore[arg-type]
        BatchSettings(max_batch=max(sizes), max_batch_tokens=BIG),
    )


def ort_nli(
    cache: Path,
    variant: str,
    threads: int,
    max_batch: int,
    level: str = "all",
    spinning: bool = True,
    tokens: int = BIG,
    device: str = "cpu",
) -> Any:
    from engine.runtime.base import BatchSettings
    from engine.runtime.layout import artefact_dir
    from engine.runtime.manifest import load_manifest
    from engine.runtime.nli import NLIScorer
    from engine.runtime.session import SessionSettings

    manifest = load_manifest(artefact_dir(cache, "nli-deberta-v3-small", variant))
    session = SessionSettings(
        device=device,  # type: ignore[arg-type]
        intra_op_threads=threads,
        graph_optimization=level,
        allow_spinning=spinning,  # type: ignore[arg-type]
    )
    return NLIScorer(manifest, session, BatchSettings(max_batch=max_batch, max_batch_tokens=tokens))


def careful_cross_encoder(ce: Any, threads: int) -> Callable[[Sequence[Any], int], Any]:
    """The best PyTorch a careful user would write around a CrossEncoder's model: pairs sorted
    by token length and cut into batches (each padded to its own longest), ``inference_mode``,
    ``threads`` intra-op threads; probabilities back in the caller's order."""
    import torch

    torch.set_num_threads(threads)
    model, tokenizer = ce.model.eval(), ce.tokenizer

    def run(items: Sequence[Any], batch: int) -> np.ndarray:
        pairs = list(items)
        lengths = [len(x) for x in tokenizer(pairs, truncation=True)["input_ids"]]
        order = np.argsort(lengths, kind="stable")
        out = np.zeros((len(pairs), model.config.num_labels), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(pairs), batch):
                idx = order[start : start + batch]
                enc = tokenizer(
                    [pairs[i] for i in idx], padding=True, truncation=True, return_tensors="pt"
                )
                out[idx] = torch.softmax(model(**enc).logits, dim=-1).float().numpy()
        return out

    return run


# -- the sweep tables -------------------------------------------------------------------------
def describe(engines: Sequence[Engine]) -> dict[str, dict[str, Any]]:
    """What the report keeps of each engine once its model is freed."""
    return {
        e.name: {
            "kind": e.kind,
            "note": e.note,
            "load_s": round(e.load_s, 2),
            "memory": e.memory,
            "skipped_batch_sizes": sorted(e.skip),
        }
        for e in engines
    }


def sweep_rows(
    info: dict[str, dict[str, Any]],
    points: dict[str, dict[int, Point]],
    sizes: Sequence[int],
    cpu: bool = False,
) -> list[list[Any]]:
    rows = []
    for name, meta in info.items():
        row: list[Any] = [name]
        for b in sizes:
            rate = points[name][b].cpu_rate if cpu else points[name][b].rate
            ref = points[TORCH][b].cpu_rate if cpu else points[TORCH][b].rate
            if rate is None:
                row.append("skipped")
            elif name == TORCH or ref is None:
                row.append(f"{rate:,.1f}")
            else:
                row.append(f"{rate:,.1f} ({rate / ref:.2f}x)")
        row.append(float(meta["memory"].get("delta_rss_mb", 0.0)))
        row.append(meta["note"])
        rows.append(row)
    return rows


def ratios(points: dict[str, dict[int, Point]], sizes: Sequence[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, by_size in points.items():
        out[name] = {}
        for b in sizes:
            rate, ref = by_size[b].rate, points[TORCH][b].rate
            out[name][str(b)] = None if rate is None or ref is None else round(rate / ref, 3)
    return out


def round_ratios(engine: Point, ref: Point) -> dict[str, Any] | None:
    """``engine / PyTorch`` within each interleaved round (both measured minutes apart at most,
    so a load change hits both): median, min and max over the rounds."""
    pairs = list(zip(engine.rates, ref.rates, strict=False))
    values = sorted(a / b for a, b in pairs if b > 0)
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 3),
        "min": round(values[0], 3),
        "max": round(values[-1], 3),
        "rounds": len(values),
        "spread": round(values[-1] / values[0] - 1.0, 3),
    }


def round_ratio_table(
    points: dict[str, dict[int, Point]], sizes: Sequence[int]
) -> dict[str, dict[str, Any]]:
    return {
        name: {
            str(b): round_ratios(by_size[b], points[TORCH][b])
            for b in sizes
            if by_size[b].rates and points[TORCH][b].rates
        }
        for name, by_size in points.items()
        if name != TORCH
    }


# -- the physical limit ----------------------------------------------------------------------
def _one_matmul(path: Path, kind: str, m: int, k: int, n: int) -> dict[str, np.ndarray]:
    """A one-node graph ``[m, k] x [k, n]`` with a constant weight: fp32 MatMul, u8 x s8
    MatMulInteger (dynamic int8's kernel), 8-bit MatMulNBits at accuracy level 4 (the
    blockwise kernel), or the fp32 graph rewritten by the pipeline's rowwise route (per-row
    quantisation into MatMulIntegerToFloat: the shipped int8 kernel, its quantisation
    included). Returns its feeds."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32)
    if kind == "fp32":
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])]
        node = helper.make_node("MatMul", ["x", "w"], ["y"])
        inits = [numpy_helper.from_array(w, "w")]
        feeds = {"x": x}
        out_type = TensorProto.FLOAT
    elif kind == "int8":
        inputs = [helper.make_tensor_value_info("x", TensorProto.UINT8, [m, k])]
        node = helper.make_node("MatMulInteger", ["x", "w"], ["y"])
        inits = [numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), "w")]
        feeds = {"x": rng.integers(0, 256, (m, k), dtype=np.uint8)}
        out_type = TensorProto.INT32
    elif kind == "rowwise":
        from engine.pipeline.graph import rowwise_int8

        dense = path.with_name(path.stem + ".fp32.onnx")
        _one_matmul(dense, "fp32", m, k, n)
        rowwise_int8(dense, path)
        return {"x": x}
    else:
        from engine.pipeline.graph import BLOCKWISE_BLOCK, _int8_blocks, _weight_blocks

        codes, scales = _int8_blocks(w, BLOCKWISE_BLOCK)
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])]
        node = helper.make_node(
            "MatMulNBits",
            ["x", "b", "s"],
            ["y"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=8,
            block_size=BLOCKWISE_BLOCK,
            accuracy_level=4,
        )
        inits = [
            numpy_helper.from_array(_weight_blocks(codes, BLOCKWISE_BLOCK), "b"),
            numpy_helper.from_array(scales.reshape(-1), "s"),
        ]
        feeds = {"x": x}
        out_type = TensorProto.FLOAT
    graph = helper.make_graph(
        [node], kind, inputs, [helper.make_tensor_value_info("y", out_type, [m, n])], inits
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(path))
    return feeds


GEMM_SHAPE = (1024, 768, 3072)
"""nli-deberta-v3-small's FFN up-projection at batch 32 x 32 tokens: [M, K] x [K, N]."""


def gemm_ceiling(threads: int, rounds: int, seconds: float, isa: Sequence[str]) -> dict[str, Any]:
    """Dense GEMM throughput on the DeBERTa FFN shape, for each kernel ONNX Runtime would use:
    the ceiling that no model built from these GEMMs can beat (attention, norms and glue only
    add to it). Interleaved rounds, best round per kernel."""
    from engine.runtime.session import OrtModel, SessionSettings

    m, k, n = GEMM_SHAPE
    work = Path(tempfile.mkdtemp(prefix="memgate-gemm-"))
    kernels: dict[str, tuple[Any, dict[str, np.ndarray]]] = {}
    try:
        for kind in ("fp32", "int8", "blockwise", "rowwise"):
            feeds = _one_matmul(work / f"{kind}.onnx", kind, m, k, n)
            model = OrtModel(work / f"{kind}.onnx", SessionSettings(intra_op_threads=threads))
            model.run(feeds)
            kernels[kind] = (model, feeds)
        best: dict[str, list[float]] = {kind: [] for kind in kernels}
        for _ in range(rounds):
            for kind, (model, feeds) in kernels.items():
                calls, t0 = 0, time.perf_counter()
                while (elapsed := time.perf_counter() - t0) < seconds or calls == 0:
                    model.run(feeds)
                    calls += 1
                best[kind].append(2.0 * m * k * n * calls / elapsed / 1e9)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    flags = set(isa)
    return {
        "shape_mkn": [m, k, n],
        "threads": threads,
        "gops": {kind: round(max(v), 1) for kind, v in best.items()},
        "gops_median": {kind: round(statistics.median(v), 1) for kind, v in best.items()},
        "int8_kernel_isa": "amx"
        if {"amx_int8", "amx_tile"} <= flags
        else (
            "avx512_vnni"
            if "avx512_vnni" in flags
            else ("avx_vnni" if "avx_vnni" in flags else "avx2")
        ),
        "amx": "amx_int8" in flags,
        "note": "MLAS picks its kernel at run time; AMX is used only where the CPU has it",
    }


def gemm_flops_per_token(model_path: Path) -> float:
    """2 x the weights of every constant-weight MatMul (fp32, MatMulInteger(ToFloat) or
    MatMulNBits):
    what one token costs in GEMMs (attention's activation x activation products excluded)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    total = 0
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            total += attrs["K"] * attrs["N"]
        elif (
            node.op_type in ("MatMul", "MatMulInteger", "MatMulIntegerToFloat")
            and len(node.input) > 1
        ):
            dims = shapes.get(node.input[1])
            if dims and len(dims) == 2:
                total += dims[0] * dims[1]
    return 2.0 * total


def ceiling_fractions(
    ceiling: dict[str, Any],
    rate: float | None,
    flops_per_token: float,
    tokens_per_item: float,
    kernel: str,
) -> dict[str, Any]:
    """``rate`` items/s against the items/s the ``kernel``'s GEMM throughput would allow."""
    gops = ceiling["gops"].get(kernel)
    if not rate or not gops or not flops_per_token:
        return {"kernel": kernel, "fraction": None}
    limit = gops * 1e9 / (flops_per_token * tokens_per_item)
    return {
        "kernel": kernel,
        "gemm_gops": gops,
        "gflop_per_item": round(flops_per_token * tokens_per_item / 1e9, 3),
        "ceiling_items_per_s": round(limit, 1),
        "items_per_s": round(rate, 1),
        "fraction": round(rate / limit, 3),
    }


# -- steps at NLI int8, batch 32 --------------------------------------------------------------
def pad(encodings: Sequence[Any], width: int, pad_id: int) -> dict[str, np.ndarray]:
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), width), dtype=np.int64)
    for row, enc in enumerate(encodings):
        n = len(enc.ids)
        ids[row, :n] = enc.ids
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def bucketing_step(nli: Any, pairs: Sequence[tuple[str, str]], rounds: int) -> list[dict[str, Any]]:
    """One call of many pairs cut into batches of 32: the engine's length buckets against
    batches in arrival order (each padded to its own longest, or all to the call's longest),
    the latter built here and fed to the session directly."""
    from engine.runtime.base import BatchSettings

    saved = nli.batching
    nli.batching = BatchSettings()  # the engine's defaults: 32 items, 8,192 tokens
    real = int(sum(len(e.ids) for e in nli.encode(pairs)))

    def engine_way() -> int:
        prepared = nli.preprocess(pairs)
        nli.postprocess(nli.forward(prepared), prepared)
        return int(prepared.stats.padded_tokens)

    def arrival(pad_to_call: bool) -> Callable[[], int]:
        def go() -> int:
            encodings = nli.encode(pairs)
            longest = max(len(e.ids) for e in encodings)
            padded = 0
            for start in range(0, len(encodings), 32):
                chunk = encodings[start : start + 32]
                width = longest if pad_to_call else max(len(e.ids) for e in chunk)
                nli.model.run(pad(chunk, width, nli.pad_id))
                padded += width * len(chunk)
            return padded

        return go

    ways = [
        ("on: sorted by length, buckets of <= 32 (engine default)", engine_way),
        ("off: arrival order, each batch padded to its longest", arrival(False)),
        ("off: arrival order, all padded to the call's longest", arrival(True)),
    ]
    results: dict[str, list[float]] = {w: [] for w, _ in ways}
    padded: dict[str, int] = {}
    for _ in range(rounds):
        for label, fn in ways:
            t0 = time.perf_counter()
            padded[label] = fn()
            results[label].append(len(pairs) / (time.perf_counter() - t0))
    nli.batching = saved
    base = statistics.median(results[ways[0][0]])
    return [
        {
            "way": label,
            "pairs_per_s": statistics.median(results[label]),
            "vs_on": statistics.median(results[label]) / base,
            "padded_tokens": padded[label],
            "padding_overhead": padded[label] / real - 1.0,
        }
        for label, _ in ways
    ]


GEMM_OPS = frozenset(
    {
        "MatMulNBits",
        "MatMul",
        "FusedMatMul",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QLinearMatMul",
        "Gemm",
        "FusedGemm",
    }
)
"""Operators whose time is a matrix product (what a faster GEMM kernel would speed up)."""


def operator_times(events: Sequence[dict[str, Any]], skip_runs: int) -> dict[str, Any]:
    """Kernel time by operator type in an ONNX Runtime profile (its JSON events), leaving out
    the first ``skip_runs`` model runs (warm-up), and what follows from it: the share of a run
    spent in matrix products (:data:`GEMM_OPS`) and how much faster a run would be if they cost
    nothing (the bound any GEMM kernel can give)."""
    runs = sorted(
        (e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e["ts"],
    )
    if len(runs) <= skip_runs:
        raise ValueError(f"the profile has {len(runs)} model runs, {skip_runs} to skip")
    cut = runs[skip_runs]["ts"]
    run_us = float(sum(e["dur"] for e in runs[skip_runs:]))
    by: dict[str, float] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= cut:
            op = e["args"]["op_name"]
            by[op] = by.get(op, 0.0) + float(e["dur"])
    gemm = sum(us for op, us in by.items() if op in GEMM_OPS)
    rest = run_us - gemm
    return {
        "runs": len(runs) - skip_runs,
        "run_us": run_us,
        "kernel_us_by_op": dict(sorted(by.items(), key=lambda kv: -kv[1])),
        "gemm_us": gemm,
        "gemm_share": gemm / run_us if run_us else None,
        "free_gemm_speedup": run_us / rest if rest > 0 else None,
    }


def operators_step(nli: Any, pairs: Sequence[tuple[str, str]], threads: int) -> dict[str, Any]:
    """Where the scorer's forward spends its time: the scorer's own graph in a session with
    the engine's options and ONNX Runtime's profiler on, fed the engine's length buckets; one
    warm-up pass over the buckets, then a profiled one."""
    import json

    import onnxruntime as ort

    prepared = nli.preprocess(pairs)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tmp) / "nli")
        session = ort.InferenceSession(
            str(nli.manifest.model_path), opts, providers=["CPUExecutionProvider"]
        )
        names = {i.name for i in session.get_inputs()}
        feeds = [{k: v for k, v in b.feeds.items() if k in names} for b in prepared.buckets]
        for f in feeds:
            session.run(None, f)
        t0 = time.perf_counter()
        for f in feeds:
            session.run(None, f)
        wall = time.perf_counter() - t0
        events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    out = operator_times(events, skip_runs=len(feeds))
    out.update(pairs=len(pairs), batches=len(feeds), profiled_pairs_per_s=len(pairs) / wall)
    return out


def gemm_bounds(
    ops: dict[str, Any], rate: float | None, pytorch: float | None, faster: float | None
) -> dict[str, Any]:
    """What faster GEMMs could give the NLI forward at batch 32, from the profiled share of
    its time in GEMMs (Amdahl): with every GEMM free (the most any kernel can give), and with
    GEMMs ``faster`` times as fast (ONNX Runtime's per-tensor int8 kernel against the
    row-invariant blockwise one, on the FFN shape; None when the graph is not on blockwise).
    Each as pairs/s and as a multiple of PyTorch's same-run rate."""
    share = ops.get("gemm_share")

    def at(speedup: float | None) -> dict[str, float | None]:
        if share is None or not rate or speedup is None:
            return {"speedup": None, "pairs_per_s": None, "vs_pytorch": None}
        bound = rate * speedup
        return {
            "speedup": speedup,
            "pairs_per_s": bound,
            "vs_pytorch": bound / pytorch if pytorch else None,
        }

    free = ops.get("free_gemm_speedup")
    sped = None if share is None or not faster else 1.0 / ((1.0 - share) + share / faster)
    return {"free_gemms": at(free), "gemms_faster": at(sped), "faster": faster}


def operators_table(ops: dict[str, Any], low: str, top: int = 8) -> str:
    per_pair = ops["run_us"] / ops["pairs"] / 1e3
    rows = [
        [op, f"{us / ops['pairs'] / 1e3:.2f}", f"{us / ops['run_us']:.1%}", op in GEMM_OPS]
        for op, us in list(ops["kernel_us_by_op"].items())[:top]
    ]
    title = (
        f"(e) NLI {low}, batch 32: {per_pair:.1f} ms a pair under the profiler, "
        f"{ops['gemm_share']:.1%} of it in GEMMs"
    )
    text = table(["operator", "ms a pair", "share", "GEMM"], rows, title=title)
    bound = ops.get("bound") or {}
    free, sped = bound.get("free_gemms") or {}, bound.get("gemms_faster") or {}
    if free.get("vs_pytorch"):
        text += (
            f"\n  with every GEMM free: {free['pairs_per_s']:.0f} pairs/s = "
            f"{free['vs_pytorch']:.2f}x PyTorch (the most any GEMM kernel can give)"
        )
    if sped.get("vs_pytorch"):
        text += (
            f"\n  with GEMMs {bound['faster']:.2f}x as fast (per-tensor MatMulInteger, not "
            f"row-invariant): {sped['pairs_per_s']:.0f} pairs/s = {sped['vs_pytorch']:.2f}x"
        )
    return text


def threads_step(
    cache: Path, pool: Sequence[tuple[str, str]], rounds: int, seconds: float
) -> list[dict[str, Any]]:
    """intra-op threads 1 vs 2, spinning on vs off: one session each, in interleaved rounds."""
    configs = [(2, True), (2, False), (1, True), (1, False)]
    scorers = {c: ort_nli(cache, "int8", c[0], 32, spinning=c[1]) for c in configs}
    engines = [
        Engine(
            f"{t} thread{'s' if t > 1 else ''}, spinning {'on' if s else 'off'}",
            "ort",
            lambda items, _b, sc=scorers[(t, s)]: sc.score(items),
        )
        for t, s in configs
    ]
    points = sweep(engines, pool, [32], rounds, seconds, "threads x spinning")
    base = points[engines[0].name][32].rate or 1.0
    out = []
    for (t, s), e in zip(configs, engines, strict=True):
        rate = points[e.name][32].rate
        out.append(
            {
                "threads": t,
                "allow_spinning": s,
                "pairs_per_s": rate,
                "vs_default": (rate or 0) / base,
                "call_p50_ms": points[e.name][32].record()["call_p50_ms"],
            }
        )
    del scorers, engines
    release_memory()
    return out


def quant_step(cache: Path) -> dict[str, Any]:
    root = cache / "models" / "nli-deberta-v3-small"
    variants = (
        sorted(
            p.name for p in root.iterdir() if "int8" in p.name and (p / "manifest.json").is_file()
        )
        if root.is_dir()
        else []
    )
    import json

    settings = {}
    for v in variants:
        raw = json.loads((root / v / "manifest.json").read_text(encoding="utf-8"))
        settings[v] = raw.get("quantization")
    note = ""
    if len(variants) <= 1:
        note = (
            "skipped: the pipeline builds one int8 variant (its settings are in the JSON), so "
            "there is no other quantisation setting to compare"
        )
    return {"variants": variants, "settings": settings, "note": note}


# -- int8 drift -------------------------------------------------------------------------------
def drift(
    fp32: Any,
    int8: Any,
    corpus: Corpus,
    n_sentences: int,
    n_memories: int,
    n_queries: int,
    floor: float = 0.60,
    top_k: int = 20,
) -> dict[str, Any]:
    sentences = corpus.sentences(n_sentences, salt=11)
    a, b = fp32.embed(sentences), int8.embed(sentences)
    cos = np.sum(a * b, axis=1)
    stored = corpus.memories(n_memories, namespace="drift", salt=12)
    queries = [f.text for f in corpus.incoming(stored, n_queries, salt=13)]
    texts = [s.text for s in stored]
    m32, m8 = fp32.embed(texts), int8.embed(texts)
    q32, q8 = fp32.embed(queries), int8.embed(queries)
    s32, s8 = q32 @ m32.T, q8 @ m8.T

    def jaccard(cap: int | None) -> dict[str, Any]:
        values, sizes32, sizes8, both_empty = [], [], [], 0
        for i in range(len(queries)):
            if cap is None:
                x, y = set(np.flatnonzero(s32[i] >= floor)), set(np.flatnonzero(s8[i] >= floor))
            else:
                top32 = np.argsort(-s32[i])[:cap]
                top8 = np.argsort(-s8[i])[:cap]
                x = {int(j) for j in top32 if s32[i, j] >= floor}
                y = {int(j) for j in top8 if s8[i, j] >= floor}
            sizes32.append(len(x))
            sizes8.append(len(y))
            if not x and not y:
                both_empty += 1
                values.append(1.0)
            else:
                values.append(len(x & y) / len(x | y))
        arr = np.asarray(values)
        return {
            "mean": float(arr.mean()),
            "median": float(np.median(arr)),
            "min": float(arr.min()),
            "identical_share": float(np.mean(arr == 1.0)),
            "both_empty": both_empty,
            "mean_size_fp32": float(np.mean(sizes32)),
            "mean_size_int8": float(np.mean(sizes8)),
        }

    return {
        "sentences": n_sentences,
        "cosine_mean": float(cos.mean()),
        "cosine_min": float(cos.min()),
        "cosine_p01": float(np.quantile(cos, 0.01)),
        "memories": n_memories,
        "queries": n_queries,
        "floor": floor,
        "jaccard_all_above_floor": jaccard(None),
        "jaccard_top20_above_floor": jaccard(top_k),
        "top1_agreement": float(np.mean(np.argmax(s32, axis=1) == np.argmax(s8, axis=1))),
    }


# -- plot -------------------------------------------------------------------------------------
def plot(
    path: Path,
    emb: dict[str, dict[int, Point]],
    nli: dict[str, dict[int, Point]],
    sizes: Sequence[int],
    title: str,
) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    for ax, points, what in ((axes[0], emb, "embeddings/s"), (axes[1], nli, "NLI pairs/s")):
        for name, by_size in points.items():
            xs = [b for b in sizes if by_size[b].rate is not None]
            ys = [by_size[b].rate for b in xs]
            style = "k--" if name == TORCH else "-"
            ax.plot(xs, ys, style, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(sizes), [str(s) for s in sizes])
        ax.set_xlabel("batch size")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title("MiniLM-L6 embedder")
    axes[1].set_title("nli-deberta-v3-small")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# -- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per point")
    parser.add_argument("--slice", type=float, default=None, help="seconds per engine per round")
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="cuda: fp32 and fp16 variants on the CUDA provider with IO binding",
    )
    args = parser.parse_args(argv)
    gpu = args.device == "cuda"
    low = "fp16" if gpu else "int8"  # the reduced-precision variant measured in steps 2 and 4
    emb_variants = ("fp32", "fp16") if gpu else ("fp32", "optimized", "int8")
    nli_variants = (
        (("ort fp32 (all)", "fp32", "all"), ("ort fp16 (all)", "fp16", "all"))
        if gpu
        else (
            ("ort fp32 (basic)", "fp32", "basic"),
            ("ort fp32 (all)", "fp32", "all"),
            ("ort int8 (all)", "int8", "all"),
        )
    )
    low_nli = f"ort {low} (all)"

    # One busy pool at a time, each sized to --threads: torch's here, ONNX Runtime's per session.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    import sentence_transformers  # noqa: F401 - imported before any memory window opens

    torch_device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    if args.smoke:
        sizes: tuple[int, ...] = (1, 8)
        rounds, seconds, pool_n = 1, 0.2, 64
        n_sent, n_mem, n_q, big_n = 50, 300, 20, 64
    elif args.quick:
        # 6 rounds of 0.4 s: with 2 rounds of 0.6 s the quick ratios moved by a third between
        # runs; a ratio is now the median of per-round ratios, printed with its min-max.
        sizes, rounds, seconds, pool_n = SIZES, 6, 0.4, 1024
        n_sent, n_mem, n_q, big_n = 1000, 10_000, 200, 256
    else:
        sizes, rounds, seconds, pool_n = SIZES, 5, 2.0, 2048
        n_sent, n_mem, n_q, big_n = 1000, 10_000, 200, 512
    rounds = args.rounds or rounds
    seconds = args.slice or seconds
    cache = Path(args.cache_dir)
    # Every other built int8 route of the NLI model (static int8 beside the default), same run.
    routes = [
        p.name
        for p in sorted((cache / "models" / "nli-deberta-v3-small").glob("int8-*"))
        if (p / "manifest.json").is_file() and not gpu
    ]
    nli_variants += tuple((f"ort {v} (all)", v, "all") for v in routes)
    corpus = Corpus(args.seed)
    texts = corpus.sentences(pool_n, salt=1)
    pairs = corpus.pairs(pool_n, salt=3)
    result: dict[str, Any] = run_header(NAME, args)
    result["settings"].update(
        {
            "sizes": list(sizes),
            "rounds": rounds,
            "slice_s": seconds,
            "pool": pool_n,
            "ort_graph_optimization": "all unless the engine name says otherwise",
            "torch_threads": torch.get_num_threads(),
            "device": args.device,
            "torch_device": torch_device,
        }
    )
    result["manifests"] = manifest_summary(
        cache,
        [("minilm", v) for v in emb_variants]
        + [
            ("nli-deberta-v3-small", v)
            for _label, v, _level in nli_variants
            if "basic" not in _label
        ],
    )
    m = result["machine"]
    print(
        f"{NAME}: {m['cpu']} ({m['usable_cores']} cores, {' '.join(m['isa'][-4:])}), "
        f"{m['memory_gib']} GiB, load {m['load_average_at_start']}, "
        f"git {result['git']['sha'][:10]}{'+dirty' if result['git']['dirty'] else ''}"
    )
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    print(
        f"  {mode} mode: "
        f"{rounds} rounds x {seconds:g}s slices, batch sizes {list(sizes)}, "
        f"{args.threads} threads, {args.device}" + (f" (PyTorch on {torch_device})" if gpu else ""),
        flush=True,
    )
    warm_n = max(sizes)
    notes: list[str] = []

    # -- 1. embedder ---------------------------------------------------------------------
    print("\n[1/4] embedder", flush=True)
    emb_engines: list[Engine] = []
    ort_emb: dict[str, Any] = {}
    for variant in emb_variants:

        def build(variant: str = variant) -> Callable[[Sequence[Any], int], Any]:
            ort_emb[variant] = ort_embedder(cache, variant, args.threads, sizes, args.device)
            return lambda items, _b: ort_emb[variant].embed(items)

        emb_engines.append(load(f"ort {variant}", "ort", build, texts[:warm_n]))

    def build_st() -> Callable[[Sequence[Any], int], Any]:
        st = torch_embedder(device=torch_device)
        return lambda items, b: st.encode(
            list(items), batch_size=b, normalize_embeddings=True, show_progress_bar=False
        )

    emb_engines.append(
        load(TORCH, "torch", build_st, texts[:warm_n], note="SentenceTransformer.encode")
    )
    emb_points = sweep(emb_engines, texts, sizes, rounds, seconds, "embedder sweep")
    emb_info = describe(emb_engines)
    emb_tokens = float(np.mean([len(e.ids) for e in ort_emb["fp32"].encode(texts)]))
    emb_flops = gemm_flops_per_token(ort_emb["fp32"].manifest.model_path)

    # -- 2. int8 drift -------------------------------------------------------------------
    print(f"\n[2/4] {low} vs fp32 MiniLM drift", flush=True)
    t0 = time.perf_counter()
    drift_res = drift(ort_emb["fp32"], ort_emb[low], corpus, n_sent, n_mem, n_q)
    print(f"  drift measured in {time.perf_counter() - t0:.1f}s", flush=True)
    del emb_engines[:]
    ort_emb.clear()
    release_memory()

    # -- 3. NLI --------------------------------------------------------------------------
    print("\n[3/4] NLI", flush=True)
    nli_engines: list[Engine] = []
    scorers: dict[str, Any] = {}
    for label, variant, level in nli_variants:

        def build_nli(
            label: str = label, variant: str = variant, level: str = level
        ) -> Callable[[Sequence[Any], int], Any]:
            scorers[label] = ort_nli(
                cache, variant, args.threads, max(sizes), level, device=args.device
            )
            return lambda items, _b: scorers[label].score(items)

        note = {"basic": "online opt. basic", "all": "online opt. all (= 'optimized')"}[level]
        nli_engines.append(load(label, "ort", build_nli, pairs[:warm_n], note=note))
    work = Path(tempfile.mkdtemp(prefix="memgate-bench-"))
    ce_info: dict[str, Any] = {}

    def build_ce() -> Callable[[Sequence[Any], int], Any]:
        ce, info = torch_cross_encoder(work, device=torch_device)
        ce_info.update(info)
        ce_info["baseline"] = (
            "length-sorted batches, torch.inference_mode, "
            f"{args.threads} threads (CrossEncoder's model and tokenizer)"
        )
        return careful_cross_encoder(ce, args.threads)

    ce_engine = load(
        TORCH, "torch", build_ce, pairs[:warm_n], note="sorted, inference_mode (careful user)"
    )
    nli_engines.append(ce_engine)
    # Same weights as the ONNX artefact? (The pipeline builds it with the same seed.)
    check = pairs[:4]
    ref = scorers["ort fp32 (all)"].score(check)
    got = np.asarray(ce_engine.run(check, 4))
    ce_info["max_abs_prob_diff_vs_onnx_fp32"] = float(np.abs(ref - got).max())
    print(
        f"  PyTorch CrossEncoder vs ONNX fp32 on the same pairs: max |dp| "
        f"{ce_info['max_abs_prob_diff_vs_onnx_fp32']:.1e} (same weights)",
        flush=True,
    )
    if args.quick and 128 in sizes:
        # One call at batch 128 ran inside the load window; if it was very slow, skip it.
        t0 = time.perf_counter()
        ce_engine.run(pairs[:32], 32)
        per_pair = (time.perf_counter() - t0) / 32
        if per_pair * 128 * rounds > 25:
            ce_engine.skip.add(128)
            notes.append(
                f"quick mode: PyTorch NLI at batch 128 skipped (~{per_pair * 128:.0f}s a call)"
            )
    nli_points = sweep(nli_engines, pairs, sizes, rounds, seconds, "NLI sweep")
    nli_info = describe(nli_engines)
    nli_tokens = float(np.mean([len(e.ids) for e in scorers["ort fp32 (all)"].encode(pairs)]))
    nli_flops = gemm_flops_per_token(scorers["ort fp32 (all)"].manifest.model_path)

    # -- 4. steps at int8, batch 32 ------------------------------------------------------
    print(f"\n[4/4] NLI {low} at batch 32: what each step buys", flush=True)
    int8 = scorers[low_nli]
    for label in [k for k in scorers if k != low_nli]:
        del scorers[label]
    del nli_engines[:]
    ce_engine.run = lambda _items, _b: None  # drop the PyTorch model
    shutil.rmtree(work, ignore_errors=True)
    release_memory()
    bucket_res = bucketing_step(int8, corpus.pairs(big_n, salt=21), rounds=max(2, rounds))
    int8_sizes = sorted({*sizes, *((16, 64) if not args.smoke else ())})
    e = Engine(low_nli, "ort", lambda items, _b: int8.score(items))
    more = sweep([e], pairs, int8_sizes, rounds, seconds, f"{low} by batch size")
    batch_res: dict[int, float | None] = {b: more[e.name][b].rate for b in int8_sizes}
    ops_res = None if gpu else operators_step(int8, corpus.pairs(256, salt=23), args.threads)
    int8 = None
    release_memory()
    if gpu:  # CPU thread pools and int8 variants: nothing to measure on CUDA
        thread_res: list[dict[str, Any]] = []
        quant_res = {"variants": [], "settings": {}, "note": "skipped on CUDA (CPU-only steps)"}
    else:
        thread_res = threads_step(cache, pairs, rounds, seconds)
        quant_res = quant_step(cache)

    # -- the physical limit ---------------------------------------------------------------
    print("\n[+] GEMM ceiling on the DeBERTa FFN shape", flush=True)
    ceiling = gemm_ceiling(args.threads, max(2, rounds // 2), seconds, m["isa"])
    if ops_res is not None:  # at the batch size of the targets, against PyTorch's same-run rate
        t32 = 32 if 32 in sizes else sizes[-1]
        g = ceiling["gops"]
        on_blockwise = next(iter(ops_res["kernel_us_by_op"]), "") == "MatMulNBits"
        ops_res["bound"] = gemm_bounds(
            ops_res,
            batch_res.get(t32),
            nli_points[TORCH][t32].rate,
            g["int8"] / g["blockwise"] if on_blockwise and g.get("blockwise") else None,
        )
    t32c = 32 if 32 in sizes else sizes[-1]
    fractions = {
        "nli": {
            name: ceiling_fractions(
                ceiling,
                nli_points[name][t32c].rate,
                nli_flops,
                nli_tokens,
                "int8" if "int8" in name else "fp32",
            )
            for name in nli_points
        },
        "embedder": {
            name: ceiling_fractions(
                ceiling,
                emb_points[name][t32c].rate,
                emb_flops,
                emb_tokens,
                "int8" if "int8" in name else "fp32",
            )
            for name in emb_points
        },
        "batch": t32c,
        "tokens_per_item": {"nli": round(nli_tokens, 1), "embedder": round(emb_tokens, 1)},
    }
    # The NLI model's FFN is the GEMM shape; the embedder's GEMMs are smaller (384 wide), so
    # its fraction understates how close it runs to what its own shapes allow.

    # -- report --------------------------------------------------------------------------
    head = ["engine"] + [f"batch {b}" for b in sizes] + ["peak RSS +MB", "note"]
    print()
    print(
        table(
            head,
            sweep_rows(emb_info, emb_points, sizes),
            title="Embeddings/s (x = ratio to PyTorch at the same batch size)",
        )
    )
    print()
    print(
        table(
            head,
            sweep_rows(nli_info, nli_points, sizes),
            title="NLI pairs/s (x = ratio to PyTorch at the same batch size)",
        )
    )
    if args.threads == 1:
        # One thread: CPU time is what the work cost, whatever else the machine was doing.
        for what, info, points in (
            ("Embeddings", emb_info, emb_points),
            ("NLI pairs", nli_info, nli_points),
        ):
            print()
            print(
                table(
                    head,
                    sweep_rows(info, points, sizes, cpu=True),
                    title=f"{what} per CPU-second (1 thread: robust to other processes)",
                )
            )
    t32 = 32 if 32 in sizes else sizes[-1]
    nli_int8 = nli_points[low_nli][t32].rate or 0.0
    nli_ref = nli_points[TORCH][t32].rate or float("nan")
    emb_fp32 = emb_points["ort fp32"][t32].rate or 0.0
    emb_ref = emb_points[TORCH][t32].rate or float("nan")
    nli_rr = round_ratios(nli_points[low_nli][t32], nli_points[TORCH][t32]) or {}
    emb_rr = round_ratios(emb_points["ort fp32"][t32], emb_points[TORCH][t32]) or {}
    int8_fraction = fractions["nli"][low_nli].get("fraction") if not gpu else None
    targets = {
        "NLI int8 vs PyTorch": (nli_rr.get("median", nli_int8 / nli_ref), TARGET_NLI_RATIO, "x"),
        "NLI int8 pairs/s": (nli_int8, TARGET_NLI_RATE, ""),
        "NLI int8 of the int8 GEMM ceiling": (int8_fraction or 0.0, TARGET_NLI_CEILING, ""),
        "embedder fp32 vs PyTorch": (
            emb_rr.get("median", emb_fp32 / emb_ref),
            TARGET_EMB_RATIO,
            "x",
        ),
    }
    spread = {"NLI int8 vs PyTorch": nli_rr, "embedder fp32 vs PyTorch": emb_rr}
    if gpu:  # the targets are CPU figures
        targets = {}
        print(
            f"\nNo targets on CUDA (they are CPU figures); {low_nli} at batch {t32}: "
            f"{nli_int8:,.1f} pairs/s, {nli_int8 / nli_ref:.2f}x PyTorch on {torch_device}"
        )
    else:
        print(f"\nTargets at batch {t32}:")
    for label, (value, target, unit) in targets.items():
        verdict = "met" if value >= target else "NOT met"
        rr = spread.get(label) or {}
        span = f" [rounds {rr['min']:.2f}-{rr['max']:.2f}]" if rr else ""
        print(f"  {label:<34} {value:7.2f}{unit:<2} (target >= {target:g}{unit})  {verdict}{span}")
    result["targets"] = {
        label: {
            "value": value,
            "target": target,
            "met": bool(value >= target),
            "batch": t32,
            **(
                {"round_min": spread[label]["min"], "round_max": spread[label]["max"]}
                if spread.get(label)
                else {}
            ),
        }
        for label, (value, target, _unit) in targets.items()
    }
    if not gpu:
        g = ceiling["gops"]
        print(
            f"\nGEMM ceiling {ceiling['shape_mkn']} ({ceiling['int8_kernel_isa']}, "
            f"AMX {'yes' if ceiling['amx'] else 'no'}): fp32 {g['fp32']:,.0f}, int8 "
            f"MatMulInteger {g['int8']:,.0f}, blockwise MatMulNBits {g['blockwise']:,.0f}, "
            f"rowwise (shipped: per-row quantisation + MatMulIntegerToFloat) {g['rowwise']:,.0f} "
            "GOPS"
        )
        for what, unit in (("nli", "pairs/s"), ("embedder", "embeddings/s")):
            for name, f in fractions[what].items():
                if f.get("fraction") is not None:
                    print(
                        f"  {what:<8} {name:<18} {f['items_per_s']:>9,.1f} {unit} = "
                        f"{f['fraction']:.1%} of {f['ceiling_items_per_s']:,.0f} "
                        f"({f['kernel']} GEMMs, {f['gflop_per_item']:.2f} GFLOP/item)"
                    )

    print()
    print(
        table(
            ["length bucketing (one call, batches of 32)", "pairs/s", "x on", "padding"],
            [
                [r["way"], r["pairs_per_s"], f"{r['vs_on']:.2f}x", f"+{r['padding_overhead']:.1%}"]
                for r in bucket_res
            ],
            title=f"(a) NLI {low}, a call of {big_n} pairs",
        )
    )
    print()
    print(
        table(
            ["batch size", "pairs/s", "x batch 32"],
            [
                [
                    b,
                    rate,
                    "-"
                    if rate is None or not batch_res.get(t32)
                    else f"{rate / batch_res[t32]:.2f}x",
                ]
                for b, rate in sorted(batch_res.items())
            ],
            title=f"(b) NLI {low}, one call per batch",
        )
    )
    print()
    print(
        "(c) threads and spinning: skipped on CUDA"
        if gpu
        else table(
            ["intra-op threads", "allow_spinning", "pairs/s", "x default", "call p50 ms"],
            [
                [
                    r["threads"],
                    r["allow_spinning"],
                    r["pairs_per_s"],
                    f"{r['vs_default']:.2f}x",
                    r["call_p50_ms"],
                ]
                for r in thread_res
            ],
            title="(c) NLI int8 at batch 32: threads and spinning (default: 2, on)",
        )
    )
    print(f"\n(d) quantisation settings: {quant_res['note'] or quant_res['variants']}")
    if ops_res is not None:
        print()
        print(operators_table(ops_res, low))
    result["int8_routes"] = {}
    for v in routes:
        name = f"ort {v} (all)"
        per_size = {
            str(b): round_ratios(nli_points[name][b], nli_points[low_nli][b])
            for b in sizes
            if nli_points[name][b].rates and nli_points[low_nli][b].rates
        }
        result["int8_routes"][v] = {"vs": low_nli, "per_batch": per_size}
        cells = [
            f"batch {b} {rr['median']:.2f}x [{rr['min']:.2f}-{rr['max']:.2f}]"
            for b, rr in per_size.items()
            if rr
        ]
        print(f"    {v} / int8 (same rounds): " + ", ".join(cells))
    d = drift_res
    ja, jt = d["jaccard_all_above_floor"], d["jaccard_top20_above_floor"]
    print()
    print(
        table(
            [f"MiniLM {low} vs fp32", "value"],
            [
                [f"cosine, {d['sentences']:,} sentences: mean", f"{d['cosine_mean']:.4f}"],
                ["cosine: min / 1st percentile", f"{d['cosine_min']:.4f} / {d['cosine_p01']:.4f}"],
                [
                    f"Jaccard of sets >= {d['floor']:.2f}, {d['queries']} queries x "
                    f"{d['memories']:,} memories: mean / median / min",
                    f"{ja['mean']:.3f} / {ja['median']:.3f} / {ja['min']:.3f}",
                ],
                ["  queries with identical sets", f"{ja['identical_share']:.0%}"],
                [
                    f"  mean set size fp32 / {low}",
                    f"{ja['mean_size_fp32']:.1f} / {ja['mean_size_int8']:.1f}",
                ],
                [
                    "Jaccard of top-20 >= floor (the gate's candidates): mean / min",
                    f"{jt['mean']:.3f} / {jt['min']:.3f}",
                ],
                ["  queries with identical candidates", f"{jt['identical_share']:.0%}"],
                ["top-1 neighbour agreement", f"{d['top1_agreement']:.0%}"],
            ],
            title="(drift)",
        )
    )
    for note in notes:
        print(f"note: {note}")
    shared = shared_machine_note()
    if shared:
        print(shared)
        notes.append(shared)

    result["embedder"] = {
        n: {str(b): p.record() for b, p in by.items()} for n, by in emb_points.items()
    }
    result["nli"] = {n: {str(b): p.record() for b, p in by.items()} for n, by in nli_points.items()}
    result["ratios_vs_pytorch"] = {
        "embedder": ratios(emb_points, sizes),
        "nli": ratios(nli_points, sizes),
    }
    result["round_ratios_vs_pytorch"] = {
        "embedder": round_ratio_table(emb_points, sizes),
        "nli": round_ratio_table(nli_points, sizes),
    }
    if not gpu:
        result["gemm_ceiling"] = ceiling
        result["ceiling_fractions"] = fractions
    result[f"steps_nli_{low}_batch32"] = {
        "bucketing": bucket_res,
        "batch_size": {str(b): r for b, r in batch_res.items()},
        "threads_spinning": thread_res,
        "quantisation": quant_res,
        "operators": ops_res,
    }
    result[f"drift_minilm_{low}_vs_fp32"] = drift_res
    result["engines"] = {"embedder": emb_info, "nli": nli_info}
    result["pytorch_cross_encoder"] = ce_info
    result["notes"] = notes
    stamp = utc_stamp()
    png = Path(args.out) / f"{NAME}-{stamp}.png"
    Path(args.out).mkdir(parents=True, exist_ok=True)
    title = (
        f"{result['machine']['cpu'] if not gpu else 'CUDA'}, {args.threads} threads, git "
        f"{result['git']['sha'][:10]}; {mode} mode"
    )
    if plot(png, emb_points, nli_points, sizes, title):
        result["plot"] = str(png)
    path = write_json(Path(args.out), NAME, result, stamp=stamp)
    print(f"\nwrote {path}" + (f" and {png}" if "plot" in result else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
